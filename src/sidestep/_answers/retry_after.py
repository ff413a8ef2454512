"""``Retry-After`` and ``retry-after-ms``: how long an answer asks to be left alone.

Pure parsing for the classifier (DESIGN §3.2): delta-seconds, milliseconds
or an HTTP-date, clamped to a year; garbage is ignored. No I/O and no clock
reads: the caller passes the wall time an HTTP-date is measured from.
"""

from __future__ import annotations

import calendar
import email.utils
import re
from collections.abc import Mapping

from .ratelimits import header as _header

__all__ = ["parse_retry_after"]

_YEAR = 365 * 24 * 3600.0
# RFC 9110 delta-seconds are whole; fractions are accepted, signs and exponents are not.
_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")


def parse_retry_after(headers: Mapping[str, str], wall_now: float) -> float | None:
    """Seconds to wait, from ``retry-after-ms`` or else ``Retry-After``.

    ``retry-after-ms`` (milliseconds, fractions allowed) wins when it is valid.
    ``Retry-After`` is delta-seconds or an HTTP-date, taken relative to
    `wall_now` (epoch seconds); a date in the past gives 0.0. Negative,
    non-numeric and non-finite values are ignored. Results are clamped to one
    year.

    >>> parse_retry_after({"Retry-After": "7"}, wall_now=0.0)
    7.0
    """
    millis = (_header(headers, "retry-after-ms") or "").strip()
    if _DECIMAL.fullmatch(millis):
        return min(float(millis) / 1000, _YEAR)
    value = _header(headers, "retry-after")
    if value is None:
        return None
    value = value.strip()
    if _DECIMAL.fullmatch(value):
        # A long run of digits overflows to inf: still a valid, huge delay.
        return min(float(value), _YEAR)
    at = _http_date(value)
    if at is None:
        return None
    return min(max(at - wall_now, 0.0), _YEAR)


def _http_date(value: str) -> float | None:
    """An HTTP-date as epoch seconds; any of its three formats, always UTC."""
    parsed = email.utils.parsedate_tz(value)
    if parsed is None:
        return None
    day, hour, minute, second = parsed[2:6]
    # Out-of-range fields make it garbage rather than a date to normalise.
    if not (1 <= day <= 31 and hour < 24 and minute < 60 and second <= 60):
        return None
    try:
        return calendar.timegm(parsed[:6]) - (parsed[9] or 0)
    except (ValueError, OverflowError):  # a year beyond what the calendar handles
        return None
