"""Closing a client while one of its requests is in flight counts against no upstream.

When the application closes its client — `client.close()` from another
thread, `await client.aclose()` in another task — or the transport it gave
that client, the request in flight fails with the flavour's `ReadError`
whatever it was doing: waiting for the head, for the first body byte, for
the rest of a body, or sending its own body. httpcore's read of a socket
closed under it raises anyio's or trio's `ClosedResourceError`, or `EBADF`
in a sync client, whose close is only seen once the read's timeout runs out
(over TLS, a sync read ends as a plain end of stream: `RemoteProtocolError`).

That is the application's own doing, not the upstream's. Under sidestep the
error reaches the caller as it would plain, records nothing against any
scope, emits no failure, and nothing more of the request is sent: no retry,
no failover. A real reset or hang-up by the upstream still counts. Each case
runs over real sockets on 127.0.0.1 for httpx and httpx2, sync (the close in
another thread), asyncio and trio (the close in another task).
"""

from __future__ import annotations

import ssl
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import anyio
import httpx
import httpx2
import pytest
import trustme

import sidestep
import sidestep.httpx2
from differential import (
    FLAVOURS,
    KINDS,
    Face,
    Observer,
    Program,
    World,
    describe,
    differences,
    drive,
    run,
    world,
)
from drivers import route
from sidestep._answers.classify import ErrorKind, Exchange, Kind, Verdict, classify
from sidestep._common.scopes import ScopeKind
from sidestep._settings.values import SidestepConfigWarning
from sidestep.logging import add_observer, remove_observer
from upstream import IN_TIME, Hangup, HeadersThenHang, Reset, Respond, Stream, Upstream, wait_for

# The read budget of a request the program closes under. A sync client's close is seen
# only when its blocked read times out (httpcore's socket close does not wake it): long
# enough for the closing thread to act first on a loaded machine, short enough to wait.
READ = IN_TIME
THRESHOLD = 3  # the default breaker.failure_threshold: this many strikes open a scope
FAILURE_EVENTS = {"upstream.failed", "failover", "circuit.opened", "circuit.half_open"}


# --- closing while a call is in flight -------------------------------------------------------


async def settled(call: Awaitable[Any]) -> tuple[str, Any]:
    """What `call` gave (a response as the caller sees it) or the type of what it raised."""
    try:
        value = await call
    except Exception as exc:  # the exception's type is the observation
        return ("raised", type(exc).__name__)
    return ("returned", describe(value) if hasattr(value, "status_code") else value)


async def closing(
    sync: bool,
    call: Awaitable[Any],
    close: Callable[[], Awaitable[None]],
    ready: Callable[[], bool],
) -> tuple[str, Any]:
    """Await `call` while `close()` runs as soon as `ready()` holds; what `call` gave or raised.

    The close runs in a thread of its own for a sync client (whose `call` blocks this
    one), in a task of its own for an async one.
    """
    seen: tuple[str, Any] = ("nothing", None)
    done = threading.Event()  # the call ended: a close not made yet is not made at all

    async def attempt() -> None:
        nonlocal seen
        try:
            seen = await settled(call)
        finally:
            done.set()

    if sync:

        def closer() -> None:
            wait_for(lambda: ready() or done.is_set())
            if not done.is_set():
                drive(close())  # a sync client's close never suspends

        thread = threading.Thread(target=closer)
        thread.start()
        try:
            await attempt()
        finally:
            thread.join(10.0)
        return seen

    async def acloser() -> None:
        with anyio.fail_after(60.0):  # bounds a hang only
            while not (ready() or done.is_set()):  # noqa: ASYNC110  # conditions of threads
                await anyio.sleep(0.005)
        if not done.is_set():
            await close()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(acloser)
        await attempt()
    return seen


async def close_transport(sync: bool, transport: Any) -> None:
    if sync:
        transport.close()
    else:
        await transport.aclose()


async def next_chunk(sync: bool, chunks: Any) -> bytes:
    if sync:
        return bytes(next(chunks))
    return bytes(await chunks.__anext__())


def raw_chunks(sync: bool, response: Any) -> Any:
    return response.iter_raw() if sync else response.aiter_raw()


# --- the programs: run plain and under install() ---------------------------------------------


async def closed_waiting_for_the_head(h: Any, w: World, o: Observer) -> None:
    """Clients closed while their request waits for the head, then a transport the program
    gave its client; then the same endpoint, answered."""
    origin = w.origins["a"]
    url = w.a + "/held"
    timeout = h.Timeout(5.0, read=READ)

    def arrived() -> Callable[[], bool]:
        before = origin.arrived("/held")
        return lambda: origin.arrived("/held") > before

    for n in range(THRESHOLD):
        c = w.client(timeout=timeout)
        o.see(f"client closed {n}", await closing(w.sync, c.get(url), c.close, arrived()))
    transport = w.transport()
    c = w.client(transport=transport, timeout=timeout)
    o.see(
        "its transport closed",
        await closing(w.sync, c.get(url), lambda: close_transport(w.sync, transport), arrived()),
    )
    await c.close()
    origin.release.set()
    async with w.client(timeout=timeout) as c:
        await o.outcome("the same endpoint, answered", c.get(url))


async def closed_reading_the_body(h: Any, w: World, o: Observer) -> None:
    """Clients, then a transport, closed while the program reads a streamed body between
    its chunks; then the same endpoint, whole."""
    url = w.a + "/held-stream"
    timeout = h.Timeout(5.0, read=READ)
    for n, what in enumerate(["client"] * (THRESHOLD - 1) + ["transport"]):
        transport = w.transport()
        c = w.client(transport=transport, timeout=timeout)

        async def close(c: Face = c, transport: Any = transport, what: str = what) -> None:
            await (c.close() if what == "client" else close_transport(w.sync, transport))

        async with c.stream("GET", url) as r:
            chunks = raw_chunks(w.sync, r)
            o.see(f"{what} {n}: the first chunk", await next_chunk(w.sync, chunks))
            o.see(
                f"{what} {n} closed: the next chunk",
                await closing(w.sync, next_chunk(w.sync, chunks), close, lambda: True),
            )
        await c.close()
    w.origins["a"].release.set()

    async def whole() -> bytes:
        async with w.client(timeout=timeout) as c, c.stream("GET", url) as r:
            return b"".join(await c.collect(r, "raw"))

    o.see("the same endpoint, whole", await settled(whole()))


PROGRAMS = [
    Program(fn.__name__, fn, frozenset(), has_aside=False)
    for fn in (closed_waiting_for_the_head, closed_reading_the_body)
]
CASES = [
    pytest.param(prog, flavour, kind, id=f"{prog.name}-{flavour}-{kind}")
    for prog in PROGRAMS
    for flavour in FLAVOURS
    for kind in KINDS
]


@pytest.fixture(scope="module")
def servers() -> Iterator[World]:
    """Two origins on 127.0.0.1, shared by the module; each run resets them."""
    with world() as w:
        yield w


class Recorder:
    """Every event sidestep emits while it is added, with its fields."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Mapping[str, Any]]] = []

    def __call__(self, event: str, fields: Mapping[str, Any], /) -> None:
        self.seen.append((event, fields))

    def names(self) -> set[str]:
        return {event for event, _ in self.seen}

    def __enter__(self) -> Recorder:
        add_observer(self)
        return self

    def __exit__(self, *exc: object) -> None:
        remove_observer(self)


@pytest.mark.parametrize(("prog", "flavour", "kind"), CASES)
def test_a_client_closed_mid_request_observes_what_plain_does_and_counts_nothing(
    prog: Program, flavour: str, kind: str, servers: World
) -> None:
    """Under install(), every request closed under raises the ReadError it raises plain, and
    the endpoint answers afterwards as plain: never failed fast after `failure_threshold`
    closes. (A scope it had kept would be forgotten at that answer: the next test looks at
    the events.)"""
    plain = run(prog, flavour, kind, servers, installed=False)
    store = sidestep.MemoryStore()
    installed = run(prog, flavour, kind, servers, installed=True, store=store)
    assert differences(plain.strict, installed.strict) == []
    closed = [seen for label, seen in plain.strict if "closed" in label]
    assert len(closed) == THRESHOLD + (prog.name == "closed_waiting_for_the_head")
    assert all(seen == ("raised", "ReadError") for seen in closed)
    assert store.snapshot(time.monotonic()) == []


@pytest.mark.parametrize(("prog", "flavour", "kind"), CASES)
def test_a_client_closed_mid_request_emits_no_failure(
    prog: Program, flavour: str, kind: str, servers: World
) -> None:
    """Watched, the same program emits no failure, failover or transition: each attempt closed
    under is neutral, every other one a success."""
    store = sidestep.MemoryStore()
    with Recorder() as events:
        run(prog, flavour, kind, servers, installed=True, store=store)
    assert events.names() & FAILURE_EVENTS == set()
    results = [fields["result"] for event, fields in events.seen if event == "attempt.finished"]
    assert set(results) <= {"success", "neutral"}
    if prog.name == "closed_waiting_for_the_head":
        assert results.count("neutral") == THRESHOLD + 1
    assert store.snapshot(time.monotonic()) == []


# --- routed requests: no failover, no retry, nothing recorded --------------------------------


def execute(kind: str, fn: Callable[[], Awaitable[None]]) -> None:
    """Run `fn` without an event loop (sync: it never suspends) or under anyio's `kind`."""
    if kind == "sync":
        drive(fn())  # type: ignore[arg-type]
    else:
        anyio.run(fn, backend=kind)


def flavour_of(name: str) -> Any:
    return httpx2 if name == "httpx2" else httpx


def headers_signal(h: Any, sync: bool, arrived: threading.Event, **kw: Any) -> Any:
    """An HTTP transport of `h` (built with `kw`) that sets `arrived` once a response's
    head is in."""
    if sync:

        class Signalling(h.HTTPTransport):  # type: ignore[misc,name-defined]
            def handle_request(self, request: Any) -> Any:
                response = super().handle_request(request)
                arrived.set()
                return response

        return Signalling(**kw)

    class AsyncSignalling(h.AsyncHTTPTransport):  # type: ignore[misc,name-defined]
        async def handle_async_request(self, request: Any) -> Any:
            response = await super().handle_async_request(request)
            arrived.set()
            return response

    return AsyncSignalling(**kw)


def assert_only_a_open(transport: Any) -> None:
    """The one scope the transport holds suspended is target A's, open: its failure counted."""
    (scope,) = transport.suspensions()
    assert (scope.target, scope.state) == ("a", "open")


def failover_transport(h: Any, sync: bool, config: Any, inner: Any, **kw: Any) -> Any:
    module: Any = sidestep.httpx2 if h is httpx2 else sidestep
    with warnings.catch_warnings():
        # failure_threshold: 1, so that a single strike would show
        warnings.simplefilter("ignore", SidestepConfigWarning)
        cls = module.FailoverTransport if sync else module.AsyncFailoverTransport
        return cls(config, transport=inner, **kw)


def retrying(a: Upstream, b: Upstream, **extra: Any) -> dict[str, Any]:
    """Route "chat" over A then B: two attempts per target, one strike opens a scope."""
    return route(
        ("a", a.url + "/v1"),
        ("b", b.url + "/v1"),
        breaker={"failure_threshold": 1},
        failover={"max_attempts_per_target": 2},
        **extra,
    )


def busy_for_a_moment(
    h: Any, sync: bool, a: Upstream, b: Upstream, wait: float = 0.5, **kw: Any
) -> Any:
    """A transport over `retrying` (built with `kw`), A answering 503 with a wait of `wait`
    seconds (within max_retry_wait's 5 s): retried in place."""
    ms = str(int(wait * 1000))
    a.behaviour = lambda _: Respond(503, body="busy", headers={"retry-after-ms": ms})
    inner = h.HTTPTransport() if sync else h.AsyncHTTPTransport()
    return failover_transport(h, sync, retrying(a, b), inner, **kw)


# The transport's clock: its own (monotonic), or one that reads the same at a send and
# at the close that follows it (a fake clock; Windows' `time.monotonic()` before Python
# 3.13, in 15.6 ms ticks), where the core orders them by its count of closes.
CLOCKS = {"monotonic": {}, "frozen": {"clock": lambda: 100.0}}


def client_over(h: Any, sync: bool, transport: Any) -> Face:
    cls = h.Client if sync else h.AsyncClient
    return Face(cls(transport=transport, timeout=h.Timeout(5.0, read=READ)), sync)


PHASES = ("head", "first byte", "body", "buffered")


def scripted(phase: str, gate: threading.Event) -> Any:
    """What A does in `phase`: hold the head; send the head only; send a first chunk and
    hold the rest (read by the caller, or buffered by a `commit: complete` route)."""
    if phase == "head":
        return lambda _: Respond(body="a", gate=gate)
    if phase == "first byte":
        return lambda _: HeadersThenHang()
    return lambda _: Stream([b"one", b"two"], release=gate)


async def closed_in(
    phase: str, sync: bool, c: Face, url: str, a: Upstream, headers_in: threading.Event
) -> tuple[str, Any]:
    """A request in `phase` whose client is closed under it: what it gave or raised."""
    if phase == "body":
        async with c.stream("GET", url) as r:
            chunks = raw_chunks(sync, r)
            assert await next_chunk(sync, chunks) == b"one"
            return await closing(sync, next_chunk(sync, chunks), c.close, lambda: True)
    before = a.calls
    ready = (lambda: a.calls > before) if phase == "head" else headers_in.is_set
    return await closing(sync, c.get(url), c.close, ready)


def plain_then_sidestep(
    flavour: str, kind: str, phase: str, a: Upstream, b: Upstream, **inner: Any
) -> tuple[dict[str, Any], Any]:
    """A GET in `phase` closed under it: through a plain client, then through a failover
    transport over `retrying` (its inner transport built with `inner`). What each gave or
    raised, the events under sidestep, and that transport."""
    h, sync = flavour_of(flavour), kind == "sync"
    gate = threading.Event()
    a.behaviour = scripted(phase, gate)
    url = a.url + "/v1/x"
    config = retrying(a, b, route={"commit": "complete"} if phase == "buffered" else {})
    seen: dict[str, Any] = {}

    async def both() -> None:
        headers_in = threading.Event()
        plain = client_over(h, sync, headers_signal(h, sync, headers_in, **inner))
        seen["plain"] = await closed_in(phase, sync, plain, url, a, headers_in)
        headers_in = threading.Event()
        inner_transport = headers_signal(h, sync, headers_in, **inner)
        seen["transport"] = failover_transport(h, sync, config, inner_transport)
        c = client_over(h, sync, seen["transport"])
        with Recorder() as events:
            seen["sidestep"] = await closed_in(phase, sync, c, url, a, headers_in)
        seen["events"] = events.names()

    try:
        execute(kind, both)
    finally:
        gate.set()
    return seen, seen.pop("transport")


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_closing_mid_request_neither_fails_over_nor_counts(
    flavour: str, kind: str, phase: str, a: Upstream, b: Upstream
) -> None:
    """A routed GET whose client is closed under it — waiting for the head, for the first body
    byte, reading the body, or while a `commit: complete` route buffers it — raises what it
    raises plain; A is sent it once (no retry), B never (no failover), no scope is kept and no
    failure is emitted, with one strike enough to open a scope."""
    seen, transport = plain_then_sidestep(flavour, kind, phase, a, b)
    assert seen["plain"] == ("raised", "ReadError")
    assert seen["sidestep"] == seen["plain"]
    assert (a.calls, b.calls) == (2, 0)  # once plain, once under sidestep
    assert transport.suspensions() == []
    assert seen["events"] & FAILURE_EVENTS == set()


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    """A certificate authority of the tests' own, for TLS upstreams on 127.0.0.1."""
    return trustme.CA()


@pytest.fixture
def a_over_tls(authority: trustme.CA) -> Iterator[Upstream]:
    """Upstream "a", over TLS, with a certificate for 127.0.0.1 from `authority`."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    server = Upstream(name="a", tls=context)
    yield server
    server.close()


@pytest.mark.parametrize("phase", ["head", "body"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_closing_mid_request_over_tls_neither_fails_over_nor_counts(
    flavour: str, kind: str, phase: str, a_over_tls: Upstream, b: Upstream, authority: trustme.CA
) -> None:
    """Over TLS the same holds. A sync client's TLS socket closed under a read ends as an
    upstream's end of stream would (a RemoteProtocolError with nothing of the close in its
    chain), so there the transport's own close is what tells the core. Which of the two a
    sync client gets, plain as well, depends on whether the close came before its read
    began: either is passed on as it came."""
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)
    seen, transport = plain_then_sidestep(flavour, kind, phase, a_over_tls, b, verify=trusting)
    if kind == "sync":
        either = {("raised", "ReadError"), ("raised", "RemoteProtocolError")}
        assert {seen["plain"], seen["sidestep"]} <= either
    else:
        assert seen["plain"] == ("raised", "ReadError")
        assert seen["sidestep"] == seen["plain"]
    assert (a_over_tls.calls, b.calls) == (2, 0)
    assert transport.suspensions() == []
    assert seen["events"] & FAILURE_EVENTS == set()


@pytest.mark.parametrize("clock", sorted(CLOCKS))
@pytest.mark.parametrize("kind", ["asyncio", "trio"])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_client_closed_while_a_request_waits_to_retry_sends_nothing_more(
    flavour: str, kind: str, clock: str, a: Upstream, b: Upstream
) -> None:
    """A 503 with a `retry-after-ms` of 4 s (which the close surely comes within) is retried
    in place; closed during that wait, the request ends with the flavour's ReadError, as one
    in flight on a closed client does, and neither A nor B is sent anything more, on either
    clock. The 503 itself was real: it counts."""
    h = flavour_of(flavour)
    transport = busy_for_a_moment(h, False, a, b, wait=4.0, **CLOCKS[clock])
    seen, _ = closed_after_a_503(kind, h, transport, a.url + "/v1/x")
    assert seen == ("raised", "ReadError")
    assert (a.calls, b.calls) == (1, 0)
    assert_only_a_open(transport)


def closed_after_a_503(kind: str, h: Any, transport: Any, url: str) -> tuple[Any, float]:
    """GET `url` through a client of `h` (a sync one when `kind` is "sync") over
    `transport`, closing the client once a 503 has come back: what the request gave or
    raised (`settled`), and how long it took."""
    sync = kind == "sync"
    answered = threading.Event()

    def on_event(event: str, fields: Mapping[str, Any], /) -> None:
        if event == "attempt.finished" and fields["status"] == 503:
            answered.set()

    seen: list[tuple[str, Any]] = []
    took: list[float] = []

    async def go() -> None:
        c = client_over(h, sync, transport)
        started = time.monotonic()
        seen.append(await closing(sync, c.get(url), c.close, answered.is_set))
        took.append(time.monotonic() - started)

    add_observer(on_event)
    try:
        execute(kind, go)
    finally:
        remove_observer(on_event)
    return seen[0], took[0]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_client_closed_before_a_retry_gets_the_failure_as_it_came(
    flavour: str, a: Upstream, b: Upstream
) -> None:
    """Closed as the 503 came back, before the wait for the retry began (the application's
    hook runs in the request's thread), the request ends with that 503 as it came, body
    included, and nothing more is sent to A or B."""
    h = flavour_of(flavour)
    transport = busy_for_a_moment(h, True, a, b)
    client = h.Client(transport=transport, timeout=5.0)

    def on_event(event: str, fields: Mapping[str, Any], /) -> None:
        if event == "attempt.finished" and fields["status"] == 503:
            client.close()

    add_observer(on_event)
    try:
        response = client.get(a.url + "/v1/x")
    finally:
        remove_observer(on_event)
    assert (response.status_code, response.text) == (503, "busy")
    assert (a.calls, b.calls) == (1, 0)
    assert_only_a_open(transport)


@pytest.mark.parametrize("clock", sorted(CLOCKS))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_transport_shared_by_clients_serves_on_after_one_of_them_closed_it(
    flavour: str, kind: str, clock: str, a: Upstream, b: Upstream
) -> None:
    """One failover transport under two clients in turn: the first client's close holds back
    only what was in flight then. The second client's request, sent afterwards, is retried,
    fails over and counts as before, on either clock."""
    h, sync = flavour_of(flavour), kind == "sync"
    transport = busy_for_a_moment(h, sync, a, b, **CLOCKS[clock])
    seen: list[Any] = []

    async def go() -> None:
        async with client_over(h, sync, transport) as first:
            seen.append((await first.get(b.url + "/v1/x")).text)  # b's own answer
        async with client_over(h, sync, transport) as second:
            r = await second.get(a.url + "/v1/x")
            seen.append((r.status_code, r.text, r.extensions["sidestep"]["attempts"]))

    execute(kind, go)
    assert seen == ["b", (200, "b", 3)]  # A twice (503, then 503 after its wait), then B
    assert_only_a_open(transport)


# --- a real failure still counts --------------------------------------------------------------

REAL = {
    "reset": lambda _: Reset(),
    "hangup": lambda _: Hangup(),
}


@pytest.mark.parametrize("failure", sorted(REAL))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_real_reset_or_hangup_still_fails_over_and_counts(
    flavour: str, kind: str, failure: str, a: Upstream, b: Upstream
) -> None:
    """An upstream that resets the connection (RST) or hangs up (FIN) before answering is a
    failure of A, never taken for a local close: the GET fails over to B and A's scope opens."""
    h, sync = flavour_of(flavour), kind == "sync"
    a.behaviour = REAL[failure]
    config = route(("a", a.url + "/v1"), ("b", b.url + "/v1"), breaker={"failure_threshold": 1})
    transport = failover_transport(
        h, sync, config, h.HTTPTransport() if sync else h.AsyncHTTPTransport()
    )
    seen: list[Any] = []

    async def go() -> None:
        async with client_over(h, sync, transport) as c:
            with Recorder() as events:
                r = await c.get(a.url + "/v1/x")
            seen.extend([r.status_code, r.text, events.names()])

    execute(kind, go)
    status, text, names = seen
    assert (status, text) == (200, "b")
    assert {"upstream.failed", "failover", "circuit.opened"} <= names
    assert_only_a_open(transport)


@pytest.mark.parametrize("failure", [*sorted(REAL), "cut"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_an_unrouted_real_failure_raises_as_plain_and_counts(
    flavour: str, kind: str, failure: str, a: Upstream
) -> None:
    """With no route, a reset, a hang-up or a body cut off by the upstream raises what it
    raises plain, and is recorded against the request's endpoint and its origin."""
    h, sync = flavour_of(flavour), kind == "sync"
    a.behaviour = REAL.get(failure, lambda _: Stream([b"one", b"two"], cut_after=1))
    module: Any = sidestep.httpx2 if h is httpx2 else sidestep
    transport = (
        module.FailoverTransport(transport=h.HTTPTransport())
        if sync
        else module.AsyncFailoverTransport(transport=h.AsyncHTTPTransport())
    )
    seen: dict[str, tuple[str, Any]] = {}

    async def one(c: Face) -> tuple[str, Any]:
        try:
            async with c.stream("GET", a.url + "/x") as r:
                return ("returned", b"".join(await c.collect(r, "raw")))
        except Exception as exc:
            return ("raised", type(exc).__name__)

    async def both() -> None:
        plain = client_over(h, sync, h.HTTPTransport() if sync else h.AsyncHTTPTransport())
        async with plain:
            seen["plain"] = await one(plain)
        async with client_over(h, sync, transport) as c:
            seen["sidestep"] = await one(c)

    execute(kind, both)
    assert seen["plain"][0] == "raised"
    assert seen["sidestep"] == seen["plain"]
    # the endpoint's first failure since the origin last answered well: both count it
    scopes = {(s.scope, s.failures) for s in transport.suspensions()}
    assert scopes == {("origin+endpoint", 1), ("origin", 1)}


# --- a replacement classifier --------------------------------------------------------------


def test_a_replacement_classifier_is_not_asked_about_a_local_close(
    a: Upstream, b: Upstream
) -> None:
    """A classifier that counts every error as an outage does not see a local close: the core
    gives its neutral verdict itself, so the close still counts for nothing."""
    asked: list[ErrorKind | None] = []

    def harsh(x: Exchange) -> Verdict:
        asked.append(x.error)
        if x.error is not None:
            return Verdict(Kind.FAILURE, "unavailable", ScopeKind.MODEL, failover=True)
        return classify(x)

    gate = threading.Event()
    a.behaviour = lambda _: Respond(body="a", gate=gate)
    config = route(("a", a.url + "/v1"), ("b", b.url + "/v1"), breaker={"failure_threshold": 1})
    config["classifier"] = harsh
    transport = failover_transport(httpx, False, config, httpx.AsyncHTTPTransport())
    seen: list[tuple[str, Any]] = []

    async def go() -> None:
        c = client_over(httpx, False, transport)
        seen.append(await closing(False, c.get(a.url + "/v1/x"), c.close, lambda: a.calls > 0))

    try:
        execute("asyncio", go)
    finally:
        gate.set()
    assert seen == [("raised", "ReadError")]
    assert asked == []
    assert (a.calls, b.calls) == (1, 0)
    assert transport.suspensions() == []
