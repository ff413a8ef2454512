"""A pooled route's pools, and the order each request tries their members in.

A pooled route (`Route.pooled`) groups its targets by tier; the targets of
one tier are a pool. Each request gets its own order (`Pool.order`): the
first tier's members as the strategy ranks them, then the next tier's, and
so on, so failover stays within a pool before it moves to the next tier.

- ``weighted``: a member drawn at random by weight (one random number, one
  bisection), then the rest of its pool as listed. Only the first member is
  drawn: failover past it is rare, and a pool of n members then gives n
  orders, each made once per path (`spreading`), not n! of them.
- ``least_in_flight``: the member with the fewest attempts in flight per unit
  of weight first, then the rest of its pool as listed (on a tie, the member
  drawn by weight: at light load, weights decide). Every member of the pool is
  compared, not two drawn at random: the counts are this process's own and
  exact (a request is counted from its pick where its admission is awaited:
  `Member.hold`), and a pool has at most `MAX_POOL` members; the power of
  two choices is the remedy for counts that are late or too many to read,
  and on four equal replicas it took the p99 to 1.4x (docs/pools.md).
- ``latency``: the same, on the cost latency * (in flight + 1) / weight,
  where latency is the member's decaying peak estimate (`members.Member`);
  a member with none yet counts as the fastest measured in its pool.
- An affinity key ranks each pool by weighted rendezvous hashing instead
  (`affinity.rendezvous`); a member refused admission is skipped, and its
  keys go to their next choice.
- Whatever the strategy, a member that cannot take a request now goes
  behind those that can (it is never left out): one whose announced rate
  limits have no room left, or one refused admission a moment ago (its scope
  suspended: `Member.refused_until`), so that the choice is made between
  members that can answer.

Pure apart from the members' statistics it reads: the random numbers and
the time are passed in.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect
from collections.abc import Callable, Sequence
from math import log
from typing import TYPE_CHECKING, Any

from .._settings.routes import DEFAULT_BALANCE
from .affinity import rendezvous, seed
from .members import DECAY, LEAST_LATENCY, Member, same_clock, shared
from .memories import remember

if TYPE_CHECKING:
    from .._settings.routes import Affinity, Route

__all__ = ["TABLED", "Pool", "pool_of"]

# An affinity key orders a pool of up to this many members wholly by rendezvous
# hashing; a larger one, its first two, then the rest as listed (few orders kept).
TABLED = 6
# The log of the least latency a cost is worked out from: an estimate decayed near zero
# still lets the attempts in flight count.
_LOG_LEAST = math.log(LEAST_LATENCY)
# log(n + 1) for the counts of attempts in flight met most often
_LOGGED = 256
_LOG_UP = tuple(math.log(n + 1) for n in range(_LOGGED))

Order = tuple[int, ...]
Random = Callable[[], float]


class _Tier:
    """One pool: its positions, weights, and the orders a draw gives."""

    __slots__ = (
        "cumulative",
        "fronts",
        "positions",
        "ranks",
        "seeds",
        "total",
        "weights",
    )

    def __init__(self, positions: Order, weights: list[float], names: list[str]) -> None:
        self.positions = positions
        self.weights = weights
        self.seeds = [seed(name) for name in names]
        # the hashes of the affinity keys met, and the order each gives (no key is kept)
        self.ranks: dict[int, Order] = {}
        # each member first, then the rest as listed: the orders a draw gives
        self.fronts = tuple((p, *(q for q in positions if q != p)) for p in positions)
        self.cumulative = list(itertools.accumulate(weights))
        self.total = self.cumulative[-1]
        # (the last without end: a draw rounded up to the total still finds a member)
        self.cumulative[-1] = math.inf

    def weighted(self, random: Random) -> Order:
        """A member drawn at random by weight, then the rest as listed."""
        return self.fronts[bisect(self.cumulative, random() * self.total)]

    def ranked(self, hashed: int) -> Order:
        """The order an affinity key hashed to `hashed` gives (rendezvous hashing), remembered."""
        found = self.ranks.get(hashed)
        if found is None:
            found = rendezvous(hashed, self.positions, self.seeds, self.weights)
            if len(found) > TABLED:  # a larger pool: its first two by the key, the rest as listed
                found = (*found[:2], *(p for p in self.positions if p not in found[:2]))
            found = remember(self.ranks, hashed, found)
        return found


def pool_of(route: Route, clock: Any = None) -> Pool | None:
    """A pooled route's pools; None for a ranked one. Its members are the process's for
    the same target and `clock` (`members.shared`): their latency and refusals are
    instants on that clock, which another transport's clock cannot read."""
    if not route.pooled:
        return None
    return Pool(
        route.balance or DEFAULT_BALANCE,
        [t.name for t in route.targets],
        [t.tier for t in route.targets],
        [t.weight for t in route.targets],
        route.affinity,
        [
            (route.name, t.name, t.url, seed(repr(sorted(t.headers.items()))), same_clock(clock))
            for t in route.targets
        ],
    )


class Pool:
    """The pools of one route: which target positions each tier holds, and their members.

    Positions are indices into the route's targets, in configuration order.
    """

    __slots__ = (
        "_fronts",
        "_latency",
        "_measured",
        "_one",
        "_tiers",
        "_weighted",
        "affinity",
        "balance",
        "limited",
        "members",
        "refused",
        "tier_of",
        "tiers",
        "timed",
        "weights",
    )

    def __init__(
        self,
        balance: str,
        names: Sequence[str],
        tiers: Sequence[int | None],
        weights: Sequence[float | None],
        affinity: Affinity | None = None,
        keys: Sequence[tuple[Any, ...]] | None = None,
    ) -> None:
        self.balance = balance
        self.affinity = affinity  # the key that ranks a request's members, if any
        self.tier_of: tuple[int, ...] = tuple(0 if t is None else t for t in tiers)
        levels = sorted(set(self.tier_of))
        self.tiers: tuple[Order, ...] = tuple(
            tuple(i for i, t in enumerate(self.tier_of) if t == level) for level in levels
        )
        filled = [1.0] * len(names)
        # the weights each pool draws and compares by: its own, as shares of its largest
        # (only their ratios count, and so none overflows a sum or underflows a division)
        shares = [1.0] * len(names)
        for tier in self.tiers:
            given = [w for i in tier if (w := weights[i]) is not None]
            top = max(given) if given else 1.0
            mean = math.fsum(w / top for w in given) / len(given) if given else 1.0
            for i in tier:
                w = weights[i]
                share = mean if w is None else w / top  # no weight: its pool's mean
                filled[i], shares[i] = share * top, share
        self.weights = filled
        # each position's member: the process's for its key (`members.shared`), if given
        self.members = tuple(
            Member(name, w) if keys is None else shared((*keys[i], w), name, w)
            for i, (name, w) in enumerate(zip(names, shares, strict=True))
        )
        self._tiers = tuple(
            _Tier(tier, [shares[i] for i in tier], [names[i] for i in tier]) for tier in self.tiers
        )
        # each position first, then the rest of its pool as listed
        self._fronts = tuple(
            (i, *(j for j in next(t for t in self.tiers if i in t) if j != i))
            for i in range(len(names))
        )
        # Whether any member announced rate limits: only then is headroom looked at.
        self.limited = False
        # Whether any member was refused admission: only then are refusals looked at.
        self.refused = False
        # A route of one pool of several members, and whether it draws by weight alone.
        self._one = self._tiers[0] if len(self._tiers) == 1 and len(names) > 1 else None
        self._weighted = balance == "weighted"
        self._latency = balance == "latency"
        # Whether every member has a latency estimate (`_all_measured`).
        self._measured = False
        # Whether an order depends on the time even with no refusal nor rate limit.
        self.timed = self._latency

    def __repr__(self) -> str:
        return f"Pool(balance={self.balance!r}, tiers={self.tiers!r})"

    def order(self, random: Random, now: float, key: str | None = None) -> Order:
        """The order one request tries the route's targets in (positions): each tier's
        members as the strategy, or the affinity `key`, ranks them, tier after tier."""
        one = self._one
        if one is not None and key is None and not (self.limited or self.refused):
            # the common case, quickly: `_Tier.weighted`, inline
            drawn = one.fronts[bisect(one.cumulative, random() * one.total)]
            return drawn if self._weighted else self._least(drawn, now, random)
        out: Order = ()
        hashed = None if key is None else seed(key)
        for tier in self._tiers:
            ranked: Order
            if len(tier.positions) == 1:
                ranked = tier.positions
            elif hashed is not None:
                # (a member refused admission is skipped, its keys to their next choice)
                ranked = tier.ranked(hashed)
                if self.limited:
                    ranked = self._behind(ranked, now)[0]
            else:
                ranked = tier.weighted(random)
                able = len(ranked)
                if self.limited or self.refused:
                    ranked, able = self._behind(ranked, now)
                if not self._weighted or able < len(ranked):
                    # (weighted: drawn again among those that can take it, by weight alone)
                    ranked = self._least(ranked, now, random, able)
            out = ranked if not out else out + ranked
        return out

    def _least(self, drawn: Order, now: float, random: Random, able: int = 0) -> Order:
        """The member that costs least of the first `able` of an order drawn by weight
        (all, if 0: those that can take a request now), then the rest of its pool as
        listed. Members that tie are chosen between at random by weight (so at light
        load weights decide, and under load no member wins ties for being listed
        first): one drawn by weight that costs least is kept. Under ``weighted`` every
        member ties: one of the first `able` drawn by weight alone."""
        members = self.members
        best, least, tied = drawn[0], math.inf, 0.0
        whole = not able or able == len(drawn)
        if not whole:
            drawn, late = drawn[:able], drawn[able:]
        if self._latency:
            # the log of `Member.cost` times (in flight + 1) / weight: one subtraction
            # decays an estimate (`Member.level`), which counts as `LEAST_LATENCY` at least
            floor = now / DECAY + _LOG_LEAST
            if not (self._measured or self._all_measured()):
                # one with none yet counts as the fastest measured
                fastest = math.inf
                for i in drawn:
                    level = members[i].level
                    if -math.inf < level < fastest:
                        fastest = level
                if fastest > floor and fastest != math.inf:
                    floor = fastest  # (every measured one is at least that, none below it)
            for i in drawn:
                m = members[i]
                cost = m.level
                if cost < floor:
                    cost = floor
                n = len(m.flying)
                if n:  # (the log of n + 1: none to work out for an idle member)
                    cost += _LOG_UP[n] if n < _LOGGED else log(n + 1)
                cost += m.log_weight
                if cost < least:
                    best, least, tied = i, cost, m.weight
                elif cost == least:  # one of the tied, each by its weight (reservoir)
                    tied += m.weight
                    if random() * tied < m.weight:
                        best = i
        else:
            if whole and not members[best].flying:
                return drawn  # none in flight on the one drawn first: none costs less
            weighted = self._weighted  # (by weight alone: every member ties)
            for i in drawn:
                m = members[i]
                n = 0 if weighted else len(m.flying)
                cost = n * m.per_weight if n else 0.0  # (a weight rounded to 0: inf per unit)
                if cost < least:
                    best, least, tied = i, cost, m.weight
                elif cost == least:  # one of the tied, each by its weight (reservoir)
                    tied += m.weight
                    if random() * tied < m.weight:
                        best = i
        if not whole:
            return (best, *(i for i in drawn if i != best), *late)
        if best == drawn[0]:
            return drawn
        return self._fronts[best]

    def _all_measured(self) -> bool:
        """Whether every member has a latency estimate (for good, once it is so)."""
        self._measured = all(m.level > -math.inf for m in self.members)
        return self._measured

    def _behind(self, ranked: Order, now: float) -> tuple[Order, int]:
        """`ranked` with the members that cannot take a request now moved behind the
        others (out of rate-limit room, or refused admission a moment ago: `refused`),
        and how many can."""
        members = self.members
        late = [
            i
            for i in ranked
            if members[i].refused_until > now or (self.limited and not members[i].has_room(now))
        ]
        if not late or len(late) == len(ranked):
            return ranked, len(ranked)
        return tuple(i for i in ranked if i not in late) + tuple(late), len(ranked) - len(late)
