"""The providers' own rate-limit signals: when a limit resets, and whether it is spent.

Pure parsing for the classifier (DESIGN §3.2), used when a response carries no
``Retry-After``:

- OpenAI and the servers that copy it: ``x-ratelimit-reset-requests`` and
  ``x-ratelimit-reset-tokens``, Go durations (``6m0s``, ``1.5s``, ``20ms``,
  ``1h2m3s``), with ``x-ratelimit-remaining-*`` beside them;
- Anthropic: ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-reset``,
  RFC 3339 times, with ``-remaining`` beside each;
- Google: ``RetryInfo.retryDelay`` (``"17s"``) among the ``details`` of a JSON
  error body, also as the one-element array Gemini streams send.

Either header form is accepted under either name (a bare number is seconds).
Garbage is ignored: unparseable values, signs, and waits longer than
`LONGEST_RESET`, which no rate limit announces (an epoch timestamp, say). No
I/O and no clock reads: the caller passes the wall time RFC 3339 times are
measured from.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Mapping

__all__ = [
    "LONGEST_RESET",
    "header",
    "parse_duration",
    "reset_after",
    "reset_in",
    "retry_delay",
    "spent_requests",
]

LONGEST_RESET: float = 2 * 24 * 3600.0
_MAX_DIGITS = 12  # more digits than any reset has: not even turned into a number
"""The longest wait a reset hint may announce; past it, garbage (a day's limit resets in one)."""

# Each limit a provider reports, as (its remaining count, its reset): a 429 is about one of them.
_REQUESTS = (
    ("x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"),
    ("anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-reset"),
)
_LIMITS = (
    *_REQUESTS,
    ("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"),
    ("anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset"),
    ("anthropic-ratelimit-input-tokens-remaining", "anthropic-ratelimit-input-tokens-reset"),
    ("anthropic-ratelimit-output-tokens-remaining", "anthropic-ratelimit-output-tokens-reset"),
)

_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_DECIMAL = re.compile(_NUMBER)
# Go's time.ParseDuration units, unsigned: "1h2m3.5s", "20ms", "6m0s".
_GO_PART = re.compile(rf"({_NUMBER})(ns|us|µs|μs|ms|s|m|h)")  # Go spells micro both ways
_GO_DURATION = re.compile(rf"(?:{_GO_PART.pattern})+")
_GO_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
    r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)
# protobuf's JSON form of a google.protobuf.Duration: seconds with up to nine decimals, then "s".
_PROTO_DURATION = re.compile(r"([0-9]+(?:\.[0-9]{1,9})?)s")
_RETRY_INFO = "google.rpc.RetryInfo"


def parse_duration(value: str) -> float | None:
    """Seconds in a Go duration (``1h2m3.5s``, ``20ms``) or a bare number of seconds.

    None for anything else, including a sign.

    >>> parse_duration("6m0s")
    360.0
    """
    value = value.strip()
    if _DECIMAL.fullmatch(value):
        return float(value)
    if not _GO_DURATION.fullmatch(value):
        return None
    return sum(float(n) * _GO_UNITS[unit] for n, unit in _GO_PART.findall(value))


def reset_after(headers: Mapping[str, str], wall_now: float) -> float | None:
    """Seconds until the limit a 429 is about resets, from the reset headers; None if none reads.

    A 429 does not say which limit it hit. When a ``remaining`` header reads 0,
    that limit is spent: the longest reset among the spent ones is the answer.
    When none reads 0 (or none is sent), the longest reset given is: waiting
    for the last of them is never too early, and the suspension's ``max``
    bounds it.
    """
    given: list[float] = []
    spent: list[float] = []
    for remaining, reset in _LIMITS:
        value = header(headers, reset)
        if value is None:
            continue
        seconds = _reset(value, wall_now)
        if seconds is None:
            continue
        given.append(seconds)
        if _is_zero(header(headers, remaining)):
            spent.append(seconds)
    chosen = spent or given
    return max(chosen) if chosen else None


def spent_requests(headers: Mapping[str, str], wall_now: float) -> tuple[bool, float | None]:
    """Whether a response says no request is left in its window, and when the window resets.

    ``(True, seconds)`` when a remaining-requests header reads 0 (seconds is
    None when its reset is missing or garbage); ``(False, None)`` otherwise.
    """
    spent = False
    longest: float | None = None
    for remaining, reset in _REQUESTS:
        if not _is_zero(header(headers, remaining)):
            continue
        spent = True
        value = header(headers, reset)
        seconds = None if value is None else _reset(value, wall_now)
        if seconds is not None and (longest is None or seconds > longest):
            longest = seconds
    return spent, longest


def retry_delay(document: object) -> float | None:
    """Seconds from the ``RetryInfo.retryDelay`` of a parsed Google error body, or None.

    `document` is the parsed JSON body: an object with ``error.details``, or
    a one-element array of one.
    """
    if isinstance(document, list) and document:
        document = document[0]
    error = document.get("error") if isinstance(document, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    if not isinstance(details, list):
        return None
    for detail in details:
        if not isinstance(detail, dict):
            continue
        kind = detail.get("@type")
        if isinstance(kind, str) and kind.endswith(_RETRY_INFO):
            return _bounded(_proto_duration(detail.get("retryDelay")))
    return None


def reset_in(value: str, wall_now: float) -> float | None:
    """Seconds until one reset header's limit resets (a duration or an RFC 3339 time);
    None when it does not read."""
    return _reset(value, wall_now)


def _reset(value: str, wall_now: float) -> float | None:
    """A reset header's wait: a duration, or an RFC 3339 time (one in the past is 0.0)."""
    seconds = parse_duration(value)
    if seconds is None:
        at = _rfc3339(value.strip())
        if at is None:
            return None
        seconds = max(at - wall_now, 0.0)
    return _bounded(seconds)


def _bounded(seconds: float | None) -> float | None:
    if seconds is None or not 0.0 <= seconds <= LONGEST_RESET:  # also drops NaN and inf
        return None
    return seconds


def _is_zero(value: str | None) -> bool:
    if value is None:
        return False
    value = value.strip()
    return bool(_DECIMAL.fullmatch(value)) and float(value) == 0.0


def _rfc3339(value: str) -> float | None:
    """An RFC 3339 date-time as epoch seconds; None when malformed or out of range."""
    m = _RFC3339.fullmatch(value)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second <= 60):
        return None
    at = float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)))
    if m.group(7):
        at += float(m.group(7))
    if m.group(9):
        offset = int(m.group(10)) * 3600 + int(m.group(11)) * 60
        at -= offset if m.group(9) == "+" else -offset
    return at


def _proto_duration(value: object) -> float | None:
    if isinstance(value, str):
        m = _PROTO_DURATION.fullmatch(value.strip())
        return float(m.group(1)) if m else None
    if isinstance(value, dict):  # the message form some clients log: {"seconds": 17, "nanos": 0}
        seconds, nanos = value.get("seconds", 0), value.get("nanos", 0)
        if isinstance(seconds, str) and seconds.isdigit() and len(seconds) <= _MAX_DIGITS:
            seconds = int(seconds)
        # a whole number past any announced reset is garbage, never a float overflow
        if (
            type(seconds) is int
            and type(nanos) is int
            and 0 <= seconds <= LONGEST_RESET
            and 0 <= nanos < 10**9
        ):
            return seconds + nanos / 1e9
    return None


def header(headers: Mapping[str, str], name: str) -> str | None:
    """The value of header `name` (lower-case), looked up case-insensitively."""
    value = headers.get(name)
    if value is not None:
        return value
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None
