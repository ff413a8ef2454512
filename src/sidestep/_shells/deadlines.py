"""The read timeouts a shell raises when a request's time runs out: their messages, and
the async shell's bounds on a send or a read — anyio scopes that surface as the
flavour's ReadTimeout, as any httpx timeout would.
"""

from __future__ import annotations

from typing import Any

import anyio

from .._core.flavour import Flavour

__all__ = ["NO_ANSWER", "NO_DEADLINE", "OUT_OF_TIME", "STALLED", "Deadline", "no_deadline"]

NO_ANSWER = "sidestep: no answer within the request's deadline"
STALLED = "sidestep: the body stalled for longer than stall_timeout"
OUT_OF_TIME = "sidestep: total_timeout ran out while the body was read"


class Deadline:
    """anyio.fail_after that surfaces as the flavour's ReadTimeout, as any httpx timeout would."""

    __slots__ = ("_flavour", "_message", "_request", "_scope")

    def __init__(
        self, seconds: float, flavour: Flavour, request: Any, message: str = NO_ANSWER
    ) -> None:
        self._scope = anyio.fail_after(seconds)
        self._flavour = flavour
        self._request = request
        self._message = message

    def __enter__(self) -> None:
        self._scope.__enter__()

    def __exit__(self, *exc_info: Any) -> bool:
        try:
            return bool(self._scope.__exit__(*exc_info))
        except TimeoutError as exc:
            raise self._flavour.read_timeout(self._message, request=self._request) from exc


class _NoDeadline:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: Any) -> None:
        return None


NO_DEADLINE = _NoDeadline()


def no_deadline() -> _NoDeadline:
    return NO_DEADLINE
