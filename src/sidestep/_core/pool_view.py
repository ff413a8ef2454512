"""What the operator sees of each pooled route's members, in this process.

`pools` reads the members of every pooled route of a `Router` (`members.Member`,
shared by every transport of the process built from the same route) as plain
JSON data for the admin API and its status page: each member's tier, weight,
attempts in flight, latency estimate, whether its announced rate limits have
room, and its share of the attempts this process sent the route's members
since they were made. Names and numbers only: never a URL, a header or a
credential.
"""

from __future__ import annotations

from typing import Any

from .pools import Pool
from .routes import Router

__all__ = ["pools"]


def pools(router: Router, now: float) -> dict[str, dict[str, Any]]:
    """Each pooled route's balance and members, read at `now` (the core's clock)."""
    found: dict[str, dict[str, Any]] = {}
    for name, route in router.routes.items():
        if route.pool is not None:
            found[name] = _pool(route.pool, now)
    return found


def _pool(pool: Pool, now: float) -> dict[str, Any]:
    members = pool.members
    counts = [m.attempts for m in members]  # read once: the shares add up to 1
    total = sum(counts)
    rows = []
    # (the weights as configured, the mean standing in for none: a member draws by its
    # share of its pool's largest)
    for member, tier, weight, sent in zip(members, pool.tier_of, pool.weights, counts, strict=True):
        latency = member.cost(now)
        rows.append(
            {
                "target": member.name,
                "tier": tier,
                "weight": weight,
                "in_flight": member.in_flight,
                "latency_s": round(latency, 4) if latency >= 0.0 else None,
                "rate_limit_room": member.has_room(now),
                "attempts": sent,
                "share": round(sent / total, 4) if total else None,
            }
        )
    return {"balance": pool.balance, "members": rows}
