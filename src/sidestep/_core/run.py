"""One request's state on its way through the core, and the state the core shares.

`Run` is a request's progress through its candidates, `Outcome` one
attempt's result; both are made per request, so they are kept lean. `Ready`
is what a shell gets for a request it may send itself (a plain tuple, and
no run at all for a request that goes as it is to its first candidate).
`CoreState` declares what `Core.__init__` sets and every part of the core reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._answers import classify as c11n
from .._answers.classify import Kind, Verdict
from .._common.errors import CandidateStatus
from .._common.scopes import Fingerprinter
from .._settings.config import Config
from .._settings.policies import BreakerPolicy, FailoverPolicy, Suspensions
from .._state.circuit import State
from .._state.protocol import Admission, Refusal, StateStore
from .effects import Clock
from .flavour import Flavour
from .members import Member
from .routes import Candidates, CompiledTarget, Router

if TYPE_CHECKING:
    from .rebuild import Rebuilder

__all__ = [
    "SUCCESS",
    "CoreState",
    "Outcome",
    "Ready",
    "Run",
    "skip_status",
]

SUCCESS = Verdict(Kind.SUCCESS, None, None, failover=False)

# What `Core.decide` hands a shell that may send a request itself: the request to
# send; the run to settle it with, or, for a request sent as it is to its first
# candidate, only its candidates (no run is made unless it leaves the fast path);
# the store's sequence number at admission; when it was sent, on the core's clock, and
# the transport's count of closes then (a close the clock cannot order after it is told).
Ready = tuple[Any, "Run | Candidates", int, float, int]


class Run:
    """One request's progress through its candidates (created per request: kept lean)."""

    # Made per request: the fields most requests never change are class-level
    # defaults, so a request sets only its own (fewer stores than slots would take).
    attempts = 0
    tried = 0  # targets that were sent something
    last: Any = None  # the last failing response or exception
    last_target: CompiledTarget | None = None
    # each skipped target, its refusal and when it was refused (`skip_status`)
    skipped: tuple[tuple[CompiledTarget, Refusal, float], ...] = ()
    sent_at = 0.0  # when the latest attempt started, on the core's clock
    closes_seen = -1  # the transport's closes by then (-1: not known, the clock alone tells)
    # What the fast decision (`Core.decide`) left for the rest of the request:
    # the candidate it stopped at and that candidate's admission, or, when the
    # shell may send its request itself (`ready`), what makes its ticket; once
    # sent, the response (or the exception) the attempt takes instead of sending.
    index = 0
    admission: Admission | None = None
    sent: Any = None  # the candidate's request, as sent
    sent_body: bytes | None = None  # its body, when it can be sent again
    ready = False
    seq = 0  # a ready run's admission: the store's sequence number then
    received: Any = None
    watched = False  # someone listens: attempt and request events are emitted
    result = ""  # the latest attempt's result, as `attempt.finished` named it
    # Whether the request names state kept by one provider: None until a candidate on
    # another provider account would be tried (`Candidacy._kept_out`), its body looked
    # at then; and the candidates left out for it, for the attribution.
    holds_state: bool | None = None
    excluded: tuple[CompiledTarget, ...] = ()
    # whether the request asked for a streamed answer (`streaming`): None until the
    # core first needs to know, which is only when a first_byte_timeout is set
    streams: bool | None = None
    # the pool member its attempt in flight is counted on (`spreading.took_off`)
    aloft: Member | None = None
    # the fault a plan injected into its latest attempt (`faults.Injection`), if one did
    injected: Any = None
    # A hedged request (`hedged`): whether a hedge was sent beside its first attempt, and
    # the last candidate the hedge reached (the loop goes on after it).
    hedged = False
    passed = -1
    # A branch of a race (`hedged`): the attempts both branches may still make, shared
    # (`hedging.Allowance`); None outside a race.
    allowance: Any = None

    body: bytes | None = None  # None: a one-shot stream, sent to one target only
    deadline: float | None = None
    endpoint = ""  # an unrouted request's path; "" for a routed one
    # Set as the run is made (`Candidacy._start`), with no __init__: a call saved.
    request: Any
    cands: Candidates

    @property
    def policy(self) -> FailoverPolicy:
        return self.cands.policy

    @property
    def route_name(self) -> str | None:
        return self.cands.name


def skip_status(
    target: CompiledTarget, refusal: Refusal, now: float
) -> tuple[CandidateStatus, float | None]:
    """A skipped target's status, and the end of its open window (None: half-open)."""
    retry_in = None if math.isinf(refusal.retry_at) else max(0.0, refusal.retry_at - now)
    status = CandidateStatus(target.name, refusal.state.value, refusal.reason, retry_in)
    return status, refusal.retry_at if refusal.state is State.OPEN else None


class Outcome:
    __slots__ = ("committed", "deferred", "result", "verdict")

    def __init__(
        self, verdict: Verdict, result: Any, committed: bool = False, deferred: bool = False
    ) -> None:
        self.verdict = verdict
        self.result = result  # a response, or an exception
        self.committed = committed
        self.deferred = deferred  # the verdict is recorded when the body ends, or breaks


class CoreState:
    """What every part of the core reads: set once by `Core.__init__`."""

    config: Config
    router: Router
    store: StateStore
    clock: Clock
    flavour: Flavour
    breaker: BreakerPolicy
    suspensions: Suspensions
    classifier: c11n.Classifier
    via_proxy: Callable[[Any], bool]
    closed_at: float
    closes: int
    _custom_classifier: bool
    # a fault plan is under the transport (`faults`): results may be injected ones
    injecting: bool
    _exact: bool
    _blocking: bool
    _byte_stream: Any
    _write_timeout: type[BaseException]
    only_the_network: bool
    _fingerprint: Fingerprinter
    _failing: dict[str, set[str]]
    _quiet: dict[str | None, tuple[Any, ...]]
    _origins: dict[tuple[str, str, int | None], str]
    _own: dict[tuple[str, str, int | None], Candidates]
    _matched: dict[tuple[str, str, int | None, str], Candidates]
    _rebuilder: Rebuilder
