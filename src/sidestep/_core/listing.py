"""The operator's view of a store: its unhealthy scopes as rows named by the routes.

`Suspension` is one row as `transport.suspensions()` returns it; `Listing`
reads a store through one configuration's routes (what the transports, the
admin app and the CLI all list and clear), its async twins off the event loop,
and lists again what it listed last while the store says nothing changed;
`as_json` is the row the admin API answers and the CLI prints. A row names
routes, targets and origins, never a credential, a fingerprint, a URL path or
a query.
"""

from __future__ import annotations

import json
import logging
import math
import operator
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import anyio
import anyio.to_thread

from .._common.scopes import Fingerprinter
from .._common.turns import Turns
from .._state.circuit import State
from .._state.protocol import ScopeStatus, StateStore, store_id
from ..logging import emit, listening
from .routes import Router

__all__ = [
    "Listed",
    "Listing",
    "StoreUnavailable",
    "Suspension",
    "as_json",
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


def _listed(snapshot: list[ScopeStatus], store: StateStore, listed_at: float) -> None:
    """Report a listing: `listed_at` is when it was asked for (`time.monotonic()`).

    The ``suspensions.listed`` event says which scopes the store held then, so the
    suspended gauge lets go of those it no longer holds (expired, closed or forgotten
    elsewhere). A shared store away (its local stand-in answered) says nothing.
    """
    if getattr(store, "available", True) and listening():
        emit(
            "suspensions.listed",
            scope_ids=tuple(s.scope_id for s in snapshot),
            listed_at=listed_at,
            store=store_id(store),
        )


class _Known:
    """What the listings of one store through one set of routes have worked out, which
    later listings reuse (`Listed`'s `like`).

    The owners of a scope follow from its origin, kind and credential alone: the scopes
    of many models on one origin are worked out once, kept by a string (which the
    collector never walks), each answer once. What a status says that no clock changes
    (the start of its JSON row, its line in a page's tag) is kept by the id of the
    status, with the status itself, which keeps that id its own: a store hands out the
    same status while its scope is unchanged, so a listing of thousands of unchanged
    scopes encodes only what is read off the clock. Strings, and dictionaries of them,
    leave the collector nothing new to walk.
    """

    __slots__ = ("alike", "lines", "moments", "owners", "starts", "statuses")

    def __init__(self) -> None:
        self.owners: dict[str, tuple[tuple[str, str], ...]] = {}
        self.alike: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}
        self.statuses: dict[int, ScopeStatus] = {}
        self.starts: dict[int, str] = {}
        self.lines: dict[int, str] = {}
        self.moments: dict[int, str] = {}  # ``opened_at`` in JSON, by the second

    def fits(self, scopes: int) -> bool:
        """Whether it is worth keeping for a listing of `scopes` (not mostly scopes gone)."""
        return max(len(self.owners), len(self.statuses), len(self.moments)) <= 2 * scopes + 64

    def keep(self, status: ScopeStatus) -> int:
        """The key of what is kept for `status` (which is kept alive as long)."""
        key = id(status)
        self.statuses[key] = status
        return key


class Listed:
    """A store's unhealthy scopes at one moment (`now`, on the store's clock), each named
    by the routes when asked.

    A listing of thousands of scopes that shows a page of them builds only the
    rows it shows, one at a time: rows held all at once would outlive a few
    runs of the garbage collector, and set off its full collections, which
    hold every thread of the process (an event loop's too) for as long as
    they walk the heap.

    A listing `like` an earlier one of the same store, through the same routes,
    reuses what that one worked out (`_Known`). `answers` keeps what its readers
    work out from it (the admin app: a page of it and that page's tag): a store
    that says it has not changed is listed again as the same rows at a later
    moment (`at`), which shares it.
    """

    __slots__ = ("_by_id", "_known", "answers", "fingerprint", "now", "router", "statuses")

    def __init__(
        self,
        statuses: list[ScopeStatus],
        router: Router,
        fingerprint: Fingerprinter,
        now: float,
        *,
        like: Listed | None = None,
    ) -> None:
        self.statuses = statuses
        self.router = router
        self.fingerprint = fingerprint
        self.now = now
        self.answers: dict[Any, Any] = {}
        self._by_id: list[ScopeStatus] | None = None
        known = like._known if like is not None else None
        self._known: _Known = known if known is not None and known.fits(len(statuses)) else _Known()

    def at(self, now: float) -> Listed:
        """The same rows at a later moment (the store has not changed since), sharing what
        was worked out from them."""
        later = Listed(self.statuses, self.router, self.fingerprint, now, like=self)
        later.answers, later._by_id = self.answers, self._by_id
        return later

    def by_id(self) -> list[ScopeStatus]:
        """The statuses in ``scope_id`` order (the API's), sorted once."""
        found = self._by_id
        if found is None:
            found = self._by_id = sorted(self.statuses, key=_scope_id)
        return found

    def targets(self, status: ScopeStatus) -> tuple[tuple[str, str], ...]:
        """Every (route, target) whose scope it is; none for an origin no route names."""
        scope, known = status.scope, self._known
        shape = f"{scope.origin} {scope.kind.value} {scope.credential}"
        found = known.owners.get(shape)
        if found is None:
            found = self.router.owners(scope, self.fingerprint)
            found = known.owners[shape] = known.alike.setdefault(found, found)
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
            retry_in=status.retry_in(self.now),
            route=route,
            targets=targets,
            opened_at=status.opened_at,
        )

    def rows(self) -> list[Suspension]:
        rows = []
        turns = Turns()
        for status in self.statuses:
            rows.append(self.row(status))
            turns()
        return rows

    def encoded(self, status: ScopeStatus, now: float, wall: float) -> str:
        """``json.dumps(as_json(self.row(status), now, wall))``, encoding only the fields
        read off the clock once the row has been encoded before."""
        known = self._known
        start = known.starts.get(id(status))
        if start is None:
            fixed = json.dumps(_fixed(self.row(status)))
            start = known.starts[known.keep(status)] = f'{fixed[:-1]}, "retry_in": '
        left = status.retry_in(self.now)
        retry = "null" if left is None else repr(round(left, 3))
        opened = "null"
        if status.opened_at is not None:
            moment = wall - max(0.0, now - status.opened_at)
            opened = known.moments.get(int(moment)) or ""
            if not opened:
                opened = known.moments[int(moment)] = json.dumps(_iso(moment))
        return f'{start}{retry}, "opened_at": {opened}}}'

    def line(self, status: ScopeStatus) -> str:
        """What its row says, to the second, in one line: the same scope, in the same state,
        for the same reason, with the same count and window, under the same routes and
        targets, says the same line."""
        known = self._known
        said = known.lines.get(id(status))
        if said is None:
            said = known.lines[known.keep(status)] = (
                f"{status.scope_id} {self.pairs(status)} {status.state.value} {status.reason}"
                f" {status.failures} {_second(status.retry_at)} {_second(status.opened_at)}\n"
            )
        return said


def _second(moment: float | None) -> str:
    return "-" if moment is None or math.isinf(moment) else str(round(moment))


_scope_id = operator.attrgetter("scope_id")


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
    said = _fixed(row)
    said["retry_in"] = None if row.retry_in is None else round(row.retry_in, 3)
    said["opened_at"] = None
    if row.opened_at is not None:
        said["opened_at"] = _iso(wall - max(0.0, now - row.opened_at))
    return said


def _fixed(row: Suspension) -> dict[str, Any]:
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


def _iso(moment: float) -> str:
    """Epoch seconds as an ISO 8601 UTC time, to the second."""
    at = datetime.fromtimestamp(moment, timezone.utc)
    return at.isoformat(timespec="seconds").replace("+00:00", "Z")


class StoreUnavailable(Exception):
    """The shared store did not answer: what it would list is unknown (not "nothing")."""


class Listing:
    """One store read through one configuration's routes: list and clear, sync or async.

    Listing and clearing raise `StoreUnavailable` when a shared store did not
    answer (and served from its local fallback): an empty list would say every
    target is healthy, and a clear would find nothing to clear. Built with
    `strict` false, a listing lists that stand-in instead (a clear still raises).

    The async twins never hold the event loop while a listing is taken: with
    thousands of scopes, copying the store and reporting what it holds take a
    while. A store that never waits on I/O (`blocking` false: memory) is read
    in a worker thread, under its own lock; a store that does (Redis, SQLite)
    is read with its async twin, and reported in a worker thread. Whoever
    builds the rows of a `Listed` should do so off the loop as well.

    A store that counts its changes (`changes`: memory) is not read again while
    the count stays what it was at the last listing: that listing is the
    answer again, at the later moment (`Listed.at`), with what was worked out
    from it.
    """

    def __init__(
        self,
        store: StateStore,
        router: Router,
        clock: Callable[[], float] = time.monotonic,
        *,
        strict: bool = True,
    ) -> None:
        self.store = store
        self.router = router
        self.clock = clock
        self.strict = strict
        self._held: tuple[int, Listed] | None = None  # the last listing, and the count it saw

    def routes(self) -> dict[str, list[str]]:
        """Every configured route's target names, in order."""
        return {
            name: [target.name for target in route.targets]
            for name, route in self.router.routes.items()
        }

    def suspensions(self) -> list[Suspension]:
        return self.listed().rows()

    async def asuspensions(self) -> list[Suspension]:
        listed = await self.alisted()
        return await anyio.to_thread.run_sync(listed.rows)

    def listed(self) -> Listed:
        """The store's unhealthy scopes now, their rows built when asked for."""
        listed, listed_at = self._take()
        _listed(listed.statuses, self.store, listed_at)
        return listed

    async def alisted(self) -> Listed:
        if not self.store.blocking:
            return await anyio.to_thread.run_sync(self.listed)
        listed, listed_at = await self._atake()
        # the observers of the listing walk every scope id it holds
        await anyio.to_thread.run_sync(_listed, listed.statuses, self.store, listed_at)
        return listed

    def clear(self, scope_id: str, who: str) -> Suspension | None:
        """Clear one scope; its row as it was, or None when no such scope is unhealthy.

        `who` (a token's name and peer, or the command line's user) goes into the
        ``suspension.cleared`` event, the audit record.
        """
        listed, listed_at = self._take()
        self._answered()
        row = self._row(scope_id, listed, listed_at)
        if row is None:
            return None
        at = time.monotonic()
        done = self.store.clear(scope_id)
        self._answered()
        return _cleared(row, who, at, self.store) if done else None

    async def aclear(self, scope_id: str, who: str) -> Suspension | None:
        if not self.store.blocking:
            # finding the row, and the store finding the scope, look at every key it holds
            return await anyio.to_thread.run_sync(self.clear, scope_id, who)
        listed, listed_at = await self._atake()
        self._answered()
        row = await anyio.to_thread.run_sync(self._row, scope_id, listed, listed_at)
        if row is None:
            return None
        at = time.monotonic()
        done = await self.store.clear_async(scope_id)
        self._answered()
        return _cleared(row, who, at, self.store) if done else None

    def _take(self) -> tuple[Listed, float]:
        """The store's unhealthy scopes, and when they were asked for (`time.monotonic()`)."""
        listed_at = time.monotonic()
        changes, listed = self._again()
        if listed is None:
            now = self.clock()
            listed = self._keep(changes, self.store.snapshot(now), now)
        return listed, listed_at

    async def _atake(self) -> tuple[Listed, float]:
        listed_at = time.monotonic()
        changes, listed = self._again()
        if listed is None:
            now = self.clock()
            listed = self._keep(changes, await self.store.snapshot_async(now), now)
        return listed, listed_at

    def _again(self) -> tuple[int | None, Listed | None]:
        """The store's count of changes, and the last listing when that count says the store
        holds what it did then (None: the store is to be read)."""
        changes = getattr(self.store, "changes", None)
        held = self._held
        if changes is None or held is None or held[0] != changes:
            return changes, None
        return changes, held[1].at(self.clock())

    def _keep(self, changes: int | None, snapshot: list[ScopeStatus], now: float) -> Listed:
        """The listing of a snapshot just taken, kept with the count of changes read before it
        was taken (a change in between only makes the next listing read the store again)."""
        if self.strict:
            self._answered()
        held = self._held
        listed = Listed(
            snapshot,
            self.router,
            self.store.fingerprint,
            now,
            like=held[1] if held is not None else None,
        )
        if changes is not None:
            self._held = (changes, listed)
        return listed

    def _row(self, scope_id: str, listed: Listed, listed_at: float) -> Suspension | None:
        """The row of `scope_id` in `listed` (None when it holds no such scope), the only
        one built; the listing is reported as any other."""
        _listed(listed.statuses, self.store, listed_at)
        found = next((s for s in listed.statuses if s.scope_id == scope_id), None)
        return None if found is None else listed.row(found)

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
