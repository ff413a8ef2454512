"""A store's unhealthy scopes at one moment, each named by the routes when asked (`Listed`).

A listing builds a row, its JSON or its line only when asked for one, and keeps
what it works out (`_Known`) for the next listing of the same store through the
same routes: scopes that have not changed are not worked out again.
"""

from __future__ import annotations

import json
import math
import operator
from typing import Any

from .._common.scopes import Fingerprinter
from .._common.turns import Turns
from .._state.circuit import State
from .._state.protocol import ScopeStatus
from .listing_row import Suspension, fixed_keys, iso
from .routes import Router

__all__ = ["Listed"]


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
            fixed = json.dumps(fixed_keys(self.row(status)))
            start = known.starts[known.keep(status)] = f'{fixed[:-1]}, "retry_in": '
        left = status.retry_in(self.now)
        retry = "null" if left is None else repr(round(left, 3))
        opened = "null"
        if status.opened_at is not None:
            moment = wall - max(0.0, now - status.opened_at)
            opened = known.moments.get(int(moment)) or ""
            if not opened:
                opened = known.moments[int(moment)] = json.dumps(iso(moment))
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
