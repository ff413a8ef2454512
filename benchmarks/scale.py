"""Scenario 6, scale: memory and admission time as unhealthy scopes pile up.

A `MemoryStore` is filled with N suspended credential scopes on one origin
(many tenants' keys, each refused with a 401), N = 10, 1k and 100k. For each
N: the memory each scope takes (tracemalloc), and the time `admit()` takes
for a request on a healthy origin (a dictionary look-up), for a new
credential on the unhealthy origin (its keys worked out, one credential
hash), and for a suspended credential (refused).
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Callable

import _bench as b
from _bench import Row
from sidestep import MemoryStore
from sidestep._answers.classify import INVALID_CREDENTIAL, Kind, Verdict
from sidestep._common.scopes import ScopeFacts, ScopeKind
from sidestep._settings.policies import BreakerPolicy, Suspensions

SCENARIO = "scale"
ORIGIN = "https://api.example:443"
POLICY = BreakerPolicy()
SUSPENSIONS = Suspensions()
REFUSED = Verdict(Kind.SUSPEND, INVALID_CREDENTIAL, ScopeKind.CREDENTIAL, failover=True, status=401)


def _facts(store: MemoryStore, origin: str, key: str) -> ScopeFacts:
    return ScopeFacts(
        origin,
        headers={"authorization": f"Bearer {key}"},
        userinfo="",
        body=None,
        fingerprint=store.fingerprint,
    )


def _fill(store: MemoryStore, n: int) -> None:
    for i in range(n):
        admission = store.admit(_facts(store, ORIGIN, f"sk-tenant-{i:08d}"), POLICY, 0.0)
        assert admission.ticket is not None
        store.record(admission.ticket, REFUSED, POLICY, SUSPENSIONS, 0.0)


def _per_call(fn: Callable[[], object], calls: int) -> float:
    gc.collect()
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls


def _measure(n: int, calls: int) -> dict[str, float]:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    store = MemoryStore(max_scopes=n + 16)
    _fill(store, n)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(store) == n
    healthy = _facts(store, "https://other.example:443", "sk-tenant-00000000")
    fresh_key = "sk-a-new-tenant"
    refused_key = f"sk-tenant-{n // 2:08d}"

    def admit(origin: str, key: str) -> Callable[[], object]:
        # A new ScopeFacts per request, as the transport builds one per attempt.
        def call() -> object:
            admission = store.admit(_facts(store, origin, key), POLICY, 1.0)
            if admission.ticket is not None:
                store.release(admission.ticket)
            return admission

        return call

    assert store.admit(healthy, POLICY, 1.0).ticket is not None
    assert store.admit(_facts(store, ORIGIN, refused_key), POLICY, 1.0).ticket is None
    return {
        "bytes per scope": used / n,
        "admit, healthy origin": _per_call(admit("https://other.example:443", "x"), calls) * 1e6,
        "admit, new key on unhealthy origin": _per_call(admit(ORIGIN, fresh_key), calls) * 1e6,
        "admit, suspended key (refused)": _per_call(admit(ORIGIN, refused_key), calls) * 1e6,
    }


def run(quick: bool) -> list[Row]:
    sizes = (10, 100, 1000) if quick else (10, 1000, 100_000)
    rounds, calls = (1, 200) if quick else (5, 20_000)
    results: dict[int, dict[str, list[float]]] = {n: {} for n in sizes}
    for _ in range(rounds):
        for n in sizes:  # interleaved: each round measures every size
            for metric, value in _measure(n, calls).items():
                results[n].setdefault(metric, []).append(value)
    table = {n: {m: b.median(v) for m, v in metrics.items()} for n, metrics in results.items()}
    rows = []
    for n, metrics in table.items():
        for metric, value in metrics.items():
            out = b.row(SCENARIO, metric, value, "bytes" if metric.startswith("bytes") else "µs")
            out["subject"] = f"{n:,} scopes"
            rows.append(out)
    small, large = table[sizes[0]], table[sizes[-1]]
    worst = max(m["bytes per scope"] for m in table.values())
    rows.append(
        b.verdict(
            SCENARIO,
            "under 1 KiB per unhealthy scope",
            worst,
            "bytes",
            worst < 1024,
            f"worst of N = {', '.join(f'{n:,}' for n in sizes)}",
        )
    )
    for metric in ("admit, healthy origin", "admit, new key on unhealthy origin"):
        growth = b.ratio(large[metric], small[metric])
        rows.append(
            b.verdict(
                SCENARIO,
                f"{metric}: flat from {sizes[0]:,} to {sizes[-1]:,} scopes (<= 1.5x)",
                growth,
                "x",
                growth <= 1.5,
                f"{small[metric]:.2f} µs -> {large[metric]:.2f} µs",
            )
        )
    return rows
