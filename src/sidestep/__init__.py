"""sidestep keeps outbound HTTP calls working through upstream outages."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._common.errors import (
    AllCandidatesSuspended,
    CandidateStatus,
    ConfigError,
    InvalidUpstreamBody,
    SidestepError,
)
from ._common.version import __version__
from ._core.listing_row import Suspension
from ._settings.config import Config, load_config
from ._shells.adopt import install, uninstall, wrap
from ._shells.transport import AsyncFailoverTransport, FailoverTransport
from ._state.memory import MemoryStore
from ._state.protocol import StateStore
from ._state.sqlite.store import SqliteStore

if TYPE_CHECKING:
    from ._state.redis.store import RedisStore as RedisStore

__all__ = [
    "AllCandidatesSuspended",
    "AsyncFailoverTransport",
    "CandidateStatus",
    "Config",
    "ConfigError",
    "FailoverTransport",
    "InvalidUpstreamBody",
    "MemoryStore",
    "SidestepError",
    "SqliteStore",
    "StateStore",
    "Suspension",
    "__version__",
    "install",
    "load_config",
    "uninstall",
    "wrap",
]


def __getattr__(name: str) -> Any:
    # RedisStore needs the optional `redis` extra, so it is imported only when asked
    # for, and left out of __all__: `from sidestep import *` must work without it.
    if name == "RedisStore":
        try:
            from ._state.redis.store import RedisStore
        except ModuleNotFoundError as exc:
            if exc.name != "redis" and not (exc.name or "").startswith("redis."):
                raise
            raise ImportError(
                "sidestep.RedisStore needs the redis extra: pip install 'sidestep[redis]'"
            ) from exc
        return RedisStore
    raise AttributeError(f"module 'sidestep' has no attribute {name!r}")
