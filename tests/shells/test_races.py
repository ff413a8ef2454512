"""The `Race` effect as each shell performs it, against real upstreams on 127.0.0.1.

The branches here are small generators of effects (send, read the first byte), not the
core's attempts: what is under test is the shells' part — the second branch started
only after the delay, the first result that ends the race handed back, the loser
cancelled and its connection closed (never left in the pool), the caller's
cancellation reaching both. Inner transports hold two connections at most, so a leaked
connection shows as a pool that cannot serve two requests more.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Generator
from typing import Any

import anyio
import httpx
import pytest

import sidestep
from drivers import Driver
from sidestep._core.effects import NOT_RUN, Close, Race, Raced, Read, Send
from sidestep._shells.races import Lost
from upstream import IN_TIME, Hang, Respond, Upstream, wait_for

Steps = Generator[Any, Any, Any]
# The delay of a race whose first branch answers at once: far longer than any answer
# on 127.0.0.1 takes, however busy the machine, so the second branch never starts.
LONG = 30.0
# The delay of a race whose first branch is held back: the second starts at once.
SHORT = 0.01
TIMEOUTS = {"connect": IN_TIME, "read": 60.0, "write": IN_TIME, "pool": IN_TIME}


def attempt(request: Any) -> Steps:
    """One attempt, as the core makes one: send, read the first byte, close it if cut short."""
    response = yield Send(request, None)
    try:
        yield Read(response, request, 1, None)
    except BaseException:
        yield Close(response)
        raise
    return response


def discard(response: Any) -> Steps:
    yield Close(response)


def ends(response: Any) -> bool:
    return bool(response.status_code == 200)


@pytest.fixture
def driver(kind: str) -> Any:
    built = Driver(kind, None, limits=_limits(kind))
    yield built
    built.close()


def _limits(kind: str) -> Any:
    module: Any = __import__("httpx2" if kind.startswith("httpx2") else "httpx")
    return module.Limits(max_connections=2, max_keepalive_connections=2)


def race(
    driver: Driver,
    first: Upstream,
    second: Upstream | None,
    delay: float,
    ends: Any = ends,
) -> Raced:
    """Run a race of `first` against `second` (None: nothing to start) through the driver's
    shell, and return what it came to."""
    http = driver.http

    def request(upstream: Upstream) -> Any:
        return http.Request("GET", upstream.url + "/x", extensions={"timeout": TIMEOUTS})

    def hedge() -> Steps | None:
        return None if second is None else attempt(request(second))

    def steps() -> Steps:
        raced = yield Race(attempt(request(first)), hedge, delay, ends, discard)
        return raced

    shell = driver.transport
    if driver.is_async:
        result: Raced = driver.run(shell._drive(steps()))
    else:
        result = shell._drive(steps())
    return result


def body(driver: Driver, response: Any) -> bytes:
    if driver.is_async:
        return bytes(driver.run(response.aread()))
    return bytes(response.read())


def pool_serves_two_more(driver: Driver, upstream: Upstream) -> None:
    """Two requests at once still get a connection each: none was left taken (leaked)."""
    upstream.behaviour = lambda seen: Respond(body="again")
    results = driver.many(2, "GET", upstream.url + "/again")
    assert [getattr(r, "text", r) for r in results] == ["again", "again"]


def test_an_answer_before_the_delay_starts_no_second_branch(
    driver: Driver, a: Upstream, b: Upstream
) -> None:
    """A first branch that ends the race before the delay wins alone: the second never starts."""
    raced = race(driver, a, b, LONG)
    assert (raced.winner, raced.started) == (0, False)
    assert body(driver, raced.results[0]) == b"a"
    assert raced.results[1] is NOT_RUN
    assert b.calls == 0


def test_a_failure_before_the_delay_is_handed_back_at_once(
    driver: Driver, a: Upstream, b: Upstream
) -> None:
    """A first branch that fails before the delay ends the race with no winner and no hedge."""
    a.behaviour = lambda seen: Respond(503, b"down")
    raced = race(driver, a, b, LONG)
    assert (raced.winner, raced.started) == (None, False)
    assert raced.results[0].status_code == 503
    body(driver, raced.results[0])
    assert b.calls == 0


def test_the_hedge_wins_and_the_slow_first_is_closed(
    driver: Driver, a: Upstream, b: Upstream
) -> None:
    """A first branch held back past the delay loses to the second; its connection is closed,
    and the pool of two still serves two requests at once."""
    gate = threading.Event()
    a.behaviour = lambda seen: Respond(body=b"late", gate=gate)
    try:
        raced = race(driver, a, b, SHORT)
        assert (raced.winner, raced.started) == (1, True)
        assert body(driver, raced.results[1]) == b"b"
        assert raced.results[0] is NOT_RUN
    finally:
        gate.set()  # a sync loser learns it lost when its answer comes
    wait_for(lambda: a.open_connections == 0)
    pool_serves_two_more(driver, a)


def test_the_first_wins_after_the_hedge_started_and_the_hedge_is_closed(
    driver: Driver, a: Upstream, b: Upstream
) -> None:
    """When the first branch answers after the second started, it wins and the second's
    connection is closed."""
    gate = threading.Event()
    b_gate = threading.Event()

    def first(seen: Any) -> Respond:
        return Respond(body=b"a", gate=gate)

    def second(seen: Any) -> Respond:
        gate.set()  # the hedge has reached b: the first may answer now
        return Respond(body=b"b", gate=b_gate)

    a.behaviour, b.behaviour = first, second
    try:
        raced = race(driver, a, b, SHORT)
        assert (raced.winner, raced.started) == (0, True)
        assert body(driver, raced.results[0]) == b"a"
    finally:
        b_gate.set()
    wait_for(lambda: b.open_connections == 0)
    pool_serves_two_more(driver, b)


def test_a_failure_waits_for_the_other_branch(driver: Driver, a: Upstream, b: Upstream) -> None:
    """A result that does not end the race (a 503) waits for the other branch's, and both are
    handed back: here the first fails after the hedge started, and then the hedge answers."""
    gate = threading.Event()
    b_gate = threading.Event()

    def first(seen: Any) -> Respond:
        return Respond(503, b"down", gate=gate)

    def second(seen: Any) -> Respond:
        gate.set()  # the hedge has reached b: the first may fail now
        return Respond(body=b"b", gate=b_gate)

    def judged(response: Any) -> bool:
        if response.status_code == 503:
            b_gate.set()  # the first's failure is in: the hedge may answer now
        return ends(response)

    a.behaviour, b.behaviour = first, second
    try:
        raced = race(driver, a, b, SHORT, judged)
    finally:
        b_gate.set()
    assert (raced.winner, raced.started) == (1, True)
    assert raced.results[0].status_code == 503
    body(driver, raced.results[0])
    assert body(driver, raced.results[1]) == b"b"


def test_both_failing_hand_back_both(driver: Driver, a: Upstream, b: Upstream) -> None:
    """When neither result ends the race, there is no winner and both results come back."""
    gate = threading.Event()

    def first(seen: Any) -> Respond:
        return Respond(503, b"down", gate=gate)

    def second(seen: Any) -> Respond:
        gate.set()
        return Respond(502, b"bad")

    a.behaviour, b.behaviour = first, second
    raced = race(driver, a, b, SHORT)
    assert (raced.winner, raced.started) == (None, True)
    assert [r.status_code for r in raced.results] == [503, 502]
    for response in raced.results:
        body(driver, response)


def test_nothing_to_hedge_to_waits_for_the_first(driver: Driver, a: Upstream) -> None:
    """A second branch the core does not give (None) is not started: the first is awaited."""
    gate = threading.Event()
    a.behaviour = lambda seen: Respond(body=b"late", gate=gate)
    threading.Timer(0.2, gate.set).start()
    raced = race(driver, a, None, SHORT)
    assert (raced.winner, raced.started) == (0, False)
    assert body(driver, raced.results[0]) == b"late"


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.anyio
async def test_cancelling_the_caller_cancels_both_branches(a: Upstream, b: Upstream) -> None:
    """A caller cancelled while both branches wait cancels both: neither connection stays open,
    and the pool of two serves two requests at once after it."""
    a.behaviour = b.behaviour = lambda seen: Hang()
    inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=2))
    shell = sidestep.AsyncFailoverTransport(transport=inner)

    def request(upstream: Upstream) -> httpx.Request:
        return httpx.Request("GET", upstream.url + "/x", extensions={"timeout": TIMEOUTS})

    def hedge() -> Steps:
        return attempt(request(b))

    def steps() -> Steps:
        return (yield Race(attempt(request(a)), hedge, SHORT, ends, discard))

    async with anyio.create_task_group() as group:
        group.start_soon(shell._drive, steps())
        await anyio.to_thread.run_sync(lambda: wait_for(lambda: a.calls == 1 and b.calls == 1))
        group.cancel_scope.cancel()
    await anyio.to_thread.run_sync(
        lambda: wait_for(lambda: a.open_connections == 0 and b.open_connections == 0)
    )
    a.behaviour = lambda seen: Respond(body=b"again")
    answers: list[str] = []

    async def again(client: httpx.AsyncClient) -> None:
        answers.append((await client.get(a.url + "/again")).text)

    client = httpx.AsyncClient(transport=shell, timeout=IN_TIME)
    async with client, anyio.create_task_group() as group:
        for _ in range(2):
            group.start_soon(again, client)
    assert answers == ["again", "again"]


def test_a_branch_that_raises_closes_what_the_other_got(
    driver: Driver, a: Upstream, b: Upstream
) -> None:
    """A branch whose own code fails (as a logger raising would) ends the race with its
    error, and the answer the other branch had handed back (a 503, waiting for the first
    to end the race) is closed, not left to the collector; the pool of two still serves
    two requests at once."""
    gate = threading.Event()
    a.behaviour = lambda seen: Respond(body=b"late", gate=gate)
    b.behaviour = lambda seen: Respond(503, b"down" * 1000)
    http = driver.http
    handed: list[Any] = []

    def request(upstream: Upstream) -> Any:
        return http.Request("GET", upstream.url + "/x", extensions={"timeout": TIMEOUTS})

    def failing() -> Steps:
        response = yield from attempt(request(a))
        yield Close(response)
        raise RuntimeError("the branch's own failure")

    def waits(response: Any) -> bool:
        handed.append(response)
        gate.set()  # the 503 is handed back: now the first answers, and fails
        return False

    def steps() -> Steps:
        return (yield Race(failing(), lambda: attempt(request(b)), SHORT, waits, discard))

    def run() -> Any:
        if driver.is_async:
            return driver.run(driver.transport._drive(steps()))
        return driver.transport._drive(steps())

    try:
        with pytest.raises(RuntimeError, match="own failure"):
            run()
    finally:
        gate.set()
    assert [r.status_code for r in handed] == [503]
    assert handed[0].is_closed
    pool_serves_two_more(driver, b)


@pytest.mark.parametrize(("version", "cut"), [(b"HTTP/1.1", True), (b"HTTP/2", False)])
def test_a_loss_shuts_down_an_http1_connection_only(version: bytes, cut: bool) -> None:
    """A sync loser reading its body has its connection's socket shut down when it loses,
    over HTTP/1.1; over HTTP/2 the connection carries other requests' streams, and is left
    alone. (A connected pair of sockets stands for the connection.)"""
    mine, peer = socket.socketpair()
    try:
        stream = type("Stream", (), {"get_extra_info": lambda self, key: mine})()
        response = type("Answer", (), {})()
        response.extensions = {"http_version": version, "network_stream": stream}
        lost = Lost()
        with lost.aborting(response):
            lost.set()
        peer.settimeout(IN_TIME)
        if cut:
            assert peer.recv(1) == b""  # the end of the connection, seen from the other side
        else:
            mine.sendall(b"x")
            assert peer.recv(1) == b"x"
    finally:
        mine.close()
        peer.close()
