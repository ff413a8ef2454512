"""Nothing sidestep writes carries a secret: events, errors and the 503 body, end to end."""

from __future__ import annotations

import json
import string
import warnings

import httpx
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics.export import MetricsData
from prometheus_client import CollectorRegistry, generate_latest

import sidestep
from otel_capture import captured
from sidestep._config import SidestepConfigWarning
from sidestep._suspended import unavailable_body
from sidestep.metrics import prometheus

SECRET = st.text(alphabet=string.ascii_letters + string.digits, min_size=12, max_size=24).map(
    lambda s: "S3CR3T" + s
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    userinfo=SECRET,
    path=SECRET,
    query=SECRET,
    header=SECRET,
    status=st.sampled_from([401, 429, 500, 503]),
    connect_error=st.booleans(),
)
def test_no_secret_reaches_events_errors_or_the_503(
    userinfo: str, path: str, query: str, header: str, status: int, connect_error: bool
) -> None:
    """Secrets in userinfo, path, query and credential headers never appear in what sidestep writes: events, errors, the 503, metric labels and spans."""

    def upstream(request: httpx.Request) -> httpx.Response:
        if connect_error:
            raise httpx.ConnectError(f"cannot reach {request.url}", request=request)
        return httpx.Response(status, json={"error": {"message": f"bad {request.url}"}})

    config = {
        "breaker": {"failure_threshold": 1},
        "failover": {"on_all_suspended": "raise"},
        "routes": [
            {
                "name": "chat",
                "targets": [
                    {"name": "primary", "url": "https://primary.example/v1"},
                    # its own key: a 401 without a credential would be a challenge, not a suspension
                    {
                        "name": "backup",
                        "url": "https://backup.example/v1",
                        "headers": {"x-api-key": header},
                    },
                ],
            }
        ],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)
        transport = sidestep.FailoverTransport(config, transport=httpx.MockTransport(upstream))
    url = f"https://user:{userinfo}@primary.example/v1/{path}?key={query}&q=1"
    headers = {"authorization": f"Bearer {header}", "x-api-key": header}
    unrouted = f"https://user:{userinfo}@elsewhere.example/{path}?key={query}"
    written: list[str] = []
    registry = CollectorRegistry()
    prometheus.enable(registry)
    try:
        with (
            captured() as otel,
            httpx.Client(transport=transport) as client,
            structlog.testing.capture_logs() as logs,
        ):
            for target in (url, url, unrouted):
                try:
                    client.get(target, headers=headers)
                except sidestep.AllCandidatesSuspended as exc:
                    written += [str(exc), repr(exc), unavailable_body(exc).decode()]
                except httpx.HTTPError as exc:
                    written.append(repr(exc.__class__))  # the upstream's own error, not ours
            spans = otel.spans()
            metrics = otel.reader.get_metrics_data()
        metric_text = generate_latest(registry).decode()
    finally:
        prometheus.disable()
    written += [json.dumps(event, default=str) for event in logs]
    assert "sidestep_attempts_total{" in metric_text and spans  # metrics and spans were written
    written += [metric_text, *(span.to_json() for span in spans)]
    assert isinstance(metrics, MetricsData)
    written.append(metrics.to_json())
    written += [repr(s) for s in transport.suspensions()]
    assert logs  # something was written, and it is what is checked
    assert any("all_candidates_suspended" in text for text in written)  # the 503 body too
    for secret in (userinfo, path, query, header):
        for text in written:
            assert secret not in text
