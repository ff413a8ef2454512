"""The demo's load: paced calls through one client, and what each client's run has seen.

`drive` starts calls at a steady rate with a bound on those in flight and
keeps each one's start, latency and outcome in a `Tally`; `naive` and
`through` are the two clients' calls; a `Phase` is one client's run as the
demo shows and summarises it. The benchmarks drive their load the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from .._shells.transport import AsyncFailoverTransport

__all__ = ["Call", "Phase", "Tally", "drive", "naive", "through"]


@dataclass(slots=True)
class Tally:
    """What one client's run has seen so far: each request's start, latency and outcome."""

    total: int
    done: int = 0
    errors: int = 0
    starts: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    started: float = 0.0
    finished: float | None = None


Call = Callable[[], Awaitable[bool]]


async def drive(call: Call, tally: Tally, *, concurrency: int, rate: float) -> None:
    """Make `tally.total` calls, starting `rate` per second at most, `concurrency` at once at most.

    A call returns whether it succeeded; its latency is measured from the
    moment it got a slot (queueing for one is not counted).
    """
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(concurrency)
    tasks: set[asyncio.Task[None]] = set()

    async def one() -> None:
        started = loop.time()
        try:
            ok = await call()
        except Exception:  # whatever a call raises reached its caller: an error
            ok = False
        finally:
            slots.release()
        tally.starts.append(started)
        tally.latencies.append(loop.time() - started)
        tally.done += 1
        tally.errors += not ok

    tally.started = loop.time()
    try:
        for n in range(tally.total):
            wait = tally.started + n / rate - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            await slots.acquire()
            task = asyncio.ensure_future(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    tally.finished = loop.time()


def naive(client: httpx.AsyncClient, urls: list[str]) -> Call:
    """Plain httpx: a request tries `urls` in order, one call each, until one answers below 500."""

    async def call() -> bool:
        for url in urls:
            try:
                response = await client.get(url)
            except httpx.TransportError:
                continue
            if response.status_code < 500:
                return True
        return False

    return call


def through(client: httpx.AsyncClient, url: str) -> Call:
    """One request to the first target; the client's transport does any failover."""

    async def call() -> bool:
        try:
            response = await client.get(url)
        except httpx.TransportError:
            return False
        return response.status_code < 500

    return call


@dataclass(slots=True)
class Phase:
    """One client's run, as shown and summarised."""

    label: str
    tally: Tally
    transport: AsyncFailoverTransport | None = None
    probes: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    wasted: int = 0
