"""The 503 answer to ``AllCandidatesSuspended``, shared by the core and the web integrations.

Finds the error behind whatever wrapped it (an SDK's connection error, an
exception group) and builds the status, headers and body of DESIGN §3.4, so
the ASGI, WSGI and Flask integrations and the synthetic response all answer
alike.
"""

from __future__ import annotations

import json
import math

from .._common.errors import AllCandidatesSuspended

__all__ = [
    "find_suspended",
    "retry_after_header",
    "unavailable_body",
    "unavailable_headers",
]

# Chains are a handful of links long; the bound only guards against a
# pathological (or adversarial) exception graph.
_MAX_VISITS = 128
_MESSAGE = "Every upstream candidate for this request is temporarily suspended."


def find_suspended(exc: BaseException) -> AllCandidatesSuspended | None:
    """The ``AllCandidatesSuspended`` behind ``exc``, if any.

    Looks at ``exc`` itself, then depth-first through ``__cause__``,
    ``__context__`` and the members of exception groups, so an SDK error
    raised ``from`` the suspension, or one raised while handling it, is seen
    through. Cycles are visited once and the walk is bounded.
    """
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending and len(seen) < _MAX_VISITS:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, AllCandidatesSuspended):
            return current
        # Pushed in reverse so the cause is looked at before the context, and
        # a group's members in their order. Exception groups are recognised by
        # their tuple of members, which also covers the backport on 3.10.
        if current.__context__ is not None:
            pending.append(current.__context__)
        if current.__cause__ is not None:
            pending.append(current.__cause__)
        members = getattr(current, "exceptions", None)
        if isinstance(members, tuple):
            pending.extend(m for m in reversed(members) if isinstance(m, BaseException))
    return None


def _retry_after_seconds(exc: AllCandidatesSuspended) -> int | None:
    if exc.retry_after is None:
        return None
    return max(1, math.ceil(exc.retry_after))


def retry_after_header(exc: AllCandidatesSuspended) -> str | None:
    """The ``Retry-After`` value: whole seconds, rounded up, at least 1; ``None`` when unknown."""
    seconds = _retry_after_seconds(exc)
    return None if seconds is None else str(seconds)


def unavailable_body(exc: AllCandidatesSuspended) -> bytes:
    """The JSON body of the 503: names no upstream, account or credential."""
    error = {
        "type": "all_candidates_suspended",
        "message": _MESSAGE,
        "retry_after": _retry_after_seconds(exc),
    }
    return json.dumps({"error": error}).encode()


def unavailable_headers(exc: AllCandidatesSuspended) -> list[tuple[str, str]]:
    """The headers of the 503, in a new list the caller may extend.

    ``content-type``, ``content-length`` and, when known, ``retry-after``.
    """
    headers = [
        ("content-type", "application/json"),
        ("content-length", str(len(unavailable_body(exc)))),
    ]
    retry_after = retry_after_header(exc)
    if retry_after is not None:
        headers.append(("retry-after", retry_after))
    return headers
