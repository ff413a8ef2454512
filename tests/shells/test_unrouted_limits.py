"""A caller's own limits never open a circuit on traffic no route names.

Real upstreams on 127.0.0.1, the four transports, the memory and Redis stores.
A timeout on one endpoint counts for that endpoint; it counts for the origin
only as the endpoint's first failure, whichever client, transport or process
saw the failures before, and however many of them run at once. A full
connection pool or a caller's write budget running out counts for nothing.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

import sidestep
from drivers import KINDS, Driver, FakeClock, outcome
from upstream import Hang, Respond, Upstream, wait_for

STORES = ("memory", "redis")
THRESHOLD = 3
# seconds a store call may take: on a busy machine a store must not fail open under
# a test that reads back what it wrote
LOADED = 10.0
CONFIG = {"breaker": {"failure_threshold": THRESHOLD}}
TIMEOUT = (5.0, 0.2, 5.0, 5.0)  # a short read budget; connects are not what is timed


def slow_and_fast(seen: Any) -> Any:
    return Hang() if seen.path == "/slow" else Respond(body="fast")


def timed_out(seen: list[str], a: Upstream) -> None:
    """Every request sent timed out, and the only others were turned away by the endpoint.

    Eight requests at once all time out; but on a busy machine one may start only after
    three others timed out (0.2 s each), and find the endpoint open, as it should.
    """
    sent = [s.path for s in a.seen].count("/slow")
    assert sent >= THRESHOLD
    assert sorted(seen) == ["AllCandidatesSuspended"] * (8 - sent) + ["ReadTimeout"] * sent


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A memory store, or a Redis store on an emptied real Redis."""
    if request.param == "memory":
        yield sidestep.MemoryStore()
        return
    url = request.getfixturevalue("redis_url")
    redis.Redis.from_url(url).flushall()
    s = sidestep.RedisStore(url, fingerprint_key="k", timeout=LOADED)
    yield s
    s.close()


def fresh(kind: str, store: Any, clock: FakeClock) -> Driver:
    """A new client with a transport of its own over `store`, as each `httpx.Client()`
    under install() gets."""
    return Driver(kind, CONFIG, store=store, clock=clock, timeout=TIMEOUT)


@pytest.mark.parametrize("kind", KINDS)
def test_one_endpoint_timing_out_in_fresh_clients_never_opens_its_origin(
    kind: str, store: Any, a: Upstream
) -> None:
    """Six fresh clients (twice the threshold) in turn time out on one slow path, before the origin answers anything: that path is failed fast from the threshold on, and the origin's other paths then answer."""
    a.behaviour = slow_and_fast
    clock = FakeClock()
    seen = []
    for n in range(THRESHOLD * 2 + 1):
        d = fresh(kind, store, clock)
        try:
            if n < THRESHOLD * 2:
                seen.append(outcome(d, a.url + "/slow"))
            else:
                assert [outcome(d, a.url + p) for p in ("/fast", "/other")] == [200, 200]
        finally:
            if d.is_async and isinstance(store, sidestep.RedisStore):
                d.run(store.aclose())  # its asyncio client lives on this driver's loop
            d.close()
    assert seen == ["ReadTimeout"] * THRESHOLD + ["AllCandidatesSuspended"] * THRESHOLD
    assert [s.path for s in a.seen].count("/slow") == THRESHOLD


@pytest.mark.parametrize("kind", ["httpx-async", "httpx2-async"])
def test_concurrent_timeouts_of_one_endpoint_never_open_its_origin(
    kind: str, store: Any, a: Upstream
) -> None:
    """Eight requests to one hung path at once, on a healthy origin, all time out; the origin's other paths still answer afterwards."""
    a.behaviour = slow_and_fast
    d = fresh(kind, store, FakeClock())

    async def burst() -> list[str]:
        async def one() -> str:
            try:
                await d.client.get(a.url + "/slow")
            except Exception as exc:
                return type(exc).__name__
            return "answered"

        return list(await asyncio.gather(*(one() for _ in range(8))))

    try:
        timed_out(d.run(burst()), a)
        assert [outcome(d, a.url + p) for p in ("/fast", "/other")] == [200, 200]
    finally:
        if isinstance(store, sidestep.RedisStore):
            d.run(store.aclose())
        d.close()


@pytest.mark.parametrize("kind", ["httpx-sync", "httpx2-sync"])
def test_timeouts_of_one_endpoint_from_many_threads_never_open_its_origin(
    kind: str, store: Any, a: Upstream
) -> None:
    """Eight threads time out on one hung path at once (or, a thread late by the read
    budget, are turned away by the endpoint, open after three timeouts); the origin's
    other paths still answer afterwards."""
    a.behaviour = slow_and_fast
    d = fresh(kind, store, FakeClock())
    try:
        with ThreadPoolExecutor(8) as pool:
            seen = list(pool.map(lambda _: outcome(d, a.url + "/slow"), range(8)))
        timed_out(seen, a)
        assert [outcome(d, a.url + p) for p in ("/fast", "/other")] == [200, 200]
    finally:
        d.close()


@pytest.mark.parametrize("shared", ["redis", "sqlite"])
def test_other_processes_see_the_endpoint_failing(
    shared: str, a: Upstream, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    """Three processes' stores on one Redis, or on one SQLite file (as many as the threshold), take turns timing out on one path: the endpoint opens, the origin never does (the store, not a process's memory, says the endpoint failed before)."""
    a.behaviour = slow_and_fast
    if shared == "redis":
        redis_url = request.getfixturevalue("redis_url")
        redis.Redis.from_url(redis_url).flushall()
        stores: list[Any] = [
            sidestep.RedisStore(redis_url, fingerprint_key="k", timeout=LOADED)
            for _ in range(THRESHOLD)
        ]
    else:
        path = str(tmp_path / "state.db")
        stores = [sidestep.SqliteStore(path, timeout=LOADED) for _ in range(THRESHOLD)]
    clock = FakeClock()
    drivers = [fresh("httpx-sync", s, clock) for s in stores]
    try:
        seen = [outcome(drivers[n % THRESHOLD], a.url + "/slow") for n in range(THRESHOLD * 2)]
        assert seen == ["ReadTimeout"] * THRESHOLD + ["AllCandidatesSuspended"] * THRESHOLD
        assert [outcome(d, a.url + "/fast") for d in drivers] == [200] * THRESHOLD
    finally:
        for d in drivers:
            d.close()
        for s in stores:
            s.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_full_connection_pool_counts_for_nothing(kind: str, store: Any, a: Upstream) -> None:
    """With its one connection held, a client's next six requests (twice the threshold) end in PoolTimeout (nothing was sent); once it is free every path answers and nothing is suspended."""
    gate = threading.Event()
    a.behaviour = lambda seen: (
        Respond(body="held", gate=gate) if seen.path == "/held" else Respond()
    )
    http: Any = __import__("httpx2" if kind.startswith("httpx2") else "httpx")
    d = Driver(
        kind,
        CONFIG,
        store=store,
        clock=FakeClock(),
        timeout=http.Timeout(5.0, pool=0.05),
        limits=http.Limits(max_connections=1),
    )
    try:
        held = ThreadPoolExecutor(1)
        first = held.submit(outcome, d, a.url + "/held")
        wait_for(lambda: a.calls == 1)
        seen = [outcome(d, a.url + "/x") for _ in range(THRESHOLD * 2)]
        gate.set()
        assert first.result(timeout=10) == 200
        held.shutdown()
        assert seen == ["PoolTimeout"] * (THRESHOLD * 2)
        assert [outcome(d, a.url + p) for p in ("/x", "/y")] == [200, 200]
        assert d.transport.suspensions() == []
        assert a.calls == 3
    finally:
        gate.set()
        if d.is_async and isinstance(store, sidestep.RedisStore):
            d.run(store.aclose())
        d.close()


@pytest.fixture
def deaf() -> Iterator[str]:
    """A server that accepts connections and never reads from them: a large upload stalls."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            accepted.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in accepted:
        conn.close()
    listener.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_callers_write_budget_running_out_counts_for_nothing(
    kind: str, store: Any, deaf: str
) -> None:
    """Uploads to a host that reads nothing end in WriteTimeout six times over (twice the threshold) and suspend nothing: the budget was the caller's."""
    http: Any = __import__("httpx2" if kind.startswith("httpx2") else "httpx")
    d = Driver(kind, CONFIG, store=store, clock=FakeClock(), timeout=http.Timeout(5.0, write=0.05))
    body = b"x" * (32 * 1024 * 1024)  # far more than the sockets' buffers hold
    try:
        seen = []
        for _ in range(THRESHOLD * 2):
            try:
                d.post(deaf + "/upload", content=body)
                seen.append("answered")
            except Exception as exc:
                seen.append(type(exc).__name__)
        assert seen == ["WriteTimeout"] * (THRESHOLD * 2)
        assert d.transport.suspensions() == []
    finally:
        if d.is_async and isinstance(store, sidestep.RedisStore):
            d.run(store.aclose())
        d.close()
