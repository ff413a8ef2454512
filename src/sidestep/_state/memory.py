"""Where circuit state lives in one process: `MemoryStore`.

A store offers whole operations (``protocol``): here each is one step
under one lock. The steps that decide are `Steps`' (``steps``), which a store
sharing state runs on a view of it; here they change the scopes kept
(``kept``) through the bookkeeping that keeps them bounded.

Only unhealthy scopes are kept. While an origin has none, admission is one
dictionary look-up: the request's model and credential are never worked out.
They are bounded (`max_scopes`): room is made by forgetting unrouted traffic's
scopes first, and never a route's for unrouted traffic (`_evict`).

Operators' reads stay off the lock but for a copy: a snapshot hands out again
the status of every scope whose circuit has not changed since the last one
(``statuses``), the store counts its changes (`changes`), so that a listing
of an unchanged store need not be taken again, and a clear finds its scope by
the ids the keys keep before it takes the lock.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from .._common.scopes import Fingerprinter, ScopeFacts, ScopeKey, ScopeKind
from .._common.turns import Turns
from . import circuit
from .circuit import Circuit, State
from .kept import Origin, Scopes
from .protocol import Admission, ScopeStatus, Ticket, Transition
from .statuses import Statuses
from .steps import Steps, transition

if TYPE_CHECKING:
    from .._answers.classify import Verdict
    from .._settings.policies import BreakerPolicy, Suspensions

__all__ = ["DEFAULT_MAX_SCOPES", "MemoryStore"]

DEFAULT_MAX_SCOPES = 10_000


class MemoryStore(Steps):
    """Circuit state in this process: thread-safe, bounded, keeping only unhealthy scopes.

    Args:
        max_scopes: the most scopes kept. Past it, a new scope takes the place of
            the oldest closed scope of unrouted traffic (else of its oldest); a
            scope a routed request recorded a result on gives its place only to
            another route's, once no scope of unrouted traffic is left (the oldest
            closed, else the oldest), and a new scope of unrouted traffic that finds
            no place is not kept. Forgetting one that is open or half-open is among
            the transitions `record` returns (`forgotten`).
        fingerprint_key: the key for credential fingerprints (random if None).
    """

    blocking = False

    def __init__(
        self, *, max_scopes: int = DEFAULT_MAX_SCOPES, fingerprint_key: bytes | str | None = None
    ) -> None:
        if max_scopes < 1:
            raise ValueError("max_scopes must be at least 1")
        self.fingerprint = Fingerprinter(fingerprint_key)
        self._max = max_scopes
        self._lock = threading.Lock()
        self._state = Scopes()
        # Every scope kept (the very dict in `_state`): while it is empty, every origin
        # is healthy. The core's fast path reads it, as `healthy` reads its origins:
        # without the lock, and before `_seq`.
        self._kept = self._state.entries
        self._seq = 0
        self._changes = 0  # every write to the scopes kept (`changes`)
        self._statuses = Statuses()
        # The suspended scopes the current operation forgot to make room (under the lock).
        self._dropped: list[Transition] = []

    def __repr__(self) -> str:
        return f"MemoryStore(scopes={len(self._state.entries)}, max_scopes={self._max})"

    def __len__(self) -> int:
        return len(self._state.entries)

    @property
    def changes(self) -> int | None:
        """How many times the scopes kept have changed: while it stays the same, a
        snapshot lists what the last one did (None from a store that cannot tell
        without asking where its state lives)."""
        return self._changes

    # -- admission ---------------------------------------------------------

    def healthy(self, origin: str) -> int | None:
        """Whether nothing is kept for `origin`: then admission there is a ticket
        ``Ticket(facts, seq)`` for this sequence number, and a success records
        nothing; None otherwise."""
        kept = self._state.origins.get(origin)
        return self._seq if kept is None or not kept.unhealthy else None

    def refused(self, origin: str, policy: BreakerPolicy, now: float) -> Admission | None:
        """The refusal `admit` gives every request to `origin` now, its own scope being
        open; None when that is not known without the request's keys."""
        kept = self._state.origins.get(origin)
        if kept is None or not kept.unhealthy:
            return None
        return self._refused(kept, origin, policy, now)

    def admit(
        self, facts: ScopeFacts, policy: BreakerPolicy, now: float, lease: float | None = None
    ) -> Admission:
        # `lease` is for stores shared with other processes, whose probe holder
        # may die; here a probe ends with its request, in every path.
        origin = self._state.origins.get(facts.origin)
        if origin is None or not origin.unhealthy:
            # The healthy path: no key, no body parse, no hash, no lock.
            return Admission(Ticket(facts, self._seq))
        refused = self._refused(origin, facts.origin, policy, now)
        if refused is not None:
            return refused
        keys = facts.keys()
        with self._lock:
            return self._admit(facts, keys, policy, now)

    def _admit(
        self, facts: ScopeFacts, keys: tuple[ScopeKey, ...], policy: BreakerPolicy, now: float
    ) -> Admission:
        admission = self._look(facts, keys, policy, now, change=True)
        assert admission is not None  # allowed to change, it always decides
        return admission

    # -- verdicts ----------------------------------------------------------

    def record(
        self,
        ticket: Ticket,
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        now: float,
    ) -> tuple[Transition, ...]:
        keys = self._verdict_keys(ticket, verdict)
        if keys is None:
            return ()
        with self._lock:
            return self._record(ticket, keys, verdict, policy, suspensions, now)

    def _record(
        self,
        ticket: Ticket,
        keys: tuple[ScopeKey, ...],
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        now: float,
    ) -> tuple[Transition, ...]:
        dropped: list[Transition] = []
        self._dropped = dropped
        transitions = [
            t
            for key in keys
            if (t := self._apply(ticket, key, verdict, policy, suspensions, now)) is not None
        ]
        self._release(ticket, exclude=keys)
        return (*transitions, *dropped) if dropped else tuple(transitions)

    def _apply(
        self,
        ticket: Ticket,
        key: ScopeKey,
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        now: float,
    ) -> Transition | None:
        change = self._verdict(ticket, key, verdict, policy, suspensions, now, self._seq)
        if change is None:
            return None
        before, after, self._seq = change
        if not self._put(key, before, after):
            return None  # unrouted traffic's new scope, with no room left for it
        previous = before.state if before is not None else State.CLOSED
        return transition(key, after, previous, now) if after.state is not previous else None

    # -- releasing -----------------------------------------------------------

    def release(self, ticket: Ticket) -> None:
        if ticket.done:
            return
        ticket.done = True
        if ticket.probes:
            with self._lock:
                self._release(ticket, exclude=())

    def _release(self, ticket: Ticket, exclude: tuple[ScopeKey, ...]) -> None:
        entries = self._state.entries
        for key in ticket.probes:
            c = entries.get(key)
            if key in exclude or c is None or ticket.generations is None:
                continue
            if c.generation == ticket.generations.get(key):
                entries[key] = circuit.release(c)
                self._changes += 1

    # -- bookkeeping ----------------------------------------------------------

    def _put(self, key: ScopeKey, before: Circuit | None, after: Circuit) -> bool:
        """Keep `after` for `key`, or forget the scope once healthy; False when it is a new
        scope of unrouted traffic and no room can be made for it (`_evict`)."""
        entries, origins = self._state.entries, self._state.origins
        if after.healthy:
            if before is not None:
                self._forget(key)
            return True
        if before is None:
            if len(entries) >= self._max and not self._evict(after.routed):
                return False
            kept = origins.setdefault(key.origin, Origin())
            kept.unhealthy += 1
            if key.kind is ScopeKind.ORIGIN:
                kept.key = key  # the very key of the entry: found by identity
        entries[key] = after
        self._changes += 1
        return True

    def _forget(self, key: ScopeKey) -> None:
        del self._state.entries[key]
        self._changes += 1
        origin = self._state.origins[key.origin]
        origin.unhealthy -= 1
        origin.forgot = self._seq
        if len(self._state.origins) > self._max:
            self._prune_origins()

    def _evict(self, routed: bool) -> bool:
        """Make room for a new scope (`routed`: a route's): forget the oldest closed scope
        of unrouted traffic, else its oldest; for a route's new scope only, when none is
        left, the oldest closed scope of a route, else the oldest. False when there is
        none to forget: unrouted traffic never makes room by forgetting a route's scope."""
        entries = self._state.entries
        victim: ScopeKey | None = None
        spare = closed = oldest = victim
        for k, c in entries.items():  # one pass, oldest first
            if not c.routed:
                if c.state is State.CLOSED:
                    victim = k
                    break
                if spare is None:
                    spare = k
            elif routed and closed is None:
                if oldest is None:
                    oldest = k
                if c.state is State.CLOSED:
                    closed = k
        victim = victim or spare or closed or oldest
        if victim is None:
            return False
        c = entries[victim]
        if c.state is not State.CLOSED:  # a suspended scope goes: it is told
            self._dropped.append(
                Transition(
                    victim,
                    State.CLOSED,
                    c.state,
                    c.reason,
                    c.failures,
                    None,
                    True,
                    time.monotonic(),
                )
            )
        self._seq += 1
        self._forget(victim)
        return True

    def _prune_origins(self) -> None:
        origins = self._state.origins
        for name in [n for n, o in origins.items() if not o.unhealthy]:
            del origins[name]

    # -- operators -------------------------------------------------------------

    def snapshot(self, now: float) -> list[ScopeStatus]:
        # `now` is unused: a status holds nothing that depends on the time it is read
        with self._lock:
            # two lists, not a pair per scope: thousands of pairs held while the statuses
            # are made would outlive collections of the youngest objects
            entries = self._state.entries
            keys, circuits = list(entries), list(entries.values())
        return self._statuses.of(keys, circuits)

    def clear(self, scope_id: str) -> bool:
        key = self._scope(scope_id)
        with self._lock:
            return self._clear(scope_id, key)

    def _scope(self, scope_id: str) -> ScopeKey | None:
        """The kept scope of that id, found without the lock: keys keep their ids."""
        turns = Turns()
        for key in list(self._state.entries):
            if key.scope_id == scope_id:
                return key
            turns()
        return None

    def _clear(self, scope_id: str, key: ScopeKey | None) -> bool:
        """Forget `key` (the scope of `scope_id` found before the lock was taken), if kept."""
        if key is None or key not in self._state.entries:
            return False
        self._seq += 1
        self._forget(key)
        return True

    # -- async twins: nothing here waits, so they just call through -------------

    async def admit_async(
        self, facts: ScopeFacts, policy: BreakerPolicy, now: float, lease: float | None = None
    ) -> Admission:
        return self.admit(facts, policy, now, lease)

    async def record_async(
        self,
        ticket: Ticket,
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        now: float,
    ) -> tuple[Transition, ...]:
        return self.record(ticket, verdict, policy, suspensions, now)

    async def release_async(self, ticket: Ticket) -> None:
        self.release(ticket)

    async def snapshot_async(self, now: float) -> list[ScopeStatus]:
        return self.snapshot(now)

    async def clear_async(self, scope_id: str) -> bool:
        return self.clear(scope_id)
