"""The store a configuration's `store:` section describes, built.

Above the settings and every store: each kind of `StoreSettings` has its
builder here. Redis is imported only when a Redis store is built, so a
configuration naming one loads without the extra.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._settings.stores import StoreSettings
from .memory import MemoryStore
from .protocol import StateStore
from .sqlite.store import SqliteStore

__all__ = ["build_store"]


def build_store(settings: StoreSettings) -> StateStore:
    """A new store as `settings` describe it (no I/O: a Redis store connects on first use).

    Raises:
        ImportError: the store's kind needs an extra that is not installed.
        ValueError: the store refuses its settings (never quoting the URL).
    """
    return _BUILDERS[settings.kind](settings.options)


def _memory(options: Any) -> StateStore:
    return MemoryStore(max_scopes=options.max_scopes)


def _sqlite(options: Any) -> StateStore:
    return SqliteStore(**options.model_dump(exclude_unset=True))


def _redis(options: Any) -> StateStore:
    try:
        from .redis.store import RedisStore  # the optional redis extra: only when asked for
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "redis":
            raise
        raise ImportError(
            "store: redis needs the redis extra: pip install 'sidestep[redis]'"
        ) from None
    return RedisStore(**options.model_dump(exclude_unset=True))


# A builder for each of the settings' `KINDS`.
_BUILDERS: dict[str, Callable[[Any], StateStore]] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "redis": _redis,
}
