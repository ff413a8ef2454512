"""The instruments, and the measurements each event makes: shared by every exporter.

`INSTRUMENTS` lists what Prometheus and OpenTelemetry both report; `Measures`
turns one event into its measurements — instrument, label values, amount —
by the label rules, once for every exporter: route and target names come
from the configuration, everything else from a fixed enumeration; a request
that matches no route is labelled by its origin, up to `max_origins`
distinct origins, past which it counts as ``other``. No label ever holds a
path, a query, userinfo, a credential or a fingerprint.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

from .._answers import classify as c11n
from .._common.outcomes import ATTEMPT_RESULTS, CANCELLED, HEDGE_OUTCOMES, REQUEST_OUTCOMES
from .._common.scopes import ScopeKind
from .._settings.faults import FAULTS as FAULTS_KINDS
from .._state.circuit import State

__all__ = ["INFLIGHT", "INSTRUMENTS", "MAX_ORIGINS", "OTHER", "Instrument", "Measure", "Measures"]

MAX_ORIGINS = 100  # distinct unrouted origins labelled by name; past that, "other"
OTHER = "other"


@dataclass(frozen=True, slots=True)
class Instrument:
    """One instrument: its names in each system, its kind, unit and labels."""

    prometheus: str  # without the `_total` prometheus_client adds to a counter's samples
    otel: str
    kind: Literal["counter", "histogram", "updown"]
    labels: tuple[str, ...]
    description: str
    unit: str = "1"

    @property
    def exposed(self) -> str:
        """The name Prometheus shows: a counter's ends in ``_total``."""
        return f"{self.prometheus}_total" if self.kind == "counter" else self.prometheus


REQUESTS = Instrument(
    "sidestep_requests",
    "sidestep.requests",
    "counter",
    ("route", "outcome"),
    "Requests handled, by how they ended",
)
ATTEMPTS = Instrument(
    "sidestep_attempts",
    "sidestep.attempts",
    "counter",
    ("route", "target", "result"),
    "Upstream attempts, by result",
)
DURATION = Instrument(
    "sidestep_attempt_duration_seconds",
    "sidestep.attempt.duration",
    "histogram",
    ("route", "target"),
    "Time from sending an attempt to its verdict (to the first byte of a stream)",
    unit="s",
)
FAILOVERS = Instrument(
    "sidestep_failovers",
    "sidestep.failovers",
    "counter",
    ("route", "from_target", "to_target"),
    "Moves from a failing target to the next one",
)
SKIPPED = Instrument(
    "sidestep_candidates_skipped",
    "sidestep.candidates.skipped",
    "counter",
    ("route", "target", "reason"),
    "Calls never made because a scope of the target was not closed",
)
TRANSITIONS = Instrument(
    "sidestep_circuit_transitions",
    "sidestep.circuit.transitions",
    "counter",
    ("target", "scope", "from_state", "to_state", "reason"),
    "Circuit state changes",
)
PROBES = Instrument(
    "sidestep_probes_admitted",
    "sidestep.probes.admitted",
    "counter",
    ("target", "scope"),
    "Requests admitted as a half-open scope's probe",
)
SUSPENDED = Instrument(
    "sidestep_suspended",
    "sidestep.suspended",
    "updown",
    ("target", "scope", "reason"),
    "Scopes currently open or half-open",
)
INFLIGHT = Instrument(
    "sidestep_inflight",
    "sidestep.inflight",
    "updown",
    ("route", "target"),
    "Attempts in flight on pooled routes' members, from their send to their verdict",
)
FAULTS = Instrument(
    "sidestep_faults_injected",
    "sidestep.faults.injected",
    "counter",
    ("route", "target", "fault"),
    "Faults a fault plan or chaos injected, by target and fault",
)
HEDGES = Instrument(
    "sidestep_hedges",
    "sidestep.hedges",
    "counter",
    ("route", "outcome"),
    "Hedged requests whose delay ran out, by what came of the hedge",
)
INSTRUMENTS = (
    REQUESTS,
    ATTEMPTS,
    DURATION,
    FAILOVERS,
    SKIPPED,
    TRANSITIONS,
    PROBES,
    SUSPENDED,
    INFLIGHT,
    FAULTS,
    HEDGES,
)

Measure = tuple[Instrument, tuple[str, ...], float]

_TRANSITION_EVENTS = frozenset({"circuit.opened", "circuit.half_open", "circuit.closed"})
# A suspended scope the store no longer holds, with no transition: cleared by hand,
# or forgotten by the store to stay within its bound.
_LET_GO_EVENTS = frozenset({"suspension.cleared", "suspension.forgotten"})
_RESULTS = frozenset((*ATTEMPT_RESULTS, CANCELLED))
_OUTCOMES = frozenset((*REQUEST_OUTCOMES, CANCELLED))
_HEDGE_OUTCOMES = frozenset(HEDGE_OUTCOMES)
_REASONS = frozenset(
    {*c11n.SUSPENSION_REASONS, c11n.UNAVAILABLE, c11n.CONTEXT_OVERFLOW, c11n.CLIENT_ERROR}
)
_SCOPES = frozenset(k.value for k in ScopeKind)
# a fault's label: its kind, or a status fault's code (`FaultRule.label`)
_FAULTS = frozenset(
    {*(f for f in FAULTS_KINDS if f != "status"), *(f"status_{s}" for s in range(400, 600))}
)
_STATES = frozenset(s.value for s in State)
_CLOSED = State.CLOSED.value


def _one_of(value: object, allowed: frozenset[str]) -> str:
    """`value` when it is one of `allowed`; "" for none; otherwise "other"."""
    if value is None:
        return ""
    return value if isinstance(value, str) and value in allowed else OTHER


class Measures:
    """Each event's measurements, by the label rules (one instance per exporter).

    Keeps two bounded memories: the unrouted origins labelled so far (at most
    `max_origins`), and, by store and scope id, the gauge labels each scope it
    saw leave ``closed`` was counted under, so that closing, clearing or
    forgetting it takes the gauge down under those same labels (two models of
    one target are two scopes; one scope reached through two targets' names is
    one; one origin in two stores of the process, two), with when its last
    transition was seen and when it last left ``closed``: a listing of a store
    (``suspensions.listed``) takes off the scopes of that store it no longer
    holds, those seen before it was asked for — not one that opened again
    meanwhile; a clear or forgetting told after the scope left ``closed`` anew
    is of its former suspension, and takes nothing off.

    An attempt on a pool member (its ``attempt.started`` names a ``tier``) is
    counted in flight until its ``attempt.finished``, which comes in the same
    thread or task: a context variable pairs the two, so an exporter enabled
    while an attempt was in flight never takes off what it did not count.
    """

    def __init__(self, max_origins: int = MAX_ORIGINS) -> None:
        self._max_origins = max_origins
        self._origins: set[str] = set()
        # gauge labels, by store and scope_id (two stores of one process: two scopes)
        self._suspended: dict[tuple[object, object], tuple[str, str, str]] = {}
        self._seen: dict[tuple[object, object], float] = {}  # when its last transition came
        self._born: dict[tuple[object, object], float] = {}  # when last seen leave closed
        self._lock = threading.Lock()
        # the labels of the attempt on a pool member this thread or task counted in flight
        # (an attempt's events come in the thread or task that started it): its end takes
        # off only what its start put on, whenever the exporter was enabled
        self._aloft: ContextVar[tuple[str, str] | None] = ContextVar(
            f"sidestep_aloft_{id(self)}", default=None
        )

    def __call__(self, event: str, fields: Mapping[str, Any]) -> list[Measure]:
        if event == "attempt.started":
            if not isinstance(fields.get("tier"), int):
                return []  # not on a pool member
            labels = self._route_target(fields)
            self._aloft.set(labels)
            return [(INFLIGHT, labels, 1)]
        if event == "attempt.finished":
            measures: list[Measure] = []
            aloft = self._aloft.get()
            if aloft is not None:  # counted in flight at its start, here: no longer
                self._aloft.set(None)
                measures.append((INFLIGHT, aloft, -1))
            result = fields.get("result")
            if result not in _RESULTS:
                return measures
            route, target = self._route_target(fields)
            duration = fields.get("duration_s")
            measures.append((ATTEMPTS, (route, target, result), 1))
            # a cancelled attempt never got its verdict: no send-to-verdict time
            if isinstance(duration, (int, float)) and result != CANCELLED:
                measures.append((DURATION, (route, target), float(duration)))
            return measures
        if event == "request.finished":
            outcome = fields.get("outcome")
            if outcome not in _OUTCOMES:
                return []
            return [(REQUESTS, (self._route(fields), outcome), 1)]
        if event == "failover":
            route = self._route(fields)
            previous = self._name(fields.get("previous"), route)
            return [(FAILOVERS, (route, previous, self._name(fields.get("target"), route)), 1)]
        if event == "candidate.skipped":
            if fields.get("enforced") is False:
                return []  # observe mode: the call was made
            route, target = self._route_target(fields)
            return [(SKIPPED, (route, target, _one_of(fields.get("reason"), _REASONS)), 1)]
        if event in _TRANSITION_EVENTS:
            return self._transition(fields)
        if event in _LET_GO_EVENTS:
            return self._cleared(fields)
        if event == "suspensions.listed":
            return self._listed(fields)
        if event == "probe.admitted":
            _, target = self._route_target(fields)
            return [(PROBES, (target, _one_of(fields.get("scope"), _SCOPES)), 1)]
        if event == "hedge.finished":
            outcome = _one_of(fields.get("outcome"), _HEDGE_OUTCOMES)
            return [(HEDGES, (self._route(fields), outcome), 1)]
        if event == "fault.injected":
            route, target = self._route_target(fields)
            return [(FAULTS, (route, target, _one_of(fields.get("fault"), _FAULTS)), 1)]
        return []

    def _route(self, fields: Mapping[str, Any]) -> str:
        route = fields.get("route")
        return route if isinstance(route, str) else ""

    def _route_target(self, fields: Mapping[str, Any]) -> tuple[str, str]:
        route = self._route(fields)
        return route, self._name(fields.get("target"), route)

    def _name(self, target: object, route: str) -> str:
        """A configured target's name; for unrouted traffic its origin, while under the cap."""
        if not isinstance(target, str):
            return ""
        if route:
            return target
        if target in self._origins:
            return target
        with self._lock:
            if len(self._origins) < self._max_origins:
                self._origins.add(target)
                return target
        return OTHER

    def _cleared(self, fields: Mapping[str, Any]) -> list[Measure]:
        """A scope cleared by hand, or forgotten: it leaves the gauge as its closing would have
        — unless it was seen leave closed again after the store let go of it (told late,
        the let-go is of its former suspension)."""
        key = (fields.get("store"), fields.get("scope_id"))
        at = fields.get("forgotten_at", fields.get("cleared_at"))
        with self._lock:
            if isinstance(at, (int, float)) and self._born.get(key, -math.inf) > at:
                return []
            labels = self._suspended.pop(key, None)
            self._seen.pop(key, None)
            self._born.pop(key, None)
        return [] if labels is None else [(SUSPENDED, labels, -1)]

    def _listed(self, fields: Mapping[str, Any]) -> list[Measure]:
        """The store's listing: counted scopes it does not hold leave the gauge."""
        held, listed_at = fields.get("scope_ids"), fields.get("listed_at")
        if not isinstance(held, (tuple, list)) or not isinstance(listed_at, (int, float)):
            return []
        store, held = fields.get("store"), frozenset(held)
        measures: list[Measure] = []
        with self._lock:
            gone = [
                key
                for key in self._suspended
                if key[0] == store and key[1] not in held and self._seen.get(key, 0.0) < listed_at
            ]
            for key in gone:
                measures.append((SUSPENDED, self._suspended.pop(key), -1))
                self._seen.pop(key, None)
                self._born.pop(key, None)
        return measures

    def _transition(self, fields: Mapping[str, Any]) -> list[Measure]:
        _, target = self._route_target(fields)
        scope = _one_of(fields.get("scope"), _SCOPES)
        before = _one_of(fields.get("previous"), _STATES)
        after = _one_of(fields.get("state"), _STATES)
        reason = _one_of(fields.get("reason"), _REASONS)
        key = (fields.get("store"), fields.get("scope_id"))
        measures: list[Measure] = []
        with self._lock:
            known = self._suspended.get(key)
            if after == _CLOSED:
                if known is not None:  # only what this process counted comes off
                    del self._suspended[key]
                    self._seen.pop(key, None)
                    self._born.pop(key, None)
                    reason = known[2]  # a closing is labelled with what it ends
                    measures.append((SUSPENDED, known, -1))
            else:
                if (known is None and before == _CLOSED) or (known and known[2] != reason):
                    if known is not None:  # suspended again, for another reason
                        measures.append((SUSPENDED, known, -1))
                    labels = (known[0], known[1], reason) if known else (target, scope, reason)
                    measures.append((SUSPENDED, labels, 1))
                    self._suspended[key] = labels
                if key in self._suspended:
                    self._seen[key] = seen = time.monotonic()
                    if before == _CLOSED:
                        self._born[key] = seen
        measures.append((TRANSITIONS, (target, scope, before, after, reason), 1))
        return measures
