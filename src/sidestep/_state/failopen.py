"""A shared store's stand-in while it is away: a local `MemoryStore`, and when to try again.

A shared store (Redis, a SQLite file) that does not answer never fails a
request: the store serves from a `MemoryStore` of this process, warns with
``store.unavailable``, and tries the shared state again at most every
``retry_interval`` (one caller tries; the others stay local until it knows).
Each ticket's verdict goes back to the store that issued it. When the shared
state answers again, ``store.recovered`` is emitted and the local state is
forgotten: it served the outage and would only mislead the next one.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from ..logging import emit
from .memory import MemoryStore
from .protocol import Admission, Ticket

if TYPE_CHECKING:
    from .._common.scopes import ScopeFacts
    from .._settings.policies import BreakerPolicy

__all__ = ["FailOpen", "LocalTicket"]


class LocalTicket(Ticket):
    """A ticket the local fallback issued: its verdict goes to that same fallback,
    even after the shared state came back and a fresh fallback replaced it."""

    __slots__ = ("store",)

    def __init__(self, store: MemoryStore, ticket: Ticket) -> None:
        super().__init__(ticket.facts, ticket.seq, ticket.generations, ticket.probes, ticket.shadow)
        self.store = store


class FailOpen:
    """Whether the shared state is deemed away, and the local store that stands in meanwhile.

    Args:
        store: the kind of store, for events (``"redis"``, ``"sqlite"``).
        where: where it lives, as events may show it (never a secret).
        max_scopes: the local store's bound.
        retry_interval: while away, try again at most this often.
        claim: how long the caller that tries again has before another may.
        always: operations tried even while the shared state is deemed away.
        repeat: warn on every failed call (else only when the state goes away).
    """

    def __init__(
        self,
        store: str,
        where: str,
        *,
        max_scopes: int,
        retry_interval: float,
        claim: float,
        always: frozenset[str] = frozenset(),
        repeat: bool = True,
    ) -> None:
        self.store = store
        self.where = where
        self.fallback = MemoryStore(max_scopes=max_scopes)
        self.fallbacks = 0  # calls that failed and were served locally (or dropped)
        self.down = False
        self._max_scopes = max_scopes
        self._retry_interval = retry_interval
        self._claim = claim
        self._always = always
        self._repeat = repeat
        self._retry_at = 0.0
        self._lock = threading.Lock()

    def usable(self, op: str) -> bool:
        """May `op` try the shared state now?"""
        if not self.down or op in self._always:
            return True
        now = time.monotonic()
        with self._lock:
            if now < self._retry_at:
                return False
            # This caller tries; the others stay local until it knows.
            self._retry_at = now + self._retry_interval + self._claim
            return True

    def due(self) -> bool:
        """Would a caller be let try the shared state now (`usable`, without claiming it)?"""
        return not self.down or time.monotonic() >= self._retry_at

    def unavailable(self, op: str, exc: BaseException) -> None:
        """A call to the shared state failed: serve locally for now."""
        with self._lock:
            self.fallbacks += 1
            was, self.down = self.down, True
            self._retry_at = time.monotonic() + self._retry_interval
            count = self.fallbacks
        if was and not self._repeat:
            return
        # The exception's type only: its text is the client library's to word.
        emit(
            "store.unavailable",
            store=self.store,
            server=self.where,
            operation=op,
            error=type(exc).__name__,
            retry_in_s=self._retry_interval,
            fallbacks=count,
        )

    def answered(self) -> None:
        """A call to the shared state succeeded."""
        if not self.down:
            return
        with self._lock:
            was, self.down = self.down, False
            if was:
                # What the fallback learnt served the outage; kept, it would be invisible
                # and uncleared while the shared state is up, and refuse requests in the
                # next outage. Its tickets still in flight keep it alive for their verdicts.
                self.fallback = MemoryStore(max_scopes=self._max_scopes)
        if was:
            emit("store.recovered", store=self.store, server=self.where)

    def admit(self, facts: ScopeFacts, policy: BreakerPolicy, now: float) -> Admission:
        """Admission by the local store; its ticket remembers which store that was."""
        store = self.fallback
        admission = store.admit(facts, policy, now)
        if admission.ticket is None:
            return admission
        return Admission(
            LocalTicket(store, admission.ticket), admission.refusal, admission.transitions
        )

    def issuer(self, ticket: Ticket) -> MemoryStore:
        """The local store that issued `ticket` (the current one for any other ticket)."""
        return ticket.store if isinstance(ticket, LocalTicket) else self.fallback
