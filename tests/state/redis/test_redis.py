"""RedisStore against a real Redis: shared across processes, leased probes, outages, redaction.

The semantics themselves are pinned by tests/state/test_store.py, which runs every
store test on both stores; here a random differential test holds RedisStore
to MemoryStore's answers, socket-level tests stage slow, lost and missing
replies (`DelayProxy`, a silent socket, a stopped server), and the
transports run in four spawned worker processes sharing one prefix, or one
SQLite file: those multi-process tests run on `SqliteStore` too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import itertools
import json
import math
import multiprocessing
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import redis
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sidestep
from drivers import route
from redis_server import PASSWORD, DelayProxy, RedisServer, fresh_prefix
from sidestep._answers.classify import INVALID_CREDENTIAL, RATE_LIMITED, Kind, Verdict
from sidestep._common.scopes import ScopeFacts, ScopeKey, ScopeKind
from sidestep._settings.policies import BreakerPolicy, FailureRate, Suspensions
from sidestep._state.circuit import State
from sidestep._state.failopen import LocalTicket
from sidestep._state.memory import MemoryStore
from sidestep._state.protocol import Admission, Ticket, Transition
from sidestep._state.redis.calls import RedisTicket
from sidestep._state.redis.keys import anchor, origin_hash
from sidestep._state.redis.store import RedisStore
from sidestep._state.sqlite.store import SqliteStore
from upstream import IN_TIME, STORE_WAIT, Hang, Respond, Upstream, wait_for

ORIGIN = "https://api.example:443"
OK = Verdict(Kind.SUCCESS, None, None, failover=False)
FAIL = Verdict(Kind.FAILURE, "unavailable", ScopeKind.MODEL, failover=True)
# One probe at a time, so a slot taken is a scope shut.
ONE_PROBE = BreakerPolicy(failure_threshold=2, cooldown=5, max_cooldown=60, half_open_probes=1)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[DelayProxy]:
    """A proxy in front of the session's Redis that can make its replies late."""
    delaying = DelayProxy(redis_server)
    yield delaying
    delaying.close()


def store_on(url: str, **kw: Any) -> RedisStore:
    """A store on a fresh prefix whose windows follow the caller's (fake) clock.

    Its mirror is off unless asked for: these tests count and delay the round
    trips a store makes without one, as it does while its mirror is not live
    (test_redis_mirror.py tests the mirror; the store suite runs with it).
    """
    kw.setdefault("mirror", False)
    store = RedisStore(url, prefix=kw.pop("prefix", None) or fresh_prefix(), **kw)
    store._caller_clock = True
    return store


def facts(store: Any, model: str = "m", key: str = "k1") -> ScopeFacts:
    return ScopeFacts(
        ORIGIN,
        headers={"authorization": f"Bearer {key}"},
        userinfo="",
        body=json.dumps({"model": model}).encode(),
        fingerprint=store.fingerprint,
    )


def open_scope(store: Any, policy: BreakerPolicy, now: float = 0.0) -> None:
    for _ in range(policy.failure_threshold):
        ticket = store.admit(facts(store), policy, now).ticket
        assert ticket is not None
        store.record(ticket, FAIL, policy, Suspensions(), now)


def model_scope(store: Any) -> ScopeKey:
    """The scope FAIL opens for `facts(store)`."""
    return facts(store).key(ScopeKind.MODEL)


def scope_hash(store: RedisStore, key: ScopeKey) -> str:
    """The name of the hash that holds `key`'s scope (under its origin's hash tag)."""
    return f"{anchor(store._prefix, origin_hash(key.origin))}:s:{key.scope_id}"


def leases(server: RedisServer, store: RedisStore, key: ScopeKey) -> dict[str, float]:
    """The probe leases the server keeps on `key`'s scope: token -> seconds left."""
    with server.client() as client:
        text = client.hget(scope_hash(store, key), "pl") or ""
        seconds, micros = client.time()
    now_ms = seconds * 1000 + micros / 1000
    pairs = (entry.split("=") for entry in text.split(";") if entry)
    return {token: (int(until) - now_ms) / 1000 for token, until in pairs if int(until) > now_ms}


def between(value: float, low: float, high: float, slack: float = 0.002) -> bool:
    """`low <= value <= high`, give or take the millisecond rounding of server times."""
    return low - slack <= value <= high + slack


# --- the same answers as MemoryStore -------------------------------------------------------

VERDICTS = [
    OK,
    FAIL,
    Verdict(Kind.FAILURE, "unavailable", ScopeKind.MODEL, failover=True, slow=True),
    Verdict(Kind.FAILURE, "unavailable", ScopeKind.ORIGIN, failover=True),
    Verdict(Kind.NEUTRAL, "client_error", None, failover=False),
    Verdict(Kind.SUSPEND, RATE_LIMITED, ScopeKind.CREDENTIAL_MODEL, failover=True, retry_after=3),
    Verdict(Kind.SUSPEND, RATE_LIMITED, ScopeKind.CREDENTIAL_MODEL, failover=True),
    Verdict(Kind.SUSPEND, INVALID_CREDENTIAL, ScopeKind.CREDENTIAL, failover=True),
]
POLICIES = [
    BreakerPolicy(failure_threshold=2, cooldown=2, max_cooldown=8, half_open_probes=2),
    BreakerPolicy(
        failure_threshold=5,
        cooldown=2,
        max_cooldown=30,
        failure_rate=FailureRate(threshold=0.5, window=10, minimum_calls=4),
    ),
    BreakerPolicy(failure_threshold=2, cooldown=2, max_cooldown=8, enforce=False),
]
SUSPENSION_SETS = [
    Suspensions.model_validate({"invalid_credential": {"initial": 4, "max": 30}}),
    Suspensions.model_validate({"invalid_credential": {"initial": 4, "max": 30}}),
    Suspensions.model_validate({"invalid_credential": {"initial": 60, "max": None}}),
]
ADMIT = st.tuples(st.just("admit"), st.sampled_from(["m1", "m2"]), st.sampled_from(["k1", "k2"]))
RECORD = st.tuples(st.just("record"), st.integers(0, 20), st.sampled_from(range(len(VERDICTS))))
WAIT = st.tuples(st.just("wait"), st.sampled_from([0.5, 1.0, 2.5]))
OPS = st.one_of(
    ADMIT,
    ADMIT,
    ADMIT,
    RECORD,
    RECORD,
    RECORD,
    WAIT,
    WAIT,
    st.tuples(st.just("release"), st.integers(0, 20)),
    st.tuples(st.just("clear"), st.integers(0, 20)),
)


def admission_view(a: Admission) -> tuple[Any, ...]:
    t = a.ticket
    return (
        t is None,
        t is not None and t.shadow,
        tuple(sorted(k.key for k in t.probes)) if t is not None else (),
        a.refusal,
        transitions_view(a.transitions),
    )


def transitions_view(ts: tuple[Transition, ...]) -> list[Transition]:
    return sorted(ts, key=lambda t: t.scope.key)


def snapshot_view(store: Any, now: float) -> list[tuple[Any, ...]]:
    return sorted(
        (s.scope_id, s.scope, s.state, s.reason, s.failures, s.retry_at, s.retry_in(now))
        for s in store.snapshot(now)
    )


def same(got: Any, expected: Any) -> bool:
    """Equal, times within a microsecond: the stores add and subtract times in different orders."""
    if isinstance(expected, float) and isinstance(got, float):
        return math.isclose(got, expected, rel_tol=0.0, abs_tol=1e-6)  # inf is close to inf
    if dataclasses.is_dataclass(expected) and type(got) is type(expected):
        fields = dataclasses.fields(expected)
        return all(same(getattr(got, f.name), getattr(expected, f.name)) for f in fields)
    if isinstance(expected, (tuple, list)) and isinstance(got, (tuple, list)):
        return len(got) == len(expected) and all(map(same, got, expected))
    return bool(got == expected)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ops=st.lists(OPS, min_size=10, max_size=60),
    policy=st.sampled_from(POLICIES),
    suspensions=st.sampled_from(SUSPENSION_SETS),
)
def test_redis_store_answers_exactly_like_memory_store(
    redis_url: str, ops: list[tuple[Any, ...]], policy: BreakerPolicy, suspensions: Suspensions
) -> None:
    """Any interleaving of admit, record, release, clear and time passing gets the same admissions, transitions and snapshots from both stores."""
    memory = MemoryStore(fingerprint_key="same")
    shared = store_on(redis_url, fingerprint_key="same")
    tickets: list[tuple[Ticket, Ticket]] = []
    now = 0.0
    try:
        for op in ops:
            if op[0] == "admit":
                m = memory.admit(facts(memory, op[1], op[2]), policy, now)
                r = shared.admit(facts(shared, op[1], op[2]), policy, now)
                assert same(admission_view(r), admission_view(m)), (r, m)
                if m.ticket is not None and r.ticket is not None:
                    tickets.append((m.ticket, r.ticket))
            elif op[0] == "record" and tickets:
                mt, rt = tickets[-1 - op[1] % len(tickets)]  # mostly the latest
                verdict = VERDICTS[op[2]]
                expected = memory.record(mt, verdict, policy, suspensions, now)
                got = shared.record(rt, verdict, policy, suspensions, now)
                assert same(transitions_view(got), transitions_view(expected)), (got, expected)
            elif op[0] == "release" and tickets:
                mt, rt = tickets[op[1] % len(tickets)]
                memory.release(mt)
                shared.release(rt)
            elif op[0] == "wait":
                now += op[1]
            elif op[0] == "clear":
                ids = sorted(s.scope_id for s in memory.snapshot(now))
                if ids:
                    scope_id = ids[op[1] % len(ids)]
                    assert shared.clear(scope_id) == memory.clear(scope_id)
            got_snapshot, expected_snapshot = snapshot_view(shared, now), snapshot_view(memory, now)
            assert same(got_snapshot, expected_snapshot), (got_snapshot, expected_snapshot)
            assert len(shared) == len(memory)
        assert shared.fallbacks == 0
    finally:
        shared.close()


# --- round trips: one per call, and no key on the healthy path ----------------------------------


def test_round_trips_per_admission_and_verdict(redis_url: str) -> None:
    """Without a live mirror, a healthy origin costs one script call per admission and per verdict; an origin known unhealthy sends its keys in the first call."""
    store = store_on(redis_url)
    calls: list[str] = []
    script = store._clients._script

    def counting(*args: Any, **kw: Any) -> Any:
        calls.append(kw["args"][0])
        return script(*args, **kw)

    store._clients._script = counting  # type: ignore[assignment]
    p = BreakerPolicy(failure_threshold=3, cooldown=10)
    ticket = store.admit(facts(store), p, 0).ticket
    assert ticket is not None and ticket.generations is None
    store.record(ticket, OK, p, Suspensions(), 0)
    assert calls == ["admit", "record"]
    open_scope(store, p)  # the first admission after the origin fell ill asks twice, once
    calls.clear()
    assert store.admit(facts(store), p, 1).ticket is None
    assert store.admit(facts(store, model="other"), p, 1).ticket is not None
    assert calls == ["admit", "admit"]
    store.close()


def test_a_new_connection_costs_three_replies_then_one_per_call(proxy: DelayProxy) -> None:
    """A new connection costs three replies before the call's own (none for CLIENT SETINFO, no NOSCRIPT detour): authentication, loading the script, the call; later calls cost one (the mirror off: its subscription has a connection of its own)."""
    store = store_on(proxy.url)
    p = BreakerPolicy()
    store.admit(facts(store), p, 0)
    assert proxy.replies == 3
    store.admit(facts(store), p, 0)
    assert proxy.replies == 4

    async def twice() -> None:
        for _ in range(2):
            await store.admit_async(facts(store), p, 0)
        await store.aclose()

    asyncio.run(twice())
    assert proxy.replies == 4 + 3 + 1
    store.close()


@pytest.mark.anyio
@pytest.mark.parametrize(
    "anyio_backend", ["asyncio"]
)  # under trio a worker thread runs the sync client
async def test_an_async_call_is_bounded_as_a_whole_by_the_timeout(
    anyio_backend: str, proxy: DelayProxy
) -> None:
    """When every reply takes three quarters of the timeout, the first async admission (connect, authenticate, load, call: three replies) falls back at the timeout, before its replies could all have come."""
    timeout = IN_TIME  # what the first reply takes on a busy machine stays within it
    proxy.delay = 0.75 * timeout
    store = store_on(proxy.url, timeout=timeout)
    started = time.monotonic()
    admission = await store.admit_async(facts(store), BreakerPolicy(), 0)
    waited = time.monotonic() - started
    assert isinstance(admission.ticket, LocalTicket) and store.fallbacks == 1
    assert timeout <= waited < 2 * timeout  # all three replies: 2.25 timeouts at the least
    await store.aclose()


# --- the server's clock -----------------------------------------------------------------------


def test_server_clock_decides_windows_and_times_return_on_each_callers_clock(
    redis_url: str,
) -> None:
    """Two stores whose clocks are far apart see the same window, each on its own clock, and it ends when the server says so."""
    prefix = fresh_prefix()
    a, b = RedisStore(redis_url, prefix=prefix), RedisStore(redis_url, prefix=prefix)
    p = BreakerPolicy(failure_threshold=2, cooldown=0.4, max_cooldown=10)
    first = a.admit(facts(a), p, 1000.0).ticket
    assert first is not None
    a.record(first, FAIL, p, Suspensions(), 1000.0)
    second = a.admit(facts(a), p, 1000.0).ticket
    assert second is not None
    opening = time.monotonic()  # the window opens on the server between these two readings
    (opened,) = a.record(second, FAIL, p, Suspensions(), 1000.0)
    opened_by = time.monotonic()
    assert opened.retry_in == pytest.approx(0.4, abs=1e-6)  # measured from the server's now

    asked = time.monotonic()
    refused = b.admit(facts(b), p, 5_000_000.0)  # the model's scope: no credential in it
    answered = time.monotonic()
    assert refused.ticket is None and refused.refusal is not None
    # What was left of the window when the server answered, put on b's clock.
    assert between(
        refused.refusal.retry_at - 5_000_000.0,
        0.4 - (answered - opening),
        0.4 - (asked - opened_by),
    )
    asked = time.monotonic()
    (status,) = a.snapshot(1000.0)
    answered = time.monotonic()
    left = status.retry_in(1000.0)
    assert left is not None
    assert between(left, 0.4 - (answered - opening), 0.4 - (asked - opened_by))

    while (
        probe := b.admit(facts(b), p, 5_000_000.0)
    ).ticket is None:  # callers' clocks stand still
        assert time.monotonic() - opening < 60  # only bounds a hang
        time.sleep(0.01)
    assert time.monotonic() - opening >= 0.4 - 0.002  # the server's clock moved on
    assert probe.ticket is not None and probe.ticket.probes
    a.close()
    b.close()


def test_an_unchanged_scope_lists_at_the_same_instants_whatever_the_round_trips_jitter(
    redis_url: str,
) -> None:
    """Listings of an unchanged open scope, each with this process's clock read up to 0.3 s before the server reads its own (a loaded machine's jitter), put its window at the same instants every time (an admin listing's tag follows them); a server clock 5 s away is measured afresh."""
    store = RedisStore(redis_url, prefix=fresh_prefix(), mirror=False)
    p = BreakerPolicy(failure_threshold=2, cooldown=30, max_cooldown=60)
    for _ in range(2):
        ticket = store.admit(facts(store), p, 0.0).ticket
        assert ticket is not None
        store.record(ticket, FAIL, p, Suspensions(), 0.0)
    seen = set()
    for late in (0.0, 0.3, 0.1, 0.0, 0.2, 0.3, 0.1):
        (status,) = store.snapshot(time.monotonic() - late)
        assert status.state is State.OPEN and status.opened_at is not None
        seen.add((status.retry_at, status.opened_at))
    assert len(seen) == 1
    ((retry_at, opened_at),) = seen
    assert retry_at - opened_at == pytest.approx(30.0)
    # This process's clock stepped 5 s: the store follows it rather than its old offset.
    (status,) = store.snapshot(time.monotonic() + 5.0)
    assert status.retry_at == pytest.approx(retry_at + 5.0, abs=0.5)
    store.close()


# --- probe leases ------------------------------------------------------------------------------


def test_probe_lease_is_the_one_passed_in_else_the_stores_default(
    redis_server: RedisServer,
) -> None:
    """A probe admitted with a lease holds its slot that long on the server and then frees it; one admitted without gets the store's probe_lease."""
    store = store_on(redis_server.url, probe_lease=30.0)
    open_scope(store, ONE_PROBE)
    key = model_scope(store)
    started = time.monotonic()
    short = store.admit(facts(store), ONE_PROBE, 10.0, lease=0.5).ticket
    assert short is not None and short.probes
    ((left,),) = [leases(redis_server, store, key).values()]
    assert between(left, 0.5 - (time.monotonic() - started), 0.5)
    assert store.admit(facts(store), ONE_PROBE, 10.0).ticket is None  # the slot is taken
    while True:
        asked = time.monotonic()
        if (after := store.admit(facts(store), ONE_PROBE, 10.0).ticket) is not None:
            break
        assert asked - started < 60  # only bounds a hang
        time.sleep(0.01)
    assert time.monotonic() - started >= 0.5 - 0.002  # not before its lease ended
    assert after.probes
    ((left,),) = [leases(redis_server, store, key).values()]
    # no lease passed in: the store's default, less what has passed since it was asked for
    assert between(left, 30.0 - (time.monotonic() - asked), 30.0)
    store.close()


@pytest.mark.anyio
@pytest.mark.parametrize(
    "anyio_backend", ["asyncio"]
)  # under trio a worker thread runs the sync client
async def test_a_cancelled_admission_gives_its_probe_slot_back_at_once(
    anyio_backend: str, redis_server: RedisServer, proxy: DelayProxy
) -> None:
    """An async admission cancelled while its reply is on the way gives back the probe slot the server gave it, so another host probes right away."""
    prefix = fresh_prefix()
    direct = store_on(redis_server.url, prefix=prefix, fingerprint_key="k")
    slow = store_on(proxy.url, prefix=prefix, fingerprint_key="k", timeout=5.0)
    open_scope(direct, ONE_PROBE)
    key = model_scope(direct)
    try:
        warm = await slow.admit_async(facts(slow, model="warm"), ONE_PROBE, 0.0)
        assert warm.ticket is not None  # connected, and the origin is known to be unhealthy
        proxy.hold(1, 3.0)  # the next reply: the probe's admission
        async with anyio.create_task_group() as tg:
            tg.start_soon(slow.admit_async, facts(slow), ONE_PROBE, 10.0)
            for _ in range(500):  # poll the server: a condition on another process
                if leases(redis_server, slow, key):  # the server gave it the slot
                    break
                await anyio.sleep(0.01)
            else:
                pytest.fail("the admission never reached the server")
            tg.cancel_scope.cancel()
        assert leases(redis_server, slow, key) == {}
        probe = direct.admit(facts(direct), ONE_PROBE, 10.0)
        assert probe.ticket is not None and probe.ticket.probes
        assert slow.fallbacks == 0  # a cancellation is no outage
    finally:
        await slow.aclose()
        slow.close()
        direct.close()


class _CancelledAsItTimesOut(RedisStore):
    """A store whose callers are cancelled 2 ms after its time for an admission runs out,
    while the event loop is busy across both moments (as under load): the loop then
    handles the timeout and the cancellation in one pass, the timeout first."""

    async def admit_async(self, *args: Any, **kw: Any) -> Admission:
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        assert task is not None
        deadline = loop.time() + self._timeout  # the store's own deadline follows within µs
        cancel_at = deadline + 0.002

        def busy() -> None:
            while loop.time() < cancel_at + 0.001:  # the clock passes both moments
                pass

        loop.call_at(deadline - 0.01, busy)
        loop.call_at(cancel_at, task.cancel)
        return await super().admit_async(*args, **kw)


def test_a_request_cancelled_as_the_store_times_out_is_not_sent(
    proxy: DelayProxy, a: Upstream, b: Upstream
) -> None:
    """Requests cancelled as Redis's time runs out raise CancelledError and none is sent upstream (on Python 3.10 the store's timeout took the cancellation for its own, served them from memory and sent them)."""
    store = _CancelledAsItTimesOut(proxy.url, prefix=fresh_prefix(), timeout=0.1, mirror=False)
    transport = sidestep.AsyncFailoverTransport(
        route(("a", a.url + "/v1"), ("b", b.url + "/v1")), store=store
    )

    async def scenario() -> list[str]:
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            proxy.delay = 0.3  # Redis answers after the store's timeout

            async def one() -> str:
                try:
                    await client.post(a.url + "/v1/x", json={"q": 1})
                except asyncio.CancelledError:
                    return "cancelled"
                return "answered"

            tasks = [asyncio.ensure_future(one()) for _ in range(10)]
            outcomes = list(await asyncio.gather(*tasks))
            proxy.delay = 0.0
            await store.aclose()
            return outcomes

    try:
        outcomes = asyncio.run(scenario())
        with httpx.Client() as plain:  # after every request: anything sent has arrived
            plain.get(b.url + "/v1/sentinel")
        assert outcomes == ["cancelled"] * 10
        assert (a.calls, b.calls) == (0, 1)  # the sentinel only
    finally:
        store.close()


def test_a_timed_out_admission_gives_its_probe_slot_back(
    redis_server: RedisServer, proxy: DelayProxy
) -> None:
    """An admission whose reply comes after the timeout is served from memory and gives its probe slot back: at once if Redis takes the drop, else with the next call that succeeds."""
    prefix = fresh_prefix()
    direct = store_on(redis_server.url, prefix=prefix, fingerprint_key="k")
    # a reply 1 s late is past this store's timeout
    slow = store_on(proxy.url, prefix=prefix, fingerprint_key="k", retry_interval=0, timeout=0.25)
    open_scope(direct, ONE_PROBE)
    key = model_scope(direct)
    assert slow.admit(facts(slow, model="warm"), ONE_PROBE, 0.0).ticket is not None

    proxy.hold(1, 1.0)  # only the admission's reply is late: the drop goes through at once
    late = slow.admit(facts(slow), ONE_PROBE, 10.0)
    assert isinstance(late.ticket, LocalTicket) and slow.fallbacks == 1
    assert leases(redis_server, slow, key) == {}
    probe = direct.admit(facts(direct), ONE_PROBE, 10.0).ticket
    assert probe is not None and probe.probes
    direct.release(probe)

    proxy.delay = 1.0  # every reply is late: the drop waits
    late = slow.admit(facts(slow), ONE_PROBE, 10.0)
    assert isinstance(late.ticket, LocalTicket) and slow.fallbacks == 2
    assert len(leases(redis_server, slow, key)) == 1  # taken by the lost admission
    assert direct.admit(facts(direct), ONE_PROBE, 10.0).ticket is None
    proxy.delay = 0.0
    assert len(slow) == 1  # the next call that succeeds takes the drop along
    assert leases(redis_server, slow, key) == {}
    probe = direct.admit(facts(direct), ONE_PROBE, 10.0).ticket
    assert probe is not None and probe.probes
    direct.close()
    slow.close()


def test_an_admission_reaching_redis_after_its_drop_takes_nothing(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An admission that reaches the server only after the drop that gave it up (on another connection) takes no probe slot."""
    store = store_on(redis_server.url)
    open_scope(store, ONE_PROBE)
    key = model_scope(store)
    monkeypatch.setattr("sidestep._state.redis.calls._token", lambda keys: "given-up")
    store._driver._queue_drops([(origin_hash(key.origin), "given-up", "5000", "1", key.scope_id)])
    store._driver._send_drops()  # the drop overtook its admission
    assert store.admit(facts(store), ONE_PROBE, 10.0).ticket is None
    assert leases(redis_server, store, key) == {}
    monkeypatch.undo()
    probe = store.admit(facts(store), ONE_PROBE, 10.0).ticket
    assert probe is not None and probe.probes
    store.close()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_stores_forked_from_one_parent_never_free_each_others_probes(redis_url: str) -> None:
    """Processes forked after the store was built name their probe leases apart: one releasing its probe leaves the other's slot taken."""
    p = BreakerPolicy(failure_threshold=2, cooldown=1, max_cooldown=10, half_open_probes=2)
    store = store_on(redis_url, fingerprint_key="k")
    open_scope(store, p)  # in the parent, before forking
    context = multiprocessing.get_context("fork")
    mine, theirs = context.Pipe()

    def child() -> None:  # pragma: no cover - runs in the forked process
        ticket = store.admit(facts(store), p, 5.0).ticket
        assert isinstance(ticket, RedisTicket) and ticket.probes
        theirs.send(ticket.token)
        theirs.recv()  # the parent holds its own probe now
        store.release(ticket)
        theirs.send("released")

    process = context.Process(target=child)
    process.start()
    try:
        child_token = mine.recv()
        probe = store.admit(facts(store), p, 5.0).ticket
        assert isinstance(probe, RedisTicket) and probe.probes
        assert probe.token != child_token
        mine.send("go")
        assert mine.recv() == "released"
    finally:
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join(5)
    assert process.exitcode == 0
    assert store._hot  # the origin is still known unhealthy: admissions carry their keys
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        kept = client.hget(scope_hash(store, model_scope(store)), "pl") or ""
    assert [entry.split("=")[0] for entry in kept.split(";")] == [probe.token]
    assert store.admit(facts(store), p, 5.0).ticket is not None  # the child's slot is free
    assert store.admit(facts(store), p, 5.0).ticket is None  # the parent's is still taken
    store.close()


# --- redaction ---------------------------------------------------------------------------------


def chain(exc: BaseException | None) -> list[BaseException]:
    """`exc` and every exception it carries as cause or context."""
    found: list[BaseException] = []
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is not None and all(e is not f for f in found):
            found.append(e)
            todo += (e.__cause__, e.__context__)
    return found


def test_password_never_appears_in_logs_errors_or_reprs(redis_server: RedisServer) -> None:
    """Whether Redis answers, refuses the password or is unreachable, the URL's password shows up in no log event, error or repr."""
    wrong = "wr0ng-" + PASSWORD
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead_port = closed.getsockname()[1]
    closed.close()
    urls = [
        redis_server.url,
        redis_server.url.replace(PASSWORD, wrong),
        f"redis://user:{PASSWORD}@127.0.0.1:{dead_port}/0",
    ]
    p = BreakerPolicy(failure_threshold=2, cooldown=10)
    with structlog.testing.capture_logs() as logs:
        texts = []
        for url in urls:
            store = store_on(url)
            open_scope(store, p)
            texts += [repr(store), str(store.snapshot(1)), repr(store.admit(facts(store), p, 1))]
            store.close()
    events = [e for e in logs if e["event"] == "store.unavailable"]
    assert len(events) == 2  # the wrong password and the dead port; the good URL never fell back
    assert {e["error"] for e in events} == {"AuthenticationError", "ConnectionError"}
    everything = repr(logs) + "".join(texts)
    assert PASSWORD not in everything and wrong not in everything
    assert f"127.0.0.1:{redis_server.port}" in everything  # the server is still named


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{PASSWORD}@127.0.0.1:notaport/0",
        f"redis://:{PASSWORD}/x@127.0.0.1:6379/0",  # an unencoded "/": the password reads as a port
        f"redis://:{PASSWORD}@127.0.0.1:6379/0?socket_timeout=abc",
    ],
)
def test_a_malformed_url_is_refused_without_its_password_anywhere_in_the_error(url: str) -> None:
    """The error for a malformed URL carries no exception, as cause or context, that quotes its password."""
    with pytest.raises(ValueError, match="not a usable Redis URL") as info:
        RedisStore(url)
    for exc in chain(info.value):
        assert PASSWORD not in str(exc) and PASSWORD not in repr(exc)


# --- expiry ------------------------------------------------------------------------------------------


def test_keys_expire_after_healing_and_all_live_under_the_prefix(redis_server: RedisServer) -> None:
    """After a scope heals, its bookkeeping keys expire after ttl and nothing is left; a lone failure expires too; no key lives outside the prefix."""
    url = redis_server.url.rsplit("/", 1)[0] + "/3"  # a database of its own, to list every key
    store = store_on(url, ttl=0.4)
    prefix = store._prefix
    p = BreakerPolicy(failure_threshold=2, cooldown=10)
    open_scope(store, p)
    probe = store.admit(facts(store), p, 10).ticket
    assert probe is not None
    store.record(probe, OK, p, Suspensions(), 10)
    assert len(store) == 0
    db3 = redis.Redis.from_url(url, decode_responses=True)
    left = db3.keys("*")
    assert left and all(k.startswith(prefix + ":") for k in left)
    assert not any(":s:" in k for k in left)  # the healed scope itself is gone
    wait_for(lambda: not db3.keys("*"))
    one = store.admit(facts(store), p, 20).ticket
    assert one is not None
    store.record(one, FAIL, p, Suspensions(), 20)  # closed, one failure: kept for ttl
    assert len(store) == 1
    wait_for(lambda: not db3.keys("*"))
    db3.close()
    store.close()


# --- unrouted traffic's scopes: the ones max_scopes forgets first ---------------------------------

CONNECT_FAIL = Verdict(Kind.FAILURE, "unavailable", ScopeKind.ORIGIN, failover=True)


def unrouted(store: Any, origin: str = ORIGIN, path: str = "/x") -> ScopeFacts:
    """An unrouted request's facts: its path is its endpoint."""
    return ScopeFacts(origin, {}, b"", store.fingerprint, path=path)


def record(store: Any, f: ScopeFacts, verdict: Verdict, p: BreakerPolicy) -> tuple[Transition, ...]:
    ticket = store.admit(f, p, 0).ticket
    assert ticket is not None
    return store.record(ticket, verdict, p, Suspensions(), 0)


def test_unrouted_traffics_set_empties_as_its_scopes_heal_and_expires_with_them(
    redis_server: RedisServer,
) -> None:
    """The set of unrouted traffic's scopes holds a scope until it heals, then is gone; a lone
    unrouted failure's keys, that set's included, expire after ttl."""
    url = redis_server.url.rsplit("/", 1)[0] + "/3"  # a database of its own, to list every key
    store = store_on(url, ttl=0.4)
    unrouted_set = f"{store._prefix}:u"
    db3 = redis.Redis.from_url(url, decode_responses=True)
    p = BreakerPolicy(failure_threshold=2, cooldown=10)
    record(store, unrouted(store), CONNECT_FAIL, p)
    assert db3.zcard(unrouted_set) == 1
    record(store, unrouted(store), OK, p)
    assert len(store) == 0 and not db3.exists(unrouted_set)
    record(store, unrouted(store), CONNECT_FAIL, p)
    assert db3.zcard(unrouted_set) == 1
    wait_for(lambda: not db3.keys("*"), timeout=5)
    db3.close()
    store.close()


def test_scopes_kept_before_unrouted_traffic_was_told_apart_are_spared_as_routes(
    redis_server: RedisServer,
) -> None:
    """Scopes in no set of unrouted traffic's (written by an earlier version) are spared as a
    route's: unrouted traffic at max_scopes is not kept, a route's new scope takes a place."""
    store = store_on(redis_server.url, max_scopes=2)
    p = BreakerPolicy(failure_threshold=2, cooldown=10)
    a, b, c = (unrouted(store, f"https://{h}.example:443") for h in "abc")
    record(store, a, CONNECT_FAIL, p)
    record(store, b, CONNECT_FAIL, p)
    with redis_server.client() as client:
        client.delete(f"{store._prefix}:u")
    assert record(store, c, CONNECT_FAIL, p) == ()
    assert {s.scope.origin for s in store.snapshot(0)} == {a.origin, b.origin}
    record(store, facts(store), FAIL, p)
    assert len(store) == 2
    assert model_scope(store) in {s.scope for s in store.snapshot(0)}
    store.close()


def test_a_member_of_unrouted_traffics_set_whose_scope_is_gone_is_passed_over(
    redis_server: RedisServer,
) -> None:
    """At max_scopes, a member left in the set of unrouted traffic's scopes with no scope
    behind it (an earlier version forgot the scope) is dropped, and the next one makes room."""
    store = store_on(redis_server.url, max_scopes=2)
    p = BreakerPolicy(failure_threshold=2, cooldown=10)
    a, b, c = (unrouted(store, f"https://{h}.example:443") for h in "abc")
    record(store, a, CONNECT_FAIL, p)
    record(store, b, CONNECT_FAIL, p)
    unrouted_set = f"{store._prefix}:u"
    with redis_server.client() as client:
        first, score = client.zrange(unrouted_set, 0, 0, withscores=True)[0]
        assert first.endswith(a.key(ScopeKind.ORIGIN).scope_id)  # the next to go
        ghost = origin_hash("https://ghost.example:443") + ":" + "0" * 16
        client.zadd(unrouted_set, {ghost: score - 1})  # before it
        record(store, c, CONNECT_FAIL, p)
        assert client.zscore(unrouted_set, ghost) is None
    assert {s.scope.origin for s in store.snapshot(0)} == {b.origin, c.origin}
    store.close()


# --- outages ---------------------------------------------------------------------------------------


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own, free to be stopped and restarted."""
    server = RedisServer()
    server.start()
    yield server
    server.stop()


def test_falls_back_to_memory_and_returns_when_redis_answers(own_redis: RedisServer) -> None:
    """With Redis gone the store serves from memory, tries Redis at most once per retry_interval, and goes back to Redis when it answers."""
    store = store_on(own_redis.url, retry_interval=0.3)
    p = BreakerPolicy(failure_threshold=2, cooldown=10)
    redis_ticket = store.admit(facts(store), p, 0).ticket
    assert redis_ticket is not None
    own_redis.stop()
    with structlog.testing.capture_logs() as logs:
        assert store.record(redis_ticket, FAIL, p, Suspensions(), 0) == ()  # dropped
        local = [store.admit(facts(store), p, 0).ticket for _ in range(5)]
        assert store.fallbacks == 1  # one failed call, then memory until the retry is due
        assert all(isinstance(t, LocalTicket) for t in local)
        for t in local[:2]:
            assert t is not None
            store.record(t, FAIL, p, Suspensions(), 0)  # recorded in memory
        assert store.admit(facts(store), p, 1).ticket is None  # memory opened the scope
        own_redis.start()

        def back_on_redis() -> bool:
            ticket = store.admit(facts(store, model="other"), p, 1).ticket
            return isinstance(ticket, RedisTicket)

        wait_for(back_on_redis)
        back = store.admit(facts(store), p, 1)
        assert isinstance(back.ticket, RedisTicket)  # Redis's state: not opened there
        store.record(back.ticket, FAIL, p, Suspensions(), 1)
        assert [s.failures for s in store.snapshot(1)] == [1]
    assert [e["event"] for e in logs] == ["store.unavailable", "store.recovered"]
    assert logs[0]["operation"] == "record" and logs[0]["log_level"] == "warning"
    store.close()


def test_local_state_is_forgotten_when_redis_answers_again(own_redis: RedisServer) -> None:
    """What the fallback learnt in one outage is gone once Redis answers: nothing left behind locally, no refusal in the next outage, and a late verdict from the first outage lands nowhere."""
    store = store_on(own_redis.url, retry_interval=0)
    p = BreakerPolicy(failure_threshold=2, cooldown=600, max_cooldown=600)
    own_redis.stop()
    open_scope(store, p)  # in memory
    late = store.admit(facts(store, model="late"), p, 0).ticket
    assert isinstance(late, LocalTicket)
    assert store.admit(facts(store), p, 1).ticket is None
    own_redis.start()
    back = store.admit(facts(store), p, 1)
    assert isinstance(back.ticket, RedisTicket)
    assert store.snapshot(1) == [] and len(store._fallback) == 0
    late_model = Verdict(Kind.FAILURE, "unavailable", ScopeKind.MODEL, failover=True)
    store.record(late, late_model, p, Suspensions(), 1)  # to the store that issued it
    assert len(store._fallback) == 0 and store.snapshot(1) == []
    own_redis.stop()  # the next outage
    again = store.admit(facts(store), p, 2)
    assert isinstance(again.ticket, LocalTicket) and again.refusal is None
    store.close()


def test_clear_reaches_redis_even_while_it_is_deemed_down(
    redis_server: RedisServer, proxy: DelayProxy
) -> None:
    """clear() during the back-off after an outage clears the scope in Redis, for every process, and in the local fallback alike."""
    prefix = fresh_prefix()
    p = BreakerPolicy(failure_threshold=2, cooldown=600, max_cooldown=600)
    slow = store_on(proxy.url, prefix=prefix, retry_interval=600, timeout=0.25)  # < 1 s delay
    other = store_on(redis_server.url, prefix=prefix)
    open_scope(slow, p)  # in Redis
    (status,) = other.snapshot(0)
    proxy.delay = 1.0
    assert (
        slow.admit(facts(slow), p, 1).ticket is not None
    )  # timed out: memory, which knows nothing
    open_scope(slow, p, 1)  # in memory too
    assert [s.scope_id for s in slow.snapshot(1)] == [status.scope_id]  # the fallback's
    proxy.delay = 0.0
    assert slow.clear(status.scope_id)
    assert other.snapshot(1) == []
    assert len(slow._fallback) == 0
    slow.close()
    other.close()


def test_one_caller_retries_a_silent_redis_while_the_others_stay_on_memory() -> None:
    """With Redis silent, 32 threads admitting for a while pay about one timeout per retry window between them, not one each."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(512)  # connections complete in the kernel; nobody ever reads them
    url = f"redis://:{PASSWORD}@127.0.0.1:{silent.getsockname()[1]}/0"
    # a timeout no admission served from memory takes, however busy the machine
    timeout, interval = 0.5, 1.0
    store = RedisStore(url, prefix=fresh_prefix(), timeout=timeout, retry_interval=interval)
    p = BreakerPolicy()
    # Deemed down first: callers already waiting when Redis falls silent all wait it out.
    assert store.admit(facts(store), p, 0).ticket is not None and store.fallbacks == 1
    waits: list[float] = []
    lock = threading.Lock()
    started = time.monotonic()
    until = started + 3 * interval

    def admit_for_a_while() -> None:
        while time.monotonic() < until:
            t0 = time.monotonic()
            assert store.admit(facts(store), p, 0).ticket is not None
            with lock:
                waits.append(time.monotonic() - t0)
            time.sleep(0.002)

    threads = [threading.Thread(target=admit_for_a_while) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    windows = (time.monotonic() - started) / interval + 1
    try:
        assert len(waits) > 500
        assert store.fallbacks - 1 <= windows  # one try per window, each paying one timeout
        assert sum(w >= timeout for w in waits) <= 2 * windows
    finally:
        store.close()
        silent.close()


# --- async: the event loop never waits on Redis ------------------------------------------------


@pytest.mark.anyio
async def test_async_transport_keeps_the_loop_running_while_redis_is_silent(
    anyio_backend: str,
) -> None:
    """Against a Redis that accepts connections and never answers, requests still flow within about the timeout and a ticker task keeps ticking meanwhile."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # connections complete in the kernel; nobody ever reads them
    port = silent.getsockname()[1]
    upstream = Upstream()
    timeout = 1.0  # a hundred ticks: ten come however busy the machine
    store = RedisStore(
        f"redis://:{PASSWORD}@127.0.0.1:{port}/0", timeout=timeout, retry_interval=60
    )
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.sleep(0.01)

    try:
        transport = sidestep.AsyncFailoverTransport(store=store)
        async with anyio.create_task_group() as tg, httpx.AsyncClient(transport=transport) as c:
            tg.start_soon(ticker)
            await anyio.sleep(0.05)
            before, started = ticks, time.monotonic()
            response = await c.get(upstream.url + "/x")
            waited = time.monotonic() - started
            assert response.status_code == 200
            assert timeout <= waited < timeout + IN_TIME  # one timeout, then memory
            assert ticks - before >= 10  # the loop ran all along
            for _ in range(20):
                assert (await c.get(upstream.url + "/x")).status_code == 200
            assert store.fallbacks == 1  # no further attempt, so no further wait
            assert await transport.asuspensions() == []  # the fallback's, at once
            tg.cancel_scope.cancel()
    finally:
        await store.aclose()
        upstream.close()
        silent.close()


@pytest.mark.anyio
async def test_async_transport_shares_state_through_the_async_methods(
    anyio_backend: str, redis_url: str
) -> None:
    """Failures seen by an async transport open the scope in Redis for a sync transport in another store, and asuspensions/aclear see and clear it, all through the *_async methods."""
    primary = Upstream(behaviour=lambda seen: Respond(503), name="primary")
    backup = Upstream(name="backup")
    prefix = fresh_prefix()
    config = route(("primary", primary.url + "/v1"), ("backup", backup.url + "/v1"))
    store = RedisStore(redis_url, prefix=prefix, fingerprint_key="shared")
    called: list[str] = []
    spied = ("admit", "admit_async", "record_async", "snapshot", "snapshot_async", "clear")
    for name in (*spied, "clear_async"):
        method = getattr(store, name)

        def spy(*args: Any, _name: str = name, _method: Any = method) -> Any:
            called.append(_name)
            return _method(*args)

        setattr(store, name, spy)
    other = RedisStore(redis_url, prefix=prefix, fingerprint_key="shared")
    try:
        transport = sidestep.AsyncFailoverTransport(config, store=store)
        async with httpx.AsyncClient(transport=transport) as client:
            for _ in range(2):
                response = await client.post(primary.url + "/v1/chat", json={"model": "m"})
                assert response.extensions["sidestep"]["target"] == "backup"
        assert "admit_async" in called and "record_async" in called
        assert [s.state.value for s in other.snapshot(0)] == ["open"]

        def from_another_store() -> str:
            transport = sidestep.FailoverTransport(config, store=other)
            with httpx.Client(transport=transport) as sync:
                answer = sync.post(primary.url + "/v1/chat", json={"model": "m"})
            return str(answer.extensions["sidestep"]["target"])

        assert await anyio.to_thread.run_sync(from_another_store) == "backup"
        assert primary.calls == 2

        (suspension,) = await transport.asuspensions()
        assert (suspension.target, suspension.state) == ("primary", "open")
        assert await transport.aclear(suspension.scope_id)
        assert other.snapshot(0) == []  # cleared for every process
        assert await transport.asuspensions() == []
        assert {"snapshot_async", "clear_async"} <= set(called)
        if anyio_backend == "asyncio":  # redis.asyncio, no worker thread
            assert not {"admit", "snapshot", "clear"} & set(called)
    finally:
        await store.aclose()
        other.close()
        primary.close()
        backup.close()


def test_async_clients_close_with_their_event_loop(own_redis: RedisServer) -> None:
    """Twenty asyncio.run() calls through one store leave no connection of theirs open, and aclose closes the running loop's client but not the sync one (the mirror off: its subscription has a connection of its own)."""
    store = store_on(own_redis.url)
    p = BreakerPolicy()
    with own_redis.client() as admin:
        base = len(admin.client_list())
        for _ in range(20):
            asyncio.run(store.admit_async(facts(store), p, 0))
        gc.collect()
        wait_for(lambda: len(admin.client_list()) <= base)
        # the last loop's, closed: dropped with the next loop
        assert len(store._clients._async) <= 1

        assert store.admit(facts(store), p, 0).ticket is not None  # the sync client connects

        async def use_then_aclose() -> None:
            await store.admit_async(facts(store), p, 0)
            wait_for(lambda: len(admin.client_list()) == base + 2)  # sync and async
            await store.aclose()
            wait_for(lambda: len(admin.client_list()) == base + 1)  # the sync one stays

        asyncio.run(use_then_aclose())
        assert len(store._clients._async) == 0
        assert store.admit(facts(store), p, 0).ticket is not None
        assert len(admin.client_list()) == base + 1  # the same sync connection, still open
        assert store.fallbacks == 0
    store.close()


# --- four worker processes ----------------------------------------------------------------


def _worker(inbox: Any, outbox: Any) -> None:  # pragma: no cover - runs in a child process
    """A worker process: runs each job it is sent in a thread of its own and reports the results."""
    clients: dict[str, httpx.Client] = {}
    lock = threading.Lock()

    def client_for(job: dict[str, Any]) -> httpx.Client:
        key = json.dumps([job["config"], job["store"]], sort_keys=True)
        with lock:
            if key not in clients:
                spec = dict(job["store"])
                shared: Any = SqliteStore if spec.pop("kind", "redis") == "sqlite" else RedisStore
                store = shared(**spec)
                transport = sidestep.FailoverTransport(job["config"], store=store)
                clients[key] = httpx.Client(transport=transport, timeout=60)  # bounds hangs
            return clients[key]

    def run(job_id: int, job: dict[str, Any]) -> None:
        results: list[str] = []
        try:
            client = client_for(job)
            for _ in range(job["n"]):
                try:
                    response = client.get(job["url"])
                    results.append(
                        f"{response.status_code} {response.extensions['sidestep']['target']}"
                    )
                except Exception as exc:
                    results.append(f"error {exc!r}")
                time.sleep(job.get("pause", 0))
        except BaseException as exc:
            results.append(f"crash {exc!r}")
        outbox.put((job_id, results))

    while (message := inbox.get()) is not None:
        threading.Thread(target=run, args=message, daemon=True).start()


class Workers:
    """Spawned processes running sidestep's sync transport over a shared store, driven by jobs."""

    def __init__(self, n: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.outbox: Any = context.Queue()
        self.inboxes: list[Any] = [context.Queue() for _ in range(n)]
        self.processes = [
            context.Process(target=_worker, args=(inbox, self.outbox), daemon=True)
            for inbox in self.inboxes
        ]
        for process in self.processes:
            process.start()
        self._ids = itertools.count()
        self._done: dict[int, list[str]] = {}

    def submit(self, worker: int, **job: Any) -> int:
        job_id = next(self._ids)
        self.inboxes[worker].put((job_id, job))
        return job_id

    def result(self, job_id: int, timeout: float = 30) -> list[str]:
        deadline = time.monotonic() + timeout
        while job_id not in self._done:
            try:
                done_id, results = self.outbox.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"job {job_id} did not finish in time") from None
            self._done[done_id] = results
        return self._done.pop(job_id)

    def finished(self, ids: list[int]) -> list[int]:
        """Those of `ids` whose results are in (not yet taken)."""
        while True:
            try:
                done_id, results = self.outbox.get_nowait()
            except queue.Empty:
                break
            self._done[done_id] = results
        return [job_id for job_id in ids if job_id in self._done]

    def run(self, worker: int, **job: Any) -> list[str]:
        return self.result(self.submit(worker, **job))

    def everywhere(self, **job: Any) -> list[str]:
        ids = [self.submit(w, **job) for w in range(len(self.inboxes))]
        return [r for job_id in ids for r in self.result(job_id)]

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for process in self.processes:
            process.join(5)
            if process.is_alive():
                process.kill()


@pytest.fixture(scope="module")
def workers() -> Iterator[Workers]:
    pool = Workers(4)
    yield pool
    pool.close()


@pytest.fixture
def pair() -> Iterator[tuple[Upstream, Upstream]]:
    primary, backup = Upstream(name="primary"), Upstream(name="backup")
    yield primary, backup
    primary.close()
    backup.close()


@pytest.fixture(params=["redis", "sqlite"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """Where the workers share state: a fresh prefix on the session's Redis, or a fresh file
    (waited for up to `STORE_WAIT`: a store that failed open would answer from a stale memory)."""
    if request.param == "sqlite":
        return {"kind": "sqlite", "path": str(tmp_path / "state.db"), "timeout": STORE_WAIT}
    url = request.getfixturevalue("redis_url")
    return {
        "kind": "redis",
        "url": url,
        "prefix": fresh_prefix(),
        "fingerprint_key": "shared",
        "timeout": STORE_WAIT,
    }


def job(
    where: dict[str, Any], primary: Upstream, backup: Upstream, n: int = 1, **breaker: Any
) -> dict[str, Any]:
    """A job: `n` GETs through a route primary -> backup, sharing state `where` says
    (``store=`` adds arguments of the store)."""
    store = {**where, **breaker.pop("store", {})}
    failover = breaker.pop("failover", {})
    return {
        "config": route(
            ("primary", primary.url + "/v1"),
            ("backup", backup.url + "/v1"),
            breaker={"failure_threshold": 2, "cooldown": 30, **breaker},
            failover=failover,
        ),
        "store": store,
        "url": primary.url + "/v1/chat",
        "n": n,
    }


@pytest.mark.slow
def test_failures_in_one_process_make_every_process_skip_the_target(
    workers: Workers, pair: tuple[Upstream, Upstream], shared: dict[str, Any]
) -> None:
    """After failure_threshold failures seen by one process, no process sends the target another call."""
    primary, backup = pair
    primary.behaviour = lambda seen: Respond(503)
    spec = job(shared, primary, backup)
    assert workers.run(0, **{**spec, "n": 2}) == ["200 backup"] * 2
    assert primary.calls == 2
    assert workers.everywhere(**{**spec, "n": 5}) == ["200 backup"] * 20
    assert primary.calls == 2


@pytest.mark.slow
def test_exactly_half_open_probes_across_processes(
    workers: Workers, pair: tuple[Upstream, Upstream], shared: dict[str, Any]
) -> None:
    """After the window, exactly half_open_probes requests over all processes reach the target; their success closes it for everyone."""
    primary, backup = pair
    primary.behaviour = lambda seen: Respond(503)
    spec = job(shared, primary, backup, cooldown=0.5, half_open_probes=2)
    workers.run(0, **{**spec, "n": 2})
    gate = threading.Event()
    primary.behaviour = lambda seen: Respond(body="primary", gate=gate)
    time.sleep(0.6)  # the window
    ids = [workers.submit(w % 4, **spec) for w in range(16)]
    wait_for(lambda: len(workers.finished(ids)) == 14)
    skipped = workers.finished(ids)
    assert [r for job_id in skipped for r in workers.result(job_id)] == ["200 backup"] * 14
    assert primary.calls == 4  # two failures, then exactly two probes, still in flight
    gate.set()
    probes = [job_id for job_id in ids if job_id not in skipped]
    assert [r for job_id in probes for r in workers.result(job_id)] == ["200 primary"] * 2
    assert workers.everywhere(**spec) == ["200 primary"] * 4


@pytest.mark.slow
def test_probe_of_a_killed_process_is_freed_when_its_lease_ends(
    workers: Workers, pair: tuple[Upstream, Upstream], shared: dict[str, Any]
) -> None:
    """A process killed while holding the probe keeps the slot while its lease (the request's total_timeout) runs — one of ten minutes, still running however slow the machine — and, when the lease is short, only until it ends: then another process probes."""
    primary, backup = pair

    def killed_probe(lease: float) -> tuple[dict[str, Any], float]:
        """Open the primary, let a new process take its probe (which hangs) with `lease`,
        and kill that process: the jobs' spec, and a time before the probe was taken."""
        spec = job(shared, primary, backup, cooldown=0.3, failover={"total_timeout": lease})
        primary.behaviour = lambda seen: Respond(503)
        assert workers.run(0, **{**spec, "n": 2}) == ["200 backup"] * 2
        primary.behaviour = lambda seen: Hang()
        calls = primary.calls
        time.sleep(0.4)  # the window (0.3 s) ends
        victim = Workers(1)
        try:
            before = time.monotonic()  # the probe's request starts after this: its lease ends later
            victim.submit(0, **spec)
            wait_for(lambda: primary.calls == calls + 1)
            os.kill(victim.processes[0].pid or 0, signal.SIGKILL)
        finally:
            victim.processes[0].join(5)
        primary.behaviour = lambda seen: Respond(body="primary")
        return spec, before

    spec, before = killed_probe(lease=2.0)
    calls = primary.calls
    results: list[str] = []
    while "200 primary" not in results:
        assert time.monotonic() - before < 60  # only bounds a hang
        results = workers.run(2, **spec)
    assert time.monotonic() - before >= 2.0 - 0.01  # not before the lease ended
    assert primary.calls == calls + 1  # one probe, whose success closed the primary again

    spec, _ = killed_probe(lease=600.0)
    calls = primary.calls
    assert workers.run(1, **spec) == ["200 backup"]  # the dead probe still holds the slot
    assert primary.calls == calls


@pytest.mark.slow
def test_redis_outage_mid_traffic_fails_no_request_and_sharing_resumes(
    workers: Workers, pair: tuple[Upstream, Upstream], own_redis: RedisServer
) -> None:
    """Redis stopped and restarted under traffic from four processes: every request succeeds, and afterwards state is shared again."""
    primary, backup = pair
    redis_spec = {"kind": "redis", "url": own_redis.url, "prefix": fresh_prefix()}
    spec = job(redis_spec, primary, backup, store={"retry_interval": 0.2})
    ids = [workers.submit(w, **{**spec, "n": 40, "pause": 0.02}) for w in range(4)]
    wait_for(lambda: primary.calls >= 20)
    own_redis.stop()
    calls = primary.calls
    wait_for(lambda: primary.calls >= calls + 40)  # traffic goes on without Redis
    own_redis.start()
    results = [r for job_id in ids for r in workers.result(job_id)]
    assert results == ["200 primary"] * 160
    time.sleep(0.3)  # every worker's next Redis attempt is due
    primary.behaviour = lambda seen: Respond(503)
    assert workers.run(3, **{**spec, "n": 2}) == ["200 backup"] * 2
    calls = primary.calls
    assert workers.everywhere(**spec) == ["200 backup"] * 4
    assert primary.calls == calls
