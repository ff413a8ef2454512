"""What the store scenarios share: one admission plus one verdict, timed; requests/s.

Every store is driven the same way: a healthy origin (nothing kept for it),
an unhealthy one (another model's scope open on it), and sequential
requests through the sync and async transports to a local upstream.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

import httpx

import sidestep
from sidestep._answers.classify import Kind, Verdict
from sidestep._common.scopes import ScopeFacts, ScopeKind
from sidestep._settings.policies import BreakerPolicy, Suspensions

ORIGIN = "https://api.example:443"
OK = Verdict(Kind.SUCCESS, None, None, failover=False)
FAIL = Verdict(Kind.FAILURE, "unavailable", ScopeKind.MODEL, failover=True)
POLICY = BreakerPolicy(failure_threshold=1 + 2, cooldown=3600, max_cooldown=3600)
SUSPENSIONS = Suspensions()
Store = Any  # any StateStore


def facts(store: Store, body: bytes = b'{"model": "m"}', origin: str = ORIGIN) -> ScopeFacts:
    return ScopeFacts(
        origin,
        headers={"authorization": "Bearer k"},
        userinfo="",
        body=body,
        fingerprint=store.fingerprint,
    )


def pair_us(store: Store, n: int, body: bytes = b'{"model": "m"}') -> float:
    """Microseconds per admission plus verdict (a success) on `store`."""
    start = time.perf_counter()
    for _ in range(n):
        ticket = store.admit(facts(store, body), POLICY, 0.0).ticket
        assert ticket is not None
        store.record(ticket, OK, POLICY, SUSPENSIONS, 0.0)
    return (time.perf_counter() - start) / n * 1e6


def sicken(store: Store) -> None:
    """Open another model's scope on the origin: every admission there needs its keys."""
    for _ in range(POLICY.failure_threshold):
        ticket = store.admit(facts(store, b'{"model": "other"}'), POLICY, 0.0).ticket
        assert ticket is not None
        store.record(ticket, FAIL, POLICY, SUSPENSIONS, 0.0)


def interleaved(variants: dict[str, Callable[[], float]], runs: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(runs):
        for name, measure in variants.items():
            samples[name].append(measure())
    return {name: statistics.median(values) for name, values in samples.items()}


def sync_rps(store: Store, url: str, n: int) -> float:
    transport = sidestep.FailoverTransport(store=store)
    with httpx.Client(transport=transport) as client:
        client.get(url)  # connect outside the timing
        start = time.perf_counter()
        for _ in range(n):
            client.get(url)
        return n / (time.perf_counter() - start)


def async_rps(store: Store, url: str, n: int) -> float:
    async def go() -> float:
        transport = sidestep.AsyncFailoverTransport(store=store)
        async with httpx.AsyncClient(transport=transport) as client:
            await client.get(url)
            start = time.perf_counter()
            for _ in range(n):
                await client.get(url)
            elapsed = time.perf_counter() - start
        aclose = getattr(store, "aclose", None)
        if aclose is not None:
            await aclose()
        return n / elapsed

    return asyncio.run(go())
