"""The effects the failover core yields, and the shells perform.

`Core.handle` decides; whenever it needs I/O it yields one of these — send
this request, read the head of that body, close a response, sleep, call a
store that talks to a server — and takes the result (or the exception) back.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Final, Protocol

__all__ = [
    "NOT_RUN",
    "Call",
    "Clock",
    "Close",
    "Race",
    "Raced",
    "Read",
    "Scan",
    "Send",
    "Sleep",
]

Clock = Callable[[], float]


@dataclass(slots=True)
class Send:
    """Send `request` through the inner transport; the result is its response."""

    request: Any
    deadline: float | None  # on the core's clock; shells that can, enforce it exactly


class Scan(Protocol):
    """The core's reader of a body as it comes, which a `Read` may carry."""

    def feed(self, chunk: bytes) -> bool:
        """Take the next chunk; True when it ends the head. May raise (a timeout)."""
        ...

    def stall_left(self) -> float:
        """Seconds the next wait for a chunk may last before the body counts as stalled."""
        ...


@dataclass(slots=True)
class Read:
    """Read the head of `response` (sent for `request`): chunks until `limit` bytes, or its end.

    The result is ``(head, ended)``. The shell puts the chunks back in front of
    the rest, so the caller still gets the whole body; after the head, body
    errors are passed to `on_error` (a generator of effects) before they rise,
    and a body read to its end calls `on_end`.

    `stall` bounds each wait for a chunk, from the headers on, head and rest
    alike: a silence that long raises the flavour's ReadTimeout. Shells that
    can bound a wait from outside (async) enforce it per chunk; the sync one
    relies on the read timeout the core set for the body's socket reads.

    `deadline` bounds the head, `end_by` the rest (both on the core's clock):
    a chunk not in by then raises the flavour's ReadTimeout. The async shell
    cuts the wait at the deadline; the sync one, whose reads the core bounded
    through the read timeout, compares the deadline with the clock as each
    chunk comes in, so a body trickling in faster than the read timeout still
    ends there.

    `scan`, when given, is fed every chunk of the body as it is read, head and
    rest alike; the head ends when it says so (or at `limit` bytes), and each
    wait for a chunk lasts at most its `stall_left()` rather than `stall`.
    """

    response: Any
    request: Any
    limit: int
    deadline: float | None
    on_error: Callable[[BaseException], Generator[Any, Any, None]] | None = None
    on_end: Callable[[], Generator[Any, Any, None]] | None = None
    stall: float | None = None
    end_by: float | None = None
    scan: Scan | None = None


@dataclass(slots=True)
class Close:
    response: Any


@dataclass(slots=True)
class Sleep:
    """Wait ``seconds`` before the next attempt, or until the transport is closed: not at
    all when it was closed since the core's count of closes was ``closes``."""

    seconds: float
    closes: int


@dataclass(slots=True)
class Call:
    """Call a store operation that may wait on I/O (its ``*_async`` twin in async shells)."""

    name: str
    args: tuple[Any, ...]


class _NotRun:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_RUN"


NOT_RUN: Final = _NotRun()
"""A `Race` branch's result when it was never started, or was cancelled before it ended."""


@dataclass(slots=True)
class Race:
    """Drive `first` (a generator of effects, as `Core.handle` is); if it has not returned
    after `delay` seconds, call `second` and drive the generator it returns beside it
    (None: nothing to start). The first result for which `ends` holds wins: the other
    branch is cancelled, and its generator closes what it holds as any cancelled
    attempt does. A result for which it does not hold waits for the other branch.

    The result is a `Raced`. A branch that raises cancels the other, and its error
    is raised; so is the caller's cancellation, after both branches are cancelled.
    A result that comes from a branch already cancelled (a sync shell's thread, which
    learns of it late) is not handed back: the shell drives `discard(result)`, which
    closes what it holds.
    Every decision (`second`, `ends`, the delay) is the core's: the shell only runs
    the branches at once (the async shell as two tasks, the sync one in threads).
    """

    first: Generator[Any, Any, Any]
    second: Callable[[], Generator[Any, Any, Any] | None]
    delay: float
    ends: Callable[[Any], bool]
    discard: Callable[[Any], Generator[Any, Any, None]]


@dataclass(slots=True)
class Raced:
    """What a `Race` came to: each branch's result (`NOT_RUN` if never started, or
    cancelled), the winner's index (None: neither result ended the race), and whether
    the second branch was started."""

    results: tuple[Any, Any]
    winner: int | None
    started: bool
