"""sidestep keeps outbound HTTP calls working through upstream outages."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from ._adopt import install, uninstall, wrap
from ._config import Config, load_config
from ._errors import AllCandidatesSuspended, CandidateStatus, ConfigError, SidestepError
from ._store import MemoryStore, StateStore
from ._transport import AsyncFailoverTransport, FailoverTransport, Suspension

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
    "MemoryStore",
    "SidestepError",
    "StateStore",
    "Suspension",
    "__version__",
    "install",
    "load_config",
    "uninstall",
    "wrap",
]
