"""Scenario sqlite_store: what sharing circuit state through a SQLite file costs.

Measures the store alone — one admission plus one verdict, in microseconds,
for `MemoryStore` and `SqliteStore` on a healthy and on an unhealthy origin,
with the default ``refresh`` (the file is asked whether it changed at most
every 10 ms) and with ``refresh=0`` (asked on every request) — and requests
per second through the sync and async transports to a local upstream with
either store. The verdict: a healthy request costs at most 5 µs more than
with the memory store. Variants are interleaved (A B A B …) and each figure
is the median over the runs.

    python benchmarks/sqlite_store.py [--quick]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from _stores import async_rps, interleaved, pair_us, sicken, sync_rps  # noqa: E402
from sidestep._sqlite import SqliteStore  # noqa: E402
from sidestep._store import MemoryStore  # noqa: E402
from upstream import Upstream  # noqa: E402

SCENARIO = "sqlite_store"
BUDGET_US = 5.0  # what a healthy request may cost on top of the memory store

Row = dict[str, Any]


def _row(metric: str, value: float, unit: str, note: str = "", **extra: Any) -> Row:
    return {
        "scenario": SCENARIO,
        "metric": metric,
        "value": value,
        "unit": unit,
        "note": note,
        **extra,
    }


def _store_rows(where: Path, quick: bool) -> list[Row]:
    n, runs = (200, 2) if quick else (20_000, 7)
    memory, memory_sick = MemoryStore(), MemoryStore()
    healthy = SqliteStore(where / "healthy.db")
    every = SqliteStore(where / "every.db", refresh=0)
    sick = SqliteStore(where / "sick.db")
    sicken(memory_sick)
    sicken(sick)
    medians = interleaved(
        {
            "memory, healthy origin": lambda: pair_us(memory, n),
            "sqlite, healthy origin": lambda: pair_us(healthy, n),
            "sqlite, healthy origin, refresh=0": lambda: pair_us(every, n),
            "memory, unhealthy origin": lambda: pair_us(memory_sick, max(10, n // 20)),
            "sqlite, unhealthy origin": lambda: pair_us(sick, max(10, n // 20)),
        },
        runs,
    )
    for store in (healthy, every, sick):
        assert store.fallbacks == 0, "the benchmark fell back to memory: numbers are not the file's"
        store.close()
    notes = {
        "sqlite, healthy origin": "no statement; the file asked whether it changed every 10 ms",
        "sqlite, healthy origin, refresh=0": "PRAGMA data_version on every request",
        "sqlite, unhealthy origin": "two write transactions: admit, record",
    }
    added = medians["sqlite, healthy origin"] - medians["memory, healthy origin"]
    return [
        *(
            _row(f"admit+record: {name}", value, "us", notes.get(name, ""))
            for name, value in medians.items()
        ),
        _row(
            "healthy request: added over memory",
            added,
            "us",
            f"budget {BUDGET_US:g} us",
            verdict="pass" if added <= BUDGET_US else "fail",
        ),
    ]


def _transport_rows(where: Path, quick: bool) -> list[Row]:
    n, runs = (50, 2) if quick else (1500, 5)
    upstream = Upstream()
    target = upstream.url + "/v1/items"
    sqlite = SqliteStore(where / "transport.db")
    memory = MemoryStore()
    try:
        medians = interleaved(
            {
                "sync, MemoryStore": lambda: sync_rps(memory, target, n),
                "sync, SqliteStore": lambda: sync_rps(sqlite, target, n),
                "async, MemoryStore": lambda: async_rps(memory, target, n),
                "async, SqliteStore": lambda: async_rps(sqlite, target, n),
            },
            runs,
        )
        assert sqlite.fallbacks == 0
    finally:
        sqlite.close()
        upstream.close()
    note = "sequential requests to a local upstream, healthy origin"
    return [_row(f"requests/s: {name}", value, "req/s", note) for name, value in medians.items()]


def run(quick: bool) -> list[Row]:
    """The scenario's rows: store cost per admission+verdict, and transport throughput."""
    with tempfile.TemporaryDirectory() as where:
        return _store_rows(Path(where), quick) + _transport_rows(Path(where), quick)


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(f"{r['metric']:<62} {r['value']:>12,.2f} {r['unit']:<6} {r['note']}")
