"""What a memory store's snapshot is made of: a status per scope, made again only when it changed.

A circuit is never changed in place, only replaced, so a scope whose circuit
is the very one it was at the last snapshot keeps the status it had then
(`Statuses`): a snapshot of thousands of unchanged scopes builds nothing new
(nothing for the garbage collector to walk, no id to work out). A status holds
no clock reading (`ScopeStatus.retry_in` is worked out when asked), so it
stays right for as long as its circuit does.
"""

from __future__ import annotations

import math

from .._common.scopes import ScopeKey
from .._common.turns import Turns
from .circuit import Circuit, State
from .protocol import ScopeStatus

__all__ = ["Statuses", "opened_at", "status_of"]

_STEP = 64
"""Scopes looked at between two checks for other threads' turns."""


class Statuses:
    """The statuses of a store's last snapshot, by scope: `of` hands them out again for
    the scopes whose circuit is unchanged, and makes the others (outside the store's
    lock, other threads getting their turns meanwhile)."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        # Statuses and circuits, both by the id of the key (a key's own hash is a call into
        # Python), not as pairs: thousands of pairs would be as many more objects for the
        # collector to walk. A status holds its key, which keeps the id its own. The two
        # are replaced together, as one value: snapshots may be taken in several threads.
        self._held: tuple[dict[int, ScopeStatus], dict[int, Circuit]] = ({}, {})

    def of(self, keys: list[ScopeKey], circuits: list[Circuit]) -> list[ScopeStatus]:
        """The statuses of the scopes `keys`, whose circuits are `circuits` (in that order)."""
        held, was = self._held
        kept: dict[int, ScopeStatus] = {}
        statuses = []
        turns = Turns()
        for i in range(0, len(keys), _STEP):
            for key, c in zip(keys[i : i + _STEP], circuits[i : i + _STEP], strict=True):
                status = held.get(id(key))
                if status is None or status.scope is not key or was[id(key)] is not c:
                    status = status_of(key, c)
                kept[id(key)] = status
                statuses.append(status)
            turns()
        # the scopes gone since are let go of
        self._held = (kept, dict(zip(kept, circuits, strict=True)))
        return statuses


def status_of(key: ScopeKey, c: Circuit) -> ScopeStatus:
    """The status of one kept scope."""
    return ScopeStatus(key.scope_id, key, c.state, c.reason, c.failures, c.retry_at, opened_at(c))


def opened_at(c: Circuit) -> float | None:
    """When an open or half-open scope's latest window began (unknown for one until cleared)."""
    if c.state is State.CLOSED or math.isinf(c.retry_at):
        return None
    return c.retry_at - c.window
