"""Long work beside an event loop: other threads get a turn about every millisecond.

A thread running Python keeps the interpreter's lock until it waits on
something, or until another thread has asked for the lock for a whole switch
interval (5 ms). An event loop's thread gives the lock up at every system call
and asks for it again right after, so while a worker thread of the same
process runs a listing of thousands of scopes, or turns thousands of a
file's rows into values, each turn of the loop would wait out that interval
several times over. Letting the lock go for a moment does not help: SQLite
does at every row, and the thread takes it back before a waiting one has
woken. `Turns` is called between the small steps of such work, and once a
millisecond has gone by it sleeps `PAUSE`: long enough for a waiting thread
to wake and take the lock. `paced` does the same between the items of an
iterable.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["PAUSE", "TURN", "Turns", "paced"]

TURN = 0.001
"""Seconds of work between two chances for other threads to run."""
PAUSE = 0.0001
"""Seconds each chance lasts: a waiting thread wakes and takes the lock meanwhile."""

_T = TypeVar("_T")


class Turns:
    """Call it between steps of long work: about every `TURN` it lets other threads run."""

    __slots__ = ("_due",)

    def __init__(self) -> None:
        self._due = time.perf_counter() + TURN

    def __call__(self) -> None:
        if time.perf_counter() >= self._due:
            time.sleep(PAUSE)  # the interpreter's lock let go: a waiting thread takes it
            self._due = time.perf_counter() + TURN


def paced(items: Iterable[_T]) -> Iterator[_T]:
    """`items`, with a turn for other threads about every `TURN` of work on them (by the
    thread iterating, since the last turn)."""
    turns = Turns()
    for item in items:
        yield item
        turns()
