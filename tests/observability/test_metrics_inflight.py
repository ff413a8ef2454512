"""The `sidestep_inflight` gauge: attempts in flight on pooled routes' members, from the
`attempt.*` events, in a real prometheus_client registry and OpenTelemetry's SDK."""

from __future__ import annotations

import shutil
import subprocess
import threading
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import sidestep
from drivers import Driver, MakeDriver
from otel_capture import captured
from scrape import samples
from sidestep.logging import add_observer, remove_observer
from sidestep.metrics import prometheus
from upstream import CLIENT_TIMEOUT, Hang, Respond, Upstream, wait_for


def pooled(a: Upstream, b: Upstream, **route: Any) -> dict[str, Any]:
    """Route `chat`: one pool of A and B."""
    return {
        "routes": [
            {
                "name": "chat",
                "balance": route.pop("balance", "least_in_flight"),
                "targets": [
                    {"name": "a", "url": a.url + "/v1"},
                    {"name": "b", "url": b.url + "/v1"},
                ],
                **route,
            }
        ]
    }


def inflight(registry: CollectorRegistry) -> dict[str, float]:
    """The gauge's value per target of route `chat`, read from the metrics page."""
    found = samples(generate_latest(registry).decode())
    return {
        dict(labels)["target"]: amount
        for (name, labels), amount in found.items()
        if name == "sidestep_inflight" and dict(labels)["route"] == "chat"
    }


def members_in_flight(d: Driver) -> dict[str, int]:
    pool = d.transport._core.router.routes["chat"].pool
    assert pool is not None
    return {m.name: m.in_flight for m in pool.members}


def hold(d: Driver, url: str, n: int) -> threading.Thread:
    """`n` requests sent at once from a thread of their own (joined by the caller)."""
    thread = threading.Thread(target=lambda: d.many(n, "GET", url, timeout=CLIENT_TIMEOUT))
    thread.start()
    return thread


def test_the_gauge_counts_the_attempts_held_at_each_member(
    make: MakeDriver, a: Upstream, b: Upstream, registry: CollectorRegistry
) -> None:
    """While answers are held back, the gauge says per member what the pool counts in flight
    (what each upstream holds); once they are answered, every series is back to zero."""
    gate = threading.Event()
    a.behaviour = lambda _: Respond(body="a", gate=gate)
    b.behaviour = lambda _: Respond(body="b", gate=gate)
    d = make(pooled(a, b))
    held = hold(d, a.url + "/v1/chat", 6)
    try:
        wait_for(lambda: a.calls + b.calls == 6)
        wait_for(lambda: sum(inflight(registry).values()) == 6)
        assert inflight(registry) == {"a": a.calls, "b": b.calls}
        assert members_in_flight(d) == {"a": a.calls, "b": b.calls}
    finally:
        gate.set()
        held.join(CLIENT_TIMEOUT)
    assert inflight(registry) == {"a": 0, "b": 0}


def test_failed_and_failed_over_attempts_leave_the_gauge(
    make: MakeDriver, a: Upstream, b: Upstream, registry: CollectorRegistry
) -> None:
    """Attempts that fail, are retried elsewhere or find their upstream gone all give their
    count back; a ranked route's targets have no series at all."""
    a.behaviour = lambda _: Respond(500)
    d = make(pooled(a, b, balance="weighted"))
    for _ in range(200):  # each draws A first half the time: until both were tried
        d.get(a.url + "/v1/chat")
        if a.calls and b.calls:
            break
    assert a.calls > 0 and b.calls > 0
    assert inflight(registry) == {"a": 0, "b": 0}
    gone = Upstream(name="gone")
    gone.close()
    lost = make(pooled(gone, b))
    for _ in range(4):
        lost.get(b.url + "/v1/chat")
    assert inflight(registry) == {"a": 0, "b": 0}
    ranked = make(
        {
            "routes": [
                {
                    "name": "ranked",
                    "targets": [{"name": "first", "url": a.url + "/ranked"}],
                }
            ]
        }
    )
    assert ranked.get(a.url + "/ranked/x").status == 500
    found = samples(generate_latest(registry).decode())
    routes = {dict(labels)["route"] for (name, labels) in found if name == "sidestep_inflight"}
    assert routes == {"chat"}


def test_an_exporter_enabled_mid_attempt_never_counts_below_zero(a: Upstream, b: Upstream) -> None:
    """An attempt already in flight when the metrics are enabled (its start seen by
    another observer only) takes nothing off at its end; the next one counts as usual."""
    gate = threading.Event()
    a.behaviour = b.behaviour = lambda _: Respond(body="held", gate=gate)

    def nobody(event: str, fields: Any, /) -> None:
        return None

    add_observer(nobody)  # someone listens: the attempts' events are emitted
    registry = CollectorRegistry()
    transport = sidestep.FailoverTransport(pooled(a, b))
    try:
        with httpx.Client(transport=transport, timeout=CLIENT_TIMEOUT) as client:
            first = threading.Thread(target=client.get, args=(a.url + "/v1/chat",))
            first.start()
            wait_for(lambda: a.calls + b.calls == 1)
            prometheus.enable(registry)
            gate.set()
            first.join(CLIENT_TIMEOUT)
            assert set(inflight(registry).values()) <= {0.0}
            gate.clear()
            second = threading.Thread(target=client.get, args=(a.url + "/v1/chat",))
            second.start()
            wait_for(lambda: a.calls + b.calls == 2)
            wait_for(lambda: sum(inflight(registry).values()) == 1)
            gate.set()
            second.join(CLIENT_TIMEOUT)
            assert set(inflight(registry).values()) == {0.0}
    finally:
        gate.set()
        prometheus.disable()
        remove_observer(nobody)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.anyio
async def test_a_cancelled_attempt_leaves_the_gauge(
    a: Upstream, b: Upstream, registry: CollectorRegistry
) -> None:
    """A request cancelled while its attempt waits for an answer counts in flight until
    then, and not after."""
    a.behaviour = b.behaviour = lambda _: Hang()
    transport = sidestep.AsyncFailoverTransport(pooled(a, b))
    async with (
        httpx.AsyncClient(transport=transport, timeout=CLIENT_TIMEOUT) as client,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(client.get, a.url + "/v1/chat")
        await anyio.to_thread.run_sync(wait_for, lambda: a.calls + b.calls == 1)
        assert sum(inflight(registry).values()) == 1
        tg.cancel_scope.cancel()
    assert set(inflight(registry).values()) == {0.0}


def test_promtool_accepts_the_metrics_page(
    a: Upstream, b: Upstream, registry: CollectorRegistry
) -> None:
    """`promtool check metrics` finds nothing wrong with the page, the gauge on it."""
    gate = threading.Event()
    a.behaviour = b.behaviour = lambda _: Respond(body="held", gate=gate)
    with httpx.Client(
        transport=sidestep.FailoverTransport(pooled(a, b)), timeout=CLIENT_TIMEOUT
    ) as client:
        held = threading.Thread(target=client.get, args=(a.url + "/v1/chat",))
        held.start()
        try:
            wait_for(lambda: sum(inflight(registry).values()) == 1)
            page = generate_latest(registry)
        finally:
            gate.set()
            held.join(CLIENT_TIMEOUT)
    assert b'sidestep_inflight{route="chat",target=' in page
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: install Debian's prometheus package", pytrace=False)
    checked = subprocess.run(  # noqa: S603 - promtool, found on PATH, with no shell
        [promtool, "check", "metrics"], input=page, capture_output=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_otel_counts_the_same_attempts_in_flight(a: Upstream, b: Upstream) -> None:
    """The OpenTelemetry up-down counter `sidestep.inflight` follows the attempts held at
    each member, with the same attributes, and returns to zero."""
    gate = threading.Event()
    a.behaviour = lambda _: Respond(body="a", gate=gate)
    b.behaviour = lambda _: Respond(body="b", gate=gate)
    with captured() as otel:
        transport = sidestep.FailoverTransport(pooled(a, b))
        with httpx.Client(transport=transport, timeout=CLIENT_TIMEOUT) as client:
            threads = [
                threading.Thread(target=client.get, args=(a.url + "/v1/chat",)) for _ in range(4)
            ]
            for thread in threads:
                thread.start()
            try:
                wait_for(lambda: a.calls + b.calls == 4)
                counted = {t: otel.value("sidestep.inflight", route="chat", target=t) for t in "ab"}
                assert counted == {"a": a.calls, "b": b.calls}
            finally:
                gate.set()
                for thread in threads:
                    thread.join(CLIENT_TIMEOUT)
        assert otel.value("sidestep.inflight", route="chat", target="a") == 0
        assert otel.value("sidestep.inflight", route="chat", target="b") == 0
