"""The circuit state machine as the stores run it: fake clock, no sleeps.

Every test runs on `MemoryStore`, on `SqliteStore` over a real file, and on
`RedisStore` against a real Redis and a real Redis Cluster (their private caller-clock hooks let the
same fake clock drive the windows).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeAlias

import pytest

from redis_server import fresh_prefix
from sidestep._answers.classify import INVALID_CREDENTIAL, RATE_LIMITED, Kind, Verdict
from sidestep._common.scopes import ScopeFacts, ScopeKey, ScopeKind
from sidestep._settings.policies import BreakerPolicy, FailureRate, Suspensions
from sidestep._settings.values import SidestepConfigWarning
from sidestep._state.circuit import State
from sidestep._state.memory import MemoryStore
from sidestep._state.protocol import Ticket, Transition
from sidestep._state.redis.store import RedisStore
from sidestep._state.sqlite.store import SqliteStore
from upstream import wait_for

ORIGIN = "https://api.example:443"
FAIL = Verdict(Kind.FAILURE, "unavailable", ScopeKind.MODEL, failover=True)
SLOW_FAIL = Verdict(Kind.FAILURE, "unavailable", ScopeKind.MODEL, failover=True, slow=True)
CONNECT_FAIL = Verdict(Kind.FAILURE, "unavailable", ScopeKind.ORIGIN, failover=True)
OK = Verdict(Kind.SUCCESS, None, None, failover=False)
NEUTRAL = Verdict(Kind.NEUTRAL, "client_error", None, failover=False)
SUSPENSIONS = Suspensions()

Store: TypeAlias = MemoryStore | SqliteStore | RedisStore
MakeStore: TypeAlias = Callable[..., Store]


@pytest.fixture(params=["memory", "sqlite", "redis", "redis-cluster"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeStore]:
    """Builds the store under test; a shared store gets a fresh file or prefix and follows the fake clock."""
    made: list[RedisStore | SqliteStore] = []

    def make(**kw: Any) -> Store:
        store: RedisStore | SqliteStore
        if request.param == "memory":
            return MemoryStore(**kw)
        if request.param == "sqlite":
            store = SqliteStore(tmp_path / f"{len(made)}.db", **kw)
        else:
            url = request.getfixturevalue(
                "cluster_url" if "cluster" in request.param else "redis_url"
            )
            if "cluster" in request.param:
                # a cluster's first call learns its slots: slow on a busy machine
                kw.setdefault("timeout", 5.0)
            store = RedisStore(url, prefix=fresh_prefix(), **kw)
        store._caller_clock = True
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()
        assert store.fallbacks == 0  # every operation ran on the shared store, none fell back


def policy(**changes: object) -> BreakerPolicy:
    base: dict[str, object] = {"failure_threshold": 3, "cooldown": 10, "max_cooldown": 60}
    base.update(changes)
    return BreakerPolicy.model_validate(base)


def facts(store: Store, model: str = "m", key: str = "k1", origin: str = ORIGIN) -> ScopeFacts:
    body = f'{{"model": "{model}"}}'.encode() if model else b""
    return ScopeFacts(
        origin,
        headers={"authorization": f"Bearer {key}"},
        userinfo="",
        body=body,
        fingerprint=store.fingerprint,
    )


def admit(store: Store, p: BreakerPolicy, now: float, **kw: str) -> Ticket | None:
    return store.admit(facts(store, **kw), p, now).ticket


def fail(store: Store, p: BreakerPolicy, now: float, n: int = 1, verdict: Verdict = FAIL) -> None:
    for _ in range(n):
        ticket = admit(store, p, now)
        assert ticket is not None
        store.record(ticket, verdict, p, SUSPENSIONS, now)


def state(store: Store) -> State | None:
    states = {s.state for s in store.snapshot(0)}
    assert len(states) <= 1
    return states.pop() if states else None


def test_opens_after_exactly_the_threshold(make_store: MakeStore) -> None:
    """The scope stays closed for threshold-1 consecutive failures and opens on the threshold-th."""
    store, p = make_store(), policy()
    fail(store, p, 0, 2)
    assert admit(store, p, 0) is not None
    assert state(store) is State.CLOSED
    fail(store, p, 0, 1)
    assert state(store) is State.OPEN
    assert admit(store, p, 1) is None


def test_success_in_between_resets_the_count(make_store: MakeStore) -> None:
    """A success between failures resets the consecutive count and forgets the scope."""
    store, p = make_store(), policy()
    fail(store, p, 0, 2)
    ticket = admit(store, p, 0)
    assert ticket is not None
    store.record(ticket, OK, p, SUSPENSIONS, 0)
    assert len(store) == 0
    fail(store, p, 0, 2)
    assert state(store) is State.CLOSED


def test_nothing_admitted_while_open_then_exactly_the_probes_from_threads(
    make_store: MakeStore,
) -> None:
    """While open nothing passes; after the window exactly half_open_probes of 1000 threads get in."""
    store, p = make_store(), policy(half_open_probes=2)
    fail(store, p, 0, 3)
    assert all(admit(store, p, t) is None for t in (0, 5, 9.99))
    barrier = threading.Barrier(50)

    def attempt(_: int) -> bool:
        if _ < 50:
            barrier.wait()
        return admit(store, p, 10.0) is not None

    with ThreadPoolExecutor(max_workers=50) as pool:
        admitted = sum(pool.map(attempt, range(1000)))
    assert admitted == 2
    assert state(store) is State.HALF_OPEN


def test_successful_probe_closes_and_forgets_history(make_store: MakeStore) -> None:
    """After a successful probe the next run of failures opens with cooldown again, not the grown window."""
    store, p = make_store(), policy()
    fail(store, p, 0, 3)
    probe = admit(store, p, 10)
    assert probe is not None
    store.record(probe, SLOW_FAIL, p, SUSPENSIONS, 10)  # slow failed probe: window 20
    assert store.snapshot(10)[0].retry_at == 30
    probe = admit(store, p, 30)
    assert probe is not None
    store.record(probe, OK, p, SUSPENSIONS, 30)
    assert len(store) == 0
    fail(store, p, 40, 3)
    assert store.snapshot(40)[0].retry_at == 50


def _probe_windows(store: Store, p: BreakerPolicy, verdicts: list[Verdict]) -> list[float]:
    """Open the scope, then fail one probe per verdict at each window's end: the windows."""
    fail(store, p, 0, 3)
    now, windows = 0.0, []
    for verdict in verdicts:
        now = store.snapshot(now)[0].retry_at
        probe = admit(store, p, now)
        assert probe is not None
        assert admit(store, p, now) is None  # one probe per window
        store.record(probe, verdict, p, SUSPENSIONS, now)
        windows.append(store.snapshot(now)[0].retry_at - now)
    return windows


def test_slow_failed_probe_multiplies_the_window_up_to_the_cap(make_store: MakeStore) -> None:
    """Each slow failed probe (a timeout) doubles the window, never above max_cooldown."""
    store, p = make_store(), policy(cooldown=10, max_cooldown=35)
    assert _probe_windows(store, p, [SLOW_FAIL] * 4) == [20, 35, 35, 35]


def test_quick_failed_probe_reopens_for_cooldown(make_store: MakeStore) -> None:
    """A quick failed probe (a 503, a refused connection) reopens for cooldown, not a grown window."""
    store, p = make_store(), policy(cooldown=10, max_cooldown=600)
    assert _probe_windows(store, p, [FAIL] * 30) == [10] * 30


def test_quick_failure_after_slow_ones_returns_to_cooldown(make_store: MakeStore) -> None:
    """The window follows the last probe's cost: grown by slow ones, back to cooldown after a quick one."""
    store, p = make_store(), policy(cooldown=10, max_cooldown=600)
    verdicts = [SLOW_FAIL, SLOW_FAIL, FAIL, SLOW_FAIL]
    assert _probe_windows(store, p, verdicts) == [20, 40, 10, 20]


def test_retry_after_on_a_failed_probe_wins_over_its_speed(make_store: MakeStore) -> None:
    """A failed probe's Retry-After is its window, bounded by max_cooldown, quick or slow."""
    store, p = make_store(), policy(cooldown=10, max_cooldown=60)
    told = Verdict(Kind.FAILURE, "unavailable", ScopeKind.MODEL, True, retry_after=45)
    told_slow = Verdict(Kind.FAILURE, "unavailable", ScopeKind.MODEL, True, 500, slow=True)
    assert _probe_windows(store, p, [told, told_slow, FAIL]) == [45, 60, 10]


def test_a_ten_minute_quick_outage_costs_one_probe_per_cooldown(make_store: MakeStore) -> None:
    """Probed once per cooldown through a 10-minute outage of quick failures, it closes on the first probe after recovery."""
    store, p = make_store(), policy(cooldown=30, max_cooldown=600)
    fail(store, p, 0, 3)
    recovered, wasted, now = 601.0, 0, 0.0
    while True:
        now += 1  # one request a second
        ticket = admit(store, p, now)
        if ticket is None:
            continue
        if now < recovered:
            wasted += 1
            store.record(ticket, FAIL, p, SUSPENSIONS, now)
        else:
            store.record(ticket, OK, p, SUSPENSIONS, now)
            break
    assert wasted == 20  # at 30, 60, ... 600: one per window
    assert now - recovered == 29  # the probe at 630
    assert len(store) == 0


def test_failures_while_open_do_not_extend_the_window(make_store: MakeStore) -> None:
    """Failures recorded for requests admitted before opening leave retry_at alone."""
    store, p = make_store(), policy()
    late = [admit(store, p, 0) for _ in range(5)]
    fail(store, p, 0, 3)
    for ticket in late:
        assert ticket is not None
        store.record(ticket, FAIL, p, SUSPENSIONS, 5)
    assert store.snapshot(5)[0].retry_at == 10


def test_stale_success_cannot_close_an_open_scope(make_store: MakeStore) -> None:
    """A slow request admitted before the circuit opened succeeds afterwards: the scope stays open."""
    store, p = make_store(), policy()
    slow = admit(store, p, 0)
    fail(store, p, 0, 3)
    assert slow is not None
    store.record(slow, OK, p, SUSPENSIONS, 1)
    assert state(store) is State.OPEN
    assert admit(store, p, 1) is None


def test_stale_ticket_cannot_close_or_extend_a_newer_generation(make_store: MakeStore) -> None:
    """Tickets from a half-open generation cannot touch the scope once it reopened."""
    store, p = make_store(), policy(half_open_probes=2)
    fail(store, p, 0, 3)
    first, second = admit(store, p, 10), admit(store, p, 10)
    assert first is not None and second is not None
    store.record(first, FAIL, p, SUSPENSIONS, 10)  # reopens: retry_at 20
    store.record(second, OK, p, SUSPENSIONS, 11)  # stale: must not close
    store.record(second, FAIL, p, SUSPENSIONS, 11)  # already done: ignored
    snap = store.snapshot(11)[0]
    assert (snap.state, snap.retry_at) == (State.OPEN, 20)


def test_stale_failure_from_before_a_heal_is_ignored(make_store: MakeStore) -> None:
    """A request admitted before a scope healed cannot count against the fresh closed scope."""
    store = make_store()
    with pytest.warns(UserWarning, match="failure_threshold is 1"):
        p = policy(failure_threshold=1)
    old = admit(store, p, 0)
    fail(store, p, 0, 1)
    probe = admit(store, p, 10)
    assert old is not None and probe is not None
    store.record(probe, OK, p, SUSPENSIONS, 10)
    store.record(old, FAIL, p, SUSPENSIONS, 11)
    assert len(store) == 0


def test_concurrent_failures_during_an_outage_all_count(make_store: MakeStore) -> None:
    """Requests admitted while healthy that fail together open the scope."""
    store, p = make_store(), policy()
    tickets = [admit(store, p, 0) for _ in range(3)]
    for ticket in tickets:
        assert ticket is not None
        store.record(ticket, FAIL, p, SUSPENSIONS, 1)
    assert state(store) is State.OPEN


def test_releasing_a_cancelled_probe_frees_its_slot(make_store: MakeStore) -> None:
    """A cancelled probe gives its slot back, so the scope cannot stay stuck half-open."""
    store, p = make_store(), policy()
    fail(store, p, 0, 3)
    probe = admit(store, p, 10)
    assert probe is not None
    assert admit(store, p, 10) is None
    store.release(probe)
    store.release(probe)  # twice is harmless
    again = admit(store, p, 10)
    assert again is not None
    assert admit(store, p, 10) is None


def test_neutral_results_neither_count_nor_reset(make_store: MakeStore) -> None:
    """A neutral 4xx leaves the failure count as it was, and frees a probe slot."""
    store, p = make_store(), policy()
    fail(store, p, 0, 2)
    ticket = admit(store, p, 0)
    assert ticket is not None
    store.record(ticket, NEUTRAL, p, SUSPENSIONS, 0)
    assert store.snapshot(0)[0].failures == 2
    fail(store, p, 0, 1)
    assert state(store) is State.OPEN
    probe = admit(store, p, 10)
    assert probe is not None
    store.record(probe, NEUTRAL, p, SUSPENSIONS, 10)
    assert admit(store, p, 10) is not None


def test_success_on_one_scope_never_touches_another(make_store: MakeStore) -> None:
    """Model X's open scope stays open while model Y's requests succeed on the same host."""
    store, p = make_store(), policy()
    for _ in range(3):
        ticket = admit(store, p, 0, model="x")
        assert ticket is not None
        store.record(ticket, FAIL, p, SUSPENSIONS, 0)
    other = admit(store, p, 1, model="y")
    assert other is not None
    store.record(other, OK, p, SUSPENSIONS, 1)
    assert admit(store, p, 1, model="x") is None
    assert admit(store, p, 1, model="y") is not None


def test_connect_failures_open_the_origin_for_every_model(make_store: MakeStore) -> None:
    """An origin-scope failure keeps every model of that host out."""
    store, p = make_store(), policy()
    fail(store, p, 0, 3, verdict=CONNECT_FAIL)
    assert admit(store, p, 1, model="other") is None
    assert admit(store, p, 1, model="") is None


def test_failure_rate_opens_on_a_partial_outage(make_store: MakeStore) -> None:
    """Alternating success and failure opens the scope once minimum_calls results are in."""
    store = make_store()
    p = policy(failure_rate=FailureRate(threshold=0.5, window=10, minimum_calls=10))
    now = 0.0
    for i in range(9):
        ticket = admit(store, p, now)
        assert ticket is not None
        store.record(ticket, FAIL if i % 2 == 0 else OK, p, SUSPENSIONS, now)
        now += 0.1
        assert state(store) is State.CLOSED
    ticket = admit(store, p, now)
    assert ticket is not None
    store.record(ticket, OK, p, SUSPENSIONS, now)
    assert (
        state(store) is State.CLOSED
    )  # 5 of 10 failed, but the last was a success: check on failure
    fail(store, p, now)
    assert state(store) is State.OPEN


def test_failure_rate_ages_old_results_out(make_store: MakeStore) -> None:
    """Failures older than the window no longer count toward the rate."""
    store = make_store()
    p = policy(
        failure_threshold=100, failure_rate=FailureRate(threshold=0.5, window=10, minimum_calls=4)
    )
    for i in range(3):
        fail(store, p, float(i) * 0.1)  # three failures early on
    now = 20.0  # the window has moved past them
    for _ in range(3):
        ticket = admit(store, p, now)
        assert ticket is not None
        store.record(ticket, OK, p, SUSPENSIONS, now)
    fail(store, p, now)
    assert state(store) in (State.CLOSED, None)


def test_observe_mode_never_refuses_but_reports_the_same_transitions(make_store: MakeStore) -> None:
    """With enforce off, requests are admitted (marked shadow) and transitions still happen."""
    store, p = make_store(), policy(enforce=False)
    fail(store, p, 0, 3)
    assert state(store) is State.OPEN
    shadow = store.admit(facts(store), p, 1)
    assert shadow.ticket is not None and shadow.ticket.shadow
    assert shadow.refusal is not None and shadow.refusal.state is State.OPEN
    store.record(shadow.ticket, OK, p, SUSPENSIONS, 1)  # what enforcing would never have sent
    assert state(store) is State.OPEN
    probe = store.admit(facts(store), p, 10)
    assert probe.ticket is not None and not probe.ticket.shadow
    assert [t.state for t in probe.transitions] == [State.HALF_OPEN]
    store.record(probe.ticket, OK, p, SUSPENSIONS, 10)
    assert len(store) == 0


def test_reason_suspensions_use_their_own_windows(make_store: MakeStore) -> None:
    """A 401 suspends the credential scope for invalid_credential's initial window."""
    store, p = make_store(), policy()
    v = Verdict(Kind.SUSPEND, INVALID_CREDENTIAL, ScopeKind.CREDENTIAL, failover=True)
    fail(store, p, 0, 1, verdict=v)
    snap = store.snapshot(0)[0]
    assert (snap.state, snap.reason, snap.retry_at) == (State.OPEN, INVALID_CREDENTIAL, 600)
    assert admit(store, p, 1, key="k1") is None
    assert admit(store, p, 1, key="fresh-key") is not None


@pytest.mark.parametrize(("retry_after", "expected"), [(2.0, 2.0), (None, 1.0), (3600.0, 60.0)])
def test_retry_after_sets_the_window_within_the_reason_cap(
    retry_after: float | None, expected: float, make_store: MakeStore
) -> None:
    """Retry-After sets a rate limit's window, bounded by the reason's max."""
    store, p = make_store(), policy()
    v = Verdict(
        Kind.SUSPEND,
        RATE_LIMITED,
        ScopeKind.CREDENTIAL_MODEL,
        failover=True,
        retry_after=retry_after,
    )
    fail(store, p, 0, 1, verdict=v)
    assert store.snapshot(0)[0].retry_at == expected


@pytest.mark.parametrize(("retry_after", "expected"), [(25.0, 25.0), (None, 10.0), (3600.0, 60.0)])
def test_retry_after_on_an_outage_sets_the_open_window_within_max_cooldown(
    retry_after: float | None, expected: float, make_store: MakeStore
) -> None:
    """A 503/529's Retry-After is the window of the circuit it opens, bounded by max_cooldown."""
    store, p = make_store(), policy()
    v = Verdict(Kind.FAILURE, "unavailable", ScopeKind.MODEL, True, retry_after, 503)
    fail(store, p, 0, 3, verdict=v)
    assert store.snapshot(0)[0].retry_at == expected


def test_retry_after_on_a_failed_probe_sets_the_next_window(make_store: MakeStore) -> None:
    """A failed probe answered with Retry-After reopens for that long, not the doubled cooldown."""
    store, p = make_store(), policy()
    fail(store, p, 0, 3)
    probe = admit(store, p, 10)
    assert probe is not None
    v = Verdict(Kind.FAILURE, "unavailable", ScopeKind.MODEL, True, 45.0, 503)
    store.record(probe, v, p, SUSPENSIONS, 10)
    assert store.snapshot(10)[0].retry_at == 55


def test_unbounded_reason_lasts_until_cleared(make_store: MakeStore) -> None:
    """A reason whose max is null stays open until an operator clears it."""
    store, p = make_store(), policy()
    s = Suspensions.model_validate({"invalid_credential": {"initial": 60, "max": None}})
    ticket = admit(store, p, 0)
    assert ticket is not None
    v = Verdict(Kind.SUSPEND, INVALID_CREDENTIAL, ScopeKind.CREDENTIAL, failover=True)
    store.record(ticket, v, p, s, 0)
    assert admit(store, p, 1e9) is None
    (snap,) = store.snapshot(0)
    assert snap.retry_in(1e9) is None
    assert store.clear(snap.scope_id)
    assert not store.clear(snap.scope_id)
    assert admit(store, p, 1) is not None


def test_store_is_bounded(make_store: MakeStore) -> None:
    """Past max_scopes the oldest scopes are forgotten; memory stays bounded (on Redis Cluster
    the cap is per origin, as no key counts the whole store: 500 scopes of one origin keep 50)."""
    store, p = make_store(max_scopes=50), policy()
    per_origin = isinstance(store, RedisStore) and store._cluster
    for i in range(500):
        if per_origin:
            f, verdict = facts(store, model=f"m{i}"), FAIL
        else:
            f, verdict = facts(store, origin=f"https://h{i}:443"), CONNECT_FAIL
        ticket = store.admit(f, p, 0).ticket
        assert ticket is not None
        store.record(ticket, verdict, p, SUSPENSIONS, 0)
    assert len(store) == 50


# -- max_scopes: what routes learned outlasts outside traffic -------------------------------
# Every scope here is of one origin unless a test says otherwise, so that the cap is
# the same on every store (on Redis Cluster it is per origin).

ENDPOINT_FAIL = Verdict(Kind.FAILURE, "unavailable", ScopeKind.ENDPOINT, failover=True)


def routed(store: Store, model: str = "m", origin: str = ORIGIN) -> ScopeFacts:
    """A routed request's facts: no path."""
    return ScopeFacts(origin, {}, f'{{"model": "{model}"}}'.encode(), store.fingerprint)


def unrouted(store: Store, path: str = "/x", origin: str = ORIGIN) -> ScopeFacts:
    """An unrouted request's facts: its path is its endpoint."""
    return ScopeFacts(origin, {}, b"", store.fingerprint, path=path)


def record(
    store: Store, f: ScopeFacts, verdict: Verdict, p: BreakerPolicy, now: float = 0
) -> tuple[Transition, ...]:
    ticket = store.admit(f, p, now).ticket
    assert ticket is not None
    return store.record(ticket, verdict, p, SUSPENSIONS, now)


def opens(cooldown: float = 10) -> BreakerPolicy:
    """A policy whose every failure opens its scope: the cap then finds no closed scope."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)  # failure_threshold 1
        return policy(failure_threshold=1, cooldown=cooldown, max_cooldown=600)


def kept(store: Store) -> dict[ScopeKey, State]:
    return {s.scope: s.state for s in store.snapshot(0)}


@pytest.mark.parametrize("outside", ["hosts", "paths"])
def test_thousands_of_failing_unrouted_scopes_never_forget_a_routes_suspension(
    make_store: MakeStore, outside: str
) -> None:
    """At max_scopes, 2,000 unrouted hosts (or paths of the route's own origin) that fail and
    open forget one another's scopes, never the route's open one: it still refuses, and
    no forgotten transition names it (Redis Cluster caps each origin: there hosts forget
    nothing, paths as on the other stores)."""
    cap, n = 50, 2000
    store, p = make_store(max_scopes=cap), opens()
    per_origin = isinstance(store, RedisStore) and store._cluster
    record(store, routed(store), FAIL, p)
    (route_scope,) = kept(store)
    forgotten = []
    for i in range(n):
        if outside == "hosts":
            host = f"http://10.0.{i // 250}.{i % 250}:80"
            f, verdict = unrouted(store, origin=host), CONNECT_FAIL
        else:
            f, verdict = unrouted(store, path=f"/p{i}"), ENDPOINT_FAIL
        transitions = record(store, f, verdict, p)
        assert any(t.state is State.OPEN for t in transitions)  # every one was kept
        forgotten += [t.scope for t in transitions if t.forgotten]
    refusal = store.admit(routed(store), p, 1).refusal
    assert refusal is not None and refusal.scope == route_scope
    assert route_scope not in forgotten
    if per_origin and outside == "hosts":
        assert forgotten == []
    else:
        assert len(forgotten) == len(set(forgotten)) == n - (cap - 1)
        assert len(store) == cap
        assert kept(store)[route_scope] is State.OPEN


def test_a_routes_new_scope_takes_the_place_of_unrouted_traffics(make_store: MakeStore) -> None:
    """At max_scopes, a route's new scope forgets the oldest closed unrouted scope, then the
    oldest open one (told as forgotten)."""
    store, p, closing = make_store(max_scopes=3), opens(), policy()
    record(store, unrouted(store, "/p0"), ENDPOINT_FAIL, p)  # open
    record(store, unrouted(store, "/p1"), ENDPOINT_FAIL, closing)  # closed, one failure
    record(store, unrouted(store, "/p2"), ENDPOINT_FAIL, opens(cooldown=20))  # open longer
    p0, p1, p2 = (unrouted(store, f"/p{i}").key(ScopeKind.ENDPOINT) for i in range(3))
    assert [t.forgotten for t in record(store, routed(store, "m1"), FAIL, p)] == [False]
    assert set(kept(store)) == {p0, p2, routed(store, "m1").key(ScopeKind.MODEL)}
    told = [t for t in record(store, routed(store, "m2"), FAIL, p) if t.forgotten]
    assert [(t.scope, t.previous) for t in told] == [(p0, State.OPEN)]
    assert p1 not in kept(store) and p2 in kept(store)


def test_unrouted_traffic_finds_no_room_among_routes_scopes(make_store: MakeStore) -> None:
    """With every place taken by scopes routes recorded on, an unrouted failure is not kept
    (nothing forgotten, its host still admitted); a route's new scope forgets the oldest
    closed routed scope, then the oldest open one."""
    store, p, closing = make_store(max_scopes=2), opens(), policy()
    record(store, routed(store, "m1"), FAIL, closing)  # closed, one failure
    record(store, routed(store, "m2"), FAIL, p)  # open
    m1, m2, m3, m4 = (routed(store, f"m{i}").key(ScopeKind.MODEL) for i in range(1, 5))
    for i in range(20):
        assert record(store, unrouted(store, f"/p{i}"), ENDPOINT_FAIL, p) == ()
    assert kept(store) == {m1: State.CLOSED, m2: State.OPEN}
    assert store.admit(unrouted(store, "/p0"), p, 1).ticket is not None
    assert not any(t.forgotten for t in record(store, routed(store, "m3"), FAIL, opens(20)))
    assert set(kept(store)) == {m2, m3}
    told = [t for t in record(store, routed(store, "m4"), FAIL, p) if t.forgotten]
    assert [(t.scope, t.previous) for t in told] == [(m2, State.OPEN)]
    assert set(kept(store)) == {m3, m4}


def test_a_scope_shared_with_a_route_is_spared_once_a_routed_request_records_on_it(
    make_store: MakeStore,
) -> None:
    """An origin scope that unrouted traffic made is a route's once a routed request's failure
    is recorded on it: unrouted traffic at max_scopes then forgets only its own scopes."""
    store, p = make_store(max_scopes=2), policy()
    origin = unrouted(store).key(ScopeKind.ORIGIN)
    record(store, unrouted(store), CONNECT_FAIL, p)  # the origin's scope: one failure
    record(store, routed(store), CONNECT_FAIL, p)  # now two, one of them a route's
    record(store, unrouted(store, "/p0"), ENDPOINT_FAIL, p)
    for i in range(1, 10):
        record(store, unrouted(store, f"/p{i}"), ENDPOINT_FAIL, p)
        assert set(kept(store)) == {origin, unrouted(store, f"/p{i}").key(ScopeKind.ENDPOINT)}
    assert [s.failures for s in store.snapshot(0) if s.scope == origin] == [2]


def test_an_unrouted_scope_a_route_never_recorded_on_is_forgotten_first(
    make_store: MakeStore,
) -> None:
    """Without a routed request's result on it, the same origin scope is unrouted traffic's
    like the others, and goes first at max_scopes, being the oldest."""
    store, p = make_store(max_scopes=2), policy()
    origin = unrouted(store).key(ScopeKind.ORIGIN)
    record(store, unrouted(store), CONNECT_FAIL, p)
    record(store, unrouted(store), CONNECT_FAIL, p)
    # Redis places scopes by the millisecond of its own clock: scopes placed within one
    # millisecond are equally old, so the endpoints come a millisecond later, at least
    placed = time.time()
    wait_for(lambda: time.time() >= placed + 0.002)
    record(store, unrouted(store, "/p0"), ENDPOINT_FAIL, p)
    record(store, unrouted(store, "/p1"), ENDPOINT_FAIL, p)
    assert origin not in kept(store)


def test_healthy_admission_computes_no_key(make_store: MakeStore) -> None:
    """On an origin with nothing unhealthy, admission neither parses the body nor hashes the credential."""
    store, p = make_store(), policy()

    class Exploding(dict[str, str]):
        def get(self, *_: object) -> str:  # type: ignore[override]
            raise AssertionError("credential looked at on the healthy path")

    f = ScopeFacts(
        ORIGIN, headers=Exploding(), userinfo="", body=b"{not json", fingerprint=store.fingerprint
    )
    ticket = store.admit(f, p, 0).ticket
    assert ticket is not None and ticket.generations is None
    assert store.record(ticket, OK, p, SUSPENSIONS, 0) == ()
