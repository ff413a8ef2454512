"""Nothing sidestep writes carries a secret: events, errors and the 503 body, end to end."""

from __future__ import annotations

import json
import string
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics.export import MetricsData
from prometheus_client import CollectorRegistry, generate_latest

import sidestep
import sidestep.admin
from otel_capture import captured
from redis_server import fresh_prefix
from servers import serve_asgi
from sidestep._common.scopes import ScopeFacts
from sidestep._core.suspended import unavailable_body
from sidestep._ops.cli import main
from sidestep._settings.policies import BreakerPolicy
from sidestep._settings.values import SidestepConfigWarning
from sidestep.logging import add_observer, remove_observer
from sidestep.metrics import prometheus
from upstream import Respond, Upstream

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
    """Secrets in userinfo, path, query and credential headers never appear in what sidestep writes: events (a suspended scope the store forgets, a listing of the store included), errors, the 503, metric labels and spans."""

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
        # room for two scopes: the route's failures make the store forget the suspended
        # scopes of the unrouted failure before them
        transport = sidestep.FailoverTransport(
            config,
            transport=httpx.MockTransport(upstream),
            store=sidestep.MemoryStore(max_scopes=2),
        )
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
            for target in (unrouted, url, url):
                try:
                    client.get(target, headers=headers)
                except sidestep.AllCandidatesSuspended as exc:
                    written += [str(exc), repr(exc), unavailable_body(exc).decode()]
                except httpx.HTTPError as exc:
                    written.append(repr(exc.__class__))  # the upstream's own error, not ours
            written += [repr(s) for s in transport.suspensions()]  # suspensions.listed too
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
    told = {event["event"] for event in logs}
    assert "suspensions.listed" in told
    if connect_error:  # the unrouted failure is kept, then forgotten (an answer never is)
        assert "suspension.forgotten" in told
    assert any("all_candidates_suspended" in text for text in written)  # the 503 body too
    for secret in (userinfo, path, query, header):
        for text in written:
            assert secret not in text


# --- the admin app and the operator's commands ---------------------------------------------

ADMIN_SECRETS = {
    "userinfo": "S3CR3Tuserinfo0123",
    "path": "S3CR3Tpath0123",
    "query": "S3CR3Tquery0123",
    "header": "S3CR3Theader0123",
    "redis_password": "s3cret-redis-pw",  # tests/redis_server.py's
    "fingerprint_key": "S3CR3Tfingerprint0123",
    "token": "S3CR3Ttoken0123456789",
}


def test_no_secret_reaches_admin_answers_or_cli_output(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    a: Upstream,
    b: Upstream,
    redis_url: str,
) -> None:
    """A credential suspension caused by real traffic, listed and cleared through the admin API (JSON, page, 401, 403, 404) and the CLI (table, JSON, clear, doctor, a dead Redis): no credential, fingerprint, URL userinfo, path, query, Redis password or token in any of it."""
    s = ADMIN_SECRETS
    a.behaviour = lambda seen: Respond(401, {"error": {"message": "invalid api key"}})
    monkeypatch.setenv("SECRETS_REDIS_URL", redis_url)
    monkeypatch.setenv("SECRETS_KEY", s["header"])
    monkeypatch.setenv("SECRETS_FINGERPRINT", s["fingerprint_key"])
    primary = a.url.replace("http://", f"http://user:{s['userinfo']}@")
    path = tmp_path / "sidestep.yaml"
    path.write_text(
        "routes:\n"
        "  - name: chat\n"
        "    targets:\n"
        f"      - {{name: primary, url: '{primary}/v1/{s['path']}'}}\n"
        f"      - {{name: backup, url: '{b.url}/v1', headers: {{x-api-key: '${{SECRETS_KEY}}'}}}}\n"
        "store:\n"
        "  redis: {url: '${SECRETS_REDIS_URL}', prefix: "
        f"{fresh_prefix()}, fingerprint_key: '${{SECRETS_FINGERPRINT}}'}}\n"
    )
    config = sidestep.load_config(path)
    written = [repr(config), repr(config.store)]
    transport = sidestep.FailoverTransport(config)
    with httpx.Client(transport=transport) as client:
        url = f"{a.url}/v1/{s['path']}/chat?key={s['query']}"
        client.post(url, json={}, headers={"authorization": f"Bearer {s['header']}"})
    snapshot = transport.store.snapshot(0.0)
    assert any(scope.scope.credential for scope in snapshot)  # a credential scope opened
    fingerprints = [scope.scope.credential for scope in snapshot if scope.scope.credential]
    (row,) = transport.suspensions()

    tokens = [sidestep.admin.Token("ops", s["token"])]
    app = sidestep.admin.app(transport, token=tokens)
    with serve_asgi(app, lifespan="off") as base, httpx.Client(base_url=base) as admin:
        auth = {"authorization": f"Bearer {s['token']}"}
        for response in [
            admin.get("/suspensions", headers=auth),
            admin.get("/", headers=auth),
            admin.get("/suspensions"),
            admin.get("/suspensions", headers={"authorization": "Bearer wrong"}),
            admin.delete("/suspensions/unknown", headers=auth),
        ]:
            written += [response.text, json.dumps(dict(response.headers))]
        assert "primary" in written[-10]  # the listing names the target
    for argv in (
        ["suspensions", "-c", str(path)],
        ["suspensions", "-c", str(path), "--json"],
        ["clear", "-c", str(path), row.scope_id],
        ["doctor", "-c", str(path), "--online"],
        ["doctor", "-c", str(path), "--json"],
    ):
        status = main(argv)
        out, err = capsys.readouterr()
        assert status == 0, (argv, err)
        written += [out, err]
    assert any("cleared" in text for text in written)
    monkeypatch.setenv("SECRETS_REDIS_URL", f"redis://:{s['redis_password']}@127.0.0.1:1/0")
    main(["suspensions", "-c", str(path)])
    written += list(capsys.readouterr())
    transport.store.close()  # type: ignore[attr-defined]
    for name, secret in [*s.items(), *(("fingerprint", f) for f in fingerprints)]:
        for text in written:
            assert secret not in text, name


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


def test_the_error_of_a_request_closed_during_its_retry_wait_names_no_secret() -> None:
    """A request whose client is closed while it waits to be retried ends with an error
    sidestep makes; neither it nor the events hold the request's credentials, path or query."""
    secret = "S3CR3Tclosing0123456789"
    config = {
        "breaker": {"failure_threshold": 5},
        "failover": {"max_attempts_per_target": 2},
        "routes": [{"name": "chat", "targets": [{"name": "p", "url": "https://p.example/v1"}]}],
    }

    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, headers={"retry-after-ms": "300"}, text=f"{request.url}")

    answered = threading.Event()

    def observe(event: str, fields: Mapping[str, Any], /) -> None:
        if event == "attempt.finished":
            answered.set()

    transport = sidestep.AsyncFailoverTransport(config, transport=httpx.MockTransport(upstream))
    raised: list[BaseException] = []

    async def go() -> None:
        client = httpx.AsyncClient(transport=transport)

        async def close_when_answered() -> None:
            with anyio.fail_after(5):
                while not answered.is_set():  # noqa: ASYNC110  # set in the request's task
                    await anyio.sleep(0.005)
            await client.aclose()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(close_when_answered)
            try:
                await client.get(
                    f"https://u:{secret}@p.example/v1/{secret}?key={secret}",
                    headers={"authorization": f"Bearer {secret}"},
                )
            except httpx.ReadError as exc:
                raised.append(exc)

    add_observer(observe)
    try:
        with structlog.testing.capture_logs() as logs:
            anyio.run(go)
    finally:
        remove_observer(observe)
    (error,) = raised  # the close came during the wait: sidestep's own error
    assert "closed" in str(error)
    assert secret not in str(error) and secret not in repr(error)
    assert secret not in json.dumps(logs, default=str)


def test_a_redis_cluster_store_names_no_password_or_credential(cluster_url: str) -> None:
    """On a real Redis Cluster no key name or value holds a credential, path or query, and an unreachable cluster's warning, the store's repr and a refused URL never quote the password."""
    secret = "S3CR3Tcluster0123456789"
    config = {
        "breaker": {"failure_threshold": 2},
        "routes": [{"name": "chat", "targets": [{"name": "p", "url": "https://p.example/v1"}]}],
    }

    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"error": {"message": f"bad {request.url}"}})

    prefix = fresh_prefix()
    store = sidestep.RedisStore(cluster_url, prefix=prefix)
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
    client_url = cluster_url.replace("redis+cluster://", "redis://")
    written = []
    clients = sidestep.RedisStore(client_url, cluster=True)._clients
    with clients.sync_script().registered_client as raw:
        for key in raw.scan_iter(match=f"{prefix}:*"):
            written.append(key)
            if raw.type(key) == "hash":
                written.append(json.dumps(raw.hgetall(key)))
    assert written and not [text for text in written if secret in text]
    store.close()
    password = ADMIN_SECRETS["redis_password"]
    away = sidestep.RedisStore(f"redis+cluster://:{password}@127.0.0.1:1/0", timeout=0.1)
    with structlog.testing.capture_logs() as logs:
        away.admit(store_facts(away), sidestep_policy(), 0.0)
    assert [e["event"] for e in logs] == ["store.unavailable"]
    texts = [json.dumps(logs, default=str), repr(away)]
    with pytest.raises(ValueError, match="Redis Cluster needs") as refused:
        sidestep.RedisStore(f"unix://:{password}@/tmp/r.sock", cluster=True)
    texts.append(str(refused.value))
    assert not [text for text in texts if password in text]
    away.close()


def store_facts(store: sidestep.RedisStore) -> ScopeFacts:
    return ScopeFacts("https://p.example:443", {}, b"", store.fingerprint)


def sidestep_policy() -> BreakerPolicy:
    return BreakerPolicy()
