"""A pooled route's request given its own order of candidates, and its attempts counted.

`Spreading._spread` turns the candidates a pooled route's request matched
into those of the order its pools give it (`pools.Pool.order`): a variant
made once per order and remembered, so the loop, the fast path and the
attribution read it as they read a ranked route's. A request that names
state kept by one provider is not spread: it keeps the route's ranked order
(`provider_state`). The functions below count each attempt on its member
from its send to its verdict, and take from each answer its time to first
byte and the rate limits it announces. Where admission awaits the store, a
request is counted on the member it was picked for from its pick
(`FastPath.decide`), so that the requests picked meanwhile see it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .affinity import key_of
from .members import Member, announces
from .memories import remember
from .pools import Pool
from .routes import Candidates, CompiledRoute, CompiledTarget
from .run import CoreState, Run

__all__ = ["Spreading", "answered", "landed", "member_of", "took_off"]

# What a variant's `balance` says when its request names provider state, and its key.
_RANKED = "provider_state"
_RANKED_KEY: tuple[int, ...] = ()


class Spreading(CoreState):
    """A pooled route's request given its own order of candidates."""

    # Set by `Core.__init__`: the random numbers pools draw (a seeded one in tests).
    _random: Callable[[], float]
    # `Candidacy`'s: the body of a request not in memory yet, when it can be replayed.
    _streamed_body: Callable[[Any], bytes | None]

    def _spread(self, cands: Candidates, request: Any) -> Candidates:
        """The candidates of `request`, matched to the pooled route of `cands`, in the
        order its pools give it (or the ranked order, when it names provider state)."""
        pool, variants = cands.pool, cands.variants
        if pool is None or variants is None:
            return cands  # (only a pooled route's candidates have variants)
        if pool.affinity is not None or cands.pinned:
            return self._looked_at(cands, pool, variants, request)
        if cands.others:  # other provider accounts: the request's body may name state
            try:
                if request._content:  # (none, for most calls but an API's own)
                    return self._looked_at(cands, pool, variants, request)
            except AttributeError:  # a body still to stream
                return self._looked_at(cands, pool, variants, request)
        # the common case, quickly: nothing about the request itself to look at
        now = self.clock() if pool.limited or pool.refused or pool.timed else 0.0
        order = pool.order(self._random, now)
        found = variants.get(order)
        if found is None:
            assert cands.route is not None  # (a pooled route's candidates)
            variant = _variant(cands.route, pool, cands, order, pool.balance)
            found = remember(variants, order, variant)
        return found

    def _looked_at(
        self,
        cands: Candidates,
        pool: Pool,
        variants: dict[tuple[int, ...], Candidates],
        request: Any,
    ) -> Candidates:
        """`_spread` for a request whose body or headers count: one that may name provider
        state, or carry an affinity key."""
        route = cands.route
        assert route is not None  # (a pooled route's candidates)
        try:
            content = request._content
        except AttributeError:
            # A body still to stream: one that can be replayed (bytes given as a stream,
            # as a followed redirect's are; in-memory parts) is read now, as `_start`
            # would read it, so that it is looked at for state and a key as content is;
            # one sent once, as it streams, has none looked at.
            content = self._streamed_body(request) if cands.replay else None
        state = route.state
        if cands.others and (
            cands.pinned
            or (content and state is not None and state.names_state(content))
            # a body sent once, as it streams, cannot be looked at before it goes: where
            # the route's rules read bodies, it keeps the ranked order, as it would there
            or (content is None and state is not None and bool(state.bodies))
        ):
            order, balance = _RANKED_KEY, _RANKED
        else:
            key = None
            if pool.affinity is not None:
                key = key_of(pool.affinity, request.headers, content)
            now = self.clock() if pool.limited or pool.refused or pool.timed else 0.0
            order = pool.order(self._random, now, key)
            balance = pool.balance
            if key is not None:
                balance = "affinity"
                order += (-1,)  # (remembered apart from the same order spread)
        found = variants.get(order)
        if found is None:
            found = remember(variants, order, _variant(route, pool, cands, order, balance))
        return found


def _variant(
    route: CompiledRoute, pool: Pool, cands: Candidates, order: tuple[int, ...], balance: str
) -> Candidates:
    """The candidates of a request to `cands` in `order` (route positions; `_RANKED_KEY`:
    the ranked order, provider state kept as `cands` keeps it)."""
    if order == _RANKED_KEY:
        targets, others, direct = cands.targets, cands.others, cands.direct
        positions = [route.targets.index(t) for t in targets]
    else:
        positions = [i for i in order if i >= 0]
        targets = tuple(route.targets[i] for i in positions)
        others = frozenset()
        direct = cands.direct and targets[0] is cands.targets[0]
    made = Candidates.of(route, targets, cands.rest, cands.origin, direct, cands.policy, others)
    about = tuple(
        {**said, "tier": pool.tier_of[i], "balance": balance}
        for said, i in zip(made.about, positions, strict=True)
    )
    members = tuple(pool.members[i] for i in positions)
    return replace(made, about=about, members=members, variants=None)


def took_off(run: Run, member: Member) -> None:
    """`run`'s attempt is being sent to `member` (no longer held by the member it was
    picked for, if that one was refused)."""
    held = run.aloft
    if held is not None and held is not member:
        held.landed(run.request)
    member.took_off(run.request)
    run.aloft = member


def landed(run: Run) -> None:
    """`run`'s attempt in flight, if any, has its verdict (or will never have one), or
    the member it was picked for will have none of it."""
    member = run.aloft
    if member is not None:
        run.aloft = None
        member.landed(run.request)


def answered(cands: Candidates, member: Member, seconds: float, headers: Any, now: float) -> None:
    """An attempt on `member` (a candidate of `cands`) got an answer's `headers` at `now`,
    `seconds` after it was sent."""
    member.sample(seconds, now)
    if member.buckets or announces(headers):  # (most answers announce no rate limit)
        member.heard(headers, now, time.time())
        if member.buckets and cands.pool is not None:
            cands.pool.limited = True


def member_of(cands: Candidates, target: CompiledTarget) -> Member:
    """The pool member a candidate of `cands` (a pooled route's variant) is."""
    members = cands.members
    assert members is not None
    return members[cands.targets.index(target)]
