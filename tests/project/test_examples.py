"""The example services, started with their documented commands, against fake upstreams on 127.0.0.1.

One process per example serves every test of this module. Each test asks for
a model of its own, and a 503's circuit belongs to an origin and a model, so
no test sees another's circuits.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import sidestep
from llm_upstream import llm, unavailable
from scrape import sample, samples
from suspensions import assert_unavailable
from upstream import Action, Seen, Upstream, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
# The commands of the examples' READMEs, run from the repository root; the port is added.
COMMANDS = {
    "fastapi": ["uvicorn", "examples.fastapi_app.app:app"],
    "flask": ["flask", "--app", "examples.flask_app.app", "run"],
}
PRIMARY_KEY = "sk-primary-0123456789abcdef"
BACKUP_KEY = "sk-backup-0123456789abcdef"
DOWN_EVERYWHERE = "model-down-everywhere"  # the backup answers every other model
COOLDOWN = 20  # seconds
# The examples' route, with circuits that open at the first failure.
TEST_CONFIG = f"""
breaker: {{failure_threshold: 1, cooldown: {COOLDOWN}s}}
observability: {{prometheus: true}}
routes:
  - name: chat
    targets:
      - {{name: primary, url: "${{PRIMARY_URL}}"}}
      - name: backup
        url: ${{BACKUP_URL}}
        headers: {{authorization: "Bearer ${{BACKUP_API_KEY}}"}}
"""


@dataclass(frozen=True, slots=True)
class Running:
    """An example serving on 127.0.0.1, its two upstreams, and where its output goes."""

    client: httpx.Client
    primary: Upstream
    backup: Upstream
    logs: Path

    def chat(self, model: str) -> httpx.Response:
        return self.client.post(
            "/chat", json={"model": model, "messages": [{"role": "user", "content": "hi"}]}
        )

    def output(self) -> str:
        return (self.logs / "stdout").read_text() + (self.logs / "stderr").read_text()

    def events(self, name: str) -> list[dict[str, object]]:
        """The structured log events called `name` that the example printed so far."""
        lines = (self.logs / "stdout").read_text().splitlines()
        found = [json.loads(line) for line in lines if line.startswith("{")]
        return [event for event in found if event["event"] == name]


def calls(upstream: Upstream, model: str) -> list[Seen]:
    return [seen for seen in upstream.seen if seen.json()["model"] == model]


def backup_behaviour(seen: Seen) -> Action:
    """The backup: down for `DOWN_EVERYWHERE`, answering "hello from backup" otherwise."""
    if seen.json()["model"] == DOWN_EVERYWHERE:
        return unavailable(seen)
    return llm("backup")(seen)


@pytest.fixture(scope="module", params=sorted(COMMANDS))
def running(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    """One example, started with its documented command and the test configuration."""
    with example(request.param, tmp_path_factory.mktemp(request.param)) as started:
        yield started


@contextlib.contextmanager
def example(name: str, logs: Path) -> Iterator[Running]:
    """The example `name` serving, against its two fake upstreams, until the block ends."""
    config = logs / "sidestep.yaml"
    config.write_text(TEST_CONFIG)
    primary = Upstream(unavailable, name="primary")
    backup = Upstream(backup_behaviour, name="backup")
    try:
        env = {
            "PRIMARY_URL": primary.url + "/v1",
            "PRIMARY_API_KEY": PRIMARY_KEY,
            "BACKUP_URL": backup.url + "/v1",
            "BACKUP_API_KEY": BACKUP_KEY,
            "SIDESTEP_CONFIG": str(config),
        }
        with serve(COMMANDS[name], env, logs) as client:
            yield Running(client, primary, backup, logs)
    finally:
        primary.close()
        backup.close()


@contextlib.contextmanager
def serve(command: list[str], env: dict[str, str], logs: Path) -> Iterator[httpx.Client]:
    """Run `command` as a user would, until its /healthz answers; a client for it."""
    port = free_port()
    # The console script of this interpreter's environment, as `pip install` put it there.
    argv = [str(Path(sysconfig.get_path("scripts")) / command[0]), *command[1:]]
    argv += ["--port", str(port)]
    # Proxy settings would send the example's upstream calls elsewhere.
    environ = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), environ.get("PYTHONPATH", "")])
    environ |= env
    with (
        (logs / "stdout").open("wb") as stdout,
        (logs / "stderr").open("wb") as stderr,
        # The command is this module's own, run without a shell.
        subprocess.Popen(argv, cwd=ROOT, env=environ, stdout=stdout, stderr=stderr) as process,  # noqa: S603
        httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=5) as client,
    ):
        try:
            wait_for(lambda: started(process, client))  # a busy machine may start it slowly
            yield client
        finally:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()


def started(process: subprocess.Popen[bytes], client: httpx.Client) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"the example exited at start-up with status {process.returncode}")
    try:
        return bool(client.get("/healthz").json() == {"status": "ok"})
    except httpx.TransportError:
        return False


def test_a_503_from_the_primary_is_answered_by_the_backup(running: Running) -> None:
    """A chat request the primary answers 503 gets the backup's completion, sent with the backup's own key, and no key reaches the logs."""
    model = "model-up"
    response = running.chat(model)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "hello from backup"
    [primary], [backup] = calls(running.primary, model), calls(running.backup, model)
    assert primary.headers["authorization"] == f"Bearer {PRIMARY_KEY}"
    assert backup.headers["authorization"] == f"Bearer {BACKUP_KEY}"
    assert {"target": "primary", "status": 503} in [
        {"target": e["target"], "status": e["status"]} for e in running.events("upstream.failed")
    ]
    output = running.output()
    assert PRIMARY_KEY not in output and BACKUP_KEY not in output


def test_every_upstream_suspended_is_a_503_with_retry_after(running: Running) -> None:
    """Once both circuits are open, the SDK's connection error around the suspension becomes the 503 of DESIGN §3.4, and no upstream is called."""
    first = running.chat(DOWN_EVERYWHERE)  # both answer 503, and both circuits open
    assert first.status_code == 502
    assert first.json() == {"error": {"type": "upstream_error", "status": 503}}
    response = running.chat(DOWN_EVERYWHERE)
    retry_after = int(response.headers.get("retry-after", "0"))
    assert 1 <= retry_after <= COOLDOWN
    assert_unavailable(response, retry_after)
    assert len(calls(running.primary, DOWN_EVERYWHERE)) == 1
    assert len(calls(running.backup, DOWN_EVERYWHERE)) == 1
    listed = {(s["target"], s["state"]) for s in running.client.get("/suspensions").json()}
    assert {("primary", "open"), ("backup", "open")} <= listed


@pytest.mark.parametrize("folder", ["fastapi_app", "flask_app"])
def test_the_shipped_configurations_load(folder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each example's own sidestep.yaml loads, taking both targets' URLs and the backup's key from the environment."""
    monkeypatch.setenv("PRIMARY_URL", "https://primary.example/v1")
    monkeypatch.setenv("BACKUP_URL", "https://backup.example/v1")
    monkeypatch.setenv("BACKUP_API_KEY", BACKUP_KEY)
    config = sidestep.load_config(ROOT / "examples" / folder / "sidestep.yaml")
    [route] = config.routes
    primary, backup = route.targets
    assert (primary.name, primary.url) == ("primary", "https://primary.example/v1")
    assert (backup.name, backup.url) == ("backup", "https://backup.example/v1")
    assert backup.headers == {"authorization": f"Bearer {BACKUP_KEY}"}


def test_the_metrics_page_follows_an_outage(tmp_path: Path) -> None:
    """The FastAPI example's /metrics (prometheus_client's own ASGI app) shows nothing before traffic, then the primary's failure, the failover, its suspension and the skip that follows, with no key, path or model in any label."""
    with example("fastapi", tmp_path) as running:
        before = samples(running.client.get("/metrics/").text)
        assert sample(before, "sidestep_requests_total", route="chat", outcome="served") == 0
        model = "model-metrics"
        assert running.chat(model).status_code == 200  # the primary fails; the backup answers
        assert running.chat(model).status_code == 200  # the primary is skipped
        page = running.client.get("/metrics/").text
    found = samples(page)
    chat = {"route": "chat"}
    assert sample(found, "sidestep_requests_total", **chat, outcome="served_after_failover") == 2
    failed = {**chat, "target": "primary", "result": "unavailable"}
    assert sample(found, "sidestep_attempts_total", **failed) == 1
    assert sample(found, "sidestep_attempts_total", **chat, target="backup", result="success") == 2
    moved = {**chat, "from_target": "primary", "to_target": "backup"}
    assert sample(found, "sidestep_failovers_total", **moved) == 1
    scope = {"target": "primary", "scope": "origin+model", "reason": "unavailable"}
    assert sample(found, "sidestep_suspended", **scope) == 1
    skipped = {**chat, "target": "primary", "reason": "unavailable"}
    assert sample(found, "sidestep_candidates_skipped_total", **skipped) == 1
    for secret in (PRIMARY_KEY, BACKUP_KEY, model, "/v1", "completions"):
        assert secret not in page
