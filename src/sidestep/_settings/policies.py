"""How circuits open and close, and how a request moves through its candidates: the
`breaker:`, `failover:` and `suspensions:` sections (DESIGN §3).
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    model_validator,
)

from .values import Count, Model, Multiplier, NonNegativeDuration, PositiveDuration, Ratio, warn

__all__ = [
    "BreakerPolicy",
    "FailoverOverrides",
    "FailoverPolicy",
    "FailureRate",
    "SuspensionWindow",
    "Suspensions",
]


class FailureRate(Model):
    """Open a scope when the failure ratio over a sliding window reaches `threshold`."""

    threshold: Ratio
    window: PositiveDuration = 30.0
    minimum_calls: Count = 20


class BreakerPolicy(Model):
    """When a scope's circuit opens and how long it stays open (DESIGN §3.3)."""

    failure_threshold: Count = 3
    cooldown: PositiveDuration = 30.0
    max_cooldown: PositiveDuration = 600.0
    backoff_multiplier: Multiplier = 2.0
    slow_failure: NonNegativeDuration = 1.0
    half_open_probes: Count = 1
    failure_rate: FailureRate | None = None
    enforce: bool = True

    @model_validator(mode="after")
    def _check(self) -> BreakerPolicy:
        if self.max_cooldown < self.cooldown:
            raise ValueError("max_cooldown must not be shorter than cooldown")
        if self.cooldown < 0.1:
            warn("breaker.cooldown is under 100ms: an open scope is retried almost at once")
        if self.failure_threshold == 1:
            warn("breaker.failure_threshold is 1: a single transient failure opens a scope")
        return self


class FailoverPolicy(Model):
    """How one request moves through its candidates (DESIGN §3.1)."""

    max_total_attempts: Count = 4
    max_attempts_per_target: Count = 1
    max_retry_wait: NonNegativeDuration = 5.0
    total_timeout: PositiveDuration | None = None
    first_byte_timeout: PositiveDuration | None = None  # answers that stream only
    response_timeout: PositiveDuration | None = None  # any answer's first body byte
    stall_timeout: PositiveDuration | None = None
    retry_ambiguous: bool = False
    on_context_overflow: bool = True
    on_all_suspended: Literal["raise", "respond"] = "raise"


class FailoverOverrides(Model):
    """A route's changes to the `FailoverPolicy`; a field left unset (or `None`) inherits."""

    max_total_attempts: Count | None = None
    max_attempts_per_target: Count | None = None
    max_retry_wait: NonNegativeDuration | None = None
    total_timeout: PositiveDuration | None = None
    first_byte_timeout: PositiveDuration | None = None
    response_timeout: PositiveDuration | None = None
    stall_timeout: PositiveDuration | None = None
    retry_ambiguous: bool | None = None
    on_context_overflow: bool | None = None
    on_all_suspended: Literal["raise", "respond"] | None = None

    def apply(self, base: FailoverPolicy) -> FailoverPolicy:
        """Return `base` with the fields set here replacing its own, validated again.

        An explicit `None` clears a timeout the base sets (``total_timeout: null``
        on a route means no total timeout there); for the other fields, which
        cannot be `None`, it inherits.
        """
        updates = {
            name: getattr(self, name)
            for name in self.model_fields_set
            if getattr(self, name) is not None or name in _CLEARABLE
        }
        if not updates:
            return base
        return FailoverPolicy.model_validate({**base.model_dump(), **updates})


_CLEARABLE = frozenset(
    name for name, field in FailoverPolicy.model_fields.items() if field.default is None
)


class SuspensionWindow(Model):
    """How long a reason suspension lasts: `initial`, growing to `max` (`None`: until cleared)."""

    initial: PositiveDuration
    max: PositiveDuration | None

    @model_validator(mode="after")
    def _check(self) -> SuspensionWindow:
        if self.max is not None and self.max < self.initial:
            raise ValueError("max must not be shorter than initial")
        return self


class Suspensions(Model):
    """The window of each suspension reason (DESIGN §3.2)."""

    rate_limited: SuspensionWindow = SuspensionWindow(initial=1.0, max=60.0)
    quota_exhausted: SuspensionWindow = SuspensionWindow(initial=900.0, max=21600.0)
    invalid_credential: SuspensionWindow = SuspensionWindow(initial=600.0, max=21600.0)

    def window(self, reason: str) -> SuspensionWindow:
        """The window for `reason` (``"rate_limited"``, …); `KeyError` for an unknown reason."""
        return {
            "rate_limited": self.rate_limited,
            "quota_exhausted": self.quota_exhausted,
            "invalid_credential": self.invalid_credential,
        }[reason]


# A path segment as it travels (percent-encoded), or "*" for any one segment.
