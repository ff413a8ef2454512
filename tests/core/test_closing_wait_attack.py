"""A close that cuts a retry wait short, attacked from the sides `test_closing_wait` leaves.

Many requests wait at once when the close comes; the caller cancels the wait itself,
alone or together with a close; an async transport serves two event loops in two
threads and one of them closes it; a transport is closed again and again and used on;
the close lands as the failing answer arrives, before the core counts it. In each,
no request waits its whole wait after a close that may wake it, none sends anything
more, a cancellation stays a cancellation, and the transport is left serving (no wait
registered, no probe slot held). Real upstreams on 127.0.0.1, real clients of both
flavours, sync (threads), asyncio and trio.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from differential import FLAVOURS
from drivers import route
from sidestep.logging import add_observer, remove_observer
from test_closing import (
    CLOCKS,
    assert_only_a_open,
    execute,
    failover_transport,
    flavour_of,
)
from test_closing_attack import AdmittingStore
from test_closing_wait import WAIT, waiting_long
from upstream import Respond, Upstream, wait_for

ASYNC = ["asyncio", "trio"]


class Answered:
    """Counts A's 503s as the request's own events report them (`attempt.finished`)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self, event: str, fields: Mapping[str, Any], /) -> None:
        if event == "attempt.finished" and fields["status"] == 503:
            with self._lock:
                self.count += 1

    def __enter__(self) -> Answered:
        add_observer(self)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        remove_observer(self)


async def until(condition: Any, bound: float = 60.0) -> None:
    """Poll `condition` (a fact of other threads) from an event loop, at most `bound` s."""
    with anyio.fail_after(bound):
        while not condition():  # noqa: ASYNC110  # conditions of threads
            await anyio.sleep(0.005)


async def raised(call: Any) -> str:
    try:
        await call
    except Exception as exc:  # the exception's type is the observation
        return type(exc).__name__
    return "returned"


def serves_b_afterwards(h: Any, sync: bool, transport: Any, a: Upstream, b: Upstream) -> Any:
    """A request through a fresh client on `transport`: A is open, so B answers it."""

    async def go() -> str:
        if sync:
            with h.Client(transport=transport, timeout=5.0) as client:
                return str(client.get(a.url + "/v1/x").text)
        async with h.AsyncClient(transport=transport, timeout=5.0) as client:
            with anyio.fail_after(10.0):
                return str((await client.get(a.url + "/v1/x")).text)

    return go


# --- many requests waiting when the close comes ------------------------------------------------

MANY_TASKS = 30
MANY_THREADS = 12


@pytest.mark.parametrize("kind", ASYNC)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_close_wakes_every_request_waiting_in_its_event_loop(
    flavour: str, kind: str, a: Upstream, b: Upstream
) -> None:
    """Thirty requests of one async client all wait out A's 30 s `Retry-After` when the
    client is closed: each ends at once with the flavour's ReadError, A was sent each
    once and B nothing, no wait stays registered, and a fresh client on the same
    transport is served by B (A's failures counted, no probe slot held)."""
    h = flavour_of(flavour)
    transport = waiting_long(h, False, a, b)
    seen: list[str] = []
    took: list[float] = []

    async def one(client: Any) -> None:
        seen.append(await raised(client.get(a.url + "/v1/x")))

    async def go() -> None:
        client = h.AsyncClient(transport=transport, timeout=5.0)
        with Answered() as answered:
            async with anyio.create_task_group() as tasks:
                for _ in range(MANY_TASKS):
                    tasks.start_soon(one, client)
                await until(lambda: answered.count == MANY_TASKS)
                await until(lambda: len(transport._sleeping) == MANY_TASKS)
                started = time.monotonic()
                await client.aclose()
            took.append(time.monotonic() - started)
        assert transport._sleeping == {}
        assert await serves_b_afterwards(h, False, transport, a, b)() == "b"

    execute(kind, go)
    assert seen == ["ReadError"] * MANY_TASKS
    assert took[0] < WAIT / 3
    assert (a.calls, b.calls) == (MANY_TASKS, 1)
    assert_only_a_open(transport)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_close_wakes_every_sync_request_waiting_in_other_threads(
    flavour: str, a: Upstream, b: Upstream
) -> None:
    """Twelve threads share a sync client, each request waiting out A's 30 s
    `Retry-After`, when the main thread closes it: every thread gets the ReadError at
    once, A was sent each request once and B nothing; the transport serves on."""
    h = flavour_of(flavour)
    transport = waiting_long(h, True, a, b)
    client = h.Client(transport=transport, timeout=5.0)
    seen: list[str] = []

    def one() -> None:
        try:
            client.get(a.url + "/v1/x")
        except Exception as exc:  # the exception's type is the observation
            seen.append(type(exc).__name__)
        else:
            seen.append("returned")

    threads = [threading.Thread(target=one) for _ in range(MANY_THREADS)]
    with Answered() as answered:
        for thread in threads:
            thread.start()
        try:
            wait_for(lambda: answered.count == MANY_THREADS)
            started = time.monotonic()
            client.close()
        finally:
            for thread in threads:
                thread.join(WAIT * 2)
        took = time.monotonic() - started
    assert seen == ["ReadError"] * MANY_THREADS
    assert took < WAIT / 3
    assert (a.calls, b.calls) == (MANY_THREADS, 0)
    execute("sync", lambda: serves_b_afterwards(h, True, transport, a, b)())
    assert b.calls == 1
    assert_only_a_open(transport)


# --- the caller's own cancellation -------------------------------------------------------------


@pytest.mark.parametrize("close_too", [False, True], ids=["alone", "with-close"])
@pytest.mark.parametrize("kind", ASYNC)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_callers_cancellation_of_a_wait_stays_a_cancellation(
    flavour: str, kind: str, close_too: bool, a: Upstream, b: Upstream
) -> None:
    """The caller's cancel scope is cancelled while its request waits to retry — alone,
    or with the client closed at the same moment: the request ends cancelled (neither a
    ReadError nor a response), at once, no wait stays registered, and nothing more is
    sent to A or B."""
    h = flavour_of(flavour)
    transport = waiting_long(h, False, a, b)
    seen: list[str] = []

    async def go() -> None:
        client = h.AsyncClient(transport=transport, timeout=5.0)
        with Answered() as answered:
            async with anyio.create_task_group() as tasks:
                outer = anyio.CancelScope()

                async def request() -> None:
                    with outer:
                        seen.append(await raised(client.get(a.url + "/v1/x")))
                    seen.append("cancelled" if outer.cancelled_caught else "not cancelled")

                tasks.start_soon(request)
                await until(lambda: answered.count == 1 and len(transport._sleeping) == 1)
                started = time.monotonic()
                outer.cancel()
                if close_too:
                    await client.aclose()
            assert time.monotonic() - started < WAIT / 3
        assert transport._sleeping == {}
        await client.aclose()

    execute(kind, go)
    assert seen == ["cancelled"]
    assert (a.calls, b.calls) == (1, 0)


@pytest.mark.parametrize("order", ["cancel-then-close", "close-then-cancel"])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_an_asyncio_task_cancelled_while_its_wait_is_closed_ends_cancelled(
    flavour: str, order: str, a: Upstream, b: Upstream
) -> None:
    """asyncio's own `task.cancel()` on a request waiting to retry, in the same moment as
    the client's close, in either order: awaiting the task raises CancelledError (the
    close's wake-up does not swallow the caller's cancellation), no wait stays
    registered, nothing more is sent."""
    h = flavour_of(flavour)
    transport = waiting_long(h, False, a, b)
    seen: list[str] = []

    async def go() -> None:
        client = h.AsyncClient(transport=transport, timeout=5.0)
        task = asyncio.ensure_future(client.get(a.url + "/v1/x"))
        await until(lambda: len(transport._sleeping) == 1)  # its 503 in, its wait begun
        if order == "cancel-then-close":
            task.cancel()
            await client.aclose()
        else:
            closed = asyncio.ensure_future(client.aclose())
            await asyncio.sleep(0)  # the close has run up to its first await
            task.cancel()
            await closed
        try:
            await asyncio.wait_for(task, WAIT / 3)
        except asyncio.CancelledError:
            seen.append("cancelled")
        except Exception as exc:  # the exception's type is the observation
            seen.append(type(exc).__name__)
        else:
            seen.append("returned")
        assert transport._sleeping == {}

    asyncio.run(go())
    assert seen == ["cancelled"]
    assert (a.calls, b.calls) == (1, 0)


# --- two event loops, two threads, one async transport ----------------------------------------


@pytest.mark.parametrize("kind", ASYNC)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_an_async_transport_closed_in_one_thread_wakes_only_that_threads_waits(
    flavour: str, kind: str, a: Upstream, b: Upstream
) -> None:
    """One async transport serves two event loops in two threads, a request of each
    waiting out A's `retry-after-ms`: 30 s for the first thread's, 1.5 s for the other's.
    Closed from the first thread, its own request ends at once with the ReadError; the
    other thread's waits on, undisturbed (no wake-up crosses threads, nothing raises
    inside sidestep), and ends with the ReadError of a request the close found in flight.
    Nothing more is sent."""
    h = flavour_of(flavour)
    transport = waiting_long(h, False, a, b)
    waits = {"closing": str(int(WAIT * 1000)), "other": "1500"}
    a.behaviour = lambda seen: Respond(
        503, body="busy", headers={"retry-after-ms": waits[seen.headers["x-thread"]]}
    )
    seen: dict[str, tuple[str, float]] = {}
    errors: list[BaseException] = []

    def loop(name: str, closes: bool, answered: Answered) -> None:
        async def go() -> None:
            client = h.AsyncClient(transport=transport, timeout=5.0)
            started = time.monotonic()
            async with anyio.create_task_group() as tasks:

                async def request() -> None:
                    outcome = await raised(client.get(a.url + "/v1/x", headers={"x-thread": name}))
                    seen[name] = (outcome, time.monotonic() - started)

                tasks.start_soon(request)
                if closes:
                    await until(lambda: answered.count == 2 and len(transport._sleeping) == 2)
                    await transport.aclose()

        try:
            anyio.run(go, backend=kind)
        except BaseException as exc:  # reported to the test's thread
            errors.append(exc)

    with Answered() as answered:
        threads = [
            threading.Thread(target=loop, args=("closing", True, answered)),
            threading.Thread(target=loop, args=("other", False, answered)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT * 2)
    assert errors == []
    assert seen["closing"][0] == "ReadError"
    assert seen["closing"][1] < WAIT / 3
    assert seen["other"][0] == "ReadError"
    assert seen["other"][1] >= 1.4  # its wait, waited out
    assert (a.calls, b.calls) == (2, 0)
    assert transport._sleeping == {}


# --- a transport closed, and closed again, serves on ------------------------------------------


@pytest.mark.parametrize("kind", ["sync", *ASYNC])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_transport_closed_repeatedly_still_waits_out_later_retry_waits(
    flavour: str, kind: str, a: Upstream, b: Upstream
) -> None:
    """A transport closed three times with nothing in flight, then once while a request
    waited (woken), then used again: the later request waits out its own 0.3 s wait in
    full before A's second attempt, as before any close (no close is remembered as a
    wake-up), and B answers it after."""
    h = flavour_of(flavour)
    sync = kind == "sync"
    transport = waiting_long(h, sync, a, b)
    calls: list[float] = []

    def busy(_: Any) -> Respond:
        calls.append(time.monotonic())
        return Respond(503, body="busy", headers={"retry-after-ms": "300"})

    async def close() -> None:
        if sync:
            transport.close()
        else:
            await transport.aclose()

    async def go() -> None:
        for _ in range(3):
            await close()
        # one request woken by a close from another thread (sync) or task (async)
        a.behaviour = lambda _: Respond(503, body="busy", headers={"retry-after": str(int(WAIT))})
        with Answered() as answered:
            if sync:
                client = h.Client(transport=transport, timeout=5.0)
                closer = threading.Thread(
                    target=lambda: (wait_for(lambda: answered.count == 1), client.close())
                )
                closer.start()
                try:
                    assert await raised(_sync(client.get, a.url + "/v1/x")) == "ReadError"
                finally:
                    closer.join(10.0)
            else:
                aclient = h.AsyncClient(transport=transport, timeout=5.0)
                async with anyio.create_task_group() as tasks:

                    async def closer_task() -> None:
                        await until(lambda: len(transport._sleeping) == 1)
                        await aclient.aclose()

                    tasks.start_soon(closer_task)
                    with anyio.fail_after(WAIT / 3):
                        assert await raised(aclient.get(a.url + "/v1/x")) == "ReadError"
        assert_only_a_open(transport)  # the woken request's 503 counted: cleared by hand
        (scope,) = transport.suspensions()
        assert transport.clear(scope.scope_id)
        a.behaviour = busy
        if sync:
            with h.Client(transport=transport, timeout=5.0) as c:
                response = c.get(a.url + "/v1/x")
        else:
            async with h.AsyncClient(transport=transport, timeout=5.0) as ac:
                with anyio.fail_after(10.0):
                    response = await ac.get(a.url + "/v1/x")
        assert response.status_code == 200

    execute(kind, go)
    assert len(calls) == 2
    assert calls[1] - calls[0] >= 0.25  # the 0.3 s wait, less the clocks' resolution
    assert b.calls == 1


async def _sync(call: Any, *args: Any) -> Any:
    return call(*args)


# --- the close lands as the failing answer arrives ---------------------------------------------


@pytest.mark.parametrize("clock", sorted(CLOCKS))
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_close_as_the_first_answer_arrives_allows_no_wait_and_no_retry(
    flavour: str, clock: str, a: Upstream, b: Upstream
) -> None:
    """A sync client is closed (from another thread, joined) just as A's 503 comes back
    — its head and body in, before the transport has looked at it — with no one
    listening to events (the fast path). The request ends with that 503 as it came, at
    once: no retry wait, nothing more sent to A or B, on either clock (one reading the
    same at the send and at the close included)."""
    h = flavour_of(flavour)
    a.behaviour = lambda _: Respond(503, body="busy", headers={"retry-after": str(int(WAIT))})
    config = route(
        ("a", a.url + "/v1"),
        ("b", b.url + "/v1"),
        breaker={"failure_threshold": 1},
        failover={"max_attempts_per_target": 2, "max_retry_wait": 60},
    )
    holder: list[Any] = []

    class ClosedAsItAnswers(h.HTTPTransport):  # type: ignore[misc,name-defined]
        def handle_request(self, request: Any) -> Any:
            response = super().handle_request(request)
            if response.status_code == 503 and not holder[1]:
                response.read()
                holder[1] = True
                closer = threading.Thread(target=holder[0].close)
                closer.start()
                closer.join(10.0)
            return response

    transport = failover_transport(h, True, config, ClosedAsItAnswers(), **CLOCKS[clock])
    holder[:] = [transport, False]
    client = h.Client(transport=transport, timeout=5.0)
    started = time.monotonic()
    response = client.get(a.url + "/v1/x")
    took = time.monotonic() - started
    assert ((response.status_code, response.text), took < WAIT / 3, a.calls, b.calls) == (
        (503, "busy"),
        True,
        1,
        0,
    )


# --- a probe woken from its wait ---------------------------------------------------------------

PROBE_CANCELS = [("asyncio", "cancel"), ("trio", "cancel")]  # a sync caller cannot cancel


@pytest.mark.parametrize(
    ("kind", "ending"),
    [("sync", "close"), ("asyncio", "close"), ("trio", "close"), *PROBE_CANCELS],
)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_probe_woken_from_its_retry_wait_leaves_its_slot_free(
    flavour: str, kind: str, ending: str, a: Upstream, b: Upstream
) -> None:
    """A half-open A's one probe is answered 503 with a 30 s `Retry-After` and waits to
    retry, holding the probe slot, when its client is closed (or, async, its caller
    cancels it). The probe ends at once; its slot does not stay taken: once A's window
    has passed again (a close: the 503 counted, A open again) or at once (a
    cancellation: nothing recorded, A still half-open), the next request through a fresh
    client is A's probe, and A, well again, answers it."""
    h = flavour_of(flavour)
    sync = kind == "sync"
    now = [100.0]
    transport = waiting_long(h, sync, a, b, clock=lambda: now[0])
    # A opens: a 503 whose wait is beyond max_retry_wait fails over to B at once
    a.behaviour = lambda _: Respond(503, body="busy", headers={"retry-after": "90"})
    later = serves_b_afterwards(h, sync, transport, a, b)
    seen: list[str] = []

    async def go() -> None:
        assert await later() == "b"
        assert_only_a_open(transport)
        now[0] += 1000.0  # A's window is over: the next request is its probe
        a.behaviour = lambda _: Respond(503, body="busy", headers={"retry-after": str(int(WAIT))})
        if sync:
            client = h.Client(transport=transport, timeout=5.0)
            with Answered() as answered:
                closer = threading.Thread(
                    target=lambda: (wait_for(lambda: answered.count == 1), client.close())
                )
                closer.start()
                try:
                    seen.append(await raised(_sync(client.get, a.url + "/v1/x")))
                finally:
                    closer.join(10.0)
        else:
            aclient = h.AsyncClient(transport=transport, timeout=5.0)
            outer = anyio.CancelScope()
            async with anyio.create_task_group() as tasks:

                async def request() -> None:
                    with outer:
                        seen.append(await raised(aclient.get(a.url + "/v1/x")))

                tasks.start_soon(request)
                await until(lambda: len(transport._sleeping) == 1)
                if ending == "close":
                    await aclient.aclose()
                else:
                    outer.cancel()
            with anyio.fail_after(WAIT / 3):  # bounds a hang only
                await aclient.aclose()
            if ending == "cancel":
                seen.append("cancelled" if outer.cancelled_caught else "not cancelled")
        assert transport._sleeping == {}
        (scope,) = transport.suspensions()
        assert scope.state == ("open" if ending == "close" else "half_open")
        now[0] += 1000.0
        a.behaviour = lambda _: Respond(body="a")
        assert await later() == "a"
        assert transport.suspensions() == []

    started = time.monotonic()
    execute(kind, go)
    assert time.monotonic() - started < WAIT / 2
    assert seen == ["ReadError" if ending == "close" else "cancelled"]
    assert (a.calls, b.calls) == (3, 1)


# --- a close from inside the transport's own calls --------------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_close_from_a_store_call_wakes_another_threads_wait_without_deadlock(
    flavour: str, a: Upstream, b: Upstream, tmp_path: Path
) -> None:
    """A sync request waits out A's 30 s `Retry-After` in one thread; in another, a
    request to B is being admitted by a real SQLite store when the transport is closed
    from inside that admission (the request's own thread, mid-call). Nothing deadlocks:
    the waiting request ends at once with the ReadError, having sent nothing more, and
    the request being admitted, sent after the close, is served by B."""
    h = flavour_of(flavour)
    store = AdmittingStore(tmp_path / "state.db", b.url)
    try:
        transport = waiting_long(h, True, a, b, store=store)
        client = h.Client(transport=transport, timeout=5.0)
        store.hook = transport.close
        seen: list[str] = []

        def waiting() -> None:
            seen.append(execute_sync(raised(_sync(client.get, a.url + "/v1/x"))))

        with Answered() as answered:
            thread = threading.Thread(target=waiting)
            thread.start()
            try:
                wait_for(lambda: answered.count == 1)
                started = time.monotonic()
                with h.Client(transport=transport, timeout=5.0) as other:
                    text = other.get(b.url + "/v1/x").text
            finally:
                thread.join(WAIT * 2)
            took = time.monotonic() - started
        assert (seen, text) == (["ReadError"], "b")
        assert took < WAIT / 3
        assert (a.calls, b.calls) == (1, 1)
    finally:
        store.close()


def execute_sync(coroutine: Any) -> Any:
    """The value of a coroutine that never suspends."""
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("suspended")


# --- two event loops, one after the other, in one thread ---------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_close_in_a_later_event_loop_of_the_same_thread_leaves_an_earlier_ones_wait(
    flavour: str, a: Upstream, b: Upstream
) -> None:
    """A request waits out A's 1.5 s `retry-after-ms` in an asyncio loop that stopped
    running (its task left pending); the same thread then closes the transport in a new
    loop. That close does not reach into the stopped loop: the new loop stays idle (no
    cancellation delivered over and over to a task that cannot run, spinning it), and
    the waiting request, once its loop runs again, ends with the ReadError of a request
    the close found in flight, having sent nothing more."""
    h = flavour_of(flavour)
    transport = waiting_long(h, False, a, b)
    a.behaviour = lambda _: Respond(503, body="busy", headers={"retry-after-ms": "1500"})
    client = h.AsyncClient(transport=transport, timeout=5.0)
    first = asyncio.new_event_loop()
    try:

        async def start() -> Any:
            task = asyncio.ensure_future(client.get(a.url + "/v1/x"))
            await until(lambda: len(transport._sleeping) == 1)
            return task

        task = first.run_until_complete(start())
        busy: list[float] = []

        async def close_then_idle() -> None:
            await transport.aclose()
            started = time.thread_time()
            await asyncio.sleep(1.0)
            busy.append(time.thread_time() - started)

        asyncio.run(close_then_idle())
        assert busy[0] < 0.1  # an idle loop, not one spinning for the whole second
        assert first.run_until_complete(raised(task)) == "ReadError"
    finally:
        first.close()
    assert (a.calls, b.calls) == (1, 0)
    assert transport._sleeping == {}
