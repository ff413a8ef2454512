"""The operator's view of a store: its unhealthy scopes as rows named by the routes.

`Suspension` is one row as `transport.suspensions()` returns it; `Listing`
reads a store through one configuration's routes (what the transports, the
admin app and the CLI all list and clear), its async twins off the event loop;
`as_json` is the row the admin API answers and the CLI prints. A row names
routes, targets and origins, never a credential, a fingerprint, a URL path or
a query.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import anyio
import anyio.to_thread

from ._circuit import State
from ._routes import Router
from ._scopes import Fingerprinter
from ._store import ScopeStatus, StateStore, store_id
from .logging import emit, listening

__all__ = [
    "Listed",
    "Listing",
    "StoreUnavailable",
    "Suspension",
    "as_json",
    "matches",
    "passes",
    "suspensions",
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


def suspensions(
    snapshot: list[ScopeStatus], router: Router, store: StateStore, listed_at: float
) -> list[Suspension]:
    """The rows of a store's snapshot, each named by the routes and targets it belongs to.

    `listed_at` is when the snapshot was asked for (`time.monotonic()`): the
    ``suspensions.listed`` event says which scopes the store held then, so the
    suspended gauge lets go of those it no longer holds (expired, closed or
    forgotten elsewhere). A shared store away (its local stand-in answered) says nothing.
    """
    _listed(snapshot, store, listed_at)
    return Listed(snapshot, router, store.fingerprint).rows()


def _listed(snapshot: list[ScopeStatus], store: StateStore, listed_at: float) -> None:
    if getattr(store, "available", True) and listening():
        emit(
            "suspensions.listed",
            scope_ids=tuple(s.scope_id for s in snapshot),
            listed_at=listed_at,
            store=store_id(store),
        )


class Listed:
    """A store's unhealthy scopes at one moment, each named by the routes when asked.

    A listing of thousands of scopes that shows a page of them builds only the
    rows it shows, one at a time: rows held all at once would outlive a few
    runs of the garbage collector, and set off its full collections, which
    hold every thread of the process (an event loop's too) for as long as
    they walk the heap.
    """

    __slots__ = ("_alike", "_owners", "fingerprint", "router", "statuses")

    def __init__(
        self, statuses: list[ScopeStatus], router: Router, fingerprint: Fingerprinter
    ) -> None:
        self.statuses = statuses
        self.router = router
        self.fingerprint = fingerprint
        # The owners of a scope follow from its origin, kind and credential alone: the
        # scopes of many models on one origin are worked out once. Kept by a string (which
        # the collector never walks), each answer once, so thousands of scopes that share
        # nothing leave the collector nothing new to walk.
        self._owners: dict[str, tuple[tuple[str, str], ...]] = {}
        self._alike: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}

    def targets(self, status: ScopeStatus) -> tuple[tuple[str, str], ...]:
        """Every (route, target) whose scope it is; none for an origin no route names."""
        scope = status.scope
        shape = f"{scope.origin} {scope.kind.value} {scope.credential}"
        found = self._owners.get(shape)
        if found is None:
            found = self.router.owners(scope, self.fingerprint)
            found = self._owners[shape] = self._alike.setdefault(found, found)
        return found

    def pairs(self, status: ScopeStatus) -> tuple[tuple[str | None, str], ...]:
        """The (route, target) pairs it is shown under; (None, origin) for an unrouted one."""
        return self.targets(status) or ((None, status.scope.origin),)

    def row(self, status: ScopeStatus) -> Suspension:
        targets = self.targets(status)
        route, target = targets[0] if targets else (None, status.scope.origin)
        return Suspension(
            scope_id=status.scope_id,
            target=target,
            scope=status.scope.kind.value,
            state=status.state.value,
            reason=status.reason,
            failures=status.failures,
            retry_at=None
            if math.isinf(status.retry_at) or status.state is not State.OPEN
            else status.retry_at,
            retry_in=status.retry_in,
            route=route,
            targets=targets,
            opened_at=status.opened_at,
        )

    def rows(self) -> list[Suspension]:
        return [self.row(status) for status in self.statuses]


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

    The async twins never hold the event loop while a listing is taken: with
    thousands of scopes, copying the store and reporting what it holds take a
    while. A store that never waits on I/O (`blocking` false: memory) is read
    in a worker thread, under its own lock; a store that does (Redis, SQLite)
    is read with its async twin, and reported in a worker thread. Whoever
    builds the rows of a `Listed` should do so off the loop as well.
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
        return self.listed().rows()

    def listed(self) -> Listed:
        """The store's unhealthy scopes now, their rows built when asked for."""
        snapshot, listed_at = self._snapshot()
        _listed(snapshot, self.store, listed_at)
        return Listed(snapshot, self.router, self.store.fingerprint)

    async def alisted(self) -> Listed:
        if not self.store.blocking:
            return await anyio.to_thread.run_sync(self.listed)
        snapshot, listed_at = await self._asnapshot()
        # the observers of the listing walk every scope id it holds
        await anyio.to_thread.run_sync(_listed, snapshot, self.store, listed_at)
        return Listed(snapshot, self.router, self.store.fingerprint)

    def clear(self, scope_id: str, who: str) -> Suspension | None:
        """Clear one scope; its row as it was, or None when no such scope is unhealthy.

        `who` (a token's name and peer, or the command line's user) goes into the
        ``suspension.cleared`` event, the audit record.
        """
        row = self._row(scope_id, *self._snapshot())
        if row is None:
            return None
        at = time.monotonic()
        done = self.store.clear(scope_id)
        self._answered()
        return _cleared(row, who, at, self.store) if done else None

    async def aclear(self, scope_id: str, who: str) -> Suspension | None:
        if not self.store.blocking:
            # finding the row, and the store finding the scope, hash every key it holds
            return await anyio.to_thread.run_sync(self.clear, scope_id, who)
        snapshot, listed_at = await self._asnapshot()
        row = await anyio.to_thread.run_sync(self._row, scope_id, snapshot, listed_at)
        if row is None:
            return None
        at = time.monotonic()
        done = await self.store.clear_async(scope_id)
        self._answered()
        return _cleared(row, who, at, self.store) if done else None

    def _snapshot(self) -> tuple[list[ScopeStatus], float]:
        """The store's unhealthy scopes, and when they were asked for (`time.monotonic()`)."""
        listed_at = time.monotonic()
        snapshot = self.store.snapshot(self.clock())
        self._answered()
        return snapshot, listed_at

    async def _asnapshot(self) -> tuple[list[ScopeStatus], float]:
        listed_at = time.monotonic()
        snapshot = await self.store.snapshot_async(self.clock())
        self._answered()
        return snapshot, listed_at

    def _row(
        self, scope_id: str, snapshot: list[ScopeStatus], listed_at: float
    ) -> Suspension | None:
        """The row of `scope_id` in `snapshot` (None when it holds no such scope), the only
        one built; the listing is reported as any other."""
        _listed(snapshot, self.store, listed_at)
        found = [s for s in snapshot if s.scope_id == scope_id]
        return next(iter(Listed(found, self.router, self.store.fingerprint).rows()), None)

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
