"""sidestep keeps outbound HTTP calls working through upstream outages."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from ._adopt import install, uninstall, wrap
from ._config import Config, load_config
from ._errors import (
    AllCandidatesSuspended,
    CandidateStatus,
    ConfigError,
    InvalidUpstreamBody,
    SidestepError,
)
from ._sqlite import SqliteStore
from ._store import MemoryStore, StateStore
from ._transport import AsyncFailoverTransport, FailoverTransport, Suspension

if TYPE_CHECKING:
    from ._redis import RedisStore as RedisStore

try:
    __version__ = version("sidestep")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

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
            from ._redis import RedisStore
        except ModuleNotFoundError as exc:
            if exc.name != "redis" and not (exc.name or "").startswith("redis."):
                raise
            raise ImportError(
                "sidestep.RedisStore needs the redis extra: pip install 'sidestep[redis]'"
            ) from exc
        return RedisStore
    raise AttributeError(f"module 'sidestep' has no attribute {name!r}")
