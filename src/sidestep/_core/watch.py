"""A request's and its attempts' own events, for whoever listens.

`request.started` / `request.finished` around a request's whole way through
its candidates, `attempt.started` / `attempt.finished` around each upstream
call, `probe.admitted` when an attempt is a scope's probe. The core takes
this path for a whole request only when someone listens
(`sidestep.logging.listening`), so a request nobody watches builds none of
these fields. Each `*.started` is followed by its `*.finished` in the same
thread or task — also when the request is cancelled or its generator is
closed — so a subscriber may keep context (a current span) between the two.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from .._answers import classify as c11n
from .._answers.classify import Kind
from .._common.errors import AllCandidatesSuspended, InvalidUpstreamBody
from .._common.outcomes import CANCELLED
from .._state.protocol import Ticket
from ..logging import emit
from .routes import Candidates, CompiledTarget
from .run import CoreState, Outcome, Run
from .spreading import landed

__all__ = ["Watching"]


_REASONS = frozenset(
    {c11n.RATE_LIMITED, c11n.QUOTA_EXHAUSTED, c11n.INVALID_CREDENTIAL, c11n.CONTEXT_OVERFLOW}
)
_ANSWERED = frozenset({"", "success", "neutral"})  # a last answer that is not a failure


class Watching(CoreState):
    """The watched path of a request: the loop and each attempt, between their events."""

    _loop: Callable[[Run], Generator[Any, Any, Any]]
    _attempt: Callable[[Run, CompiledTarget, Any, Ticket], Generator[Any, Any, Outcome]]

    def _watched(self, run: Run) -> Generator[Any, Any, Any]:
        run.watched = True
        route = run.route_name
        try:
            emit("request.started", route=route, method=run.request.method)
        except BaseException:
            landed(run)  # (held for the member it was picked for: `FastPath.decide`)
            raise
        outcome, error = CANCELLED, None
        try:
            response = yield from self._loop(run)
            outcome = _ending(response, run)
            return response
        except AllCandidatesSuspended:
            outcome = "all_suspended"
            raise
        except Exception as exc:
            outcome, error = "error", type(exc).__name__
            raise
        finally:
            emit(
                "request.finished",
                route=route,
                outcome=outcome,
                attempts=run.attempts,
                error=error,
            )

    def _watched_attempt(
        self, run: Run, target: CompiledTarget, request: Any, ticket: Ticket
    ) -> Generator[Any, Any, Outcome]:
        number = run.attempts
        route = run.route_name
        # on a pool member, its tier: the attempt is counted in flight (`_attempt`)
        cands = run.cands
        pooled = {} if cands.members is None else _tier(cands, target)
        emit(
            "attempt.started",
            route=route,
            target=target.name,
            attempt=number,
            origin=target.shown,
            probe=bool(ticket.probes),
            **pooled,
        )
        started = self.clock()
        result, status, error = CANCELLED, None, None
        try:
            outcome = yield from self._attempt(run, target, request, ticket)
            result, status, error = attempt_result(outcome)
            return outcome
        except Exception as exc:  # the core's own failure (a store, a logger)
            result, error = "unavailable", type(exc).__name__
            raise
        finally:
            run.result = result
            emit(
                "attempt.finished",
                route=route,
                target=target.name,
                attempt=number,
                origin=target.shown,
                result=result,
                status=status,
                error=error,
                duration_s=max(0.0, self.clock() - started),
                **pooled,
            )

    def _admitted(self, run: Run, target: CompiledTarget, ticket: Ticket) -> None:
        for key in ticket.probes:
            emit("probe.admitted", route=run.route_name, target=target.name, scope=key.kind.value)


def _tier(cands: Candidates, target: CompiledTarget) -> dict[str, Any]:
    """The ``tier`` field of an attempt on a pool member (`target`, a candidate of `cands`)."""
    return {"tier": cands.about[cands.targets.index(target)]["tier"]}


def attempt_result(outcome: Outcome) -> tuple[str, int | None, str | None]:
    """An attempt's `result` (one of `ATTEMPT_RESULTS`), its status and its error type."""
    verdict, answer = outcome.verdict, outcome.result
    if isinstance(answer, BaseException):
        status, error = None, type(answer).__name__
    else:
        status, error = answer.status_code, None
    if isinstance(answer, InvalidUpstreamBody):
        return "invalid_body", status, error
    if verdict.kind is Kind.SUCCESS:
        return "success", status, error
    if verdict.timeout:
        return "timeout", status, error
    if verdict.reason in _REASONS:
        return verdict.reason, status, error
    if verdict.kind is Kind.NEUTRAL:
        return "neutral", status, error
    return "unavailable", status, error


def _ending(response: Any, run: Run) -> str:
    about = response.extensions.get("sidestep") or {}
    if about.get("target") is None:
        return "all_suspended"
    if run.result not in _ANSWERED:
        return "upstream_error"
    return "served_after_failover" if about.get("failover") else "served"
