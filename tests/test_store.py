"""The circuit state machine as the stores run it: fake clock, no sleeps.

Every test runs on `MemoryStore`, on `SqliteStore` over a real file, and on
`RedisStore` against a real Redis and a real Redis Cluster (their private caller-clock hooks let the
same fake clock drive the windows).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeAlias

import pytest

from redis_server import fresh_prefix
from sidestep._circuit import State
from sidestep._classify import INVALID_CREDENTIAL, RATE_LIMITED, Kind, Verdict
from sidestep._config import BreakerPolicy, FailureRate, Suspensions
from sidestep._redis import RedisStore
from sidestep._scopes import ScopeFacts, ScopeKind
from sidestep._sqlite import SqliteStore
from sidestep._store import MemoryStore, Ticket

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
    assert snap.retry_in is None
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
