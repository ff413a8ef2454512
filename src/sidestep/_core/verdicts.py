"""What one attempt's result means, and recording it.

classify -> record: the classifier's verdict made exact (timeouts, proxies,
unrouted endpoints, rate limits ahead), whether a target is worth another
attempt and after how long, and the store's record with its events.
"""

from __future__ import annotations

import random
import time
from collections.abc import Generator
from dataclasses import replace
from typing import Any

from .._answers import classify as c11n
from .._answers.classify import ErrorKind, Exchange, Kind, Verdict
from .._common.scopes import ScopeKind
from .._settings.policies import FailoverPolicy
from .._state.circuit import State
from .._state.memory import MemoryStore
from .._state.protocol import Admission, Refusal, Ticket, Transition, store_id
from ..logging import emit
from .effects import Call
from .flavour import raised_by_a_mock
from .memories import remember
from .routes import CompiledTarget
from .run import SUCCESS, CoreState, Outcome, Run, skip_status

__all__ = ["Verdicts"]

_BACKOFF_BASE = 0.1  # seconds before the second attempt on one target, doubled after
_TRANSITION_EVENTS = {
    State.OPEN: "circuit.opened",
    State.HALF_OPEN: "circuit.half_open",
    State.CLOSED: "circuit.closed",
}


class Verdicts(CoreState):
    """What one attempt's result means, and recording it."""

    def _classify_error(self, request: Any, exc: BaseException, run: Run) -> Verdict:
        kind = self.flavour.error_kind(exc)
        if self.only_the_network and raised_by_a_mock(exc):
            # install() breaks circuits for the network only: a test's mock is not it
            return c11n.NOT_COUNTED
        if kind is ErrorKind.CLOSED or self._closed_since(run):
            # A fact, not a classifier's opinion: our own side closed the connection
            # under the attempt (the application closed its client, transport or pool),
            # or closed this transport while it was in flight (a sync TLS socket closed
            # under a read says no more than an upstream's end of stream would).
            return c11n.CLOSED_LOCALLY
        if kind is ErrorKind.CONNECT and self.via_proxy(request.url):
            kind = ErrorKind.PROXY  # the proxy could not be reached: it is not the upstream
        if run.endpoint and kind is ErrorKind.AMBIGUOUS and isinstance(exc, self._write_timeout):
            # An unrouted caller's own write budget ran out: a limit it chose, not a
            # host that stopped answering (one that does shows as a read timeout).
            return c11n.NOT_COUNTED
        verdict = self._classify(
            Exchange(
                method=request.method,
                request_headers=request.headers,
                error=kind,
                retry_ambiguous=run.policy.retry_ambiguous,
                on_context_overflow=run.policy.on_context_overflow,
                routed=not run.endpoint,
            )
        )
        if self.flavour.is_timeout(exc):
            # A fact, not a classifier's opinion: the target kept this request
            # waiting, so it gets no second attempt (scope and failover unchanged).
            verdict = replace(verdict, timeout=True)
        return verdict

    def _closed_since(self, run: Run) -> bool:
        """Whether the transport was closed after the request's latest attempt was sent:
        the request is in flight on a closed client. (A transport that several clients
        share serves the requests sent after one of them closed it as before.) Told by
        the clock, and by the count of closes taken when the core sent that attempt, or
        decided that the shell would send it (`Ready`): a clock that did not move between
        the send and the close (a fake one; Windows' before Python 3.13 ticks every
        15.6 ms) cannot order them."""
        return self.closed_at > run.sent_at or 0 <= run.closes_seen < self.closes

    def _judge(
        self,
        run: Run,
        request: Any,
        ticket: Ticket,
        status: int,
        response_headers: Any,
        body: bytes,
    ) -> Verdict:
        """The verdict on an answer of `status` with (the head of) `body`, for `request`.

        An unrouted request's answer, whatever its status, goes back as it came (a
        replacement classifier's word included): the program reads it, and retries it
        or not, as it would with no sidestep between. For the breaker it is a success:
        its host answered, which is all an unrouted circuit is about (a host back from
        an outage with a 503 or a 404 is no longer suspended).
        """
        routed = not run.endpoint
        verdict = self._classify(
            Exchange(
                method=request.method,
                request_headers=request.headers,
                status=status,
                response_headers=response_headers,
                body=body,
                retry_ambiguous=run.policy.retry_ambiguous,
                on_context_overflow=run.policy.on_context_overflow,
                wall_now=time.time(),
                routed=routed,
                credentialed=bool(ticket.facts.credential),
            )
        )
        return verdict if routed else SUCCESS

    def _classify(self, exchange: Exchange) -> Verdict:
        verdict = self.classifier(exchange)
        if verdict.kind is Kind.SUSPEND and verdict.reason not in c11n.SUSPENSION_REASONS:
            # A replacement classifier named a reason with no window: count it as an outage.
            scope = verdict.scope or ScopeKind.MODEL
            return replace(verdict, kind=Kind.FAILURE, reason=c11n.UNAVAILABLE, scope=scope)
        return verdict

    @staticmethod
    def _avoid_rate_limit(outcome: Outcome) -> Outcome:
        """A success that spent its window's last request suspends its scope now (opt-in).

        The response still goes to the caller. The suspension is its verdict,
        recorded at once: a success deferred to the body's end would come too
        late to spare the next request its 429.
        """
        if outcome.verdict is not SUCCESS:
            return outcome
        response = outcome.result
        verdict = c11n.rate_limit_ahead(response.status_code, response.headers, time.time())
        if verdict is None:
            return outcome
        return Outcome(verdict, response, committed=True)

    @staticmethod
    def _retryable(verdict: Verdict) -> bool:
        """Worth another attempt on the same target: a quick outage or a rate limit.

        A timeout (connect, first byte, read, write, stall, deadline) never is:
        the target already cost the caller its wait, so the next candidate is
        tried at once.
        """
        if not verdict.failover or verdict.timeout:
            return False
        return verdict.kind is Kind.FAILURE or verdict.reason == c11n.RATE_LIMITED

    def _retry_wait(
        self, verdict: Verdict, policy: FailoverPolicy, n: int, run: Run
    ) -> float | None:
        """How long to wait before attempt `n` on the same target; None to move on."""
        if verdict.retry_after is not None:
            if verdict.retry_after > policy.max_retry_wait:
                return None
            wait = verdict.retry_after
        else:
            wait = random.uniform(0, min(policy.max_retry_wait, _BACKOFF_BASE * 2 ** (n - 1)))  # noqa: S311
        if run.deadline is not None and self.clock() + wait >= run.deadline:
            return None
        return wait

    def _record(
        self, ticket: Ticket, verdict: Verdict, target: CompiledTarget, run: Run
    ) -> Generator[Any, Any, None]:
        if run.injected and not self._counts(run):
            yield from self._let_go(ticket)  # a fault plan's result: not the upstream's
            return
        if run.endpoint:
            verdict = self._unrouted(verdict, target.origin, run.endpoint, ticket)
        now = self.clock()
        if verdict.kind is Kind.FAILURE and (
            verdict.timeout or now - run.sent_at >= self.breaker.slow_failure
        ):
            # a failure that cost its caller time (a timeout always does): a failed
            # probe grows the open window
            verdict = replace(verdict, slow=True)
        if self._blocking:
            args = (ticket, verdict, self.breaker, self.suspensions, now)
            transitions = yield Call("record", args)
        else:
            transitions = self.store.record(ticket, verdict, self.breaker, self.suspensions, now)
        if verdict.kind in (Kind.FAILURE, Kind.SUSPEND) or (
            verdict.kind is Kind.NEUTRAL and verdict.failover
        ):
            emit(
                "upstream.failed",
                route=run.route_name,
                target=target.name,
                scope=verdict.scope.value if verdict.scope else None,
                reason=verdict.reason,
                status=verdict.status,
            )
        if transitions:
            self._announce(transitions, target, run)

    def _counts(self, run: Run) -> bool:
        """Whether the fault injected into the run's latest attempt counts against its
        target's circuit: as its rule says, else only in a store of this process."""
        return bool(run.injected.counted(type(self.store) is MemoryStore))

    def _let_go(self, ticket: Ticket) -> Generator[Any, Any, None]:
        """Give back what an admission took (a probe slot) for a verdict never recorded."""
        if self._blocking:
            yield Call("release", (ticket,))
        else:
            self.store.release(ticket)

    def _unrouted(self, verdict: Verdict, origin: str, endpoint: str, ticket: Ticket) -> Verdict:
        """Where an unrouted request's failure counts: its endpoint first.

        Only failures reach here (an unrouted answer is a success, see `_judge`):
        a host that could not be reached counts for its origin; one that took the
        request and then timed out or hung up counts for its *endpoint* (origin,
        path and read budget), since a caller's short timeout on one slow path
        must not cut off the paths that answer. Such a failure counts for the
        origin too only when it is its endpoint's first since the origin last
        answered well: not in this process (every client over the store shares
        the memory), nor, as the store saw it at admission, in another (the
        endpoint and the origin both kept). So however often one endpoint fails, the
        origin opens only once `failure_threshold` different endpoints fail with
        no good answer between: a host silent on every path is failed fast within
        a bounded number of calls, one silent on a single path has that path
        failed fast and the others answering. A probe of the origin's own
        circuit always counts for it: a failed probe reopens the origin.
        """
        if verdict.kind is Kind.SUCCESS:
            if self._failing:
                self._failing.pop(origin, None)
            return verdict
        if verdict.kind is not Kind.FAILURE or verdict.scope is not ScopeKind.MODEL:
            return verdict  # nothing sent (the origin's), or neutral
        failing = self._failing.get(origin)
        if failing is None:
            failing = remember(self._failing, origin, set())
        probed = any(k.kind is not ScopeKind.ENDPOINT for k in ticket.probes)
        if not probed and (endpoint in failing or _counted_already(ticket)):
            return replace(verdict, scope=ScopeKind.ENDPOINT)  # counted for the origin already
        if len(failing) <= self.breaker.failure_threshold:
            failing.add(endpoint)
        return replace(verdict, scope=ScopeKind.ENDPOINT, also=ScopeKind.MODEL)

    def _body_failed(
        self, ticket: Ticket, target: CompiledTarget, run: Run, request: Any, exc: BaseException
    ) -> Generator[Any, Any, None]:
        """A committed body broke off: an availability failure of that scope, raised as it is.

        But a body cut by the request's own total_timeout: the answer was coming,
        and the caller's time ran out; that says nothing of the upstream.
        """
        verdict = self._classify_error(request, exc, run)
        if verdict.kind is Kind.FAILURE:
            if verdict.timeout and run.deadline is not None and self.clock() >= run.deadline:
                return
            if run.injected and not self._counts(run):
                return  # a fault plan's: its slot was let go at the commit point
            ticket.done = False  # a probe's success was recorded at the commit point
            yield from self._record(ticket, verdict, target, run)

    def _succeeded(self, ticket: Ticket, target: CompiledTarget, run: Run) -> None:
        """A success on a store that does not wait: no event, usually nothing kept to reset."""
        if self._failing:
            self._failing.pop(target.origin, None)
        changed = self.store.record(ticket, SUCCESS, self.breaker, self.suspensions, self.clock())
        if changed:
            self._announce(changed, target, run)

    def _refused(self, run: Run, target: CompiledTarget, admission: Admission, now: float) -> None:
        """A candidate refused admission (at `now`): its transitions told, then skipped."""
        if admission.transitions:
            self._announce(admission.transitions, target, run)
        refusal = admission.refusal
        assert refusal is not None
        run.skipped += ((target, refusal, now),)  # its status is made only if it is read
        cands = run.cands
        if cands.members is not None and cands.pool is not None:
            # a pool member: put behind the others while its scope is suspended
            cands.members[cands.targets.index(target)].refused(refusal.retry_at, now)
            cands.pool.refused = True
        if run.watched:  # the request's DEBUG events are heard, as it started
            _skipped(
                run, target, refusal, retry_in_s=skip_status(target, refusal, now)[0].retry_after
            )

    def _observe_skip(self, run: Run, target: CompiledTarget, admission: Admission) -> None:
        refusal = admission.refusal
        assert refusal is not None
        if run.watched:
            _skipped(run, target, refusal, enforced=False)

    def _announce(
        self, transitions: tuple[Transition, ...], target: CompiledTarget, run: Run
    ) -> None:
        for t in transitions:
            if t.forgotten:
                self._forgotten(t)
                continue
            emit(
                _TRANSITION_EVENTS[t.state],
                route=run.route_name,
                target=target.name,
                scope=t.scope.kind.value,
                scope_id=t.scope.scope_id,
                state=t.state.value,
                previous=t.previous.value,
                reason=t.reason,
                failures=t.failures,
                retry_in_s=t.retry_in,
                store=store_id(self.store),
            )

    def _forgotten(self, t: Transition) -> None:
        """The store let go of a suspended scope to stay within `max_scopes` (any target's)."""
        owners = self.router.owners(t.scope, self.store.fingerprint)
        route, target = owners[0] if owners else (None, t.scope.origin)
        emit(
            "suspension.forgotten",
            scope_id=t.scope.scope_id,
            route=route,
            target=target,
            scope=t.scope.kind.value,
            state=t.previous.value,
            reason=t.reason,
            failures=t.failures,
            cause="max_scopes",
            forgotten_at=t.at,
            store=store_id(self.store),
        )


def _counted_already(ticket: Ticket) -> bool:
    """Whether, as the store saw it at admission, the endpoint's failures were counted in
    the origin's present count: both scopes were kept (had failed). An endpoint kept while
    its origin was not failed before the origin last answered well: its next failure
    counts for the origin again."""
    generations = ticket.generations
    if not generations:
        return False  # nothing kept for the origin then
    facts = ticket.facts
    return (
        generations.get(facts.key(ScopeKind.ENDPOINT), 0) > 0
        and generations.get(facts.key(ScopeKind.MODEL), 0) > 0
    )


def _skipped(run: Run, target: CompiledTarget, refusal: Refusal, **fields: Any) -> None:
    """The `candidate.skipped` event: refused, or (observe mode) sent as if it had been."""
    emit(
        "candidate.skipped",
        route=run.route_name,
        target=target.name,
        scope=refusal.scope.kind.value,
        state=refusal.state.value,
        reason=refusal.reason,
        **fields,
    )
