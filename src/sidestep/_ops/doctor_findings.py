"""What a doctor's check finds: a `Finding`, its statuses, and the words of its reason.

A finding is ``ok``, ``warn``, or ``unknown`` when the evidence would only
come from running the configuration, with a one-line reason and the key
paths involved; `n` and `s` write the counts and durations reasons quote.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["OK", "UNKNOWN", "WARN", "Finding", "n", "s"]

OK, WARN, UNKNOWN = "ok", "warn", "unknown"


@dataclass(frozen=True, slots=True)
class Finding:
    """One check's verdict: ``ok``, ``warn`` or ``unknown``, why, and the keys involved."""

    status: str
    check: str
    reason: str
    keys: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "keys": list(self.keys)}


def n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def s(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"
