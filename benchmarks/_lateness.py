"""A bare event loop beside a benchmark's application: what the machine alone costs a loop.

`Machine` runs this file in a process of its own: an asyncio loop that sleeps
2 ms over and over, with no application, no admin app and no store in it, and
keeps how late each wake-up comes. A benchmark takes its figures over the same
windows as its application's own probe, so that a stall the busy machine (other
processes, a browser) causes a bare loop as well is told apart from the
application's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import _bench as b

HERE = Path(__file__).resolve().parent
PROBE_TICK = 0.002


class _Lateness:
    """The figures of a bare event loop's 2 ms sleeps: each line read on stdin is answered,
    on stdout, with the figures since the line before, as JSON."""

    def __init__(self) -> None:
        self.late: list[float] = []

    def answer(self) -> None:
        for _ in sys.stdin:
            late, self.late = self.late, []
            ms = sorted(x * 1000 for x in late) or [0.0]
            figures = {"max_ms": ms[-1], "p999_ms": b.percentile(ms, 0.999)}
            print(json.dumps(figures), flush=True)

    async def run(self) -> None:
        threading.Thread(target=self.answer, daemon=True).start()
        while True:
            started = time.perf_counter()
            await asyncio.sleep(PROBE_TICK)
            self.late.append(time.perf_counter() - started - PROBE_TICK)


def main() -> None:
    asyncio.run(_Lateness().run())


class Machine:
    """The bare event loop, in a process of its own (this file run as a script)."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(HERE)}
        self.child = subprocess.Popen(  # noqa: S603  # this very script
            [sys.executable, __file__],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def take(self) -> dict[str, float]:
        """Its worst and 99.9th percentile lateness (ms) since they were last taken."""
        ask, hear = self.child.stdin, self.child.stdout
        if ask is None or hear is None:
            raise RuntimeError("the bare loop's pipes are gone")
        ask.write("\n")
        ask.flush()
        figures: dict[str, float] = json.loads(hear.readline())
        return figures

    def close(self) -> None:
        self.child.terminate()
        self.child.communicate(timeout=10)  # waits for it, and closes the pipes


@contextlib.contextmanager
def machine_beside() -> Iterator[Machine]:
    """A bare event loop running beside the caller's application until the block ends."""
    machine = Machine()
    try:
        machine.take()  # it is up
        yield machine
    finally:
        machine.close()


if __name__ == "__main__":
    main()
