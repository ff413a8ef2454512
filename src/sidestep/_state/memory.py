"""Where circuit state lives in one process: `MemoryStore` (and the protocol's names).

A store offers whole operations (``_store_protocol``): here each is one step
under one lock. Those steps are written so that a store sharing state can
run them on a view of it: `_look` and `_changes_nothing` decide, changing
nothing, whether an admission or a verdict would change a scope at all.

Only unhealthy scopes are kept. While an origin has none, admission is one
dictionary look-up: the request's model and credential are never worked out.
They are bounded (`max_scopes`): room is made by forgetting unrouted traffic's
scopes first, and never a route's for unrouted traffic (`_evict`).

Operators' reads stay off the lock but for a copy: a snapshot hands out again
the status of every scope whose circuit has not changed since the last one
(``_statuses``), the store counts its changes (`changes`), so that a listing
of an unchanged store need not be taken again, and a clear finds its scope by
the ids the keys keep before it takes the lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from .._answers.classify import Kind, Verdict
from .._common.scopes import Fingerprinter, ScopeFacts, ScopeKey, ScopeKind
from .._common.turns import Turns
from . import circuit
from .circuit import Circuit, Entry, State
from .protocol import Admission, Refusal, ScopeStatus, StateStore, Ticket, Transition, store_id
from .statuses import Statuses

if TYPE_CHECKING:
    from .._settings.policies import BreakerPolicy, Suspensions

__all__ = [
    "Admission",
    "MemoryStore",
    "Refusal",
    "ScopeStatus",
    "StateStore",
    "Ticket",
    "Transition",
    "store_id",
    "verdict_keys",
]

DEFAULT_MAX_SCOPES = 10_000


@dataclass(slots=True)
class _Origin:
    unhealthy: int = 0  # entries kept for this origin
    forgot: int = 0  # the sequence number of the last time one of them was forgotten
    key: ScopeKey | None = None  # the origin's own scope, made once
    # its refusal, while that circuit and the offset of the caller's clock (`_refused`) stand
    refused: tuple[Circuit, float, Admission] | None = None


@dataclass(slots=True)
class _Scopes:
    entries: dict[ScopeKey, Circuit] = field(default_factory=dict)
    origins: dict[str, _Origin] = field(default_factory=dict)


class MemoryStore:
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
        self._state = _Scopes()
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

    def _refused(
        self, kept: _Origin, origin: str, policy: BreakerPolicy, now: float, offset: float = 0.0
    ) -> Admission | None:
        """`refused` for a kept origin. `now` is on the clock the windows are kept on; the
        refusal's end is on the caller's, `offset` behind it (a store sharing state keeps
        windows on the wall clock)."""
        if not policy.enforce:
            return None
        # The origin's own scope comes first among every request's keys: when it
        # refuses, that is the answer, before any body parse or hash (an outage).
        key = kept.key
        if key is None:
            key = kept.key = ScopeKey(ScopeKind.ORIGIN, origin)
        c = self._state.entries.get(key)
        if c is None or c.state is not State.OPEN or now >= c.retry_at:
            return None
        # The same answer for every request it turns away, while the clocks keep their
        # offset (to a millisecond: a caller's clock drifts from the wall clock).
        refused = kept.refused
        if refused is None or refused[0] is not c or abs(refused[1] - offset) >= 1e-3:
            refusal = Refusal(key, c.state, c.reason, c.retry_at - offset)
            refused = kept.refused = (c, offset, Admission(None, refusal))
        return refused[2]

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

    def _look(
        self,
        facts: ScopeFacts,
        keys: tuple[ScopeKey, ...],
        policy: BreakerPolicy,
        now: float,
        *,
        change: bool,
    ) -> Admission | None:
        """Admission on the scopes kept; without `change`, None when it would change one
        (a window over, a probe slot to take): nothing is changed then."""
        entries = self._state.entries
        # Look first, change later: a refused request must not take probe slots.
        refusal: Refusal | None = None
        for key in keys:
            c = entries.get(key)
            if c is None:
                continue
            if c.state is State.OPEN and now < c.retry_at:
                refusal = _refusal(key, c)
                break
            if c.state is State.HALF_OPEN and c.probes >= policy.half_open_probes:
                refusal = Refusal(key, c.state, c.reason, now)
                break
        if refusal is not None and policy.enforce:
            return Admission(None, refusal)
        generations: dict[ScopeKey, int] = {}
        probes: list[ScopeKey] = []
        transitions: list[Transition] = []
        for key in keys:
            c = entries.get(key)
            if c is None:
                generations[key] = 0
                continue
            if refusal is None:
                after, entry = circuit.admit(c, policy, now, self._seq + 1)
                if after is not c:
                    if not change:
                        return None
                    entries[key] = after
                    self._changes += 1
                    if after.generation != c.generation:
                        self._seq += 1
                        transitions.append(_transition(key, after, c.state, now))
                    c = after
                if entry is Entry.PROBE:
                    probes.append(key)
            generations[key] = c.generation
        ticket = Ticket(facts, self._seq, generations, tuple(probes), shadow=refusal is not None)
        return Admission(ticket, refusal, tuple(transitions))

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

    def _verdict_keys(self, ticket: Ticket, verdict: Verdict) -> tuple[ScopeKey, ...] | None:
        """Marks the ticket done; the scopes its verdict concerns, None when it records nothing."""
        if ticket.done:
            return None
        ticket.done = True
        if ticket.shadow:
            return None  # observe mode: enforcing would never have sent it
        if verdict.kind is Kind.SUCCESS:
            origin = self._state.origins.get(ticket.facts.origin)
            if not ticket.probes and (origin is None or not origin.unhealthy):
                return None  # the healthy path: nothing kept, nothing to reset
            return ticket.facts.keys()
        return verdict_keys(ticket.facts, verdict)

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

    def _changes_nothing(
        self,
        ticket: Ticket,
        keys: tuple[ScopeKey, ...],
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        now: float,
    ) -> bool:
        """Would recording this verdict leave every scope as it is (nothing written)?"""
        if ticket.probes:
            return False
        return all(
            self._verdict(ticket, key, verdict, policy, suspensions, now, self._seq) is None
            for key in keys
        )

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
        return _transition(key, after, previous, now) if after.state is not previous else None

    def _verdict(
        self,
        ticket: Ticket,
        key: ScopeKey,
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        now: float,
        seq: int,
    ) -> tuple[Circuit | None, Circuit, int] | None:
        """What the verdict does to one scope, changing nothing: the circuit before and
        after, and the sequence number after; None when it does nothing."""
        before = self._state.entries.get(key)
        if not self._current(ticket, key, before):
            return None
        if before is None:
            if verdict.kind is Kind.SUCCESS:
                return None  # healthy already
            seq += 1
            c = Circuit(generation=seq, born=seq)
        else:
            c = before
        next_gen = seq + 1
        if verdict.kind is Kind.SUCCESS:
            after = circuit.on_success(c, policy, now)
        elif verdict.kind is Kind.FAILURE:
            after = circuit.on_failure(c, policy, now, next_gen, verdict.retry_after, verdict.slow)
        else:
            reason = verdict.reason or ""
            window = suspensions.window(reason)
            after = circuit.on_suspension(
                c, reason, window, verdict.retry_after, policy, now, next_gen
            )
        if after is before:
            return None
        if after.generation == next_gen or (after.healthy and c.state is not State.CLOSED):
            seq += 1
        if not after.routed and ticket.facts.routed and not after.healthy:
            after = replace(after, routed=True)  # a route's now: room for others never takes it
        return before, after, seq

    def _current(self, ticket: Ticket, key: ScopeKey, c: Circuit | None) -> bool:
        """Is this ticket's verdict about the scope's present generation?"""
        seen = ticket.generations.get(key, 0) if ticket.generations is not None else 0
        if seen:
            return c is not None and c.generation == seen
        # Admitted while the scope was healthy: current as long as the scope has
        # not been forgotten since, nor moved past the closed state it was born in.
        origin = self._state.origins.get(key.origin)
        if origin is not None and origin.forgot > ticket.seq:
            return False
        return c is None or c.generation == c.born

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
            kept = origins.setdefault(key.origin, _Origin())
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


def verdict_keys(facts: ScopeFacts, verdict: Verdict) -> tuple[ScopeKey, ...]:
    """The scopes a failure or suspension is recorded against; none for a neutral result."""
    if verdict.kind is Kind.NEUTRAL or verdict.scope is None:
        return ()
    if verdict.also is None:
        return (facts.key(verdict.scope),)
    return tuple(dict.fromkeys((facts.key(verdict.scope), facts.key(verdict.also))))


def _refusal(key: ScopeKey, c: Circuit) -> Refusal:
    return Refusal(key, c.state, c.reason, c.retry_at)


def _transition(key: ScopeKey, after: Circuit, previous: State, now: float) -> Transition:
    return Transition(
        scope=key,
        state=after.state,
        previous=previous,
        reason=after.reason,
        failures=after.failures,
        retry_in=after.retry_in(now) if after.state is State.OPEN else 0.0,
    )
