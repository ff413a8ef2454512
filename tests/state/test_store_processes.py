"""The stores shared between processes, driven by real processes: probe slots stay exact.

Each test runs on `SqliteStore` over one file, and on `RedisStore` over one
prefix of a Redis and of a Redis Cluster. The processes are spawned; each builds its own store from a spec.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from redis_server import fresh_prefix
from sidestep._answers.classify import Kind, Verdict
from sidestep._common.scopes import ScopeFacts, ScopeKind
from sidestep._settings.policies import BreakerPolicy, Suspensions
from sidestep._settings.values import SidestepConfigWarning
from sidestep._state.redis.store import RedisStore
from sidestep._state.sqlite.store import SqliteStore
from upstream import STORE_WAIT, wait_for

ORIGIN = "https://api.example:443"
HELD = "https://held.example:443"  # an origin whose dead probe holds its slot for good
FAIL = Verdict(Kind.FAILURE, "unavailable", ScopeKind.MODEL, failover=True)
ENDPOINT_FAIL = Verdict(Kind.FAILURE, "unavailable", ScopeKind.ENDPOINT, failover=True)
PROCESSES = 4
ATTEMPTS = 1000  # over all processes, at once
Spec = tuple[str, dict[str, Any]]
CONTEXT = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads


def build(spec: Spec) -> Any:
    kind, kw = spec
    return SqliteStore(**kw) if kind == "sqlite" else RedisStore(**kw)


def facts(store: Any, origin: str = ORIGIN) -> ScopeFacts:
    return ScopeFacts(
        origin,
        headers={"authorization": "Bearer k"},
        userinfo="",
        body=b'{"model": "m"}',
        fingerprint=store.fingerprint,
    )


@pytest.fixture(params=["sqlite", "redis", "redis-cluster"])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> Spec:
    """Where the processes share state, waited for up to `STORE_WAIT` (a store that failed
    open would count from a memory of its own)."""
    if request.param == "sqlite":
        return ("sqlite", {"path": str(tmp_path / "state.db"), "timeout": STORE_WAIT})
    url = request.getfixturevalue("cluster_url" if "cluster" in request.param else "redis_url")
    kw = {"url": url, "prefix": fresh_prefix(), "fingerprint_key": "shared", "timeout": STORE_WAIT}
    return ("redis", kw)


def half_open(spec: Spec, policy: BreakerPolicy, origin: str = ORIGIN) -> None:
    """Open the scope in this process and wait out its window."""
    store = build(spec)
    for _ in range(policy.failure_threshold):
        ticket = store.admit(facts(store, origin), policy, time.monotonic()).ticket
        assert ticket is not None
        store.record(ticket, FAIL, policy, Suspensions(), time.monotonic())
    ends = time.monotonic() + policy.cooldown
    wait_for(lambda: time.monotonic() > ends)
    store.close()


def _attempts(spec: Spec, policy: BreakerPolicy, start: Any, out: Any, n: int) -> None:
    """In a child: `n` admissions from 8 threads once every process is ready; reports
    the tickets given, those holding a probe, and the calls served without the shared store."""
    store = build(spec)

    def one(_: int) -> tuple[int, int]:
        ticket = store.admit(facts(store), policy, time.monotonic(), 30.0).ticket
        return int(ticket is not None), int(ticket is not None and bool(ticket.probes))

    start.wait()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(n)))
    out.put((sum(r[0] for r in results), sum(r[1] for r in results), store.fallbacks))


def _hold_probe(spec: Spec, policy: BreakerPolicy, origin: str, lease: float, out: Any) -> None:
    """In a child: take the probe with `lease`, say so, and wait to be killed."""
    store = build(spec)
    before = time.monotonic()  # one clock for every process on the host
    admission = store.admit(facts(store, origin), policy, time.monotonic(), lease)
    out.put((admission.ticket is not None and bool(admission.ticket.probes), before))
    time.sleep(60)


def _outside_traffic(spec: Spec, start: Any, out: Any, n: int) -> None:
    """In a child whose store keeps at most 20 scopes: `n` unrouted failures, each on a path
    of its own that it opens at once; reports the scope ids the store forgot, and the
    calls served without the shared store."""
    spec = (spec[0], {**spec[1], "max_scopes": 20})
    store = build(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)  # failure_threshold 1
        policy = BreakerPolicy(failure_threshold=1, cooldown=600, max_cooldown=600)
    start.wait()
    forgot = []
    for i in range(n):
        path = f"/{os.getpid()}/{i}"
        f = ScopeFacts(ORIGIN, {}, b"", store.fingerprint, path=path)
        ticket = store.admit(f, policy, time.monotonic()).ticket
        assert ticket is not None
        changes = store.record(ticket, ENDPOINT_FAIL, policy, Suspensions(), time.monotonic())
        forgot += [t.scope.scope_id for t in changes if t.forgotten]
    out.put((forgot, store.fallbacks))
    store.close()


def run(target: Callable[..., None], *args: Any) -> multiprocessing.Process:
    process = CONTEXT.Process(target=target, args=args, daemon=True)
    process.start()
    return process


@pytest.mark.slow
def test_exactly_half_open_probes_among_a_thousand_attempts_from_four_processes(
    spec: Spec,
) -> None:
    """1000 admissions at once from 4 processes at a half-open scope: exactly half_open_probes are admitted, each holding a probe, all decided by the shared store."""
    policy = BreakerPolicy(failure_threshold=2, cooldown=0.2, max_cooldown=60, half_open_probes=3)
    half_open(spec, policy)
    start, out = CONTEXT.Event(), CONTEXT.Queue()
    processes = [
        run(_attempts, spec, policy, start, out, ATTEMPTS // PROCESSES) for _ in range(PROCESSES)
    ]
    start.set()
    try:
        reports = [out.get(timeout=60) for _ in processes]
        assert [sum(column) for column in zip(*reports, strict=True)] == [3, 3, 0]
    finally:
        for process in processes:
            process.join(10)


def killed_probe(spec: Spec, policy: BreakerPolicy, origin: str, lease: float) -> float:
    """Half-open `origin`'s scope, let a process take its only probe with `lease` and
    SIGKILL it; returns a time before the probe was taken."""
    half_open(spec, policy, origin)
    out = CONTEXT.Queue()
    victim = run(_hold_probe, spec, policy, origin, lease, out)
    took, taken = out.get(timeout=60)
    assert took
    os.kill(victim.pid or 0, signal.SIGKILL)
    victim.join(10)
    return float(taken)


@pytest.mark.slow
def test_a_probe_held_by_a_killed_process_is_freed_when_its_lease_ends(spec: Spec) -> None:
    """A process SIGKILLed while holding the only probe keeps the slot while its lease runs (one of ten minutes: still running, however slow the machine); one whose lease is short frees it when that lease ends, not before, and another process probes."""
    policy = BreakerPolicy(failure_threshold=2, cooldown=0.2, max_cooldown=60, half_open_probes=1)
    store = build(spec)
    killed_probe(spec, policy, HELD, lease=600.0)
    assert store.admit(facts(store, HELD), policy, time.monotonic()).ticket is None  # still held

    lease = 1.0
    taken = killed_probe(spec, policy, ORIGIN, lease)

    def probe() -> bool:
        ticket = store.admit(facts(store), policy, time.monotonic()).ticket
        return ticket is not None and bool(ticket.probes)

    wait_for(probe)
    assert time.monotonic() - taken >= lease - 0.05  # not before the lease ended
    store.close()


@pytest.mark.slow
def test_a_routes_suspension_outlasts_unrouted_traffic_of_processes_keeping_fewer_scopes(
    spec: Spec,
) -> None:
    """A scope a routed request opened in this process (max_scopes 10,000) stays open while
    4 processes whose stores keep 20 scopes each open 250 unrouted endpoints of its origin
    at once: they forget only one another's, and 20 scopes are kept."""
    policy = BreakerPolicy(failure_threshold=2, cooldown=600, max_cooldown=600)
    store = build(spec)
    for _ in range(policy.failure_threshold):
        ticket = store.admit(facts(store), policy, time.monotonic()).ticket
        assert ticket is not None
        store.record(ticket, FAIL, policy, Suspensions(), time.monotonic())
    route_scope = facts(store).key(ScopeKind.MODEL)
    start, out = CONTEXT.Event(), CONTEXT.Queue()
    processes = [run(_outside_traffic, spec, start, out, 250) for _ in range(PROCESSES)]
    start.set()
    try:
        reports = [out.get(timeout=60) for _ in processes]
    finally:
        for process in processes:
            process.join(10)
    forgot = [scope_id for ids, _ in reports for scope_id in ids]
    assert [fallbacks for _, fallbacks in reports] == [0] * PROCESSES
    # (A failure admitted before another process made room on the origin is stale, and
    # counts for nothing: how many are forgotten depends on the interleaving.)
    assert forgot and len(forgot) == len(set(forgot))
    assert route_scope.scope_id not in forgot
    refusal = store.admit(facts(store), policy, time.monotonic()).refusal
    assert refusal is not None and refusal.scope == route_scope
    assert len(store) == 20
    store.close()
