"""The sidestep transports for httpx2, the fork of httpx the OpenAI and Anthropic SDKs run on.

The same shells as `sidestep.AsyncFailoverTransport` and
`sidestep.FailoverTransport`, bound to httpx2's classes: every decision is
shared. httpx2 is optional (the ``httpx2`` extra, or an SDK that brings it):
without it, importing this module raises an `ImportError` that says so.
"""

from __future__ import annotations

try:
    import httpx2 as _httpx2
except ModuleNotFoundError as exc:
    if exc.name != "httpx2":
        raise
    raise ImportError(
        "sidestep.httpx2 needs httpx2: pip install 'sidestep[httpx2]'", name="httpx2"
    ) from None

from .._core.flavour import Flavour
from .async_shell import AsyncShell
from .sync_shell import SyncShell

__all__ = ["AsyncFailoverTransport", "FailoverTransport"]

_HTTPX2 = Flavour(_httpx2)


class AsyncFailoverTransport(AsyncShell, _httpx2.AsyncBaseTransport):
    """An `httpx2.AsyncBaseTransport` that skips suspended upstreams and fails over.

    Arguments as `sidestep.AsyncFailoverTransport`; the inner transport
    defaults to `httpx2.AsyncHTTPTransport()`.
    """

    _flavour = _HTTPX2


class FailoverTransport(SyncShell, _httpx2.BaseTransport):
    """An `httpx2.BaseTransport` that skips suspended upstreams and fails over.

    Arguments as `sidestep.FailoverTransport`; the inner transport defaults to
    `httpx2.HTTPTransport()`.
    """

    _flavour = _HTTPX2
