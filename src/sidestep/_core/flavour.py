"""What the core needs to know of an httpx-like module: httpx, or its fork httpx2.

The two flavours have the same shapes under different classes; a `Flavour`
holds the classes the core builds and the map from their exceptions to the
flavour-neutral `ErrorKind` the classifier reads.
"""

from __future__ import annotations

import errno
import ssl
import sys
from types import ModuleType
from typing import Any

import anyio

from .._answers.classify import ErrorKind

__all__ = ["Flavour", "closed_locally", "is_proxy"]

# httpcore's (and httpcore2's) connection pools that reach upstreams through a proxy.
_PROXY_POOLS = frozenset({"HTTPProxy", "AsyncHTTPProxy", "SOCKSProxy", "AsyncSOCKSProxy"})

_ERROR_KINDS = {
    "ConnectError": ErrorKind.CONNECT,
    "ConnectTimeout": ErrorKind.CONNECT,
    "ProxyError": ErrorKind.PROXY,  # the proxy refused the tunnel
    "ReadTimeout": ErrorKind.AMBIGUOUS,
    "WriteTimeout": ErrorKind.AMBIGUOUS,
    "ReadError": ErrorKind.AMBIGUOUS,
    "WriteError": ErrorKind.AMBIGUOUS,
    "RemoteProtocolError": ErrorKind.AMBIGUOUS,
    "CloseError": ErrorKind.AMBIGUOUS,
    "PoolTimeout": ErrorKind.POOL,
}
# What a socket says when this process closed it under a read or write in flight: the
# descriptor is gone (or, reused meanwhile, no longer a socket). No peer can cause either.
_CLOSED_ERRNOS = frozenset({errno.EBADF, errno.ENOTSOCK})
_CAUSES = 8  # the most links of an exception's chain looked at (httpx <- httpcore <- backend)


class Flavour:
    """One httpx-like module, seen through what the core uses of it."""

    __slots__ = (
        "ByteStream",
        "Response",
        "TransportError",
        "errors",
        "module",
        "multipart",
        "name",
        "read_error",
        "read_timeout",
        "timeout_error",
    )

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.name = module.__name__
        self.Response: Any = module.Response
        self.ByteStream: Any = module.ByteStream
        self.TransportError: type[Exception] = module.TransportError
        self.read_timeout: Any = module.ReadTimeout
        self.read_error: Any = module.ReadError
        self.timeout_error: Any = module.TimeoutException
        self.multipart: type[Any] = _multipart_stream(module)
        self.errors: dict[type[BaseException], ErrorKind] = {
            getattr(module, name): kind for name, kind in _ERROR_KINDS.items()
        }

    def __repr__(self) -> str:
        return f"Flavour({self.name})"

    def error_kind(self, exc: BaseException) -> ErrorKind:
        if closed_locally(exc):
            return ErrorKind.CLOSED
        for cls in type(exc).__mro__:
            kind = self.errors.get(cls)
            if kind is not None:
                return kind
        if isinstance(exc, TimeoutError):
            return ErrorKind.AMBIGUOUS  # a first-byte or total deadline ran out mid-attempt
        return ErrorKind.OTHER

    def is_timeout(self, exc: BaseException) -> bool:
        """Whether `exc` is a timeout: the flavour's own, or a deadline sidestep enforced."""
        return isinstance(exc, (self.timeout_error, TimeoutError))


def closed_locally(exc: BaseException) -> bool:
    """Whether `exc` says our own side closed the connection under the attempt.

    The application closed its client, its transport or the pool while the
    request was in flight (or anything else in this process closed the
    socket): httpcore's read or write then fails on a closed resource, and the
    flavour's error carries that cause — anyio's or trio's
    `ClosedResourceError` (a peer that goes away is a `BrokenResourceError`,
    an end of stream or a protocol error instead), or, in a sync client, an
    `OSError` of a closed descriptor. Each link is the explicit cause, else
    the context: httpcore's pool re-raises its connection's error ``from
    None``, which hides the backend's error from tracebacks but keeps it as
    the context.
    """
    trio = sys.modules.get("trio")  # not imported: none of its errors can be here
    cause: BaseException | None = exc
    for _ in range(_CAUSES):
        if cause is None:
            return False
        if isinstance(cause, anyio.ClosedResourceError):
            return True
        if trio is not None and isinstance(cause, trio.ClosedResourceError):
            return True
        if (
            isinstance(cause, OSError)
            and not isinstance(cause, ssl.SSLError)  # its errno is TLS's own code
            and cause.errno in _CLOSED_ERRNOS
        ):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def raised_by_a_mock(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from, came out of respx: a mock
    standing in for the network below an HTTP transport (it patches httpcore's pools or
    the client's transport look-up), whose errors say nothing of any upstream."""
    cause: BaseException | None = exc
    for _ in range(_CAUSES):
        if cause is None:
            return False
        tb = cause.__traceback__
        while tb is not None:
            module = tb.tb_frame.f_globals.get("__name__", "")
            if module == "respx" or module.startswith("respx."):
                return True
            tb = tb.tb_next
        cause = cause.__cause__ or cause.__context__
    return False


def reaches_network(transport: Any, depth: int = 3) -> bool:
    """Whether `transport` sends over the network: an HTTP transport of httpx or httpx2
    (or a subclass), an aiohttp transport of the SDKs (``httpx_aiohttp``), or a wrapper
    over one of them (retries, tracing, caching: found through the attribute it keeps
    its transport in). A test double, an in-process app and whatever else cannot be told
    to reach the network do not."""
    for cls in type(transport).__mro__:
        name, module = cls.__name__, cls.__module__
        if name in _NETWORK_TRANSPORTS and module.partition(".")[0] in _FLAVOURS:
            return True
        if name == "AiohttpTransport" and "httpx_aiohttp" in module:
            return True
    if depth:
        for attribute in _WRAPPED:
            try:
                inner = getattr(transport, attribute, None)
            except Exception:  # noqa: S112  # a property of someone else's that fails
                continue
            if inner is not None and inner is not transport and reaches_network(inner, depth - 1):
                return True
    return False


def is_proxy(transport: Any) -> bool:
    """Whether `transport` (an httpx or httpx2 HTTP transport) sends through a proxy."""
    return type(getattr(transport, "_pool", None)).__name__ in _PROXY_POOLS


_NETWORK_TRANSPORTS = frozenset({"HTTPTransport", "AsyncHTTPTransport"})
_FLAVOURS = frozenset({"httpx", "httpx2"})
# where wrapper transports keep the transport they send through (OpenTelemetry's, hishel's:
# `_transport`; httpx-retries': `_sync_transport`/`_async_transport`)
_WRAPPED = ("_transport", "transport", "_sync_transport", "_async_transport", "_wrapped")


def _multipart_stream(module: ModuleType) -> type[Any]:
    # A multipart body of in-memory parts is re-iterable, so it can be replayed;
    # the class is private in both flavours, hence the careful look-up.
    multipart = getattr(module, "_multipart", None)
    stream = getattr(multipart, "MultipartStream", None)
    return stream if isinstance(stream, type) else type(None)
