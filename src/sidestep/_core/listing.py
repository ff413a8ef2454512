"""The operator's view of a store: its unhealthy scopes, listed and cleared through the routes.

`Listing` reads a store through one configuration's routes (what the transports,
the admin app and the CLI all list and clear), its async twins off the event loop,
and lists again what it listed last while the store says nothing changed. A
listing is reported (``suspensions.listed``); a clear is the audit record
(``suspension.cleared``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread

from .._state.protocol import ScopeStatus, StateStore, store_id
from ..logging import emit, listening
from .listed import Listed
from .listing_row import Suspension
from .pool_view import pools
from .routes import Router

__all__ = ["Listing", "StoreUnavailable"]


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

    def pools(self) -> dict[str, dict[str, Any]]:
        """Each pooled route's balance and members, as this process counts them
        (`pool_view.pools`)."""
        return pools(self.router, self.clock())

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
