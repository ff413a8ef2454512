"""Nothing sidestep writes carries a secret: events, errors and the 503 body, end to end."""

from __future__ import annotations

import json
import string
import warnings
from pathlib import Path

import httpx
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sidestep
from sidestep._config import SidestepConfigWarning
from sidestep._suspended import unavailable_body

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
    """Secrets in userinfo, path, query and credential headers never appear in what sidestep writes."""

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
    written: list[str] = []
    with httpx.Client(transport=transport) as client, structlog.testing.capture_logs() as logs:
        for _ in range(2):
            try:
                client.get(url, headers=headers)
            except sidestep.AllCandidatesSuspended as exc:
                written += [str(exc), repr(exc), unavailable_body(exc).decode()]
            except httpx.HTTPError as exc:
                written.append(repr(exc.__class__))  # the upstream's own error, not ours
    written += [json.dumps(event, default=str) for event in logs]
    written += [repr(s) for s in transport.suspensions()]
    assert logs  # something was written, and it is what is checked
    assert any("all_candidates_suspended" in text for text in written)  # the 503 body too
    for secret in (userinfo, path, query, header):
        for text in written:
            assert secret not in text


def test_the_sqlite_file_and_its_events_hold_no_secret(tmp_path: Path) -> None:
    """Through a SqliteStore, neither the file (nor its journal) holds a credential, path or query, and its warning never names the file's directory."""
    secret = "S3CR3Tsqlite0123456789"
    config = {
        "breaker": {"failure_threshold": 2},
        "routes": [{"name": "chat", "targets": [{"name": "p", "url": "https://p.example/v1"}]}],
    }

    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"error": {"message": f"bad {request.url}"}})

    store = sidestep.SqliteStore(tmp_path / "state.db")
    transport = sidestep.FailoverTransport(
        config, transport=httpx.MockTransport(upstream), store=store
    )
    with httpx.Client(transport=transport) as client:
        for _ in range(2):  # the threshold: the scope opens
            client.get(
                f"https://u:{secret}@p.example/v1/{secret}?key={secret}",
                headers={"authorization": f"Bearer {secret}"},
            )
    assert store.snapshot(0)  # something was kept, and it is what is checked
    store.close()
    for part in tmp_path.iterdir():
        assert secret.encode() not in part.read_bytes(), part.name
    hidden = tmp_path / secret
    with structlog.testing.capture_logs() as logs:
        sidestep.SqliteStore(hidden / "state.db")  # the directory does not exist: memory
    assert [e["event"] for e in logs] == ["store.unavailable"]
    assert secret not in json.dumps(logs, default=str)
