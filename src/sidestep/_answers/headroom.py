"""How much of its rate limits an upstream has left, from the limits it announces.

OpenAI (``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``) and
Anthropic (``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
{limit,remaining,reset}``) announce, on each answer, each limit's size, what
is left of it and when it is full again. `announced` reads them as
`Bucket` values; `has_room` estimates what is left later on: most providers
refill a limit continuously, so what is missing comes back in a straight
line until the announced reset, less the requests sent since. Pure: no I/O,
no clock reads (the caller passes the times).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .ratelimits import header, reset_in

__all__ = ["SIGNS", "Bucket", "announced", "has_room"]

# (limit, remaining, reset) header names of each limit, and whether it counts requests.
_OPENAI = "x-ratelimit-{}-{}"
_ANTHROPIC = "anthropic-ratelimit-{1}-{0}"
_KINDS = (
    (_OPENAI, "requests"),
    (_OPENAI, "tokens"),
    (_ANTHROPIC, "requests"),
    (_ANTHROPIC, "tokens"),
    (_ANTHROPIC, "input-tokens"),
    (_ANTHROPIC, "output-tokens"),
)
# Headers at least one of which an answer carries when it announces any limit.
SIGNS = ("x-ratelimit-remaining-requests", "anthropic-ratelimit-requests-remaining")


@dataclass(frozen=True, slots=True)
class Bucket:
    """One announced limit: its size, what was left, seconds until it was full again."""

    limit: float
    remaining: float
    reset: float
    requests: bool  # it counts requests (each one sent since spends one)


def announced(headers: Mapping[str, str], wall_now: float) -> tuple[Bucket, ...]:
    """The limits an answer announces (none when it carries no usable triple)."""
    found: list[Bucket] = []
    for pattern, kind in _KINDS:
        limit = _number(header(headers, pattern.format("limit", kind)))
        remaining = _number(header(headers, pattern.format("remaining", kind)))
        if limit is None or remaining is None or limit <= 0:
            continue
        value = header(headers, pattern.format("reset", kind))
        reset = None if value is None else reset_in(value, wall_now)
        found.append(Bucket(limit, min(remaining, limit), reset or 0.0, kind == "requests"))
    return tuple(found)


def has_room(buckets: tuple[Bucket, ...], elapsed: float, sent: int) -> bool:
    """Whether every limit has at least one request's worth left `elapsed` seconds after
    it was announced, `sent` requests later: what was missing comes back evenly over
    the reset (all of it at once when no reset was given)."""
    for bucket in buckets:
        missing = bucket.limit - bucket.remaining
        if bucket.reset > 0.0 and elapsed < bucket.reset:
            missing *= 1.0 - elapsed / bucket.reset
        else:
            missing = 0.0
        left = bucket.limit - missing - (sent if bucket.requests else 0)
        if left < 1.0:
            return False
    return True


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if 0.0 <= number < 1e15 else None
