"""The streams a shell gives back for a body whose head it peeked: the head again, then
the rest; closing one settles the body's verdict and closes the original. One class
per flavour and kind, made on first use.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from .._common.shield import shielded
from .._core.flavour import Flavour

__all__ = ["async_replay", "finish_iterators", "sync_replay"]


async def finish_iterators(*iterators: Any) -> None:
    """Close the async iterators a read started (a generator's finally runs now), even
    while a cancellation unwinds; one already finished, or with no aclose, is left."""
    await shielded(_close_each, iterators, limit=None, otherwise=None)


async def _close_each(iterators: tuple[Any, ...]) -> None:
    for iterator in iterators:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()


_REPLAYS: dict[tuple[str, bool], type[Any]] = {}


def sync_replay(flavour: Flavour) -> Callable[[Iterator[bytes], Any, Callable[[], None]], Any]:
    cls = _REPLAYS.get((flavour.name, False))
    if cls is None:

        class SyncReplay(flavour.module.SyncByteStream):  # type: ignore[name-defined,misc]
            """The peeked head, then the rest of the body; closing closes the original."""

            def __init__(
                self, body: Iterator[bytes], original: Any, on_close: Callable[[], None]
            ) -> None:
                self._body = body
                self._original = original
                self._on_close = on_close

            def __iter__(self) -> Iterator[bytes]:
                return self._body

            def close(self) -> None:
                try:
                    self._on_close()
                finally:
                    self._original.close()

        cls = _REPLAYS[(flavour.name, False)] = SyncReplay
    return cls


def async_replay(
    flavour: Flavour,
) -> Callable[[AsyncIterator[bytes], Any, Callable[[], Awaitable[None]], Any], Any]:
    cls = _REPLAYS.get((flavour.name, True))
    if cls is None:

        class AsyncReplay(flavour.module.AsyncByteStream):  # type: ignore[name-defined,misc]
            """The peeked head, then the rest of the body; closing closes the original."""

            def __init__(
                self,
                body: AsyncIterator[bytes],
                original: Any,
                on_close: Callable[[], Awaitable[None]],
                chunks: Any,
            ) -> None:
                self._body = body
                self._original = original
                self._on_close = on_close
                self._chunks = chunks  # the original's iterator, started by the peek

            def __aiter__(self) -> AsyncIterator[bytes]:
                return self._body

            async def aclose(self) -> None:
                try:
                    # a verdict write must land even while a cancellation unwinds
                    await shielded(self._on_close, limit=None, otherwise=None)
                finally:
                    # Finish the iterators the peek started here and now, rather
                    # than leave them to the garbage collector and a closing loop.
                    try:
                        await finish_iterators(self._body, self._chunks)
                    finally:
                        await self._original.aclose()

        cls = _REPLAYS[(flavour.name, True)] = AsyncReplay
    return cls
