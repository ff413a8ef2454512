"""`sidestep suspensions` and `sidestep clear` against a real Redis and, for a memory store,
through a running admin app; suspensions caused by real failing upstreams."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest

import sidestep
import sidestep.admin
from redis_server import PASSWORD, fresh_prefix
from servers import serve_asgi, serve_wsgi
from sidestep._ops.cli import main
from sidestep._settings.values import SidestepConfigWarning
from sidestep.logging import add_observer, remove_observer
from test_admin import suspend_origins
from upstream import Respond, Upstream, free_port

ROOT = Path(__file__).resolve().parents[2]
CREDENTIAL = "sk-cli-credential-0123456789"


def write_config(path: Path, a: Upstream, b: Upstream, store: str) -> Path:
    path.write_text(
        textwrap.dedent(f"""\
            breaker: {{failure_threshold: 1, cooldown: 5m, max_cooldown: 10m}}
            routes:
              - name: chat
                targets:
                  - name: primary
                    url: "{a.url}/v1"
                    headers: {{authorization: "Bearer ${{CLI_TEST_KEY}}"}}
                  - {{name: backup, url: "{b.url}/v1"}}
            {store}
            """)
    )
    return path


class Redis:
    """A configuration on a real Redis, and the application's transport on the same store."""

    def __init__(self, tmp_path: Path, a: Upstream, b: Upstream, url: str) -> None:
        self.prefix = fresh_prefix()
        store = (
            f'store: {{redis: {{url: "${{CLI_REDIS_URL}}", prefix: {self.prefix},'
            ' fingerprint_key: "${CLI_FINGERPRINT_KEY}"}}'
        )
        self.path = write_config(tmp_path / "sidestep.yaml", a, b, store)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SidestepConfigWarning)
            self.config = sidestep.load_config(self.path)
        self.transport = sidestep.FailoverTransport(self.config)  # the configured store
        self.client = httpx.Client(transport=self.transport)
        self.a = a

    def fail_primary(self) -> str:
        self.a.behaviour = lambda seen: Respond(503, b"down")
        assert self.client.post(f"{self.a.url}/v1/chat?key=q", json={}).text == "b"
        (row,) = self.transport.suspensions()
        return row.scope_id


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> str:
    monkeypatch.setenv("CLI_TEST_KEY", CREDENTIAL)
    monkeypatch.setenv("CLI_REDIS_URL", redis_url)
    monkeypatch.setenv("CLI_FINGERPRINT_KEY", "cli-fingerprint-key")
    return redis_url


@pytest.fixture
def redis_setup(tmp_path: Path, a: Upstream, b: Upstream, env: str) -> Any:
    built = Redis(tmp_path, a, b, env)
    yield built
    built.client.close()
    built.transport.store.close()  # type: ignore[attr-defined]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_the_transport_uses_the_configured_redis_store(redis_setup: Redis) -> None:
    """A transport built from a configuration naming Redis keeps its circuits there: a second transport from the same file sees the first one's suspension."""
    scope_id = redis_setup.fail_primary()
    other = sidestep.FailoverTransport(redis_setup.config)
    try:
        assert [row.scope_id for row in other.suspensions()] == [scope_id]
        assert type(other.store).__name__ == "RedisStore"
    finally:
        other.store.close()  # type: ignore[attr-defined]


def test_suspensions_lists_the_shared_store_as_a_table_and_as_json(
    redis_setup: Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table names the scope, route, target, state and reason; --json gives the admin API's rows; --route and --target filter."""
    scope_id = redis_setup.fail_primary()
    status, out, err = run(capsys, "suspensions", "-c", str(redis_setup.path))
    assert status == 0, err
    header, line = out.splitlines()
    assert header.split() == [
        "scope_id", "route", "target", "scope", "state", "reason", "failures", "retry_in",
    ]  # fmt: skip
    assert line.split()[:7] == [scope_id, "chat", "primary", "origin", "open", "unavailable", "1"]
    status, out, _ = run(capsys, "suspensions", "-c", str(redis_setup.path), "--json")
    data = json.loads(out)
    assert data["routes"] == {"chat": ["primary", "backup"]}
    (row,) = data["suspensions"]
    assert row["scope_id"] == scope_id and row["target"] == "primary"
    for flag, value, count in [
        ("--route", "chat", 1),
        ("--route", "other", 0),
        ("--target", "backup", 0),
        ("--reason", "unavailable", 1),
    ]:
        _, out, _ = run(capsys, "suspensions", "-c", str(redis_setup.path), "--json", flag, value)
        assert len(json.loads(out)["suspensions"]) == count, (flag, value)
    _, out, _ = run(capsys, "suspensions", "-c", str(redis_setup.path), "--target", "backup")
    assert out == "no suspensions\n"


def test_clear_closes_the_scope_for_every_process_and_audits_it(
    redis_setup: Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sidestep clear` clears the shared scope: the next request reaches the primary; the audit event names the command line's user; clearing it again exits 1."""
    scope_id = redis_setup.fail_primary()
    seen: list[tuple[str, Any]] = []

    def observer(event: str, fields: Any) -> None:
        seen.append((event, dict(fields)))

    add_observer(observer)
    try:
        status, out, err = run(capsys, "clear", "-c", str(redis_setup.path), scope_id)
    finally:
        remove_observer(observer)
    assert status == 0, err
    assert out.startswith(f"cleared {scope_id}: route chat, target primary")
    ((_, audit),) = [e for e in seen if e[0] == "suspension.cleared"]
    assert audit["who"].startswith("cli:") and audit["target"] == "primary"
    assert redis_setup.transport.suspensions() == []
    redis_setup.a.behaviour = lambda seen: Respond(200, b"a")
    assert redis_setup.client.post(f"{redis_setup.a.url}/v1/chat", json={}).text == "a"
    status, _, err = run(capsys, "clear", "-c", str(redis_setup.path), scope_id)
    assert status == 1 and "no suspension has that scope_id" in err


def test_an_unreachable_redis_is_an_error_not_an_empty_list(
    tmp_path: Path,
    a: Upstream,
    b: Upstream,
    env: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With nothing listening at the configured Redis, suspensions exits 1 saying so, showing the server but never its password."""
    monkeypatch.setenv("CLI_REDIS_URL", f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0")
    store = 'store: {redis: {url: "${CLI_REDIS_URL}", timeout: 200ms}}'
    path = write_config(tmp_path / "down.yaml", a, b, store)
    status, out, err = run(capsys, "suspensions", "-c", str(path))
    assert status == 1
    assert "did not answer" in err and "127.0.0.1" in err
    assert PASSWORD not in out + err


def test_a_memory_store_lives_in_the_process_so_the_cli_asks_its_admin_app(
    tmp_path: Path,
    a: Upstream,
    b: Upstream,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a memory store the CLI says the state is in the running process; with --admin-url and --token-env it lists and clears there, the same rows and rules."""
    monkeypatch.setenv("CLI_TEST_KEY", CREDENTIAL)
    path = write_config(tmp_path / "memory.yaml", a, b, "store: {memory: {max_scopes: 100}}")
    status, _, err = run(capsys, "suspensions", "-c", str(path))
    assert status == 2 and "inside the running process" in err and "--admin-url" in err

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)
        transport = sidestep.FailoverTransport(sidestep.load_config(path))
    a.behaviour = lambda seen: Respond(503, b"down")
    with httpx.Client(transport=transport) as client:
        client.post(f"{a.url}/v1/chat", json={})
    (mine,) = transport.suspensions()
    monkeypatch.setenv("ADMIN_TOKEN", "cli-admin-token-0123456789")
    app = sidestep.admin.app(transport, token="cli-admin-token-0123456789")
    with serve_asgi(app, lifespan="off") as url:
        remote = ["--admin-url", url, "--token-env", "ADMIN_TOKEN"]
        status, out, err = run(capsys, "suspensions", "-c", str(path), *remote, "--json")
        assert status == 0, err
        assert [r["scope_id"] for r in json.loads(out)["suspensions"]] == [mine.scope_id]
        status, out, err = run(capsys, "clear", *remote, mine.scope_id)
        assert status == 0, err
        assert transport.suspensions() == []
        status, _, err = run(capsys, "clear", *remote, mine.scope_id)
        assert status == 1
        monkeypatch.setenv("ADMIN_TOKEN", "a-wrong-token")
        status, _, err = run(capsys, "suspensions", *remote)
        assert status == 1 and "answered 401" in err
    status, _, err = run(capsys, "suspensions", "--admin-url", url)
    assert status == 2 and "--token-env" in err


def test_the_cli_reads_every_page_of_an_admin_apps_listing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With more unhealthy scopes than one answer of the admin app holds (10,001), `sidestep suspensions --admin-url` follows each answer's next page and prints every row once, as the table and as --json."""
    transport = sidestep.FailoverTransport(store=sidestep.MemoryStore(max_scopes=10_050))
    origins = suspend_origins(transport.store, 10_001)
    monkeypatch.setenv("ADMIN_TOKEN", "cli-admin-token-0123456789")
    app = sidestep.admin.app(transport, token="cli-admin-token-0123456789")
    with serve_asgi(app, lifespan="off") as url:
        remote = ["--admin-url", url, "--token-env", "ADMIN_TOKEN"]
        first = httpx.get(
            f"{url}/suspensions", headers={"authorization": "Bearer cli-admin-token-0123456789"}
        ).json()
        assert len(first["suspensions"]) == 10_000 and first["next"] is not None
        status, out, err = run(capsys, "suspensions", *remote, "--json")
        assert status == 0, err
        listed = json.loads(out)
        assert set(listed) == {"routes", "suspensions"}
        assert sorted(row["target"] for row in listed["suspensions"]) == origins
        status, out, err = run(capsys, "suspensions", *remote)
        assert status == 0, err
        assert len(out.splitlines()) == 1 + 10_001


def test_the_installed_command_runs_the_operations(redis_setup: Redis) -> None:
    """`python -m sidestep suspensions` in a fresh interpreter reads the same shared state."""
    scope_id = redis_setup.fail_primary()
    done = subprocess.run(  # noqa: S603  # our own interpreter and module
        [sys.executable, "-m", "sidestep", "suspensions", "-c", str(redis_setup.path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert done.returncode == 0, done.stderr
    assert [row["scope_id"] for row in json.loads(done.stdout)["suspensions"]] == [scope_id]


def test_the_cli_says_what_is_wrong_with_an_admin_url_or_token_without_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unparsable --admin-url, a token no header can carry, a URL that answers but not as the admin app (HTML, other JSON, another app's 404) each exit nonzero with one line naming the problem, never a traceback or the token; a SCOPE_ID is sent as one path segment."""
    seen: list[str] = []
    answers = {
        "/html/suspensions": ("text/html", b"<html>a login page</html>"),
        "/json/suspensions": ("application/json", b'{"items": []}'),
        "/json/suspensions/x": ("application/json", b'{"ok": true}'),
    }

    def impostor(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        seen.append(environ["REQUEST_URI"])
        kind, body = answers.get(
            environ["PATH_INFO"], ("application/json", b'{"error": "not_found"}')
        )
        if environ["PATH_INFO"].startswith("/html/suspensions/"):  # another app's 404
            kind, body = "text/html", b"<html>no such page</html>"
        status = "200 OK" if environ["PATH_INFO"] in answers else "404 Not Found"
        start_response(status, [("content-type", kind)])
        return [body]

    monkeypatch.setenv("ADMIN_TOKEN", "cli-admin-token-0123456789")
    with serve_wsgi(impostor) as url:
        for argv in [
            ["suspensions", "--admin-url", f"{url}/html"],
            ["suspensions", "--admin-url", f"{url}/json"],
            ["clear", "--admin-url", f"{url}/json", "x"],
        ]:
            status, out, err = run(capsys, *argv, "--token-env", "ADMIN_TOKEN")
            assert status == 1 and "not as sidestep's admin app" in err, argv
            assert out == ""
        status, _, err = run(
            capsys, "clear", "--admin-url", url, "--token-env", "ADMIN_TOKEN", "../x?y"
        )
        assert status == 1 and "no suspension has that scope_id" in err
        assert seen[-1] == "/suspensions/..%2Fx%3Fy"  # one segment below /suspensions/
        status, _, err = run(
            capsys, "clear", "--admin-url", f"{url}/html", "--token-env", "ADMIN_TOKEN", "x"
        )
        assert status == 1 and "answered 404" in err  # a wrong URL, not an unknown id

    status, _, err = run(
        capsys, "suspensions", "--admin-url", "http://[::1", "--token-env", "ADMIN_TOKEN"
    )
    assert status == 1 and "cannot reach the admin app (InvalidURL)" in err
    monkeypatch.setenv("ADMIN_TOKEN", "tökén-0123456789")
    status, _, err = run(
        capsys, "suspensions", "--admin-url", "http://127.0.0.1:1", "--token-env", "ADMIN_TOKEN"
    )
    assert status == 2 and "holds no usable token" in err and "tökén" not in err


def test_a_clear_from_a_shell_leaves_its_audit_record_on_stderr(redis_setup: Redis) -> None:
    """`sidestep clear` run as a command writes the `suspension.cleared` audit line (scope, route, target, the user) on stderr, while stdout keeps only its answer."""
    scope_id = redis_setup.fail_primary()
    done = subprocess.run(  # noqa: S603  # our own interpreter and module
        [sys.executable, "-m", "sidestep", "clear", "-c", str(redis_setup.path), scope_id],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"cleared {scope_id}: route chat, target primary")
    (audit,) = [line for line in done.stderr.splitlines() if "suspension.cleared" in line]
    assert f"scope_id={scope_id}" in audit and "route=chat" in audit
    assert "target=primary" in audit and "who=cli:" in audit
    assert CREDENTIAL not in done.stderr and "key=q" not in done.stderr


def test_the_audit_line_quotes_a_value_that_could_forge_a_pair(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A value with spaces, an equals sign, quotes or a line break (a forwarded-for peer, say) is quoted and escaped in the key=value line, so it reads as one value and never as route=/target= pairs or a second line."""
    import logging

    from sidestep.logging import emit

    forged = 'ops@10.0.0.1 route=other target=primary\nsidestep: WARNING fake "x"'
    with caplog.at_level(logging.WARNING, logger="sidestep"):
        emit("suspension.cleared", logging.WARNING, route="chat", target="backup", who=forged)
    (record,) = caplog.records
    message = record.getMessage()
    assert "\n" not in message
    assert message == ("suspension.cleared route=chat target=backup who=" + json.dumps(forged))


def test_the_admin_url_never_goes_through_a_proxy_and_plain_http_elsewhere_warns(
    tmp_path: Path,
    a: Upstream,
    b: Upstream,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With HTTP_PROXY, HTTPS_PROXY and ALL_PROXY set, --admin-url talks to the admin app directly (the proxy sees nothing, so never the token); a plain http:// URL to a host that is not loopback (a name under .localhost included: it may be looked up in DNS) warns on stderr, a loopback one does not."""
    from proxy import running_proxy

    monkeypatch.setenv("CLI_TEST_KEY", CREDENTIAL)
    monkeypatch.setenv("ADMIN_TOKEN", "cli-admin-token-0123456789")
    for variable in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(variable, raising=False)
    path = write_config(tmp_path / "memory.yaml", a, b, "store: {memory: {max_scopes: 100}}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)
        transport = sidestep.FailoverTransport(sidestep.load_config(path))
    app = sidestep.admin.app(transport, token="cli-admin-token-0123456789")
    with running_proxy() as proxy, serve_asgi(app, lifespan="off") as url:
        for variable in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
            monkeypatch.setenv(variable, proxy.url)
        status, out, err = run(
            capsys, "suspensions", "--admin-url", url, "--token-env", "ADMIN_TOKEN", "--json"
        )
        assert status == 0, err
        assert json.loads(out)["suspensions"] == []
        assert proxy.seen == []
        assert "unencrypted" not in err
    for elsewhere in ("http://admin.example:99999", "http://admin.localhost:99999"):
        # (a name under .localhost is not known to stay on this machine: it may go to DNS)
        status, _, err = run(
            capsys, "suspensions", "--admin-url", elsewhere, "--token-env", "ADMIN_TOKEN"
        )
        assert status == 1
        assert "unencrypted over http://" in err and "cli-admin-token" not in err
