"""The errors sidestep raises on purpose, all under one root.

```
SidestepError
 ├─ ConfigError                (also ValueError)
 ├─ AllCandidatesSuspended     (also httpx.TransportError, and httpx2.TransportError
 │                              when httpx2 is installed)
 └─ InvalidUpstreamBody        (the same two bases)
```

Messages and reprs name targets and origins only: never a path, a query,
userinfo or a credential (DESIGN §7).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import httpx

try:
    from httpx2 import TransportError as _Httpx2TransportError
except ModuleNotFoundError as exc:  # httpx2 is optional; nothing can expect its error then
    if exc.name != "httpx2":
        raise

    class _Httpx2TransportError(Exception):  # type: ignore[no-redef]
        """Stands in for ``httpx2.TransportError`` where httpx2 is not installed."""


__all__ = [
    "AllCandidatesSuspended",
    "CandidateStatus",
    "ConfigError",
    "InvalidUpstreamBody",
    "SidestepError",
]


class SidestepError(Exception):
    """The root of every error sidestep raises on purpose."""


class ConfigError(SidestepError, ValueError):
    """A configuration that cannot be loaded: names the file, the key path and the reason."""


@dataclass(frozen=True, slots=True)
class CandidateStatus:
    """Why one candidate target was not tried: its name, never its URL."""

    target: str
    state: str
    reason: str | None
    retry_after: float | None


class AllCandidatesSuspended(SidestepError, httpx.TransportError, _Httpx2TransportError):  # type: ignore[misc]  # both bases define .request alike
    """Every candidate target of a request is suspended; nothing was sent upstream.

    A transport error of both httpx flavours (of httpx2 where it is
    installed), so SDKs built on either turn it into their connection error
    with this one as ``__cause__``.

    Attributes:
        retry_after: seconds until the earliest candidate may be tried again,
            or ``None`` when every suspension lasts until it is cleared.
        candidates: the status of each candidate, in the order they were considered.
    """

    retry_after: float | None
    candidates: tuple[CandidateStatus, ...]

    def __init__(
        self,
        candidates: tuple[CandidateStatus, ...],
        *,
        route: str | None = None,
    ) -> None:
        self.candidates = candidates
        self.route = route
        waits = [c.retry_after for c in candidates if c.retry_after is not None]
        self.retry_after = max(0.0, min(waits)) if waits else None
        super().__init__(self._message())

    def _message(self) -> str:
        names = ", ".join(f"{c.target} ({c.reason or c.state})" for c in self.candidates)
        where = f"route {self.route!r}" if self.route else "this request"
        wait = (
            f"; earliest retry in {math.ceil(self.retry_after)}s"
            if self.retry_after is not None
            else "; no candidate has a known re-admission time"
        )
        return f"every candidate of {where} is suspended: {names}{wait}"

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_suspended, (self.candidates, self.route))

    def __repr__(self) -> str:
        return (
            f"AllCandidatesSuspended(route={self.route!r}, retry_after={self.retry_after!r}, "
            f"candidates={self.candidates!r})"
        )


def _rebuild_suspended(
    candidates: tuple[CandidateStatus, ...], route: str | None
) -> AllCandidatesSuspended:
    return AllCandidatesSuspended(candidates, route=route)


class InvalidUpstreamBody(SidestepError, httpx.TransportError, _Httpx2TransportError):  # type: ignore[misc]  # both bases define .request alike
    """The last candidate answered 2xx with a body that failed validation (``commit: complete``).

    The body was buffered whole and is malformed — JSON that does not parse,
    an event stream with an invalid event or cut before its protocol's end —
    and no other candidate was left to answer instead. A transport error of
    both httpx flavours, like `AllCandidatesSuspended`, so SDKs turn it into
    their connection error. The message names the target and the problem,
    never a byte of the body.

    Attributes:
        target: the name of the target whose body failed validation.
        route: the route's name.
        problem: what was wrong, in words (no body content).
    """

    target: str
    route: str | None
    problem: str

    def __init__(self, target: str, problem: str, *, route: str | None = None) -> None:
        self.target = target
        self.problem = problem
        self.route = route
        where = f" of route {route!r}" if route else ""
        super().__init__(f"target {target!r}{where} answered with an invalid body: {problem}")

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_invalid, (self.target, self.problem, self.route))

    def __repr__(self) -> str:
        return (
            f"InvalidUpstreamBody(target={self.target!r}, route={self.route!r}, "
            f"problem={self.problem!r})"
        )


def _rebuild_invalid(target: str, problem: str, route: str | None) -> InvalidUpstreamBody:
    return InvalidUpstreamBody(target, problem, route=route)
