"""Random interleavings of admit, record and release against the probe-slot invariants.

They run on `MemoryStore` and on `SqliteStore` over a real file, whose view
of the file is what the invariants read after each step.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sidestep._answers.classify import RATE_LIMITED, Kind, Verdict
from sidestep._common.scopes import ScopeFacts, ScopeKind
from sidestep._settings.policies import BreakerPolicy, Suspensions
from sidestep._state.circuit import State
from sidestep._state.memory import MemoryStore
from sidestep._state.protocol import Ticket
from sidestep._state.sqlite.store import SqliteStore

ORIGIN = "https://api.example:443"
VERDICTS = {
    "success": Verdict(Kind.SUCCESS, None, None, failover=False),
    "failure": Verdict(Kind.FAILURE, "unavailable", ScopeKind.MODEL, failover=True),
    "connect": Verdict(Kind.FAILURE, "unavailable", ScopeKind.ORIGIN, failover=True),
    "neutral": Verdict(Kind.NEUTRAL, "client_error", None, failover=False),
    "rate_limited": Verdict(
        Kind.SUSPEND, RATE_LIMITED, ScopeKind.CREDENTIAL_MODEL, failover=True, retry_after=3.0
    ),
}


class ProbeSlots(RuleBasedStateMachine):
    """A store driven at random never over-admits probes and never gets stuck half-open."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = BreakerPolicy(
            failure_threshold=2, cooldown=5, max_cooldown=20, half_open_probes=2
        )
        self.suspensions = Suspensions()
        self.store = self.make_store()
        self.now = 0.0
        self.open_tickets: list[Ticket] = []

    def facts(self, model: str) -> ScopeFacts:
        return ScopeFacts(
            ORIGIN,
            headers={"authorization": "Bearer k"},
            userinfo="",
            body=f'{{"model": "{model}"}}'.encode(),
            fingerprint=self.store.fingerprint,
        )

    def make_store(self) -> MemoryStore:
        return MemoryStore()

    @rule(model=st.sampled_from(["m1", "m2"]))
    def admit(self, model: str) -> None:
        ticket = self.store.admit(self.facts(model), self.policy, self.now).ticket
        if ticket is not None:
            self.open_tickets.append(ticket)

    @precondition(lambda self: self.open_tickets)
    @rule(data=st.data(), verdict=st.sampled_from(sorted(VERDICTS)))
    def record(self, data: st.DataObject, verdict: str) -> None:
        ticket = self.open_tickets.pop(data.draw(st.integers(0, len(self.open_tickets) - 1)))
        self.store.record(ticket, VERDICTS[verdict], self.policy, self.suspensions, self.now)

    @precondition(lambda self: self.open_tickets)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        ticket = self.open_tickets.pop(data.draw(st.integers(0, len(self.open_tickets) - 1)))
        self.store.release(ticket)

    @rule(seconds=st.sampled_from([0.5, 3.0, 5.0, 25.0]))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def probes_match_the_tickets_that_hold_them(self) -> None:
        for key, circuit in self.store._state.entries.items():
            held = sum(
                1
                for t in self.open_tickets
                if key in t.probes
                and t.generations is not None
                and t.generations.get(key) == circuit.generation
            )
            if circuit.state is State.HALF_OPEN:
                assert circuit.probes <= self.policy.half_open_probes
                assert circuit.probes == held
            else:
                assert circuit.probes == 0

    @invariant()
    def nothing_in_flight_means_every_scope_can_be_admitted_again(self) -> None:
        if self.open_tickets:
            return
        for circuit in self.store._state.entries.values():
            if circuit.state is State.HALF_OPEN:
                assert circuit.probes < self.policy.half_open_probes
            if circuit.state is State.OPEN:
                assert circuit.retry_at < float("inf")


class SqliteProbeSlots(ProbeSlots):
    """The same, with every step a transaction on a fresh SQLite file."""

    def make_store(self) -> MemoryStore:
        self.dir = tempfile.TemporaryDirectory()
        store = SqliteStore(Path(self.dir.name) / "state.db")
        store._caller_clock = True
        return store

    def teardown(self) -> None:
        assert isinstance(self.store, SqliteStore)
        assert self.store.fallbacks == 0
        self.store.close()
        self.dir.cleanup()


ProbeSlots.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_probe_slots = ProbeSlots.TestCase
SqliteProbeSlots.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None
)
test_probe_slots_on_sqlite = SqliteProbeSlots.TestCase
