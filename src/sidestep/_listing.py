"""The operator's view of a store: its unhealthy scopes as rows named by the routes.

`Suspension` is one row as `transport.suspensions()` returns it; `Listing`
reads a store through one configuration's routes (what the transports, the
admin app and the CLI all list and clear); `as_json` is the row the admin API
answers and the CLI prints. A row names routes, targets and origins, never a
credential, a fingerprint, a URL path or a query.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ._circuit import State
from ._routes import Router
from ._store import ScopeStatus, StateStore, store_id
from .logging import emit, listening

__all__ = ["Listing", "StoreUnavailable", "Suspension", "as_json", "matches", "suspensions"]


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


def suspensions(
    snapshot: list[ScopeStatus], router: Router, store: StateStore, listed_at: float
) -> list[Suspension]:
    """The rows of a store's snapshot, each named by the routes and targets it belongs to.

    `listed_at` is when the snapshot was asked for (`time.monotonic()`): the
    ``suspensions.listed`` event says which scopes the store held then, so the
    suspended gauge lets go of those it no longer holds (expired, closed or
    forgotten elsewhere). A shared store away (its local stand-in answered) says nothing.
    """
    if getattr(store, "available", True) and listening():
        emit(
            "suspensions.listed",
            scope_ids=tuple(s.scope_id for s in snapshot),
            listed_at=listed_at,
            store=store_id(store),
        )
    rows = []
    for s in snapshot:
        targets = router.owners(s.scope, store.fingerprint)
        route, target = targets[0] if targets else (None, s.scope.origin)
        rows.append(
            Suspension(
                scope_id=s.scope_id,
                target=target,
                scope=s.scope.kind.value,
                state=s.state.value,
                reason=s.reason,
                failures=s.failures,
                retry_at=None
                if math.isinf(s.retry_at) or s.state is not State.OPEN
                else s.retry_at,
                retry_in=s.retry_in,
                route=route,
                targets=targets,
                opened_at=s.opened_at,
            )
        )
    return rows


def matches(row: Suspension, filters: Mapping[str, str]) -> bool:
    """Whether `row` passes the ``route``, ``target`` and ``reason`` filters given."""
    pairs = row.targets or ((row.route, row.target),)
    if "route" in filters and all(route != filters["route"] for route, _ in pairs):
        return False
    if "target" in filters and all(target != filters["target"] for _, target in pairs):
        return False
    return "reason" not in filters or row.reason == filters["reason"]


def as_json(row: Suspension, now: float, wall: float) -> dict[str, Any]:
    """The row as the admin API and the CLI show it; `now` on the store's clock, `wall` epoch time.

    ``opened_at`` is an ISO 8601 UTC time (None for a scope open until cleared);
    ``retry_in`` is seconds (None: open until cleared; 0 when not open).
    """
    opened = None
    if row.opened_at is not None:
        moment = datetime.fromtimestamp(wall - max(0.0, now - row.opened_at), timezone.utc)
        opened = moment.isoformat(timespec="seconds").replace("+00:00", "Z")
    return {
        "scope_id": row.scope_id,
        "route": row.route,
        "target": row.target,
        "targets": [{"route": route, "target": target} for route, target in row.targets],
        "scope": row.scope,
        "state": row.state,
        "reason": row.reason,
        "failures": row.failures,
        "retry_in": None if row.retry_in is None else round(row.retry_in, 3),
        "opened_at": opened,
    }


class StoreUnavailable(Exception):
    """The shared store did not answer: what it would list is unknown (not "nothing")."""


class Listing:
    """One store read through one configuration's routes: list and clear, sync or async.

    Listing and clearing raise `StoreUnavailable` when a shared store did not
    answer (and served from its local fallback): an empty list would say every
    target is healthy, and a clear would find nothing to clear.
    """

    def __init__(
        self, store: StateStore, router: Router, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.router = router
        self.clock = clock

    def routes(self) -> dict[str, list[str]]:
        """Every configured route's target names, in order."""
        return {
            name: [target.name for target in route.targets]
            for name, route in self.router.routes.items()
        }

    def suspensions(self) -> list[Suspension]:
        listed_at = time.monotonic()
        snapshot = self.store.snapshot(self.clock())
        self._answered()
        return suspensions(snapshot, self.router, self.store, listed_at)

    async def asuspensions(self) -> list[Suspension]:
        listed_at = time.monotonic()
        snapshot = await self.store.snapshot_async(self.clock())
        self._answered()
        return suspensions(snapshot, self.router, self.store, listed_at)

    def clear(self, scope_id: str, who: str) -> Suspension | None:
        """Clear one scope; its row as it was, or None when no such scope is unhealthy.

        `who` (a token's name and peer, or the command line's user) goes into the
        ``suspension.cleared`` event, the audit record.
        """
        row = _find(self.suspensions(), scope_id)
        if row is None:
            return None
        at = time.monotonic()
        done = self.store.clear(scope_id)
        self._answered()
        return _cleared(row, who, at, self.store) if done else None

    async def aclear(self, scope_id: str, who: str) -> Suspension | None:
        row = _find(await self.asuspensions(), scope_id)
        if row is None:
            return None
        at = time.monotonic()
        done = await self.store.clear_async(scope_id)
        self._answered()
        return _cleared(row, who, at, self.store) if done else None

    def _answered(self) -> None:
        # a shared store that is away serves from its local stand-in (and says so)
        if not getattr(self.store, "available", True):
            raise StoreUnavailable


def _cleared(row: Suspension, who: str, at: float, store: StateStore) -> Suspension:
    """`at`: when `store` was asked to clear it (`time.monotonic()`)."""
    emit(
        "suspension.cleared",
        logging.WARNING,  # an operator's hand on the circuits: shown where warnings are
        scope_id=row.scope_id,
        route=row.route,
        target=row.target,
        scope=row.scope,
        reason=row.reason,
        who=who,
        cleared_at=at,
        store=store_id(store),
    )
    return row


def _find(rows: list[Suspension], scope_id: str) -> Suspension | None:
    return next((row for row in rows if row.scope_id == scope_id), None)
