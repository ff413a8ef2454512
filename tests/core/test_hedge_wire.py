"""Hedged requests through every transport, against real upstreams on 127.0.0.1.

A first target held back past the hedge's delay (by a gate the test opens once the
request is over, never by a fixed sleep) loses to the next candidate; the loser's
connection is closed and nothing stays taken in a pool of two connections. What may
not be hedged (a POST with no Idempotency-Key) is never sent twice.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest

import sidestep
from drivers import Driver, MakeDriver, route
from sidestep import testing
from sidestep._settings.values import SidestepConfigWarning
from sidestep._state.memory import MemoryStore
from upstream import IN_TIME, Hang, HeadersThenHang, Respond, Stream, Upstream, wait_for

# A hedge delay a held-back first target always outlasts (the gate opens only after the
# request is over), and one no answer on 127.0.0.1 takes, however busy the machine.
SHORT = 0.01
LONG = 30.0
POOL = {"max_connections": 2, "max_keepalive_connections": 2}
KEY = {"idempotency-key": "k-1"}  # a POST that may be sent twice


def hedged(*targets: Upstream, delay: float = SHORT, **hedge: Any) -> dict[str, Any]:
    """One route over `targets`, hedged after `delay` with a budget of every request."""
    return route(
        *((t.name, t.url + "/v1") for t in targets),
        route={"hedge": {"delay": delay, "budget": 1.0, **hedge}},
    )


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An event a held-back upstream waits for; set when the test ends, whatever happened."""
    event = threading.Event()
    yield event
    event.set()


def build(make: MakeDriver, config: dict[str, Any], kind: str) -> Driver:
    module: Any = __import__("httpx2" if kind.startswith("httpx2") else "httpx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)
        return make(config, limits=module.Limits(**POOL), timeout=IN_TIME * 5)


def open_when(gate: threading.Event, condition: Callable[[], bool]) -> None:
    """Set `gate` from a thread of its own once `condition()` holds: a held answer comes
    only after what the test waits for has happened."""

    def wait() -> None:
        wait_for(condition)
        gate.set()

    threading.Thread(target=wait, daemon=True).start()


def told_of(
    events: list[tuple[str, dict[str, Any]]], outcome: str | None = None
) -> Callable[[], bool]:
    """Whether a `hedge.finished` (with `outcome`, if given) has been told."""
    return lambda: any(
        e == "hedge.finished" and outcome in (None, f.get("outcome")) for e, f in list(events)
    )


def nothing_held(d: Driver, upstream: Upstream) -> bool:
    """No connection to `upstream` in the client's pool is taken by a request."""
    return all(d.pooled(upstream.port))


def test_a_slow_first_target_loses_to_the_hedge(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream, gate: threading.Event
) -> None:
    """After the delay with no answer from the first target, the next is sent the request; its
    answer is handed over, attributed as hedged, with both attempts counted."""
    a.behaviour = lambda seen: Respond(body=b"late", gate=gate)
    d = build(make, hedged(a, b), kind)
    got = d.get(a.url + "/v1/x")
    assert got.text == "b"
    assert got.extensions["sidestep"] == {
        "route": "chat",
        "target": "b",
        "attempts": 2,
        "failover": True,
        "hedged": True,
    }
    wait_for(lambda: a.calls == 1)  # (its server may note the request after b answered)
    assert b.calls == 1


def test_an_answer_within_the_delay_sends_no_hedge(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream
) -> None:
    """A first target that answers before the delay is the only one sent the request."""
    d = build(make, hedged(a, b, delay=LONG), kind)
    got = d.get(a.url + "/v1/x")
    assert got.text == "a"
    assert got.extensions["sidestep"] == {
        "route": "chat",
        "target": "a",
        "failover": False,
        "attempts": 1,
    }
    assert b.calls == 0


def test_the_losers_connection_is_closed_and_a_pool_of_two_stays_free(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream
) -> None:
    """Three hedged requests in a row, each won by the hedge, through a pool of two
    connections: each loser's connection is given back, so none waits for one."""
    gates: list[threading.Event] = []

    def held(seen: Any) -> Respond:
        gates.append(threading.Event())
        return Respond(body=b"late", gate=gates[-1])

    a.behaviour = held
    d = build(make, hedged(a, b), kind)
    try:
        for n in range(3):
            assert d.get(a.url + "/v1/x").text == "b"
            wait_for(lambda n=n: len(gates) == n + 1)
            gates[n].set()  # a sync loser learns it lost when its answer comes
            wait_for(lambda: nothing_held(d, a) and nothing_held(d, b))
    finally:
        for event in gates:
            event.set()
    assert a.calls == 3


def test_a_loser_waiting_for_its_first_token_lets_go_of_its_connection_at_once(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream
) -> None:
    """A first attempt whose headers came but whose body never does loses to its hedge, and
    gives its connection back without waiting for its upstream or a timeout (its read
    timeout is two minutes): the sync loser's read is woken by its socket being shut
    down. Three in a row through a pool of two, and the loser counts as no failure."""
    a.behaviour = lambda seen: HeadersThenHang()
    module: Any = __import__("httpx2" if kind.startswith("httpx2") else "httpx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)
        d = make(hedged(a, b), limits=module.Limits(**POOL), timeout=4 * LONG)
    for _ in range(3):
        got = d.get(a.url + "/v1/x")
        assert got.text == "b"
        assert got.extensions["sidestep"]["hedged"] is True
        wait_for(lambda: nothing_held(d, a) and nothing_held(d, b))
    assert a.calls == 3
    assert d.transport.suspensions() == []


def test_a_post_without_an_idempotency_key_is_never_hedged(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream, gate: threading.Event
) -> None:
    """A POST that is not safe to send twice waits for its first target, however slow."""
    a.behaviour = lambda seen: Respond(body=b"late", gate=gate)
    threading.Timer(0.3, gate.set).start()
    d = build(make, hedged(a, b), kind)
    assert d.post(a.url + "/v1/x", json={"q": 1}).text == "late"
    assert b.calls == 0


def test_a_post_with_an_idempotency_key_is_hedged(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream, gate: threading.Event
) -> None:
    """A POST carrying an Idempotency-Key may be sent twice, so it is hedged."""
    a.behaviour = lambda seen: Respond(body=b"late", gate=gate)
    d = build(make, hedged(a, b), kind)
    got = d.post(a.url + "/v1/x", json={"q": 1}, headers={"idempotency-key": "k-1"})
    assert got.text == "b"
    assert got.extensions["sidestep"]["hedged"] is True
    assert b.seen[0].json() == {"q": 1}


def test_when_both_fail_the_request_goes_on_to_the_next_candidate(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream, c: Upstream
) -> None:
    """A first target and its hedge that both fail are both counted, and the request fails
    over to the candidate after the hedge's, as it would have without the hedge."""
    opened = threading.Event()

    def first(seen: Any) -> Respond:
        return Respond(503, b"down", gate=opened)

    def second(seen: Any) -> Respond:
        opened.set()  # the hedge reached b: the first may fail now
        return Respond(503, b"down too")

    a.behaviour, b.behaviour = first, second
    d = build(make, hedged(a, b, c), kind)
    got = d.get(a.url + "/v1/x")
    assert got.text == "c"
    assert got.extensions["sidestep"]["attempts"] == 3
    assert got.extensions["sidestep"]["hedged"] is True
    assert (a.calls, b.calls, c.calls) == (1, 1, 1)


def test_the_budget_bounds_the_hedges(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream
) -> None:
    """With a budget of half the requests and a bucket of one, the first slow request is
    hedged (the bucket starts full), the second is not (it holds half a hedge), the third
    is: each request adds half a hedge to the route's bucket."""
    gates: list[threading.Event] = []

    def held(seen: Any) -> Respond:
        gates.append(threading.Event())
        return Respond(body=b"late", gate=gates[-1])

    a.behaviour = held
    d = build(make, hedged(a, b, budget=0.5, burst=1), kind)
    try:
        first = d.get(a.url + "/v1/x")
        assert first.text == "b"
        assert first.extensions["sidestep"]["hedged"] is True
        assert b.calls == 1
        threading.Thread(
            target=lambda: (wait_for(lambda: len(gates) == 2), gates[1].set()), daemon=True
        ).start()
        second = d.get(a.url + "/v1/x")
        assert second.text == "late"  # not hedged: it waited for its answer
        assert "hedged" not in second.extensions["sidestep"]
        assert b.calls == 1
        third = d.get(a.url + "/v1/x")
        assert third.text == "b"
        assert third.extensions["sidestep"]["hedged"] is True
        assert b.calls == 2
    finally:
        for event in gates:
            event.set()


def test_an_adaptive_delay_waits_for_enough_times_to_first_token(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream, gate: threading.Event
) -> None:
    """An adaptive hedge with no fixed delay sends no hedge until twenty times to first token
    of its target are known; then a request slower than their median is hedged."""
    config = hedged(a, b)
    config["routes"][0]["hedge"] = {"adaptive": 0.5, "budget": 1.0}
    d = build(make, config, kind)
    for _ in range(20):
        assert d.get(a.url + "/v1/fast").text == "a"
    assert b.calls == 0
    a.behaviour = lambda seen: Respond(body=b"late", gate=gate)
    got = d.get(a.url + "/v1/x")
    assert got.text == "b"
    assert got.extensions["sidestep"]["hedged"] is True


def test_a_first_attempt_its_hedge_beat_is_timed_as_at_least_its_wait(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream, gate: threading.Event
) -> None:
    """An adaptive route keeps, for a first attempt cancelled because its hedge won, the time
    it had waited without a first token (at least the delay): left out, the percentile
    would be of the fast answers only, and hedge too early."""
    config = hedged(a, b)
    config["routes"][0]["hedge"] = {"adaptive": 0.5, "budget": 1.0}
    d = build(make, config, kind)
    for _ in range(20):
        assert d.get(a.url + "/v1/fast").text == "a"
    times = d.transport._core.router.routes["chat"].hedging.times("a")
    delay = times.percentile(0.5)
    a.behaviour = lambda seen: Respond(body=b"late", gate=gate)
    got = d.get(a.url + "/v1/x")
    assert got.extensions["sidestep"]["hedged"] is True
    assert len(times) == 21
    assert times._times[-1] == delay  # the cancelled attempt: at least the delay, kept last


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.anyio
async def test_cancelling_a_hedged_request_closes_both_attempts(a: Upstream, b: Upstream) -> None:
    """A hedged request cancelled while both attempts wait closes both connections, and a pool
    of two serves two requests at once after it."""
    a.behaviour = b.behaviour = lambda seen: Hang()
    inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(**POOL))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)
        transport = sidestep.AsyncFailoverTransport(hedged(a, b), transport=inner)
    client = httpx.AsyncClient(transport=transport, timeout=60)
    async with client:
        async with anyio.create_task_group() as group:
            group.start_soon(client.get, a.url + "/v1/x")
            await anyio.to_thread.run_sync(lambda: wait_for(lambda: b.calls == 1))
            group.cancel_scope.cancel()
        await anyio.to_thread.run_sync(
            lambda: wait_for(lambda: a.open_connections == 0 and b.open_connections == 0)
        )
        a.behaviour = lambda seen: Respond(body=b"again")
        answers: list[str] = []

        async def again() -> None:
            answers.append((await client.get(a.url + "/v1/again")).text)

        async with anyio.create_task_group() as group:
            for _ in range(2):
                group.start_soon(again)
    assert answers == ["again", "again"]


@pytest.mark.anyio
@pytest.mark.parametrize("library", ["httpx", "httpx2"])
# Under trio, httpcore's body iterators are left to the collector whenever a body is closed
# before its end (plain httpx's too, a stream left after its first chunk): trio warns of
# them. What is tested here is that the answer is closed and its connection given back.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_caller_cancelled_as_the_hedge_wins_closes_the_winner(
    library: str, a: Upstream, b: Upstream, gate: threading.Event
) -> None:
    """The caller's cancellation landing as the hedge's attempt ends (from an observer of its
    attempt.finished, so at that very moment) closes the answer the hedge won: the pool of
    two has both connections free, and the next request's hedge gets one at once."""
    module: Any = __import__(library)
    shell: Any = sidestep if library == "httpx" else __import__("sidestep.httpx2").httpx2
    a.behaviour = lambda seen: Respond(body=b"late", gate=gate)
    scopes: list[anyio.CancelScope] = []

    def observe(event: str, fields: dict[str, Any]) -> None:
        if event == "attempt.finished" and fields.get("target") == "b" and scopes:
            scopes.pop().cancel()

    inner = module.AsyncHTTPTransport(limits=module.Limits(**POOL))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)
        transport = shell.AsyncFailoverTransport(hedged(a, b), transport=inner)
    sidestep.logging.add_observer(observe)
    try:
        async with module.AsyncClient(transport=transport, timeout=60) as client:
            with anyio.CancelScope() as scope:
                scopes.append(scope)
                await client.get(a.url + "/v1/x")
            assert scope.cancelled_caught
            # the winner's connection is back (the loser's was closed): both free
            await anyio.to_thread.run_sync(lambda: wait_for(lambda: b.open_connections == 0))
            got = await client.get(a.url + "/v1/x")
            assert got.text == "b"
    finally:
        sidestep.logging.remove_observer(observe)


def test_a_loser_that_fails_after_the_hedge_won_counts_as_no_failure(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream
) -> None:
    """A first attempt whose 503 comes after its hedge won (in a sync shell, a thread that
    could not be stopped in its send) is a cancelled attempt: with a threshold of one
    failure, its target's circuit stays closed, twice over."""
    gates: list[threading.Event] = []

    def held(seen: Any) -> Respond:
        gates.append(threading.Event())
        return Respond(status=503, body=b"late", gate=gates[-1])

    a.behaviour = held
    config = hedged(a, b)
    config["breaker"]["failure_threshold"] = 1
    d = build(make, config, kind)
    try:
        for n in range(2):
            assert d.get(a.url + "/v1/x").text == "b"
            wait_for(lambda n=n: len(gates) == n + 1)
            gates[n].set()  # the loser's 503 comes now, after the race
            wait_for(lambda: nothing_held(d, a))
    finally:
        for event in gates:
            event.set()
    assert d.transport.suspensions() == []


SSE = {"content-type": "text/event-stream"}
PINGS = Stream([b": ping\n\n"] * 2000, delay=0.05, headers=SSE)  # 100 s of keep-alives


def test_a_loser_reading_keep_alives_is_stopped(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream
) -> None:
    """A first attempt whose stream sends only keep-alives (no first token) is stopped when
    its hedge wins, not left reading them: its connection is free long before its
    stream would end, and a pool of two serves the next hedged request at once."""
    a.behaviour = lambda seen: PINGS
    token = b'data: {"choices": [{"delta": {"content": "b"}}]}\n\n'
    b.behaviour = lambda seen: Stream([token], headers=SSE)
    d = build(make, hedged(a, b), kind)
    for _ in range(3):
        got = d.post(a.url + "/v1/chat/completions", json={"stream": True}, headers=KEY)
        assert got.extensions["sidestep"]["target"] == "b"
        wait_for(lambda: nothing_held(d, a) and nothing_held(d, b))
    assert a.calls == 3


def test_the_attempts_of_a_race_are_counted_together(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream
) -> None:
    """With max_total_attempts 2 and two attempts per target, a race sends two requests in
    all: once the hedge is sent, neither its 503 nor the first target's is retried in
    place (each branch would otherwise count only its own)."""
    hedge_sent = threading.Event()
    a.behaviour = lambda seen: Respond(status=503, headers={"retry-after": "0"}, gate=hedge_sent)

    def failing(seen: Any) -> Respond:
        hedge_sent.set()
        return Respond(status=503, headers={"retry-after": "0"})

    b.behaviour = failing
    config = hedged(a, b)
    config["failover"] = {"max_attempts_per_target": 2, "max_total_attempts": 2}
    d = build(make, config, kind)
    got = d.get(a.url + "/v1/x")
    assert got.status == 503
    assert (a.calls, b.calls) == (1, 1)
    assert got.extensions["sidestep"]["attempts"] == 2


def test_a_hedge_not_sent_spends_no_attempt_and_is_not_reported(
    make: MakeDriver,
    kind: str,
    a: Upstream,
    b: Upstream,
    events: list[tuple[str, dict[str, Any]]],
) -> None:
    """With max_total_attempts 2, a hedge that finds no candidate (the other target open)
    leaves the request's second attempt to the first target's retry in place, as without
    hedging: its 503 is retried and answered; the answer does not say hedged."""
    # (an hour's Retry-After: not retried in place, and b is suspended for it)
    b.behaviour = lambda seen: Respond(503, b"down", headers={"retry-after": "3600"})
    config = hedged(a, b)
    config["breaker"]["failure_threshold"] = 1
    config["failover"] = {"max_attempts_per_target": 2, "max_total_attempts": 2}
    d = build(make, config, kind)
    assert d.get(b.url + "/v1/x").text == "a"  # b fails once: it is suspended
    gate = threading.Event()
    answers = [
        Respond(status=503, headers={"retry-after": "0"}, gate=gate),
        Respond(body=b"again"),
    ]
    a.behaviour = lambda seen: answers.pop(0)
    before = a.calls
    open_when(gate, told_of(events, "no_candidate"))
    try:
        got = d.get(a.url + "/v1/x")
    finally:
        gate.set()
    assert got.text == "again"
    assert a.calls - before == 2
    assert "hedged" not in got.extensions["sidestep"]
    assert got.extensions["sidestep"]["attempts"] == 2


def test_a_delay_longer_than_a_wait_can_take_never_hedges(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream
) -> None:
    """A hedge delay of a billion days (past what a thread's wait can take) is no error: the
    request is answered by its first target, and no hedge is sent."""
    d = build(make, hedged(a, b, delay="1000000000d"), kind)
    assert d.get(a.url + "/v1/x").text == "a"
    assert b.calls == 0


def test_a_pooled_route_hedges_to_its_next_member(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream, gate: threading.Event
) -> None:
    """On a pooled route the hedge goes to the member after the first in the request's order,
    and neither member is left counted in flight once the request is over."""
    a.behaviour = lambda seen: Respond(body=b"late", gate=gate)
    config = hedged(a, b)
    config["routes"][0]["balance"] = "least_in_flight"
    for target, tier in zip(config["routes"][0]["targets"], (0, 1), strict=True):
        target["tier"] = tier  # one member a tier: the order is a, then b
    d = build(make, config, kind)
    got = d.get(a.url + "/v1/x")
    assert got.text == "b"
    assert got.extensions["sidestep"]["hedged"] is True
    gate.set()
    pool = d.transport._core.router.routes["chat"].pool
    wait_for(lambda: all(m.in_flight == 0 for m in pool.members))


def test_a_hedge_is_told_by_its_event(
    make: MakeDriver,
    kind: str,
    a: Upstream,
    b: Upstream,
    gate: threading.Event,
    events: list[tuple[str, dict[str, Any]]],
) -> None:
    """`hedge.finished` names the route, the first target, where the hedge went and that it
    won; a request answered within the delay emits none."""
    a.behaviour = lambda seen: Respond(body=b"late", gate=gate)
    d = build(make, hedged(a, b), kind)
    assert d.get(a.url + "/v1/x").text == "b"
    told = [fields for event, fields in events if event == "hedge.finished"]
    assert told == [
        {"route": "chat", "target": "a", "hedge": "b", "outcome": "won", "delay_s": SHORT}
    ]
    gate.set()
    events.clear()
    a.behaviour = lambda seen: Respond(body=b"a")
    quick = build(make, hedged(a, b, delay=LONG), kind)
    assert quick.get(a.url + "/v1/x").text == "a"
    assert not [event for event, _ in events if event == "hedge.finished"]


def test_a_hedge_the_budget_refuses_is_told(
    make: MakeDriver,
    kind: str,
    a: Upstream,
    b: Upstream,
    events: list[tuple[str, dict[str, Any]]],
) -> None:
    """A request whose delay ran out with no hedge left in the budget (the bucket's one spent
    by the request before) is told as refused_budget, and no hedge is sent."""
    gate = threading.Event()
    a.behaviour = lambda seen: Respond(body=b"late", gate=gate)
    d = build(make, hedged(a, b, budget=0.5, burst=1), kind)

    try:
        assert d.get(a.url + "/v1/x").text == "b"
        open_when(gate, told_of(events, "refused_budget"))
        assert d.get(a.url + "/v1/x").text == "late"
    finally:
        gate.set()
    told = [fields for event, fields in events if event == "hedge.finished"]
    assert [(f["outcome"], f["hedge"]) for f in told] == [("won", "b"), ("refused_budget", None)]
    assert b.calls == 1


def test_no_hedge_goes_to_a_pool_member_without_rate_limit_room(
    make: MakeDriver,
    kind: str,
    a: Upstream,
    b: Upstream,
    events: list[tuple[str, dict[str, Any]]],
) -> None:
    """A pool member whose last answer said no request is left until a reset an hour away is
    sent no hedge: the request waits for its first member, told as no_candidate."""
    spent = {
        "x-ratelimit-limit-requests": "100",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1h",
    }
    gate = threading.Event()
    answers = iter([Respond(503, b"down")])
    a.behaviour = lambda seen: next(answers, None) or Respond(body=b"late", gate=gate)
    b.behaviour = lambda seen: Respond(body=b"b", headers=dict(spent))
    config = hedged(a, b)
    config["routes"][0]["balance"] = "least_in_flight"
    for target, tier in zip(config["routes"][0]["targets"], (0, 1), strict=True):
        target["tier"] = tier
    d = build(make, config, kind)
    assert d.get(a.url + "/v1/x").text == "b"  # a failed: b answered, its window spent
    events.clear()
    open_when(gate, told_of(events))
    try:
        got = d.get(a.url + "/v1/x")
    finally:
        gate.set()
    assert got.text == "late"
    told = [fields for event, fields in events if event == "hedge.finished"]
    assert [(f["outcome"], f["hedge"]) for f in told] == [("no_candidate", None)]
    assert b.calls == 1


SSE = {"content-type": "text/event-stream"}
TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'


def test_keep_alives_are_no_first_token_and_the_hedge_wins_at_its_own(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream, gate: threading.Event
) -> None:
    """A first target that sends its headers and keep-alives but no content has not reached
    its commit point: the hedge's first token wins, and the caller reads the hedge's stream."""
    a.behaviour = lambda seen: Stream([b": keep-alive\n\n", TOKEN], headers=SSE, release=gate)
    b.behaviour = lambda seen: Stream([TOKEN, b"data: [DONE]\n\n"], headers=SSE)
    d = build(make, hedged(a, b), kind)
    got = d.post(a.url + "/v1/chat/completions", json={"stream": True}, headers=KEY)
    assert got.body == TOKEN + b"data: [DONE]\n\n"
    assert got.extensions["sidestep"]["target"] == "b"


def test_with_commit_complete_the_first_whole_body_wins(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream, gate: threading.Event
) -> None:
    """With commit: complete, a first target whose body stops half-way has not reached its
    commit point: the hedge's whole body wins."""
    a.behaviour = lambda seen: Stream([b'{"a": ', b"1}"], release=gate)
    b.behaviour = lambda seen: Stream([b'{"b": ', b"2}"])
    config = hedged(a, b)
    config["routes"][0]["commit"] = "complete"
    d = build(make, config, kind)
    got = d.get(a.url + "/v1/x")
    assert got.body == b'{"b": 2}'
    assert got.extensions["sidestep"]["hedged"] is True


def test_a_shared_store_admits_the_hedge_too(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream, gate: threading.Event, tmp_path: Any
) -> None:
    """Over a store whose admissions are effects (SQLite), the hedge is admitted and sent as
    over memory."""
    a.behaviour = lambda seen: Respond(body=b"late", gate=gate)
    store = sidestep.SqliteStore(str(tmp_path / "state.db"), timeout=30)
    module: Any = __import__("httpx2" if kind.startswith("httpx2") else "httpx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)
        d = make(hedged(a, b), store=store, limits=module.Limits(**POOL))
    got = d.get(a.url + "/v1/x")
    assert got.text == "b"
    assert got.extensions["sidestep"]["hedged"] is True


def test_the_hedge_skips_a_suspended_candidate_for_the_next(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream, c: Upstream, gate: threading.Event
) -> None:
    """A hedge never goes to a suspended target: it goes to the next candidate that takes it,
    and the request's attribution names that one."""
    store = MemoryStore()
    b.behaviour = lambda seen: Respond(503, b"down")
    opener = route(
        ("a", a.url + "/v1"),
        ("b", b.url + "/v1"),
        ("c", c.url + "/v1"),
        breaker={"failure_threshold": 1},
    )
    module: Any = __import__("httpx2" if kind.startswith("httpx2") else "httpx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)
        plain = make(opener, store=store)
        d = make(hedged(a, b, c), store=store, limits=module.Limits(**POOL))
    assert plain.get(b.url + "/v1/x").text == "a"  # b failed once: open, with threshold 1
    a.behaviour = lambda seen: Respond(body=b"late", gate=gate)
    got = d.get(a.url + "/v1/x")
    assert got.text == "c"
    assert got.extensions["sidestep"]["target"] == "c"
    assert got.extensions["sidestep"]["hedged"] is True
    assert b.calls == 1


def test_a_fault_plans_slow_first_target_is_hedged(
    make: MakeDriver, kind: str, a: Upstream, b: Upstream
) -> None:
    """A fault plan's delay on the first target (an injected timeout after 1 s) is what a
    hedge is for: the hedge to the second target answers, nothing reached the first, and
    the plan saw its rule applied to the first target only."""
    d = build(make, hedged(a, b), kind)
    rule = testing.timeout(delay=1.0)
    plan = testing.FaultPlan().inject(rule, target="a").apply(d.transport)
    try:
        got = d.get(a.url + "/v1/x")
    finally:
        plan.remove()
    assert got.text == "b"
    assert got.extensions["sidestep"]["hedged"] is True
    assert (a.calls, b.calls) == (0, 1)
    assert [(i.route, i.target) for i in plan.injected] == [("chat", "a")]
