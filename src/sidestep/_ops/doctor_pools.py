"""The doctor's checks of a pooled route (`Route.pooled`).

Weights that leave a member next to no share of its pool, or that are given
to some members of a pool and not others; an affinity header that cannot
tell conversations apart; a `balance` over tiers of one member;
`avoid_rate_limits`, which the pools' own rate-limit headroom supersedes;
and which tiers a request's attempts can reach (`reach`), where a pool's
members are reached by spreading, whatever their place in the list.
"""

from __future__ import annotations

from collections.abc import Iterator

from .._common.scopes import is_credential
from .._settings.routes import Route
from .doctor_findings import OK, WARN, Finding, n

__all__ = ["pools", "reach"]

# A member whose weight is under this part of its pool's is all but left out.
_NEGLIGIBLE = 0.01
# Headers that belong to one connection (RFC 9110 §7.6.1), not to a request's
# conversation: httpx sends ``connection: keep-alive`` on every request.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


def _tiers(route: Route) -> list[tuple[int, list[int]]]:
    """Each tier of a pooled route, lowest first: its number and its targets' positions."""
    levels = sorted({t.tier or 0 for t in route.targets})
    return [
        (level, [i for i, t in enumerate(route.targets) if (t.tier or 0) == level])
        for level in levels
    ]


def _names(route: Route, positions: list[int]) -> str:
    return ", ".join(repr(route.targets[i].name) for i in positions)


def _tier_keys(route: Route, at: str, positions: list[int]) -> tuple[str, ...]:
    """The keys that place these targets in their tiers: each one's tier, if given."""
    if any(t.tier is not None for t in route.targets):
        return tuple(f"{at}.targets[{i}].tier" for i in positions)
    return (f"{at}.targets",)


def reach(route: Route, attempts: int) -> list[int]:
    """The positions of a pooled route's targets that `attempts` can never reach unless
    those before are skipped: the members of each tier whose earlier tiers hold at least
    `attempts` targets (every member of a tier reached is reached, by spreading)."""
    before, never = 0, []
    for _, positions in _tiers(route):
        if before >= attempts:
            never += positions
        before += len(positions)
    return never


def pools(route: Route, at: str) -> Iterator[Finding]:
    """The findings about a pooled route's pools (none for a ranked route)."""
    if not route.pooled:
        return
    yield from _weights(route, at)
    if route.affinity is not None:
        yield from _affinity(route, at)
    if route.balance is not None:
        yield from _balance(route, at)
    if route.avoid_rate_limits:
        yield Finding(
            WARN,
            "avoid_rate_limits",
            f"route {route.name!r} is pooled and sets avoid_rate_limits: a member whose"
            " answer says no request is left is suspended until the full reset it"
            " announces, though its limit refills before; the pool's own rate-limit"
            " headroom already moves such a member behind those with room and uses it"
            " again as soon as it has room: without avoid_rate_limits, nothing waits for"
            " the full reset",
            (f"{at}.avoid_rate_limits",),
        )


def _weights(route: Route, at: str) -> Iterator[Finding]:
    name = f"route {route.name!r}"
    warned = False
    for level, positions in _tiers(route):
        given = [route.targets[i].weight for i in positions]
        weighted = [w for w in given if w is not None]
        if not weighted or len(positions) < 2:
            continue
        keys = tuple(f"{at}.targets[{i}].weight" for i in positions)
        mean = sum(weighted) / len(weighted)
        if len(weighted) < len(positions):
            warned = True
            missing = [i for i, w in zip(positions, given, strict=True) if w is None]
            yield Finding(
                WARN,
                "weights",
                f"{name}: tier {level} gives a weight to some members and not to"
                f" {_names(route, missing)}: a member with no weight weighs the mean of"
                f" those given in its pool ({mean:g}); give every member one to say its share",
                keys,
            )
        filled = [mean if w is None else w for w in given]
        total = sum(filled)
        small = [i for i, w in zip(positions, filled, strict=True) if w / total < _NEGLIGIBLE]
        if small:
            warned = True
            yield Finding(
                WARN,
                "weights",
                f"{name}: in tier {level}, {_names(route, small)} weigh under 1% of the"
                " pool: they get almost no requests (a failover still reaches them); put a"
                " target meant only as a fallback in a later tier",
                keys,
            )
    if not warned:
        yield Finding(
            OK,
            "weights",
            f"{name}: each pool's members have a weight each, or none, and none is negligible",
            (f"{at}.targets",),
        )


def _affinity(route: Route, at: str) -> Iterator[Finding]:
    affinity = route.affinity
    assert affinity is not None
    name = f"route {route.name!r}"
    header = affinity.header
    if header is None:
        what = "json" if affinity.json_field is not None else "prefix"
        yield Finding(
            OK, "affinity", f"{name}: affinity by the body's {what}", (f"{at}.affinity.{what}",)
        )
        return
    keys = (f"{at}.affinity.header",)
    if header in _HOP_BY_HOP:
        yield Finding(
            WARN,
            "affinity",
            f"{name}: affinity header {header!r} is a hop-by-hop header: it describes a"
            " connection, not a conversation (httpx sends connection: keep-alive on every"
            " request), so requests carry one value or none: all on one member, or spread"
            " as if there were no affinity",
            keys,
        )
    elif is_credential(header):
        yield Finding(
            WARN,
            "affinity",
            f"{name}: affinity header {header!r} carries a credential: every request of"
            " one key has the same value and goes to one member, so a caller with one key"
            " is never spread; name a header that identifies a conversation or a user",
            keys,
        )
    else:
        yield Finding(OK, "affinity", f"{name}: affinity by header {header!r}", keys)


def _balance(route: Route, at: str) -> Iterator[Finding]:
    name = f"route {route.name!r}"
    keys = (f"{at}.balance",)
    alone = [(level, positions) for level, positions in _tiers(route) if len(positions) == 1]
    if not alone:
        yield Finding(OK, "balance", f"{name}: every pool has members to spread over", keys)
        return
    tiers = "; ".join(f"tier {level}: {_names(route, positions)}" for level, positions in alone)
    every = len(alone) == len({t.tier or 0 for t in route.targets})
    yield Finding(
        WARN,
        "balance",
        f"{name}: balance {route.balance} is set, but"
        f" {n(len(alone), 'tier')} {'has' if len(alone) == 1 else 'have'} one member"
        f" ({tiers}): nothing to spread there"
        f"{', and the route takes its targets in order as a ranked list would' if every else ''}",
        (*keys, *_tier_keys(route, at, [positions[0] for _, positions in alone])),
    )
