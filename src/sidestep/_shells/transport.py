"""The httpx transports: the sync and async shells bound to httpx's classes, each by a
two-line subclass (httpx2's are in the `httpx2` module beside this one).
"""

from __future__ import annotations

import httpx

from .._core.flavour import Flavour
from .async_shell import AsyncShell
from .sync_shell import SyncShell

__all__ = ["AsyncFailoverTransport", "FailoverTransport"]

_HTTPX = Flavour(httpx)


class AsyncFailoverTransport(AsyncShell, httpx.AsyncBaseTransport):
    """An `httpx.AsyncBaseTransport` that skips suspended upstreams and fails over.

    Args:
        config: a `Config`, a mapping validated into one, or None (per-host
            breaking, no routes).
        transport: the inner transport doing the I/O (default
            `httpx.AsyncHTTPTransport()`); closing this one closes it.
        store: where circuit state lives (default: a new `MemoryStore`).
        clock: monotonic seconds, for tests.

    Example:
        >>> client = httpx.AsyncClient(transport=sidestep.AsyncFailoverTransport(config))
    """

    _flavour = _HTTPX


class FailoverTransport(SyncShell, httpx.BaseTransport):
    """An `httpx.BaseTransport` that skips suspended upstreams and fails over (sync clients).

    Takes the same arguments as `AsyncFailoverTransport`; the inner transport
    defaults to `httpx.HTTPTransport()`.
    """

    _flavour = _HTTPX
