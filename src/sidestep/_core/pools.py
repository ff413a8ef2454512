"""A pooled route's pools, and the order each request tries their members in.

A pooled route (`Route.pooled`) groups its targets by tier; the targets of
one tier are a pool. Each request gets its own order (`Pool.order`): the
first tier's members as the strategy ranks them, then the next tier's, and
so on, so failover stays within a pool before it moves to the next tier.

- ``weighted``: weighted random without replacement. Up to `TABLED` members,
  every permutation's probability is worked out once, and a request draws
  one with a single random number.
- ``least_in_flight``: power of two choices: a uniformly random permutation,
  whose first two members are swapped when the second has fewer attempts in
  flight per unit of weight.
- ``latency``: the same, on the cost latency * (in flight + 1) / weight,
  where latency is the member's decaying peak estimate (`members.Member`);
  a member with none yet counts as the fastest measured.
- An affinity key ranks each pool by weighted rendezvous hashing instead
  (`affinity.rendezvous`).
- Whatever the strategy, a member whose announced rate limits have no room
  left goes behind those with room (it is never left out).

Pure apart from the members' statistics it reads: the random numbers and
the time are passed in.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect
from collections.abc import Callable, Sequence
from math import exp
from typing import TYPE_CHECKING, Any

from .._settings.routes import DEFAULT_BALANCE
from .affinity import rendezvous, seed
from .members import DECAY, Member, shared
from .memories import remember

if TYPE_CHECKING:
    from .._settings.routes import Affinity, Route

__all__ = ["TABLED", "Pool", "pool_of"]

# Pools of up to this many members draw their order from a table of permutations.
TABLED = 6
# The least latency a cost is worked out from: an estimate decayed near zero still
# lets the attempts in flight count.
_LEAST_LATENCY = 1e-9

Order = tuple[int, ...]
Random = Callable[[], float]


class _Tier:
    """One pool: its positions, weights, and the table its orders are drawn from."""

    __slots__ = (
        "cumulative",
        "orders",
        "positions",
        "ranks",
        "seeds",
        "total",
        "uniform",
        "weights",
    )

    def __init__(self, positions: Order, weights: list[float], names: list[str]) -> None:
        self.positions = positions
        self.weights = weights
        self.seeds = [seed(name) for name in names]
        # the hashes of the affinity keys met, and the order each gives (no key is kept)
        self.ranks: dict[int, Order] = {}
        self.total = 0.0
        self.cumulative: list[float] = []
        self.orders: list[Order] = []
        self.uniform: list[Order] = []
        if 1 < len(positions) <= TABLED:
            for perm in itertools.permutations(range(len(positions))):
                self.uniform.append(tuple(positions[i] for i in perm))
                probability = 1.0
                for k, i in enumerate(perm[:-1]):
                    # (what is left summed anew: a running difference can reach 0 early)
                    probability *= weights[i] / math.fsum(weights[j] for j in perm[k:])
                self.total += probability
                self.cumulative.append(self.total)
                self.orders.append(self.uniform[-1])

    def weighted(self, random: Random) -> Order:
        """An order drawn weighted at random, without replacement."""
        if self.orders:
            found = bisect(self.cumulative, random() * self.total)
            return self.orders[min(found, len(self.orders) - 1)]
        left = list(range(len(self.positions)))
        out: list[int] = []
        while left:
            draw = random() * sum(self.weights[i] for i in left)
            for k, i in enumerate(left):
                draw -= self.weights[i]
                if draw < 0.0 or k == len(left) - 1:
                    out.append(self.positions[left.pop(k)])
                    break
        return tuple(out)

    def ranked(self, hashed: int) -> Order:
        """The order an affinity key hashed to `hashed` gives (rendezvous hashing), remembered."""
        found = self.ranks.get(hashed)
        if found is None:
            found = rendezvous(hashed, self.positions, self.seeds, self.weights)
            found = remember(self.ranks, hashed, found)
        return found

    def shuffled(self, random: Random) -> Order:
        """A uniformly random order."""
        if self.uniform:
            return self.uniform[int(random() * len(self.uniform)) % len(self.uniform)]
        positions = list(self.positions)
        for i in range(len(positions) - 1, 0, -1):  # Fisher-Yates
            j = int(random() * (i + 1)) % (i + 1)
            positions[i], positions[j] = positions[j], positions[i]
        return tuple(positions)


def pool_of(route: Route) -> Pool | None:
    """A pooled route's pools; None for a ranked one."""
    if not route.pooled:
        return None
    return Pool(
        route.balance or DEFAULT_BALANCE,
        [t.name for t in route.targets],
        [t.tier for t in route.targets],
        [t.weight for t in route.targets],
        route.affinity,
        [(route.name, t.name, t.url, seed(repr(sorted(t.headers.items())))) for t in route.targets],
    )


class Pool:
    """The pools of one route: which target positions each tier holds, and their members.

    Positions are indices into the route's targets, in configuration order.
    """

    __slots__ = (
        "_latency",
        "_one",
        "_tiers",
        "_weighted",
        "affinity",
        "balance",
        "limited",
        "members",
        "tier_of",
        "tiers",
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
        # Whether any member announced rate limits: only then is headroom looked at.
        self.limited = False
        # A route of one pool of several members, and whether it draws by weight alone.
        self._one = self._tiers[0] if len(self._tiers) == 1 and len(names) > 1 else None
        self._weighted = balance == "weighted"
        self._latency = balance == "latency"

    def __repr__(self) -> str:
        return f"Pool(balance={self.balance!r}, tiers={self.tiers!r})"

    def order(self, random: Random, now: float, key: str | None = None) -> Order:
        """The order one request tries the route's targets in (positions): each tier's
        members as the strategy, or the affinity `key`, ranks them, tier after tier."""
        one = self._one
        if one is not None and key is None and not self.limited:  # the common case, quickly
            if self._weighted:
                return one.weighted(random)
            return self._two_choices(one.shuffled(random), now)
        out: Order = ()
        hashed = None if key is None else seed(key)
        for tier in self._tiers:
            ranked: Order
            if len(tier.positions) == 1:
                ranked = tier.positions
            elif hashed is not None:
                ranked = tier.ranked(hashed)
            elif self.balance == "weighted":
                ranked = tier.weighted(random)
            else:
                ranked = self._two_choices(tier.shuffled(random), now)
            if self.limited and len(ranked) > 1:
                ranked = self._room_first(ranked, now)
            out = ranked if not out else out + ranked
        return out

    def _two_choices(self, shuffled: Order, now: float) -> Order:
        """A random order whose first two are swapped if the second costs less."""
        first, second = shuffled[0], shuffled[1]
        members = self.members
        a, b = members[first], members[second]
        if self._latency:
            # each one's `Member.cost`, inline: a call is a good part of a pick's time
            la, lb = a.latency, b.latency
            if la > 0.0:
                la *= exp((a.stamp - now) / DECAY)
            if lb > 0.0:
                lb *= exp((b.stamp - now) / DECAY)
            if la < 0.0 or lb < 0.0:
                fastest = self._fastest(now)
                la, lb = (fastest if la < 0.0 else la), (fastest if lb < 0.0 else lb)
            la, lb = max(la, _LEAST_LATENCY), max(lb, _LEAST_LATENCY)
            cost_a = la * (len(a.flying) + 1) / a.weight
            cost_b = lb * (len(b.flying) + 1) / b.weight
        else:
            cost_a = len(a.flying) / a.weight
            cost_b = len(b.flying) / b.weight
        if cost_b < cost_a:
            return (second, first, *shuffled[2:])
        return shuffled

    def _fastest(self, now: float) -> float:
        """The least latency estimate among the members that have one (1.0 if none has)."""
        measured = [c for m in self.members if (c := m.cost(now)) >= 0.0]
        return min(measured) if measured else 1.0

    def _room_first(self, ranked: Order, now: float) -> Order:
        """`ranked` with the members out of rate-limit room moved behind the others."""
        members = self.members
        full = [i for i in ranked if not members[i].has_room(now)]
        if not full or len(full) == len(ranked):
            return ranked
        return tuple(i for i in ranked if i not in full) + tuple(full)
