"""Pooled routes over real sockets, on every transport: spread, tiers, provider state,
affinity, what the answer says, and attempts in flight counted back to zero however
they end (answers, failures, streams, cancellations, 32 threads at once)."""

from __future__ import annotations

import contextlib
import random
import threading
import warnings
from collections import Counter
from typing import Any

import anyio
import httpx
import pytest

import sidestep
from drivers import Driver, FakeClock, MakeDriver
from sidestep._core.members import Member
from sidestep._settings.values import SidestepConfigWarning
from upstream import CLIENT_TIMEOUT, Hang, Respond, Stream, Upstream, wait_for


def pooled(*targets: tuple[str, Upstream, dict[str, Any]], **route: Any) -> dict[str, Any]:
    return {
        "breaker": route.pop("breaker", {"failure_threshold": 1, "cooldown": 600}),
        "routes": [
            {
                "name": "chat",
                "targets": [{"name": n, "url": u.url + "/v1", **extra} for n, u, extra in targets],
                **route,
            }
        ],
    }


def members(d: Driver) -> tuple[Member, ...]:
    pool = d.transport._core.router.routes["chat"].pool
    assert pool is not None
    return pool.members


def in_flight(d: Driver) -> list[int]:
    return [m.in_flight for m in members(d)]


def seeded(d: Driver, n: int = 5) -> Driver:
    d.transport._core._random = random.Random(n).random
    return d


def test_a_ranked_route_is_unchanged(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """A route with no pool setting sends every request to its first target, and says
    nothing of tiers or balance."""
    d = make(pooled(("a", a, {}), ("b", b, {})))
    results = [d.get(b.url + "/v1/chat") for _ in range(20)]
    assert {r.text for r in results} == {"b"}  # a request's own target first, as ever
    assert "tier" not in results[0].extensions["sidestep"]
    assert d.transport._core.router.routes["chat"].pool is None


def test_a_pool_spreads_and_says_how(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """Weighted members share the requests by weight; each answer names its tier and balance."""
    d = seeded(make(pooled(("a", a, {"weight": 3}), ("b", b, {"weight": 1}), balance="weighted")))
    results = [d.get(a.url + "/v1/chat") for _ in range(200)]
    counts = Counter(r.text for r in results)
    assert 120 < counts["a"] < 180 and counts["b"] > 20
    said = {(r.text, r.extensions["sidestep"]["target"]) for r in results}
    assert said == {("a", "a"), ("b", "b")}
    assert {r.extensions["sidestep"]["balance"] for r in results} == {"weighted"}
    assert {r.extensions["sidestep"]["tier"] for r in results} == {0}
    assert in_flight(d) == [0, 0]


def test_tiers_fail_over_within_the_pool_then_to_the_next(
    make: MakeDriver, a: Upstream, b: Upstream, c: Upstream
) -> None:
    """While tier 0 has a healthy member it serves everything; tier 1 only once none has."""
    config = pooled(("a", a, {"tier": 0}), ("b", b, {"tier": 0}), ("c", c, {"priority": 1}))
    d = seeded(make(config))
    a.behaviour = lambda _: Respond(503)
    results = [d.get(a.url + "/v1/chat") for _ in range(20)]
    assert {r.text for r in results} == {"b"}
    assert c.calls == 0
    b.behaviour = lambda _: Respond(503)
    results = [d.get(a.url + "/v1/chat") for _ in range(10)]
    assert {r.text for r in results} == {"c"}
    assert {r.extensions["sidestep"]["tier"] for r in results} == {1}
    assert in_flight(d) == [0, 0, 0]


def test_a_request_naming_provider_state_is_not_spread(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A stored response's path, or a body naming one, keeps the route's ranked order."""
    keyed = {"headers": {"authorization": "Bearer key-a"}}
    other = {"headers": {"authorization": "Bearer key-b"}}
    d = seeded(make(pooled(("a", a, keyed), ("b", b, other), balance="weighted")))
    pinned = [d.get(a.url + "/v1/responses/resp_1") for _ in range(20)]
    assert {r.text for r in pinned} == {"a"}
    assert {r.extensions["sidestep"]["balance"] for r in pinned} == {"provider_state"}
    body = {"model": "m", "previous_response_id": "resp_1", "input": "hi"}
    named = [d.post(a.url + "/v1/responses", json=body) for _ in range(20)]
    assert {r.text for r in named} == {"a"}
    spread = [d.post(a.url + "/v1/responses", json={"model": "m"}) for _ in range(40)]
    assert {r.text for r in spread} == {"a", "b"}


def test_affinity_keeps_a_session_on_one_member(
    make: MakeDriver, a: Upstream, b: Upstream, c: Upstream
) -> None:
    """Requests with one session header all reach one member; sessions spread over all."""
    config = pooled(("a", a, {}), ("b", b, {}), ("c", c, {}), affinity={"header": "x-session"})
    d = make(config)
    where = {}
    for session in range(30):
        texts = {
            d.get(a.url + "/v1/chat", headers={"x-session": f"s{session}"}).text for _ in range(3)
        }
        assert len(texts) == 1
        where[session] = texts.pop()
    assert set(where.values()) == {"a", "b", "c"}
    r = d.get(a.url + "/v1/chat", headers={"x-session": "s0"})
    assert r.extensions["sidestep"]["balance"] == "affinity"


def test_least_in_flight_sends_around_a_busy_member(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """While one member holds requests, new ones go to the other."""
    gate = threading.Event()
    a.behaviour = lambda _: Respond(body="a", gate=gate)
    b.behaviour = lambda _: Respond(body="b", gate=gate)
    d = seeded(make(pooled(("a", a, {}), ("b", b, {}), balance="least_in_flight")))
    held = threading.Thread(target=lambda: d.get(a.url + "/v1/chat", timeout=CLIENT_TIMEOUT))
    held.start()
    wait_for(lambda: a.calls + b.calls == 1)
    busy = "a" if a.calls else "b"
    assert sorted(in_flight(d)) == [0, 1]
    try:  # the other member answers at once from now on
        (b if busy == "a" else a).behaviour = lambda _: Respond(body="free")
        texts = {d.get(a.url + "/v1/chat").text for _ in range(10)}
        assert texts == {"free"}
    finally:
        gate.set()
        held.join(CLIENT_TIMEOUT)
    assert in_flight(d) == [0, 0]


def test_in_flight_returns_to_zero_after_successes_failures_and_streams(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Answers, failed-over failures, a refused connection and streams read whole or
    left early each give their in-flight count back."""
    d = seeded(make(pooled(("a", a, {}), ("b", b, {}), balance="least_in_flight")))
    for _ in range(10):
        assert d.get(a.url + "/v1/chat").status == 200
    a.behaviour = lambda _: Respond(500)
    for _ in range(5):
        d.get(a.url + "/v1/chat")
    a.behaviour = lambda _: Stream([b"one", b"two", b"three"])
    b.behaviour = lambda _: Stream([b"one", b"two", b"three"])
    for _ in range(5):
        d.get(b.url + "/v1/chat")
        d.first_chunk("GET", b.url + "/v1/chat")
    assert in_flight(d) == [0, 0]
    gone = Upstream(name="gone")
    gone.close()
    lost = make(pooled(("gone", gone, {}), ("b", b, {}), balance="least_in_flight"))
    for _ in range(5):
        lost.get(b.url + "/v1/chat")
    assert in_flight(lost) == [0, 0]


def test_in_flight_counts_held_requests_and_survives_32_threads(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Requests held at the upstream are counted on their members; after many at once
    from 32 threads (or tasks) the counts are back to zero."""
    gate = threading.Event()
    a.behaviour = lambda _: Respond(body="a", gate=gate)
    b.behaviour = lambda _: Respond(body="b", gate=gate)
    d = make(pooled(("a", a, {}), ("b", b, {}), balance="least_in_flight"))
    held = threading.Thread(
        target=lambda: d.many(8, "GET", a.url + "/v1/chat", timeout=CLIENT_TIMEOUT)
    )
    held.start()
    wait_for(lambda: a.calls + b.calls == 8)
    assert sum(in_flight(d)) == 8
    assert min(in_flight(d)) >= 2  # two choices of two: the less loaded (races aside)
    gate.set()
    held.join(CLIENT_TIMEOUT)
    assert in_flight(d) == [0, 0]
    results = d.many(400, "GET", a.url + "/v1/chat", timeout=CLIENT_TIMEOUT)
    assert all(not isinstance(r, BaseException) and r.status == 200 for r in results)
    assert in_flight(d) == [0, 0]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["headers", "body"])
async def test_a_cancelled_request_gives_its_count_back(
    where: str, a: Upstream, b: Upstream
) -> None:
    """A request cancelled while waiting for its answer, or for its first body byte,
    is no longer counted in flight."""
    if where == "headers":
        a.behaviour = b.behaviour = lambda _: Hang()
    else:
        a.behaviour = b.behaviour = lambda _: Stream([b"late"], first_delay=3600)
    config = pooled(("a", a, {}), ("b", b, {}), balance="least_in_flight", breaker={})
    transport = sidestep.AsyncFailoverTransport(config)
    pool = transport._core.router.routes["chat"].pool
    assert pool is not None
    async with httpx.AsyncClient(transport=transport, timeout=CLIENT_TIMEOUT) as client:
        for n in range(1, 4):
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.get, a.url + "/v1/chat")
                await anyio.to_thread.run_sync(wait_for, lambda n=n: a.calls + b.calls == n)
                assert sum(m.in_flight for m in pool.members) == 1
                tg.cancel_scope.cancel()
            assert [m.in_flight for m in pool.members] == [0, 0]


def test_headroom_steers_away_from_a_spent_member_and_back(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A member announcing no request left gets none until its limit has refilled by
    one request, on the transport's clock; once it announces room, its share returns."""
    spent = {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "60s",
    }
    a.behaviour = lambda _: Respond(body="a", headers=dict(spent))
    clock = FakeClock()
    d = seeded(make(pooled(("a", a, {}), ("b", b, {}), balance="weighted"), clock=clock))
    texts = [d.get(a.url + "/v1/chat").text for _ in range(40)]
    assert texts.count("a") == 1  # its first answer says it is spent: none since
    clock.advance(0.5)
    assert {d.get(a.url + "/v1/chat").text for _ in range(20)} == {"b"}
    clock.advance(1.0)  # one request refilled: it is sent one
    refilled = {**spent, "x-ratelimit-remaining-requests": "30"}
    a.behaviour = lambda _: Respond(body="a", headers=dict(refilled))
    texts = [d.get(a.url + "/v1/chat").text for _ in range(40)]
    assert texts.count("a") >= 10


def test_latency_moves_share_away_from_a_slow_member_and_back(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A member whose answers take ten times longer (on the transport's clock) loses its
    share; once it answers as fast as the other, its share comes back."""
    clock = FakeClock()
    took = {"a": 1.0, "b": 0.1}

    def answer(name: str) -> Any:
        def behaviour(_: Any) -> Respond:
            clock.advance(took[name])  # the time to its first byte, as the transport sees it
            return Respond(body=name)

        return behaviour

    a.behaviour, b.behaviour = answer("a"), answer("b")
    d = seeded(make(pooled(("a", a, {}), ("b", b, {}), balance="latency"), clock=clock))
    texts = [d.get(a.url + "/v1/chat").text for _ in range(100)]
    assert texts.count("a") <= 5
    took["a"] = 0.1
    clock.advance(60.0)  # its old estimate decays meanwhile
    texts = [d.get(a.url + "/v1/chat").text for _ in range(100)]
    assert texts.count("a") >= 30
    assert in_flight(d) == [0, 0]


def test_transports_over_one_configuration_share_their_members(a: Upstream, b: Upstream) -> None:
    """Two transports built from the same route count on the same members (per process),
    so one's attempts in flight steer the other's picks; another key makes another member."""
    config = pooled(("a", a, {}), ("b", b, {}), balance="least_in_flight", breaker={})
    keyed = {"headers": {"authorization": "Bearer another"}}
    other = pooled(("a", a, keyed), ("b", b, {}), balance="least_in_flight", breaker={})
    transports = [sidestep.FailoverTransport(c) for c in (config, config, other)]
    pools = [t._core.router.routes["chat"].pool for t in transports]
    assert pools[0] is not None and pools[1] is not None and pools[2] is not None
    assert all(x is y for x, y in zip(pools[0].members, pools[1].members, strict=True))
    assert pools[2].members[0] is not pools[0].members[0]
    assert pools[2].members[1] is pools[0].members[1]
    for t in transports:
        t.close()


@pytest.mark.anyio
@pytest.mark.parametrize("flavour", ["httpx", "httpx2"])
async def test_requests_picked_at_once_over_a_shared_store_spread_one_to_each(
    flavour: str, tmp_path: Any, a: Upstream, b: Upstream, c: Upstream
) -> None:
    """Over a shared store, whose admission is awaited, three requests sent at once to
    an idle least-in-flight pool of three go one to each member: each request is counted
    on its member from its pick, so the next pick sees it; afterwards none is counted."""
    import httpx2

    gate = threading.Event()
    for u in (a, b, c):
        u.behaviour = lambda _, name=u.name: Respond(body=name, gate=gate)
    config = pooled(("a", a, {}), ("b", b, {}), ("c", c, {}), balance="least_in_flight", breaker={})
    store = sidestep.SqliteStore(str(tmp_path / "state.db"), timeout=CLIENT_TIMEOUT)
    http: Any = httpx2 if flavour == "httpx2" else httpx
    module: Any = sidestep.httpx2 if flavour == "httpx2" else sidestep
    transport = module.AsyncFailoverTransport(config, store=store)
    transport._core._random = random.Random(3).random  # (ties drawn alike each run)
    pool = transport._core.router.routes["chat"].pool
    assert pool is not None
    async with http.AsyncClient(transport=transport, timeout=CLIENT_TIMEOUT) as client:
        texts: list[str] = []

        async def one() -> None:
            texts.append((await client.get(a.url + "/v1/chat")).text)

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(one)
            await anyio.to_thread.run_sync(wait_for, lambda: a.calls + b.calls + c.calls == 3)
            assert [m.in_flight for m in pool.members] == [1, 1, 1]
            gate.set()
        assert sorted(texts) == ["a", "b", "c"]
        assert [m.in_flight for m in pool.members] == [0, 0, 0]


@pytest.mark.anyio
async def test_a_request_held_for_its_member_gives_it_back_however_it_ends(
    tmp_path: Any, a: Upstream, b: Upstream
) -> None:
    """Over a shared store, a request counted on its member from its pick is counted
    there no longer once it ends, with or without an attempt on it: failed over from a
    suspended member, refused by every member (`AllCandidatesSuspended`), or
    cancelled while its admission is awaited."""
    config = pooled(("a", a, {}), ("b", b, {}), balance="least_in_flight")
    store = sidestep.SqliteStore(str(tmp_path / "state.db"), timeout=CLIENT_TIMEOUT)
    with warnings.catch_warnings():  # (a failure_threshold of 1: one 503 suspends)
        warnings.simplefilter("ignore", SidestepConfigWarning)
        transport = sidestep.AsyncFailoverTransport(config, store=store)
    transport._core._random = random.Random(3).random
    pool = transport._core.router.routes["chat"].pool
    assert pool is not None
    async with httpx.AsyncClient(transport=transport, timeout=CLIENT_TIMEOUT) as client:
        for _ in range(20):  # cancelled at once: mostly while its admission is awaited
            with anyio.move_on_after(0):
                await client.get(a.url + "/v1/chat")
            assert [m.in_flight for m in pool.members] == [0, 0]
        a.behaviour = lambda _: Respond(503)  # suspended at its first failure
        for _ in range(6):  # some picked for a: refused there (or failed), answered by b
            assert (await client.get(a.url + "/v1/chat")).status_code == 200
            assert [m.in_flight for m in pool.members] == [0, 0]
        b.behaviour = lambda _: Respond(503)
        with contextlib.suppress(sidestep.AllCandidatesSuspended):
            await client.get(a.url + "/v1/chat")  # b suspended too, by its 503
        for _ in range(3):  # every member suspended: refused with no attempt
            with pytest.raises(sidestep.AllCandidatesSuspended):
                await client.get(a.url + "/v1/chat")
            assert [m.in_flight for m in pool.members] == [0, 0]


def test_a_logging_failure_at_the_requests_start_gives_its_member_back(
    tmp_path: Any, a: Upstream, b: Upstream
) -> None:
    """Over a shared store a request counts on its member from its pick; a structlog
    processor that raises on the request's first event ends the request there, and
    the member no longer counts it."""
    import structlog

    def boom(_: Any, __: str, event: Any) -> Any:
        if event.get("event") == "request.started":
            raise RuntimeError("the application's processor failed")
        return event

    config = pooled(("a", a, {}), ("b", b, {}), balance="least_in_flight", breaker={})
    store = sidestep.SqliteStore(str(tmp_path / "state.db"), timeout=CLIENT_TIMEOUT)
    transport = sidestep.FailoverTransport(config, store=store)
    pool = transport._core.router.routes["chat"].pool
    assert pool is not None
    structlog.configure(processors=[boom, structlog.processors.KeyValueRenderer()])
    try:
        with httpx.Client(transport=transport, timeout=CLIENT_TIMEOUT) as client:
            for _ in range(5):
                with pytest.raises(RuntimeError, match="processor failed"):
                    client.get(a.url + "/v1/chat")
                assert [m.in_flight for m in pool.members] == [0, 0]
    finally:
        structlog.reset_defaults()
