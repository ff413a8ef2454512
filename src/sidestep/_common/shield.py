"""Async work carried to its end whatever cancels its caller: a verdict's write, a probe
slot given back, a response closed.

anyio's shielded scope holds back anyio's own cancellations and trio's, but not
asyncio's: a `Task.cancel()` (asyncio's own, or the one `asyncio.timeout` sends)
still lands inside it, and anyio's worker-thread calls drop a call queued for a
thread when their caller is cancelled before a thread took it. Under asyncio the
work therefore also runs as a task of its own, which the caller waits for however
many times it is cancelled meanwhile; the caller's cancellation then comes out as
it came.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

__all__ = ["shielded"]

_T = TypeVar("_T")
_O = TypeVar("_O")


async def shielded(
    fn: Callable[..., Awaitable[_T]], *args: Any, limit: float | None, otherwise: _O
) -> _T | _O:
    """`await fn(*args)` to its end even while the caller is cancelled, for at most
    `limit` seconds (None: no bound); `otherwise` when the limit ran out first."""
    with anyio.CancelScope(shield=True):  # anyio's and trio's cancellations wait outside
        if not _on_asyncio():
            return await _bounded(fn, args, limit, otherwise)
        # asyncio's own land even here: the work is a task they do not reach
        work = asyncio.ensure_future(_bounded(fn, args, limit, otherwise))
        cancelled: BaseException | None = None
        while not work.done():
            try:
                await asyncio.wait((work,))  # which leaves the work be when cancelled
            except asyncio.CancelledError as exc:
                cancelled = exc  # the caller's: wait on, and let it out afterwards
        if cancelled is None:
            return work.result()
        work.exception()  # seen: what comes out is the caller's cancellation
        caller: BaseException = cancelled
    raise caller


def _on_asyncio() -> bool:
    try:
        return asyncio.current_task() is not None
    except RuntimeError:  # no asyncio loop runs this: trio's
        return False


async def _bounded(
    fn: Callable[..., Awaitable[_T]], args: tuple[Any, ...], limit: float | None, otherwise: _O
) -> _T | _O:
    with anyio.move_on_after(limit):
        return await fn(*args)
    return otherwise
