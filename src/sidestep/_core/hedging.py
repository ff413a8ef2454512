"""Hedged requests' decisions, sans I/O (docs/hedging.md): whether a request may be
hedged at all, how long its first attempt waits before the hedge starts, whether the
route's budget pays for one, and which attempt's outcome ends the race.

The shells only run the two attempts side by side (the `Race` effect); everything they
are told to do is decided here, so the sync and async shells cannot disagree.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Mapping
from enum import Enum
from typing import Protocol

from .._answers.classify import Verdict, is_idempotent
from .._settings.routes import Hedge

__all__ = [
    "BURST",
    "MIN_SAMPLES",
    "SAMPLES",
    "Allowance",
    "FirstTokenTimes",
    "HedgeBudget",
    "HedgeState",
    "Refused",
    "ends_race",
    "hedge_delay",
    "may_hedge",
]

# The most hedges a route's bucket holds: how far a burst of hedges may run ahead of the
# budget's share, after a calm stretch.
BURST = 10.0
# A target's times to first token kept for its adaptive delay, and the fewest that give one.
SAMPLES = 100
MIN_SAMPLES = 20
# Float sums of a budget's share (twenty deposits of 0.05) may fall short of one by this.
_ROUNDING = 1e-9


class Refused(Enum):
    """Why a request is not hedged (the `reason` of a `hedge.refused` event)."""

    UNSAFE = "unsafe"  # sending it twice is not known to be safe
    ONE_SHOT = "one_shot_body"  # its body is a stream that can be sent only once
    PROVIDER_STATE = "provider_state"  # it names state kept by its own target's provider
    NO_CANDIDATE = "no_candidate"  # nothing to hedge to
    NO_DELAY = "no_delay"  # adaptive only, and too few times to first token known yet
    BUDGET = "budget"  # the route's budget has no hedge left


def may_hedge(
    method: str,
    headers: Mapping[str, str],
    *,
    retry_ambiguous: bool,
    replayable: bool,
    holds_state: bool,
    others: int,
) -> Refused | None:
    """Why a request of a hedged route may not be hedged; None when it may.

    A hedge sends the request a second time while the first may still be
    processed: the same rule as a failover after an ambiguous outcome
    (an idempotent method, an ``Idempotency-Key``, or ``retry_ambiguous``).
    `replayable`: its body is in memory (a one-shot stream is sent once);
    `holds_state`: it names state kept by one provider, so it never leaves its
    own target; `others`: the candidates it has beside its first.
    """
    if others < 1:
        return Refused.NO_CANDIDATE
    if not replayable:
        return Refused.ONE_SHOT
    if holds_state:
        return Refused.PROVIDER_STATE
    if not retry_ambiguous and not is_idempotent(method, headers):
        return Refused.UNSAFE
    return None


class HedgeBudget:
    """A route's hedges as a token bucket, as Finagle's retry budget: each request adds
    `ratio` of a token, each hedge takes a whole one, and the bucket holds at most
    `burst`.

    Over any stretch of requests, hedges are therefore at most `ratio` of them
    plus `burst`. The bucket starts full, as gRPC's retry throttle does: a process
    that makes a few requests may hedge them, and a burst of slow answers after a
    start finds hedges paid for. Shared by the requests of one route, in threads or
    tasks, behind its own lock (held for a few arithmetic operations only).
    """

    __slots__ = ("_balance", "_lock", "burst", "ratio")

    def __init__(self, ratio: float, burst: float = BURST) -> None:
        if not 0 < ratio <= 1:
            raise ValueError("a hedge budget is a ratio above 0, at most 1")
        self.ratio = ratio
        self.burst = max(1.0, burst)
        self._balance = self.burst
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"HedgeBudget(ratio={self.ratio!r}, balance={self._balance:.3f})"

    @property
    def balance(self) -> float:
        return self._balance

    def deposit(self) -> None:
        """A request of the route started: its share of a hedge goes in."""
        with self._lock:
            self._balance = min(self.burst, self._balance + self.ratio)

    def withdraw(self) -> bool:
        """Take one hedge out if the bucket holds one; whether it did."""
        with self._lock:
            if self._balance < 1.0 - _ROUNDING:
                return False
            self._balance = max(0.0, self._balance - 1.0)
            return True

    def refund(self) -> None:
        """Give back a hedge taken but not sent (nothing was left to hedge to)."""
        with self._lock:
            self._balance = min(self.burst, self._balance + 1.0)


class Allowance:
    """The attempts a raced request may still make, shared by the race's two branches (in
    threads, for the sync shell): neither a retry in place on the first target nor the
    hedge is sent once `max_total_attempts` are spent, whichever branch spent them."""

    __slots__ = ("_left", "_lock")

    def __init__(self, left: int) -> None:
        self._left = left
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Allowance(left={self._left})"

    def take(self) -> bool:
        """Spend one attempt if one is left; whether it was."""
        with self._lock:
            if self._left <= 0:
                return False
            self._left -= 1
            return True


class FirstTokenTimes:
    """A target's recent times to first token (seconds from send to commit point), the
    last `SAMPLES` of them, and their percentiles: an adaptive hedge's delay."""

    __slots__ = ("_lock", "_times")

    def __init__(self, size: int = SAMPLES) -> None:
        self._times: deque[float] = deque(maxlen=size)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FirstTokenTimes(known={len(self._times)})"

    def __len__(self) -> int:
        return len(self._times)

    def add(self, seconds: float) -> None:
        """One more time to first token; a negative or non-finite one (a clock that ran
        backwards) is left out."""
        if math.isfinite(seconds) and seconds >= 0:
            with self._lock:
                self._times.append(seconds)

    def percentile(self, q: float, least: int = MIN_SAMPLES) -> float | None:
        """The `q` percentile (0 < q < 1) of the known times, by nearest rank; None with
        fewer than `least` known."""
        with self._lock:
            if len(self._times) < max(1, least):
                return None
            ordered = sorted(self._times)
        rank = max(1, math.ceil(q * len(ordered)))
        return ordered[min(rank, len(ordered)) - 1]


def hedge_delay(hedge: Hedge, times: FirstTokenTimes | None) -> float | None:
    """How long a request's first attempt goes without a first token before its hedge
    starts: the percentile of its target's recent `times` when the route's hedge is
    adaptive and enough are known (never longer than the fixed `delay`, when there is
    one: a run of slow answers cannot push the hedge past it), else the fixed `delay`;
    None for no hedge at all (adaptive only, too few known)."""
    if hedge.adaptive is not None and times is not None:
        known = times.percentile(hedge.adaptive)
        if known is not None:
            return known if hedge.delay is None else min(known, hedge.delay)
    return hedge.delay


class HedgeState:
    """What a hedged route keeps between its requests: its settings, its budget, and each
    target's recent times to first token (by target name)."""

    __slots__ = ("_times", "budget", "hedge")

    def __init__(self, hedge: Hedge) -> None:
        self.hedge = hedge
        self.budget = HedgeBudget(hedge.budget, float(hedge.burst))
        self._times: dict[str, FirstTokenTimes] = {}

    def __repr__(self) -> str:
        return f"HedgeState({self.hedge!r}, {self.budget!r})"

    def times(self, target: str) -> FirstTokenTimes:
        """`target`'s recent times to first token (made on first use, once)."""
        times = self._times.get(target)
        if times is None:
            times = self._times.setdefault(target, FirstTokenTimes())
        return times


class _Ended(Protocol):
    """An attempt's outcome, as far as a race needs it (`run.Outcome`)."""

    committed: bool
    verdict: Verdict


def ends_race(outcome: _Ended) -> bool:
    """Whether an attempt's outcome ends a race: an answer handed to the caller (at its
    commit point), or one the request ends with wherever it was sent (it does not fail
    over: a 400 the other attempt would get too). A failure that fails over waits for
    the other attempt."""
    return outcome.committed or not outcome.verdict.failover
