"""The pure state machine of one scope: closed, open, half-open.

No I/O and no clock reads: every function takes ``now`` and returns a new
`Circuit`. Generations are handed in by the store (one counter for the whole
store), so a generation is never reused, even after a healed scope has been
forgotten and is born again.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._settings.policies import BreakerPolicy, FailureRate, SuspensionWindow

__all__ = [
    "Circuit",
    "Entry",
    "State",
    "admit",
    "on_failure",
    "on_success",
    "on_suspension",
    "release",
]

UNAVAILABLE = "unavailable"
# The failure-rate window is kept as this many time buckets: bounded memory per scope.
RATE_BUCKETS = 10


class State(str, enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Entry(enum.Enum):
    """How admission went for one scope."""

    PASS = "pass"  # noqa: S105  # closed: an ordinary request, not a password
    PROBE = "probe"  # half-open: one of the few trial requests
    REFUSED = "refused"  # open, or half-open with every probe slot taken


@dataclass(frozen=True, slots=True)
class Bucket:
    index: int
    successes: int
    failures: int


@dataclass(frozen=True, slots=True)
class Circuit:
    state: State = State.CLOSED
    failures: int = 0
    generation: int = 0
    born: int = 0
    retry_at: float = 0.0
    window: float = 0.0
    reason: str | None = None
    probes: int = 0
    rate: tuple[Bucket, ...] = ()
    # The store's mark, like `born`: a routed request's result was recorded on the
    # scope, so making room for unrouted traffic never forgets it. Kept across its
    # transitions, until it heals.
    routed: bool = False

    @property
    def healthy(self) -> bool:
        """Nothing worth remembering: the store may forget this scope."""
        return self.state is State.CLOSED and self.failures == 0 and not self.rate

    def retry_in(self, now: float) -> float | None:
        """Seconds until re-admission while open; None when open until cleared."""
        if self.state is not State.OPEN:
            return 0.0
        return None if math.isinf(self.retry_at) else max(0.0, self.retry_at - now)


def admit(c: Circuit, policy: BreakerPolicy, now: float, next_gen: int) -> tuple[Circuit, Entry]:
    """A request wants to use the scope at `now`."""
    if c.state is State.CLOSED:
        return c, Entry.PASS
    if c.state is State.OPEN:
        if now < c.retry_at:
            return c, Entry.REFUSED
        # The window is over: this request is the first probe of a new generation.
        return replace(c, state=State.HALF_OPEN, generation=next_gen, probes=1), Entry.PROBE
    if c.probes < policy.half_open_probes:
        return replace(c, probes=c.probes + 1), Entry.PROBE
    return c, Entry.REFUSED


def release(c: Circuit) -> Circuit:
    """A probe ended without a verdict (cancelled, or a neutral answer): free its slot."""
    if c.state is State.HALF_OPEN and c.probes > 0:
        return replace(c, probes=c.probes - 1)
    return c


def on_success(c: Circuit, policy: BreakerPolicy, now: float) -> Circuit:
    """A current request on this scope succeeded."""
    if c.state is State.HALF_OPEN:
        return Circuit()  # closed, and its history forgotten
    if c.state is State.OPEN:
        return c
    rate = _count(c.rate, policy.failure_rate, now, failed=False) if c.rate else ()
    if not any(b.failures for b in rate):
        rate = ()  # no failure left in the window: nothing to remember
    return replace(c, failures=0, rate=rate)


def on_failure(
    c: Circuit,
    policy: BreakerPolicy,
    now: float,
    next_gen: int,
    retry_after: float | None = None,
    slow: bool = False,
) -> Circuit:
    """A current request saw an availability failure on this scope.

    When the failure opens the scope, an upstream's own ``Retry-After`` (a 503
    or 529 announcing its downtime) is the window, bounded by `max_cooldown`.
    Without one, the window is `cooldown`; after a failed probe that was
    `slow` (it cost its caller `slow_failure` or more), the window grows by
    `backoff_multiplier` up to `max_cooldown`. A quick failed probe (a 503, a
    refused connection) cost its caller almost nothing, since the same request
    failed over, so it reopens the scope for `cooldown` again: a target back
    after a long outage is found within one `cooldown`.
    """
    if c.state is State.OPEN:
        return c  # the window is set on the transition only
    if c.state is State.HALF_OPEN:
        if retry_after is not None:
            window = min(retry_after, policy.max_cooldown)
        elif slow:
            window = min(
                max(c.window, policy.cooldown) * policy.backoff_multiplier, policy.max_cooldown
            )
        else:
            window = policy.cooldown
        return _open(c, UNAVAILABLE, window, now, next_gen)
    failures = c.failures + 1
    rate = _count(c.rate, policy.failure_rate, now, failed=True)
    if failures >= policy.failure_threshold or _tripped(rate, policy.failure_rate):
        window = policy.cooldown
        if retry_after is not None:
            window = min(retry_after, policy.max_cooldown)
        return _open(replace(c, failures=failures), UNAVAILABLE, window, now, next_gen)
    return replace(c, failures=failures, rate=rate)


def on_suspension(
    c: Circuit,
    reason: str,
    window: SuspensionWindow,
    retry_after: float | None,
    policy: BreakerPolicy,
    now: float,
    next_gen: int,
) -> Circuit:
    """A current request was refused for `reason` (rate limit, quota, credential): open at once."""
    if c.state is State.OPEN:
        return c
    if retry_after is not None:
        length = retry_after if window.max is None else min(retry_after, window.max)
    elif window.max is None:
        length = math.inf  # until cleared, or until the credential changes
    elif c.state is State.HALF_OPEN and c.reason == reason:
        length = min(c.window * policy.backoff_multiplier, window.max)
    else:
        length = window.initial
    return _open(c, reason, length, now, next_gen)


def _open(c: Circuit, reason: str, window: float, now: float, next_gen: int) -> Circuit:
    return Circuit(
        state=State.OPEN,
        failures=c.failures,
        generation=next_gen,
        born=c.born,
        retry_at=now + window,
        window=window,
        reason=reason,
        routed=c.routed,
    )


def _count(
    rate: tuple[Bucket, ...], policy: FailureRate | None, now: float, *, failed: bool
) -> tuple[Bucket, ...]:
    """Add one result to the sliding window, dropping buckets that have aged out."""
    if policy is None:
        return ()
    index = math.floor(now * RATE_BUCKETS / policy.window)
    kept = [b for b in rate if b.index > index - RATE_BUCKETS]
    last = kept.pop() if kept and kept[-1].index == index else Bucket(index, 0, 0)
    last = replace(
        last,
        successes=last.successes + (not failed),
        failures=last.failures + failed,
    )
    kept.append(last)
    return tuple(kept)


def _tripped(rate: tuple[Bucket, ...], policy: FailureRate | None) -> bool:
    if policy is None:
        return False
    failures = sum(b.failures for b in rate)
    total = failures + sum(b.successes for b in rate)
    return total >= policy.minimum_calls and failures >= policy.threshold * total
