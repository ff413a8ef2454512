"""Cancellation and mid-body failures, under asyncio and trio, against real upstreams.

A cancellation lands when the request has reached the point under test (its call seen
by the upstream, its headers in, its answer being closed or recorded), never after a
fixed time: on a busy machine a request may take any time to get there.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import warnings
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import redis
import structlog
from prometheus_client import CollectorRegistry, generate_latest

import sidestep
from drivers import FakeClock, route
from redis_server import fresh_prefix
from scrape import sample, samples
from sidestep._settings.values import SidestepConfigWarning
from sidestep._state.memory import MemoryStore
from sidestep._state.redis.store import RedisStore
from sidestep._state.sqlite.store import SqliteStore
from sidestep.metrics import prometheus
from upstream import IN_TIME, Hang, HeadersThenHang, Respond, Stream, Upstream, wait_for


async def cancelled_when(call: Any, condition: Any, then: Any = None) -> None:
    """Run `call()` and cancel it once `condition()` holds (a fact of other threads, polled
    off the event loop), then call `then()` if given; fail if the condition never holds."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await anyio.to_thread.run_sync(wait_for, condition)
        tg.cancel_scope.cancel()
        if then is not None:
            then()


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


SSE = {"content-type": "text/event-stream"}


def config(a: Upstream, b: Upstream, **extra: Any) -> dict[str, Any]:
    return route(("a", a.url + "/v1"), ("b", b.url + "/v1"), **extra)


@pytest.mark.anyio
async def test_cancelled_probe_gives_its_slot_back(a: Upstream, b: Upstream) -> None:
    """A probe whose task is cancelled frees the slot: the next request probes A again."""
    a.behaviour = lambda _: Respond(503)
    clock = FakeClock()
    transport = sidestep.AsyncFailoverTransport(config(a, b), clock=clock)
    async with httpx.AsyncClient(transport=transport, timeout=30) as client:
        for _ in range(2):
            await client.get(a.url + "/v1/x")
        clock.advance(10)
        a.behaviour = lambda _: Hang()
        # the caller gives up while the probe hangs
        await cancelled_when(lambda: client.get(a.url + "/v1/x"), lambda: a.calls == 3)
        (scope,) = transport.suspensions()
        assert scope.state == "half_open"
        a.behaviour = lambda _: Respond(body="a")
        r = await client.get(a.url + "/v1/x")
        assert r.text == "a"
        assert a.calls == 4
        assert transport.suspensions() == []


@pytest.mark.anyio
async def test_cancellation_during_failover_reaches_no_other_target(
    a: Upstream, b: Upstream
) -> None:
    """A request cancelled while waiting on A is not sent on to B afterwards."""
    a.behaviour = lambda _: Hang()
    transport = sidestep.AsyncFailoverTransport(config(a, b, failover={"retry_ambiguous": True}))
    async with httpx.AsyncClient(transport=transport, timeout=30) as client:
        await cancelled_when(
            lambda: client.post(a.url + "/v1/x", json={"q": 1}), lambda: a.calls == 1
        )
    async with httpx.AsyncClient() as plain:  # after the request: anything it sent has arrived
        await plain.get(b.url + "/v1/sentinel")
    assert [seen.path for seen in b.seen] == ["/v1/sentinel"]


@pytest.mark.anyio
async def test_body_cut_after_commit_is_recorded_and_raised(a: Upstream, b: Upstream) -> None:
    """A read error mid-body counts against A's scope and reaches the caller unchanged."""
    a.behaviour = lambda _: Stream([b"one", b"two", b"three"], cut_after=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)
        cfg = config(a, b, breaker={"failure_threshold": 1})
        transport = sidestep.AsyncFailoverTransport(cfg)
    async with httpx.AsyncClient(transport=transport, timeout=5) as client:
        with structlog.testing.capture_logs() as logs, pytest.raises(httpx.RemoteProtocolError):
            await client.get(a.url + "/v1/x")
        assert [e["event"] for e in logs if e["event"].startswith("circuit.")] == ["circuit.opened"]
        (scope,) = transport.suspensions()
        assert (scope.target, scope.state) == ("a", "open")
        r = await client.get(a.url + "/v1/x")
        assert r.text == "b"


def test_sync_body_cut_after_commit_is_recorded_and_raised(a: Upstream, b: Upstream) -> None:
    """The sync transport records a mid-body cut the same way."""
    a.behaviour = lambda _: Stream([b"one", b"two", b"three"], cut_after=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)
        transport = sidestep.FailoverTransport(config(a, b, breaker={"failure_threshold": 1}))
    with httpx.Client(transport=transport, timeout=5) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            client.get(a.url + "/v1/x")
        wait_for(lambda: len(transport.suspensions()) == 1)
        assert client.get(a.url + "/v1/x").text == "b"


@pytest.mark.anyio
async def test_observe_mode_sends_everything_and_reports_the_skips(
    a: Upstream, b: Upstream
) -> None:
    """With enforce: false an open target still gets its calls, and candidate.skipped says it would not."""
    a.behaviour = lambda _: Respond(503)
    transport = sidestep.AsyncFailoverTransport(config(a, b, breaker={"enforce": False}))
    async with httpx.AsyncClient(transport=transport, timeout=5) as client:
        with structlog.testing.capture_logs() as logs:
            for _ in range(4):
                assert (await client.get(a.url + "/v1/x")).text == "b"
    assert a.calls == 4
    events = [e["event"] for e in logs]
    assert events.count("circuit.opened") == 1
    skipped = [e for e in logs if e["event"] == "candidate.skipped"]
    assert len(skipped) == 2
    assert all(e["enforced"] is False for e in skipped)


@pytest.mark.anyio
async def test_cancelled_while_waiting_for_the_first_byte_closes_the_connection(
    a: Upstream, b: Upstream
) -> None:
    """A request cancelled between the headers and the first body byte leaves no open socket."""
    a.behaviour = lambda _: HeadersThenHang()
    inner = _Heard()
    transport = sidestep.AsyncFailoverTransport(config(a, b), transport=inner)
    async with httpx.AsyncClient(transport=transport, timeout=30) as client:
        await cancelled_when(lambda: client.get(a.url + "/v1/x"), lambda: inner.heads == 1)
        await anyio.to_thread.run_sync(lambda: wait_for(lambda: a.open_connections == 0))
        assert b.calls == 0


class _Heard(httpx.AsyncHTTPTransport):
    """httpx's own transport, counting the answers whose headers came (`heads`)."""

    heads = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        self.heads += 1
        return response


class _SlowClose(httpx.AsyncByteStream):
    """A body whose closing takes a while (a TLS close, a slow socket teardown) while its
    transport is `slow`: here until the transport's `done` is set."""

    def __init__(self, inner: Any, closing: _SlowClosing) -> None:
        self.inner = inner
        self.closing = closing

    async def __aiter__(self) -> Any:
        async for chunk in self.inner:
            yield chunk

    async def aclose(self) -> None:
        if self.closing.slow:
            self.closing.started += 1
            await self.closing.done.wait()
        await self.inner.aclose()


class _SlowClosing(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.slow = False  # whether closing an answer waits for `done`
        self.done: Any = None
        self.started = 0  # slow closes begun

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        r = await self.inner.handle_async_request(request)
        stream = _SlowClose(r.stream, self)
        return httpx.Response(r.status_code, headers=r.headers, stream=stream)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.anyio
async def test_cancelled_while_closing_the_previous_answer_frees_the_next_probe(
    a: Upstream, b: Upstream
) -> None:
    """A cancellation landing while A's failed answer is being closed gives B's probe slot back."""
    a.behaviour = b.behaviour = lambda _: Respond(503)
    clock = FakeClock()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)
        cfg = config(a, b, breaker={"failure_threshold": 1})
        inner = _SlowClosing()
        transport = sidestep.AsyncFailoverTransport(cfg, transport=inner, clock=clock)
    async with httpx.AsyncClient(transport=transport, timeout=30) as client:
        await client.get(a.url + "/v1/x")  # both open
        clock.advance(11)
        b.behaviour = lambda _: Respond(body="b back")
        inner.slow, inner.done = True, anyio.Event()
        # A is probed and fails; B's probe waits on A's close, during which the caller gives up
        await cancelled_when(
            lambda: client.get(a.url + "/v1/x"), lambda: inner.started == 1, inner.done.set
        )
        inner.slow = False
        clock.advance(1000)
        r = await client.get(b.url + "/v1/x")
        assert r.text == "b back"


class _SlowStore(MemoryStore):
    """A store that waits on I/O, as RedisStore does: the async shell awaits its twins.
    Its verdict writes (counted in `writing` as they begin) wait until `done` is set."""

    blocking = True

    def __init__(self, done: anyio.Event) -> None:
        super().__init__()
        self.done = done
        self.writing = 0

    async def record_async(self, *args: Any) -> Any:
        self.writing += 1
        await self.done.wait()
        return self.record(*args)


@pytest.mark.anyio
async def test_cancelled_while_recording_loses_no_connection(a: Upstream) -> None:
    """A cancellation during a slow verdict write still returns the connection to the pool."""
    a.behaviour = lambda _: Stream([b"data: 1\n\n", b"data: 2\n\n"])
    inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=1))
    store = _SlowStore(anyio.Event())
    transport = sidestep.AsyncFailoverTransport({}, transport=inner, store=store)
    async with httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(5, pool=1)) as client:

        async def call() -> bytes:
            async with client.stream("GET", a.url + "/x") as r:
                return await r.aread()

        await cancelled_when(call, lambda: store.writing == 1)
        store.done.set()  # the next call's write goes through
        assert (
            await call() == b"data: 1\n\ndata: 2\n\n"
        )  # no PoolTimeout: the one connection is free


@pytest.mark.anyio
async def test_waiting_for_the_local_pool_is_not_the_upstreams_failure(a: Upstream) -> None:
    """A pool wait past first_byte_timeout (a request that accepts an event stream) is a local PoolTimeout, not an outage of a healthy upstream."""
    rest = threading.Event()  # the hog's body after its first chunk: sent once set
    a.behaviour = lambda s: (
        Stream([b"x"] * 10, release=rest) if s.path == "/slow" else Respond(body="fast")
    )
    inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=1))
    cfg = {"breaker": {"failure_threshold": 2}, "failover": {"first_byte_timeout": 0.3}}
    transport = sidestep.AsyncFailoverTransport(cfg, transport=inner)
    async with (
        httpx.AsyncClient(transport=transport, timeout=30) as client,
        anyio.create_task_group() as tg,
    ):

        async def hog() -> None:
            async with client.stream("GET", a.url + "/slow") as r:
                await r.aread()

        tg.start_soon(hog)
        # sent: the hog holds the one connection until it has read the whole body
        await anyio.to_thread.run_sync(wait_for, lambda: a.calls == 1)
        for _ in range(2):
            with pytest.raises(httpx.PoolTimeout):
                await client.get(a.url + "/fast", headers={"accept": "text/event-stream"})
        rest.set()
    assert transport.suspensions() == []


@pytest.mark.anyio
async def test_cancelled_requests_are_counted_and_count_against_no_scope(
    a: Upstream, b: Upstream
) -> None:
    """A request cancelled by its caller, and one cut by a timeout around the call, each end as `cancelled` in sidestep_requests_total and their attempt as `cancelled` in sidestep_attempts_total (no duration: no verdict); with failure_threshold 1 neither opens A, reaches B, nor moves the suspended gauge, and A's next request is served."""
    a.behaviour = lambda _: Hang()
    registry = CollectorRegistry()
    prometheus.enable(registry)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SidestepConfigWarning)
            cfg = config(a, b, breaker={"failure_threshold": 1})
            transport = sidestep.AsyncFailoverTransport(cfg)
        async with httpx.AsyncClient(transport=transport, timeout=30) as client:
            async with anyio.create_task_group() as tg:  # cancelled by the caller
                tg.start_soon(client.get, a.url + "/v1/x")
                await anyio.to_thread.run_sync(lambda: wait_for(lambda: a.calls == 1))
                tg.cancel_scope.cancel()
            # a timeout around the call, which the request reaches A well within
            with anyio.move_on_after(IN_TIME) as scope:
                await client.get(a.url + "/v1/x")
            assert scope.cancelled_caught and a.calls == 2
            assert transport.suspensions() == []
            a.behaviour = lambda _: Respond(body="a")
            assert (await client.get(a.url + "/v1/x")).text == "a"
        found = samples(generate_latest(registry).decode())
    finally:
        prometheus.disable()
    requests = {"route": "chat"}
    assert sample(found, "sidestep_requests_total", outcome="cancelled", **requests) == 2
    assert sample(found, "sidestep_requests_total", outcome="served", **requests) == 1
    attempts = {"route": "chat", "target": "a"}
    assert sample(found, "sidestep_attempts_total", result="cancelled", **attempts) == 2
    assert sample(found, "sidestep_attempt_duration_seconds_count", **attempts) == 1
    assert not [k for k in found if k[0] == "sidestep_circuit_transitions_total"]
    assert sum(v for k, v in found.items() if k[0] == "sidestep_suspended") == 0
    assert b.calls == 0


class _KeptIterators(httpx.AsyncBaseTransport):
    """Real sockets, each answer's body read through an async generator of its own that
    counts the chunks it passes on and the times its `finally` ran."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.chunks = 0
        self.finished = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        r = await self.inner.handle_async_request(request)
        return httpx.Response(r.status_code, headers=r.headers, stream=_KeptStream(r.stream, self))

    async def aclose(self) -> None:
        await self.inner.aclose()


class _KeptStream(httpx.AsyncByteStream):
    def __init__(self, inner: Any, kept: _KeptIterators) -> None:
        self.inner = inner
        self.kept = kept

    async def __aiter__(self) -> Any:
        try:
            async for chunk in self.inner:
                self.kept.chunks += 1
                yield chunk
        finally:
            self.kept.finished += 1

    async def aclose(self) -> None:
        await self.inner.aclose()


# (asyncio: under trio, httpx's own generators below this one warn when any stream is left
# unfinished, with or without sidestep)
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("limit", ["first_byte_timeout", "stall_timeout"])
@pytest.mark.anyio
async def test_a_head_given_up_between_keepalives_finishes_the_body_iterator(
    a: Upstream, b: Upstream, limit: str
) -> None:
    """A stream failed over because a ping came past its limit before the first token has the body iterator sidestep started closed at once (its finally run), not left to the garbage collector."""
    ping = b"event: ping\ndata: {}\n\n"
    more = threading.Event()
    a.behaviour = lambda _: Stream([ping, ping, ping], headers=SSE, release=more, stall_after=2)
    clock = FakeClock()
    inner = _KeptIterators()
    failover = {"retry_ambiguous": True, limit: 30}
    transport = sidestep.AsyncFailoverTransport(
        config(a, b, failover=failover), transport=inner, clock=clock
    )
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:

        async def limit_passes() -> None:  # A's second ping comes after its limit
            await anyio.to_thread.run_sync(lambda: wait_for(lambda: inner.chunks == 1))
            clock.advance(100)
            more.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(limit_passes)
            r = await client.post(a.url + "/v1/messages", json={"stream": True})
        assert (r.extensions["sidestep"]["target"], inner.finished) == ("b", 2)


class _KeptSyncIterators(httpx.BaseTransport):
    """`_KeptIterators` for a sync client."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.chunks = 0
        self.finished = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        r = self.inner.handle_request(request)
        stream = _KeptSyncStream(r.stream, self)
        return httpx.Response(r.status_code, headers=r.headers, stream=stream)

    def close(self) -> None:
        self.inner.close()


class _KeptSyncStream(httpx.SyncByteStream):
    def __init__(self, inner: Any, kept: _KeptSyncIterators) -> None:
        self.inner = inner
        self.kept = kept

    def __iter__(self) -> Any:
        try:
            for chunk in self.inner:
                self.kept.chunks += 1
                yield chunk
        finally:
            self.kept.finished += 1

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize("limit", ["first_byte_timeout", "stall_timeout"])
def test_a_sync_head_given_up_between_keepalives_finishes_the_body_iterator(
    a: Upstream, b: Upstream, limit: str
) -> None:
    """The same for a sync client, which learns of the limit from the late ping itself: the iterator it started is closed before the request moves on."""
    ping = b"event: ping\ndata: {}\n\n"
    more = threading.Event()
    a.behaviour = lambda _: Stream([ping, ping, ping], headers=SSE, release=more, stall_after=2)
    clock = FakeClock()
    inner = _KeptSyncIterators()
    failover = {"retry_ambiguous": True, limit: 30}
    transport = sidestep.FailoverTransport(
        config(a, b, failover=failover), transport=inner, clock=clock
    )

    def limit_passes() -> None:  # A's second ping comes after its limit
        wait_for(lambda: inner.chunks == 1)
        clock.advance(100)
        more.set()

    threading.Thread(target=limit_passes, daemon=True).start()
    with httpx.Client(transport=transport, timeout=10) as client:
        r = client.post(a.url + "/v1/messages", json={"stream": True})
    assert (r.extensions["sidestep"]["target"], inner.finished) == ("b", 2)


class _Gate:
    """What holds a store's half-open admission up, so that its request can be cancelled
    while it waits: for a memory store, whose admission never waits, the probe's send."""

    def __init__(self, kind: str, a: Upstream, tmp_path: Path, request: pytest.FixtureRequest):
        self.kind, self.a = kind, a
        self.holder: Any = None
        self.store: Any
        if kind == "memory":
            self.store = MemoryStore()
        elif kind == "sqlite":
            self.store = SqliteStore(tmp_path / "s.db", timeout=30)  # waits, never falls back
            self.store._caller_clock = True
        else:
            url = request.getfixturevalue("redis_url")
            self.store = RedisStore(url, prefix=fresh_prefix(), timeout=30)
            self.store._caller_clock = True
            self.holder = redis.Redis.from_url(url)

    def close(self) -> None:
        if self.kind == "memory":
            self.a.behaviour = lambda _: Hang()
        elif self.kind == "sqlite":
            self.holder = sqlite3.connect(self.store._path, isolation_level=None)
            self.holder.execute("BEGIN IMMEDIATE")  # the admission's write waits for it
        else:
            self.holder.client_pause(30_000, all=False)  # scripts that write wait

    def holding(self) -> bool:
        """A request is held: at the upstream, waiting for the file's lock, or for Redis."""
        if self.kind == "memory":
            return self.a.calls == 3
        if self.kind == "sqlite":
            return bool(self.store._tx.mutex.locked())
        return int(self.holder.info("clients")["blocked_clients"]) > 0

    def open(self) -> None:
        self.a.behaviour = lambda _: Respond(body="a")
        if self.kind == "sqlite":
            self.holder.execute("ROLLBACK")
            self.holder.close()
        elif self.kind == "redis":
            self.holder.client_unpause()
            self.holder.close()


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis"])
async def test_a_request_cancelled_while_its_probe_is_admitted_keeps_no_slot(
    kind: str,
    anyio_backend: str,
    a: Upstream,
    b: Upstream,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """A request cancelled while its half-open admission waits on the store (the file's write lock, a paused Redis; for the memory store, the probe's send) — by asyncio's own Task.cancel, which no anyio shield holds back, or by a cancel scope under trio — leaves the only probe slot free: the next requests probe the recovered primary long before the slot's lease (sized from the 30 s timeouts) could end."""
    a.behaviour = lambda _: Respond(503)
    clock = FakeClock()
    gate = _Gate(kind, a, tmp_path, request)
    cfg = config(a, b, breaker={"half_open_probes": 1})
    transport = sidestep.AsyncFailoverTransport(cfg, store=gate.store, clock=clock)
    async with httpx.AsyncClient(transport=transport, timeout=30) as client:
        for _ in range(2):
            assert (await client.get(a.url + "/v1/x")).text == "b"  # A opens
        clock.advance(11)  # its window is over: the next request is its probe
        gate.close()
        if anyio_backend == "asyncio":
            task = asyncio.ensure_future(client.get(a.url + "/v1/x"))
            while not gate.holding():  # noqa: ASYNC110  # a fact of threads and processes
                await anyio.sleep(0.01)
            task.cancel()  # asyncio's own cancellation
            gate.open()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert task.cancelled()
        else:
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.get, a.url + "/v1/x")
                while not gate.holding():  # noqa: ASYNC110  # a fact of threads and processes
                    await anyio.sleep(0.01)
                tg.cancel_scope.cancel()  # trio waits for a worker thread: let it go on
                gate.open()
        with anyio.fail_after(10):
            # B serves until A is probed again: long before the slot's lease could end
            while (await client.get(a.url + "/v1/x")).text != "a":  # noqa: ASYNC110
                await anyio.sleep(0.02)
    if kind != "memory":
        assert gate.store.fallbacks == 0
        gate.store.close()


class HeldRecords(MemoryStore):
    """A memory store that says it does I/O (so the shell awaits its calls, as it does a
    shared store's), whose async records wait until the test lets them go."""

    blocking = True

    def __init__(self) -> None:
        super().__init__()
        self.holding = False
        self.held = threading.Event()
        self.go = threading.Event()

    async def record_async(self, *args: Any) -> Any:
        if self.holding:
            self.held.set()
            while not self.go.is_set():  # noqa: ASYNC110  # another thread's event
                await asyncio.sleep(0.005)
        return await super().record_async(*args)


@pytest.mark.parametrize("cancel", ["task_cancel_thrice", "asyncio_timeout"])
def test_a_probes_verdict_lands_however_often_asyncio_cancels_its_request(
    cancel: str, a: Upstream, b: Upstream
) -> None:
    """A half-open probe answered 200 whose verdict is being recorded when asyncio's own
    cancellation lands (three `Task.cancel()`s, or an `asyncio.timeout` expiring): the
    verdict still lands (the scope closes), and the request ends cancelled (or timed out)."""
    if cancel == "asyncio_timeout" and not hasattr(asyncio, "timeout"):
        pytest.skip("asyncio.timeout is built in from 3.11")
    a.behaviour = lambda _: Respond(503, b"down")
    clock = FakeClock()
    store = HeldRecords()
    transport = sidestep.AsyncFailoverTransport(config(a, b), store=store, clock=clock)

    async def main() -> None:
        async with httpx.AsyncClient(transport=transport) as client:
            for _ in range(2):
                assert (await client.get(a.url + "/v1/x")).text == "b"
            assert [s.state for s in transport.suspensions()] == ["open"]
            clock.advance(11)
            a.behaviour = lambda _: Respond(body="a")
            store.holding = True

            timeouts: list[Any] = []

            async def probe() -> None:
                if cancel == "asyncio_timeout":
                    async with asyncio.timeout(None) as timeout:  # type: ignore[attr-defined]
                        timeouts.append(timeout)
                        await client.get(a.url + "/v1/x")
                else:
                    await client.get(a.url + "/v1/x")

            task = asyncio.ensure_future(probe())
            await anyio.to_thread.run_sync(wait_for, store.held.is_set)
            if cancel == "task_cancel_thrice":
                for _ in range(3):
                    task.cancel()
                    await asyncio.sleep(0.01)
            else:
                # the timeout expires now, while the verdict waits (however long the probe
                # took to get there: a fixed timeout could fire before it did)
                (timeout,) = timeouts
                timeout.reschedule(asyncio.get_running_loop().time())
                for _ in range(1000):  # (its handle runs at the loop's next turns)
                    if timeout.expired():
                        break
                    await asyncio.sleep(0)
                assert timeout.expired()
            store.go.set()
            with pytest.raises((asyncio.CancelledError, TimeoutError)):
                await task
        assert transport.suspensions() == []  # the probe's success closed the scope

    asyncio.run(main())
