"""The steps of `MemoryStore` that decide: the state machine run on the scopes kept, written once.

`_look` admits a request's scopes and `_verdict` works out what a verdict
does to one scope; `_current` tells a stale verdict, `_refused` the refusal an
origin's own open scope gives every request. Allowed to change, `_look` applies
what it decided; else it, and `_changes_nothing` for a verdict, tell without
changing anything whether a step would change a scope at all, so that a store
sharing state (`SqliteStore`) decides from its view what needs no write.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .._answers.classify import Kind, Verdict
from .._common.scopes import ScopeFacts, ScopeKey, ScopeKind
from . import circuit
from .circuit import Circuit, Entry, State
from .kept import Origin, Scopes
from .protocol import Admission, Refusal, Ticket, Transition

if TYPE_CHECKING:
    from .._settings.policies import BreakerPolicy, Suspensions

__all__ = ["Steps", "transition", "verdict_keys"]


class Steps:
    """`MemoryStore`'s steps that decide, on the scopes kept (`_state`) and the sequence
    number (`_seq`); `_look` alone changes them, when allowed to."""

    _state: Scopes
    _seq: int
    _changes: int  # every write to the scopes kept

    # -- admission ---------------------------------------------------------

    def _refused(
        self, kept: Origin, origin: str, policy: BreakerPolicy, now: float, offset: float = 0.0
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
                        transitions.append(transition(key, after, c.state, now))
                    c = after
                if entry is Entry.PROBE:
                    probes.append(key)
            generations[key] = c.generation
        ticket = Ticket(facts, self._seq, generations, tuple(probes), shadow=refusal is not None)
        return Admission(ticket, refusal, tuple(transitions))

    # -- verdicts ----------------------------------------------------------

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


def verdict_keys(facts: ScopeFacts, verdict: Verdict) -> tuple[ScopeKey, ...]:
    """The scopes a failure or suspension is recorded against; none for a neutral result."""
    if verdict.kind is Kind.NEUTRAL or verdict.scope is None:
        return ()
    if verdict.also is None:
        return (facts.key(verdict.scope),)
    return tuple(dict.fromkeys((facts.key(verdict.scope), facts.key(verdict.also))))


def _refusal(key: ScopeKey, c: Circuit) -> Refusal:
    return Refusal(key, c.state, c.reason, c.retry_at)


def transition(key: ScopeKey, after: Circuit, previous: State, now: float) -> Transition:
    return Transition(
        scope=key,
        state=after.state,
        previous=previous,
        reason=after.reason,
        failures=after.failures,
        retry_in=after.retry_in(now) if after.state is State.OPEN else 0.0,
    )
