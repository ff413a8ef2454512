"""The core's memories (routes matched, origins, rebuilt URLs, ...) stay bounded."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["CACHE_LIMIT", "remember"]

# The core's per-origin, per-path and per-header memories hold at most this many entries.
CACHE_LIMIT = 4096

_K = TypeVar("_K")
_V = TypeVar("_V")


def remember(memory: dict[_K, _V], key: _K, value: _V) -> _V:
    """`value` kept in `memory` under `key`; a full memory (`CACHE_LIMIT`) is emptied
    first, so that it stays bounded without freezing on the first keys it saw."""
    if len(memory) >= CACHE_LIMIT:
        memory.clear()
    memory[key] = value
    return value
