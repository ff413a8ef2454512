"""The stores shared between processes, driven by real processes: probe slots stay exact.

Each test runs on `SqliteStore` over one file, and on `RedisStore` over one
prefix of a Redis and of a Redis Cluster. The processes are spawned; each builds its own store from a spec.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from redis_server import fresh_prefix
from sidestep._classify import Kind, Verdict
from sidestep._config import BreakerPolicy, Suspensions
from sidestep._redis import RedisStore
from sidestep._scopes import ScopeFacts, ScopeKind
from sidestep._sqlite import SqliteStore
from upstream import wait_for

ORIGIN = "https://api.example:443"
HELD = "https://held.example:443"  # an origin whose dead probe holds its slot for good
FAIL = Verdict(Kind.FAILURE, "unavailable", ScopeKind.MODEL, failover=True)
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
    if request.param == "sqlite":
        return ("sqlite", {"path": str(tmp_path / "state.db")})
    url = request.getfixturevalue("cluster_url" if "cluster" in request.param else "redis_url")
    return ("redis", {"url": url, "prefix": fresh_prefix(), "fingerprint_key": "shared"})


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
