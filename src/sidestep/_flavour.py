"""What the core needs to know of an httpx-like module: httpx, or its fork httpx2.

The two flavours have the same shapes under different classes; a `Flavour`
holds the classes the core builds and the map from their exceptions to the
flavour-neutral `ErrorKind` the classifier reads.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ._classify import ErrorKind

__all__ = ["Flavour", "is_proxy"]

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
        self.timeout_error: Any = module.TimeoutException
        self.multipart: type[Any] = _multipart_stream(module)
        self.errors: dict[type[BaseException], ErrorKind] = {
            getattr(module, name): kind for name, kind in _ERROR_KINDS.items()
        }

    def __repr__(self) -> str:
        return f"Flavour({self.name})"

    def error_kind(self, exc: BaseException) -> ErrorKind:
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


def is_proxy(transport: Any) -> bool:
    """Whether `transport` (an httpx or httpx2 HTTP transport) sends through a proxy."""
    return type(getattr(transport, "_pool", None)).__name__ in _PROXY_POOLS


def _multipart_stream(module: ModuleType) -> type[Any]:
    # A multipart body of in-memory parts is re-iterable, so it can be replayed;
    # the class is private in both flavours, hence the careful look-up.
    multipart = getattr(module, "_multipart", None)
    stream = getattr(multipart, "MultipartStream", None)
    return stream if isinstance(stream, type) else type(None)
