"""The spread benchmark's traffic: how callers load a contender, and what each run saw.

Three shapes, each bounded: a closed loop of `CALLERS` callers (each sends
its next request when the last is answered) for a time or a count; an open
loop at a steady rate whatever the answers; and conversations of several
turns in three phases, one member lost and back between them. `measure`
runs one contender after a short warm-up, on deployments whose counts are
zeroed and whose rate limits are full, and keeps its client CPU.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import _routers as r
from _deployments import Deployments

CALLERS = 32
WARM_UP = 4  # requests at once before a run, not counted


@dataclass(slots=True)
class Run:
    """One contender's run in one case: what its callers saw and what the deployments counted."""

    latencies: list[float] = field(default_factory=list)  # answered requests only
    members: Counter[str] = field(default_factory=Counter)
    turns: dict[str, list[list[str | None]]] = field(default_factory=dict)  # session -> phases
    offered: int = 0
    limited: int = 0  # 429s that reached the caller
    errors: int = 0  # anything else that reached the caller
    elapsed: float = 0.0
    cpu: float = 0.0
    upstream: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def answered(self) -> int:
        return len(self.latencies)

    def share(self, member: str) -> float:
        return 100 * self.members[member] / self.answered if self.answered else float("nan")


async def request(router: r.Router, run: Run, session: str | None = None) -> str | None:
    """One request; the member that answered it, or None when the caller got an error."""
    loop = asyncio.get_running_loop()
    run.offered += 1
    started = loop.time()
    try:
        member = await router.call(session)
    except Exception as exc:  # whatever the contender raised reached its caller
        if r.caller_status(exc) == 429:
            run.limited += 1
        else:
            run.errors += 1
        return None
    run.latencies.append(loop.time() - started)
    run.members[member] += 1
    return member


def closed_loop(seconds: float = 0.0, total: int = 0) -> Drive:
    """`CALLERS` callers, each sending its next request when the last is answered, for
    `seconds` (requests under way then finish) or until `total` requests are sent."""

    async def drive(router: r.Router, run: Run, _: Deployments) -> None:
        deadline = asyncio.get_running_loop().time() + seconds

        async def caller() -> None:
            loop = asyncio.get_running_loop()
            while run.offered < total if total else loop.time() < deadline:
                await request(router, run)

        await asyncio.gather(*(caller() for _ in range(CALLERS)))

    return drive


def open_loop(rate: float, total: int) -> Drive:
    """`total` requests started at `rate` per second whatever the answers (256 at once at most)."""

    async def drive(router: r.Router, run: Run, _: Deployments) -> None:
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(256)
        start = loop.time()

        async def one() -> None:
            try:
                await request(router, run)
            finally:
                slots.release()

        tasks = []
        for n in range(total):
            await asyncio.sleep(max(0.0, start + n / rate - loop.time()))
            await slots.acquire()
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)

    return drive


def conversations(count: int, turns: tuple[int, int, int], lost: str, pause: float) -> Drive:
    """`count` conversations, `CALLERS` at a time, taking their turns in three phases:
    all members healthy, `lost` down (503), then `lost` back after `pause` seconds."""

    async def drive(router: r.Router, run: Run, servers: Deployments) -> None:
        sessions = [f"conversation-{n}" for n in range(count)]
        run.turns = {session: [] for session in sessions}
        slots = asyncio.Semaphore(CALLERS)

        async def talk(session: str, phase_turns: int) -> None:
            async with slots:
                run.turns[session].append(
                    [await request(router, run, session) for _ in range(phase_turns)]
                )

        for phase, phase_turns in enumerate(turns):
            if phase == 1:
                servers.down({lost: True})
            elif phase == 2:
                servers.down({lost: False})
                await asyncio.sleep(pause)  # the breaker's window ends: the member is tried again
            await asyncio.gather(*(talk(session, phase_turns) for session in sessions))

    return drive


Drive = Callable[[r.Router, Run, Deployments], Awaitable[None]]


async def measure(servers: Deployments, factory: Callable[[], r.Router], drive: Drive) -> Run:
    """One contender's run after a warm-up, the deployments' counts zeroed and limits full.

    The warm-up (`WARM_UP` requests at once, not counted) lets every
    contender open its connections and build what it builds lazily.
    """
    router = factory()
    with warnings.catch_warnings():
        if router.noisy:
            warnings.simplefilter("ignore")
        await asyncio.gather(*(router.call(None) for _ in range(WARM_UP)), return_exceptions=True)
        servers.reset()
        run = Run()
        loop = asyncio.get_running_loop()
        started, cpu = loop.time(), time.process_time()
        try:
            await drive(router, run, servers)
        finally:
            run.elapsed = loop.time() - started
            run.cpu = time.process_time() - cpu
            await router.close()
    run.upstream = servers.stats()
    return run
