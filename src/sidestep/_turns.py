"""Long work beside an event loop: other threads get a turn about every millisecond.

A thread running Python keeps the interpreter's lock until it waits on
something, or until another thread has asked for the lock for a whole switch
interval (5 ms). An event loop's thread gives the lock up at every system call
and asks for it again right after, so while a worker thread of the same
process runs a listing of thousands of scopes, each turn of the loop would
wait out that interval several times over. `Turns` is called between the
small steps of such work, and sleeps for nothing once a millisecond has gone
by: that hands the lock to a thread waiting for it.
"""

from __future__ import annotations

import time

__all__ = ["TURN", "Turns"]

TURN = 0.001
"""Seconds of work between two chances for other threads to run."""


class Turns:
    """Call it between steps of long work: about every `TURN` it lets other threads run."""

    __slots__ = ("_due",)

    def __init__(self) -> None:
        self._due = time.perf_counter() + TURN

    def __call__(self) -> None:
        if time.perf_counter() >= self._due:
            time.sleep(0)  # releases the interpreter's lock: a waiting thread takes it
            self._due = time.perf_counter() + TURN
