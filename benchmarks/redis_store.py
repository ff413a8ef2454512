"""Scenario redis_store: what sharing circuit state through Redis costs, on loopback.

Starts its own redis-server (the helper in tests/redis_server.py). Measures
the store alone — one admission plus one verdict, in microseconds, for
`MemoryStore` and `RedisStore` (with its mirror, and without: two round
trips) on a healthy and on an unhealthy origin — requests per second through
the sync and async transports to a local upstream with each, and how long a
transition takes to reach another store's mirror. Variants are interleaved
(A B A B …) and each figure is the median over the runs.

    python benchmarks/redis_store.py [--quick]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from _stores import (  # noqa: E402  # noqa: E402
    FAIL,
    ORIGIN,
    POLICY,
    SUSPENSIONS,
    async_rps,
    facts,
    interleaved,
    pair_us,
    sicken,
    sync_rps,
)
from redis_server import RedisServer, fresh_prefix  # noqa: E402
from sidestep._state.memory import MemoryStore  # noqa: E402
from sidestep._state.redis.store import RedisStore  # noqa: E402
from upstream import Upstream  # noqa: E402

SCENARIO = "redis_store"
# An LLM-sized request: what the healthy path avoids parsing for its model.
BIG_BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 200_000}]})

Row = dict[str, Any]
Store = MemoryStore | RedisStore


def _row(metric: str, value: float, unit: str, note: str = "") -> Row:
    return {"scenario": SCENARIO, "metric": metric, "value": value, "unit": unit, "note": note}


def _keys_us(n: int) -> float:
    """Microseconds to work out a big request's scope keys (body parse and credential hash)."""
    store = MemoryStore()
    body = BIG_BODY.encode()
    start = time.perf_counter()
    for _ in range(n):
        facts(store, body).keys()
    return (time.perf_counter() - start) / n * 1e6


def _store_rows(url: str, quick: bool) -> list[Row]:
    n, runs = (50, 2) if quick else (2000, 7)
    memory, memory_sick = MemoryStore(), MemoryStore()
    healthy = RedisStore(url, prefix=fresh_prefix(), mirror=False)
    sick = RedisStore(url, prefix=fresh_prefix(), mirror=False)
    with_keys = RedisStore(url, prefix=fresh_prefix(), mirror=False)
    mirrored = _live(RedisStore(url, prefix=fresh_prefix()))
    sicken(memory_sick)
    sicken(sick)

    # As if the origin were always unhealthy: the keys go along in every call.
    with_keys._hot[ORIGIN] = None
    with_keys._calls._note = lambda origin, unhealthy, seq=None: None  # type: ignore[method-assign]

    def keys_sent(body: bytes) -> Callable[[], float]:
        return lambda: pair_us(with_keys, n, body)

    big = BIG_BODY.encode()

    medians = interleaved(
        {
            "memory, healthy origin": lambda: pair_us(memory, n),
            "redis with mirror, healthy origin": lambda: pair_us(mirrored, n),
            "redis, healthy origin": lambda: pair_us(healthy, n),
            "redis, healthy origin, keys sent anyway": keys_sent(b'{"model": "m"}'),
            "redis, healthy origin, 200 KB body": lambda: pair_us(healthy, n, big),
            "redis, healthy origin, 200 KB body, keys sent anyway": keys_sent(big),
            "memory, unhealthy origin": lambda: pair_us(memory_sick, n),
            "redis, unhealthy origin": lambda: pair_us(sick, n),
        },
        runs,
    )
    for store in (healthy, sick, with_keys, mirrored):
        assert store.fallbacks == 0, "the benchmark fell back to memory: numbers are not Redis's"
        store.close()
    notes = {
        "redis with mirror, healthy origin": "no round trip: the mirror holds the origin healthy",
        "redis, healthy origin": "mirror=False: two round trips (admit, record); no key",
        "redis, unhealthy origin": "two round trips carrying the scope keys",
        "redis, healthy origin, keys sent anyway": "the rejected design: keys on every call",
        "redis, healthy origin, 200 KB body, keys sent anyway": "the rejected design",
    }
    keys = statistics.median(_keys_us(max(10, n // 10)) for _ in range(runs))
    return [
        *(
            _row(f"admit+record: {name}", value, "us", notes.get(name, ""))
            for name, value in medians.items()
        ),
        _row("scope keys of a 200 KB body", keys, "us", "body parse + credential hash, no store"),
    ]


def _transport_rows(url: str, quick: bool) -> list[Row]:
    n, runs = (50, 2) if quick else (1500, 5)
    upstream = Upstream()
    target = upstream.url + "/v1/items"
    redis_store = RedisStore(url, prefix=fresh_prefix(), mirror=False)
    mirrored = _live(RedisStore(url, prefix=fresh_prefix()))
    memory = MemoryStore()
    try:
        medians = interleaved(
            {
                "sync, MemoryStore": lambda: sync_rps(memory, target, n),
                "sync, RedisStore with mirror": lambda: sync_rps(mirrored, target, n),
                "sync, RedisStore, mirror=False": lambda: sync_rps(redis_store, target, n),
                "async, MemoryStore": lambda: async_rps(memory, target, n),
                "async, RedisStore with mirror": lambda: async_rps(mirrored, target, n),
                "async, RedisStore, mirror=False": lambda: async_rps(redis_store, target, n),
            },
            runs,
        )
        assert redis_store.fallbacks == 0
        assert mirrored.fallbacks == 0
    finally:
        redis_store.close()
        mirrored.close()
        upstream.close()
    note = "sequential requests to a local upstream, healthy origin"
    return [_row(f"requests/s: {name}", value, "req/s", note) for name, value in medians.items()]


def _live(store: RedisStore) -> RedisStore:
    """`store` once its mirror follows the channel (its first admission starts it)."""
    store.admit(facts(store), POLICY, 0.0)
    deadline = time.monotonic() + 10
    while not (store._mirror is not None and store._mirror.live):
        assert time.monotonic() < deadline, "the mirror never went live"
        time.sleep(0.001)
    return store


def _news_rows(url: str, quick: bool) -> list[Row]:
    """How long a transition in one store takes to reach another store's mirror."""
    prefix = fresh_prefix()
    one, two = _live(RedisStore(url, prefix=prefix)), _live(RedisStore(url, prefix=prefix))
    assert two._mirror is not None
    delays: list[float] = []
    try:
        for i in range(3 if quick else 30):
            origin = f"https://news-{i}.example:443"
            ticket = one.admit(facts(one, origin=origin), POLICY, 0.0).ticket
            assert ticket is not None
            start = time.perf_counter()
            one.record(ticket, FAIL, POLICY, SUSPENSIONS, 0.0)  # the origin gains a scope
            while two._mirror.healthy(origin):
                assert time.perf_counter() - start < 5, "the news never came"
            delays.append((time.perf_counter() - start) * 1000)
    finally:
        one.close()
        two.close()
    note = "from the verdict's call to the other mirror knowing; the issue's bound is 100 ms"
    return [
        _row("transition reaches another mirror: median", statistics.median(delays), "ms", note),
        _row("transition reaches another mirror: worst", max(delays), "ms", note),
    ]


def run(quick: bool) -> list[Row]:
    """The scenario's rows: store cost per admission+verdict, throughput, news latency."""
    server = RedisServer()
    server.start()
    try:
        rows = _store_rows(server.url, quick) + _transport_rows(server.url, quick)
        return rows + _news_rows(server.url, quick)
    finally:
        server.stop()


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(f"{r['metric']:<62} {r['value']:>12,.1f} {r['unit']:<6} {r['note']}")
