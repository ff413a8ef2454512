"""Scenario 2, throughput: requests per second against a fast upstream on 127.0.0.1.

The upstream runs in a child process (so the client keeps a core); 32
workers share one client and send requests back to back for a fixed time.
Bare `AsyncHTTPTransport` against sidestep (a route of two targets), for
httpx and for httpx2, interleaved; medians and ratios.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import httpx2

import _bench as b
import sidestep
import sidestep.httpx2
from _bench import Mode, Row

SCENARIO = "throughput"
CONCURRENCY = 32


def _config(url: str) -> dict[str, Any]:
    return {
        "routes": [
            {
                "name": "api",
                "targets": [
                    {"name": "primary", "url": url + "/v1"},
                    {"name": "backup", "url": "http://127.0.0.1:9/v1"},  # never reached
                ],
            }
        ]
    }


def _variants(url: str) -> dict[str, Callable[[], Any]]:
    def limits(module: Any) -> Any:
        return module.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)

    return {
        "httpx bare": lambda: httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(limits=limits(httpx))
        ),
        "httpx sidestep": lambda: httpx.AsyncClient(
            transport=sidestep.AsyncFailoverTransport(
                _config(url), transport=httpx.AsyncHTTPTransport(limits=limits(httpx))
            )
        ),
        "httpx2 bare": lambda: httpx2.AsyncClient(
            transport=httpx2.AsyncHTTPTransport(limits=limits(httpx2))
        ),
        "httpx2 sidestep": lambda: httpx2.AsyncClient(
            transport=sidestep.httpx2.AsyncFailoverTransport(
                _config(url), transport=httpx2.AsyncHTTPTransport(limits=limits(httpx2))
            )
        ),
    }


async def _sample(make: Callable[[], Any], url: str, seconds: float) -> tuple[float, float]:
    """(requests per second, the client process's CPU seconds per request)."""
    done = 0
    async with make() as client:
        await asyncio.gather(*(client.get(url) for _ in range(CONCURRENCY)))  # open the pool
        end = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < end:
                response = await client.get(url)
                response.raise_for_status()
                done += 1

        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        return done / (time.perf_counter() - started), (time.process_time() - cpu) / done


def run(quick: bool) -> list[Row]:
    rounds, seconds = (1, 0.15) if quick else (7, 2.0)
    rates: dict[str, list[float]] = {}
    costs: dict[str, list[float]] = {}
    with b.quiet_logs(), b.Upstreams({"fast": (Mode.HEALTHY, 0.0)}) as upstreams:
        base = upstreams.urls["fast"]
        url = base + "/v1/items"
        variants = _variants(base)

        async def measure() -> None:
            for _ in range(rounds):
                for name, make in variants.items():
                    rate, cost = await _sample(make, url, seconds)
                    rates.setdefault(name, []).append(rate)
                    costs.setdefault(name, []).append(cost)

        asyncio.run(measure())
    rows = []
    for name in variants:
        rate, cost = b.median(rates[name]), b.median(costs[name]) * 1e6
        rows.append(b.row(SCENARIO, f"{name}: requests/s", rate, "requests/s"))
        rows.append(b.row(SCENARIO, f"{name}: client CPU per request", cost, "µs"))
    note = f"median of {rounds} interleaved {seconds:g} s samples, concurrency {CONCURRENCY}"
    for flavour in ("httpx", "httpx2"):
        # Requests per second of the client's own CPU: what the machine sustains when the
        # client is the bottleneck, and steady when other work shares the cores.
        ours, bare = f"{flavour} sidestep", f"{flavour} bare"
        ratio = b.ratio(b.median(costs[bare]), b.median(costs[ours]))
        wall = b.ratio(b.median(rates[ours]), b.median(rates[bare]))
        rows.append(
            b.verdict(
                SCENARIO,
                f"{flavour}: sidestep >= 0.97x bare throughput on loopback",
                ratio,
                "x",
                ratio >= 0.97,
                f"per client CPU second; wall-clock requests/s {wall:.2f}x; {note}",
            )
        )
    return rows
