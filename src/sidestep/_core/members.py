"""What one process knows of each pool member: its attempts in flight, how fast it
answers, and how much of its rate limits it has left.

Kept in memory, one per process for each route's target (`shared`: every
transport over the same configuration counts on the same members), never in
the store: another process has its own. In-flight attempts are a set of the
requests being sent to the member, added as an attempt goes and discarded at
its verdict: adding and discarding are single operations on a set, so threads
racing cannot lose one, and a request discarded twice or never added changes
nothing, so the count cannot drift. Latency is a peak-sensitive moving
average of the time to first byte (Finagle's and Linkerd's *peak EWMA*): a
slower sample is taken at once, and the estimate decays exponentially (time
constant `DECAY`) toward the faster samples that follow, or toward zero with
none, so an idle slow member is tried again and its recovery seen. It is
kept as a logarithm (`level`: log of the estimate plus the time over
`DECAY`), so that decaying it is a subtraction and taking a sample a
maximum: a pick compares members with no exponential worked out. Headroom
is the latest rate limits the member announced (`_answers.headroom`),
refilled over time, less what was sent since. `attempts` counts the attempts
sent to it since it was made, for the operator's view of each member's share
(`pool_view`): an increment per attempt, which two threads racing may
rarely lose one of (a share, not a ledger).
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from .._answers.headroom import SIGNS, Bucket, announced, has_room

__all__ = ["DECAY", "LEAST_LATENCY", "Member", "announces", "same_clock", "shared"]

# Seconds over which the latency estimate forgets a sample (the time constant).
DECAY = 10.0
# The least time to first byte a sample counts as (a fake clock may measure none).
LEAST_LATENCY = 1e-9
_LOG_LEAST = math.log(LEAST_LATENCY)
# The log of the largest estimate `cost` gives (about 3e11 s: a bound, not a measure).
_MOST_LOG = 26.5
# The longest a refused member is put behind the others before it is asked about again.
RECHECK = 5.0
# The shortest: a refusal that names no later instant (a probe held elsewhere).
RECHECK_SOON = 1.0
_SIGNS = frozenset(name.encode("ascii") for name in SIGNS)

# The process's members, by what makes a target the same upstream (`shared`); a member
# goes when no route holds it any more.
_SHARED: weakref.WeakValueDictionary[tuple[Any, ...], Member] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()


def shared(key: tuple[Any, ...], name: str, weight: float) -> Member:
    """The process's member for `key` (made on first use): transports built from the same
    route see one another's attempts in flight, latency and rate limits."""
    with _SHARED_LOCK:
        member = _SHARED.get(key)
        if member is None:
            member = _SHARED[key] = Member(name, weight)
        return member


def same_clock(clock: Any) -> Any:
    """What tells `clock` apart in a member's key: itself (equal clocks, such as the
    default or two bound methods of one fake, share), or its identity if unhashable."""
    try:
        hash(clock)
    except TypeError:
        return ("clock", id(clock))
    return clock


class Member:
    """One pool member's in-flight attempts, latency and announced rate limits."""

    __slots__ = (
        "__weakref__",
        "attempts",
        "buckets",
        "flying",
        "level",
        "log_weight",
        "name",
        "per_weight",
        "refused_until",
        "seen_at",
        "sent",
        "weight",
    )

    def __init__(self, name: str, weight: float) -> None:
        self.name = name
        self.weight = weight
        self.per_weight = 1.0 / weight if weight > 0.0 else math.inf  # (a share may underflow)
        self.log_weight = -math.log(weight) if weight > 0.0 else math.inf  # log(per_weight)
        self.flying: set[Any] = set()  # the requests being sent to it
        # until when a pool puts it behind the others: it was refused admission
        self.refused_until = 0.0
        # the latency estimate: its logarithm plus the time of reading over DECAY, so the
        # estimate at `now` is exp(level - now / DECAY) (-inf: no sample yet)
        self.level = -math.inf
        self.buckets: tuple[Bucket, ...] = ()  # the rate limits it last announced
        self.seen_at = 0.0  # when, on the core's clock
        self.sent = 0  # requests sent to it since
        self.attempts = 0  # attempts sent to it since it was made

    def __repr__(self) -> str:
        return (
            f"Member(name={self.name!r}, weight={self.weight}, in_flight={len(self.flying)},"
            f" level={self.level:.4f})"
        )

    @property
    def in_flight(self) -> int:
        return len(self.flying)

    def took_off(self, run: Any) -> None:
        """An attempt of `run` is being sent to this member (counted in flight already if
        `run` was held for it: `hold`)."""
        self.flying.add(run)
        self.attempts += 1
        if self.buckets:
            self.sent += 1  # (a lost increment is forgotten at the next announcement)

    def refused(self, retry_at: float, now: float) -> None:
        """It was refused admission at `now`, its scope suspended until `retry_at`: pools put
        it behind the others until then, or for `RECHECK` seconds at most (a scope cleared
        early, or open until cleared, is asked about again), and for `RECHECK_SOON` at
        least (a half-open scope whose probe another request holds says "now")."""
        self.refused_until = min(max(retry_at, now + RECHECK_SOON), now + RECHECK)

    def hold(self, run: Any) -> None:
        """`run` was given this member first: counted in flight from now, so that requests
        picked before its attempt goes (its admission awaited) see it, not an idle member."""
        self.flying.add(run)

    def landed(self, run: Any) -> None:
        """`run`'s attempt on this member has its verdict (harmless if it had none in flight)."""
        self.flying.discard(run)

    def cost(self, now: float) -> float:
        """The latency estimate at `now`, decayed since its last sample (-1: none yet)."""
        level = self.level
        if level == -math.inf:
            return -1.0
        # (bounded: a clock that ran backwards cannot overflow it)
        return math.exp(min(level - now / DECAY, _MOST_LOG))

    def sample(self, seconds: float, now: float) -> None:
        """A time to first byte of `seconds`, measured at `now`: the estimate becomes the
        larger of it and the estimate decayed to `now` (a slower sample is taken at once,
        and the estimate decays toward faster ones). Two threads racing keep one sample."""
        level = (math.log(seconds) if seconds > LEAST_LATENCY else _LOG_LEAST) + now / DECAY
        if level > self.level:
            self.level = level

    def heard(self, headers: Mapping[str, str], now: float, wall_now: float) -> None:
        """An answer's headers: the rate limits they announce, if any, replace the last."""
        if self.buckets or announces(headers):
            buckets = announced(headers, wall_now)
            if buckets or not self.buckets:
                self.buckets, self.seen_at, self.sent = buckets, now, 0

    def has_room(self, now: float) -> bool:
        """Whether at least one more request fits in its announced rate limits, as estimated
        now (True when it announced none)."""
        return not self.buckets or has_room(self.buckets, now - self.seen_at, self.sent)


def announces(headers: Mapping[str, str]) -> bool:
    """Whether an answer's headers announce a rate limit (`SIGNS`). httpx's and httpx2's
    are read as kept, (name, lowercase name, value): looking a name up in them encodes
    it and raises when it is missing, a microsecond per answer for most, which have none."""
    entries = getattr(headers, "_list", None)
    if entries is None:
        return any(name in headers for name in SIGNS)
    for entry in entries:  # noqa: SIM110 - a loop makes no generator per answer
        if entry[1] in _SIGNS:
            return True
    return False
