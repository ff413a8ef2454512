"""The sidestep transports for httpx2, the fork of httpx the OpenAI and Anthropic SDKs run on.

The same shells as `sidestep.AsyncFailoverTransport` and
`sidestep.FailoverTransport`, bound to httpx2's classes: every decision is
shared.
"""

from __future__ import annotations

import httpx2 as _httpx2

from ._flavour import Flavour
from ._transport import _AsyncShell, _SyncShell

__all__ = ["AsyncFailoverTransport", "FailoverTransport"]

_HTTPX2 = Flavour(_httpx2)


class AsyncFailoverTransport(_AsyncShell, _httpx2.AsyncBaseTransport):
    """An `httpx2.AsyncBaseTransport` that skips suspended upstreams and fails over.

    Arguments as `sidestep.AsyncFailoverTransport`; the inner transport
    defaults to `httpx2.AsyncHTTPTransport()`.
    """

    _flavour = _HTTPX2


class FailoverTransport(_SyncShell, _httpx2.BaseTransport):
    """An `httpx2.BaseTransport` that skips suspended upstreams and fails over.

    Arguments as `sidestep.FailoverTransport`; the inner transport defaults to
    `httpx2.HTTPTransport()`.
    """

    _flavour = _HTTPX2
