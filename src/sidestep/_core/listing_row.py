"""One row of the operator's view of a store, and what is said of it.

`Suspension` is one row as `transport.suspensions()` returns it; `as_json` is
the row the admin API answers and the CLI prints; `matches` and `passes` are
the ``route``, ``target`` and ``reason`` filters. A row names routes, targets
and origins, never a credential, a fingerprint, a URL path or a query.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

__all__ = [
    "Suspension",
    "as_json",
    "fixed_keys",
    "iso",
    "matches",
    "passes",
]


@dataclass(frozen=True, slots=True)
class Suspension:
    """One scope that is not healthy, as `transport.suspensions()` lists it.

    `target` and `route` name the target whose scope it is (for an origin no
    route names, `target` is that origin and `route` None). A scope shared
    by several targets — an origin or model scope on an origin that several
    targets use — lists every (route, target) in `targets`; `target` and
    `route` are the first of them.
    """

    scope_id: str
    target: str
    scope: str
    state: str
    reason: str | None
    failures: int
    retry_at: float | None  # on the transport's clock; None while open until cleared
    retry_in: float | None
    route: str | None = None
    targets: tuple[tuple[str, str], ...] = ()
    opened_at: float | None = None  # on the transport's clock; None while open until cleared


def matches(row: Suspension, filters: Mapping[str, str]) -> bool:
    """Whether `row` passes the ``route``, ``target`` and ``reason`` filters given."""
    return passes(row.targets or ((row.route, row.target),), row.reason, filters)


def passes(
    pairs: tuple[tuple[str | None, str], ...], reason: str | None, filters: Mapping[str, str]
) -> bool:
    """Whether a row shown under `pairs`, for `reason`, passes the filters given."""
    if "route" in filters and all(route != filters["route"] for route, _ in pairs):
        return False
    if "target" in filters and all(target != filters["target"] for _, target in pairs):
        return False
    return "reason" not in filters or reason == filters["reason"]


def as_json(row: Suspension, now: float, wall: float) -> dict[str, Any]:
    """The row as the admin API and the CLI show it; `now` on the store's clock, `wall` epoch time.

    ``opened_at`` is an ISO 8601 UTC time (None for a scope open until cleared);
    ``retry_in`` is seconds (None: open until cleared; 0 when not open).
    """
    said = fixed_keys(row)
    said["retry_in"] = None if row.retry_in is None else round(row.retry_in, 3)
    said["opened_at"] = None
    if row.opened_at is not None:
        said["opened_at"] = iso(wall - max(0.0, now - row.opened_at))
    return said


def fixed_keys(row: Suspension) -> dict[str, Any]:
    """What `as_json` says of a row that is not read off the clock: its first keys."""
    return {
        "scope_id": row.scope_id,
        "route": row.route,
        "target": row.target,
        "targets": [{"route": route, "target": target} for route, target in row.targets],
        "scope": row.scope,
        "state": row.state,
        "reason": row.reason,
        "failures": row.failures,
    }


def iso(moment: float) -> str:
    """Epoch seconds as an ISO 8601 UTC time, to the second."""
    at = datetime.fromtimestamp(moment, timezone.utc)
    return at.isoformat(timespec="seconds").replace("+00:00", "Z")
