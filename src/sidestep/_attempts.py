"""The failover loop, sans I/O, shared by every transport.

`Core.handle` is a generator: it decides, and yields an *effect* whenever I/O
is needed — send this request, read the head of that body, close a response,
sleep, call a store that talks to a server — then takes the result (or the
exception) back. The sync and async shells in `_transport.py` only perform
effects, so both flavours and both colours of transport share every decision.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from . import _classify as c11n
from ._circuit import State
from ._classify import BODY_PREFIX_LIMIT, ErrorKind, Exchange, Kind, Verdict
from ._config import Config, FailoverPolicy, as_config
from ._encodings import decoded_head
from ._errors import AllCandidatesSuspended, CandidateStatus, InvalidUpstreamBody
from ._flavour import Flavour
from ._reverse import client_view
from ._routes import (
    Candidates,
    CompiledTarget,
    Router,
    display_origin,
    merge_json,
    rewrite_headers,
    without_credentials,
)
from ._scopes import ScopeFacts, ScopeKind, origin_key
from ._store import Admission, MemoryStore, StateStore, Ticket, Transition
from ._suspended import unavailable_body, unavailable_headers
from ._validate import body_problem
from .logging import emit

__all__ = ["Call", "Close", "Core", "Read", "Send", "Sleep"]

Clock = Callable[[], float]
_SUCCESS = Verdict(Kind.SUCCESS, None, None, failover=False)
_BACKOFF_BASE = 0.1  # seconds before the second attempt on one target, doubled after
_TIMEOUT_KEYS = ("connect", "read", "write", "pool")
_CACHE_LIMIT = 4096  # origins remembered for the request path; past it they are worked out anew
_QUIET_LIMIT = 1024  # routes whose all-suspended episode is remembered, to log it once
_TRANSITION_EVENTS = {
    State.OPEN: "circuit.opened",
    State.HALF_OPEN: "circuit.half_open",
    State.CLOSED: "circuit.closed",
}


def _never(url: Any) -> bool:
    return False


def _same_episode(seen: tuple[Any, ...] | None, episode: tuple[Any, ...]) -> bool:
    if seen is None or len(seen) != len(episode):
        return False
    for (*was, was_until), (*now, until) in zip(seen, episode, strict=True):
        if was != now or (was_until is None) != (until is None):
            return False
        if until is not None and abs(until - was_until) > 1.0:
            return False
    return True


# -- effects: what the shells perform ------------------------------------------


@dataclass(slots=True)
class Send:
    """Send `request` through the inner transport; the result is its response."""

    request: Any
    deadline: float | None  # on the core's clock; shells that can, enforce it exactly


@dataclass(slots=True)
class Read:
    """Read the head of `response` (sent for `request`): chunks until `limit` bytes, or its end.

    The result is ``(head, ended)``. The shell puts the chunks back in front of
    the rest, so the caller still gets the whole body; after the head, body
    errors are passed to `on_error` (a generator of effects) before they rise,
    and a body read to its end calls `on_end`.

    `stall` bounds each wait for a chunk, from the headers on, head and rest
    alike: a silence that long raises the flavour's ReadTimeout. Shells that
    can bound a wait from outside (async) enforce it per chunk; the sync one
    relies on the read timeout the core set for the body's socket reads.
    """

    response: Any
    request: Any
    limit: int
    deadline: float | None
    on_error: Callable[[BaseException], Generator[Any, Any, None]] | None = None
    on_end: Callable[[], Generator[Any, Any, None]] | None = None
    stall: float | None = None


@dataclass(slots=True)
class Close:
    response: Any


@dataclass(slots=True)
class Sleep:
    seconds: float


@dataclass(slots=True)
class Call:
    """Call a store operation that may wait on I/O (its ``*_async`` twin in async shells)."""

    name: str
    args: tuple[Any, ...]


# -- per-request state -----------------------------------------------------------


class _Run:
    """One request's progress through its candidates (created per request: kept lean)."""

    __slots__ = (
        "attempts",
        "body",
        "cands",
        "deadline",
        "endpoint",
        "last",
        "last_target",
        "policy",
        "request",
        "sent_at",
        "skipped",
        "tried",
    )

    def __init__(
        self,
        request: Any,
        cands: Candidates,
        policy: FailoverPolicy,
        body: bytes | None,
        deadline: float | None,
        endpoint: str,
    ) -> None:
        self.request = request
        self.endpoint = endpoint  # an unrouted request's path; "" for a routed one
        self.cands = cands
        self.policy = policy
        self.body = body  # None: a one-shot stream, sent to one target only
        self.deadline = deadline
        self.attempts = 0
        self.tried = 0  # targets that were sent something
        self.last: Any = None  # the last failing response or exception
        self.last_target: CompiledTarget | None = None
        # each skipped target's status, and the end of its open window (None: half-open)
        self.skipped: list[tuple[CandidateStatus, float | None]] = []
        self.sent_at = 0.0  # when the latest attempt started, on the core's clock

    @property
    def route_name(self) -> str | None:
        return self.cands.route.name if self.cands.route else None


class _Outcome:
    __slots__ = ("committed", "deferred", "result", "verdict")

    def __init__(
        self, verdict: Verdict, result: Any, committed: bool = False, deferred: bool = False
    ) -> None:
        self.verdict = verdict
        self.result = result  # a response, or an exception
        self.committed = committed
        self.deferred = deferred  # the verdict is recorded when the body ends, or breaks


class Core:
    """Everything a transport decides, for one configuration, store and clock."""

    def __init__(
        self,
        config: Config | Mapping[str, Any] | None,
        *,
        store: StateStore | None,
        clock: Clock | None,
        flavour: Flavour,
        exact_deadlines: bool,
    ) -> None:
        self.config = as_config(config)
        self.router = Router(self.config)
        self.store: StateStore = store if store is not None else MemoryStore()
        self.clock: Clock = clock or time.monotonic
        self.flavour = flavour
        self.breaker = self.config.breaker
        self.suspensions = self.config.suspensions
        self.classifier: c11n.Classifier = self.config.classifier or c11n.classify
        self._custom_classifier = self.config.classifier is not None
        # Shells that cannot bound a blocking read from outside (sync) shrink the
        # read timeout to the first-byte limit instead; httpcore fixes a body's
        # read timeout when the body starts, so there it bounds each later read too.
        self._exact = exact_deadlines
        self._blocking = self.store.blocking
        self._byte_stream = flavour.ByteStream
        self._fingerprint = self.store.fingerprint
        # Whether an attempt to this URL goes through a proxy: set by the shell,
        # which knows its inner transports. A proxy that fails is not the upstream.
        self.via_proxy: Callable[[Any], bool] = _never
        # Unrouted origins: the endpoints that failed since the origin last answered well.
        self._failing: dict[str, set[str]] = {}
        # Routes whose all-suspended episode was logged at WARNING already.
        self._quiet: dict[str | None, tuple[Any, ...]] = {}
        self._origins: dict[tuple[str, str, int | None], str] = {}
        self._own: dict[str, Candidates] = {}
        self._matched: dict[tuple[str, str], Candidates] = {}

    def __repr__(self) -> str:
        return f"Core(routes={list(self.router.routes)!r}, store={self.store!r})"

    # -- the loop ------------------------------------------------------------------

    def handle(self, request: Any) -> Generator[Any, Any, Any]:
        """Drive one request to its response (or error), yielding effects for the shell.

        Each candidate in order: admission, rewrite, attempts, verdict.
        """
        run = self._start(request)
        try:
            for index, target in enumerate(run.cands.targets):
                if run.attempts >= run.policy.max_total_attempts or (
                    run.deadline is not None and self.clock() >= run.deadline
                ):
                    break
                if run.body is None and run.tried:
                    break  # a one-shot body was sent once already; it cannot be replayed
                if index == 0 and run.cands.direct:
                    sent, headers, body = request, request.headers, run.body
                else:
                    sent, headers, body = self._rewrite(run, target)
                facts = ScopeFacts(
                    target.origin,
                    headers,
                    body,
                    self._fingerprint,
                    url=sent.url,
                    path=run.endpoint,
                    extensions=sent.extensions,
                )
                now = self.clock()
                if self._blocking:
                    lease = self._lease(run, sent)
                    admission: Admission = yield Call("admit", (facts, self.breaker, now, lease))
                else:
                    admission = self.store.admit(facts, self.breaker, now)
                if admission.ticket is None:
                    if admission.transitions:
                        self._announce(admission.transitions, target, run)
                    self._skip(run, target, admission)
                    continue
                ticket = admission.ticket
                outcome: _Outcome | None = None
                try:
                    if admission.transitions:
                        self._announce(admission.transitions, target, run)
                    if admission.refusal is not None:
                        self._observe_skip(run, target, admission)
                    if run.last is not None:
                        last, run.last = run.last, None
                        yield from self._discard(last)
                        emit(
                            "failover",
                            route=run.route_name,
                            target=target.name,
                            previous=run.last_target.name if run.last_target else None,
                        )
                    if run.policy.max_attempts_per_target == 1:
                        run.attempts += 1
                        outcome = yield from self._attempt(run, target, sent, ticket)
                    else:
                        outcome = yield from self._try_target(run, target, sent, ticket)
                    run.tried += 1
                    if run.cands.route is not None and run.cands.route.avoid_rate_limits:
                        outcome = self._avoid_rate_limit(outcome)
                    if outcome.deferred:
                        pass  # the body's end, or its failure, will be the verdict
                    elif outcome.verdict is _SUCCESS and not self._blocking:
                        # the healthy path: no event to emit, usually nothing kept to reset
                        if self._failing:
                            self._failing.pop(target.origin, None)
                        changed = self.store.record(
                            ticket, _SUCCESS, self.breaker, self.suspensions, self.clock()
                        )
                        if changed:
                            self._announce(changed, target, run)
                    else:
                        yield from self._record(ticket, outcome.verdict, target, run)
                except BaseException:
                    # Whatever broke (a cancellation, the store, a logger), the probe slot
                    # comes back and a response that will not be handed over is closed.
                    if outcome is not None:
                        yield from self._discard(outcome.result)
                    if self._blocking:
                        yield Call("release", (ticket,))
                    else:
                        self.store.release(ticket)
                    raise
                if outcome.committed:
                    return self._attribute(outcome.result, run, target, index)
                if not outcome.verdict.failover:
                    return self._final(outcome.result, run, target, index)
                run.last, run.last_target = outcome.result, target
            if run.last is not None and run.last_target is not None:
                index = run.cands.targets.index(run.last_target)
                last, run.last = run.last, None  # handed over: no longer ours to close
                return self._final(last, run, run.last_target, index)
            if run.tried == 0 and run.skipped:
                return self._all_suspended(run)
            raise self.flavour.timeout_error("sidestep: total_timeout ran out before any attempt")

        except BaseException:
            # Cancelled, or failed, while a failing response was held for the end.
            if run.last is not None and not isinstance(run.last, BaseException):
                last, run.last = run.last, None
                yield Close(last)
            raise

    def _try_target(
        self, run: _Run, target: CompiledTarget, request: Any, ticket: Ticket
    ) -> Generator[Any, Any, _Outcome]:
        """Up to `max_attempts_per_target` attempts on one target; the last outcome."""
        policy = run.policy
        outcome: _Outcome | None = None
        for n in range(policy.max_attempts_per_target):
            if outcome is not None:
                if run.body is None:
                    break  # a one-shot body cannot be sent again
                wait = self._retry_wait(outcome.verdict, policy, n, run)
                if wait is None:
                    break
                yield from self._discard(outcome.result)
                if wait > 0:
                    yield Sleep(wait)
            run.attempts += 1
            outcome = yield from self._attempt(run, target, request, ticket)
            if outcome.committed or not self._retryable(outcome.verdict):
                return outcome
            if run.attempts >= policy.max_total_attempts or self._expired(run):
                break
        assert outcome is not None  # max_attempts_per_target >= 1 is validated
        return outcome

    def _attempt(
        self, run: _Run, target: CompiledTarget, request: Any, ticket: Ticket
    ) -> Generator[Any, Any, _Outcome]:
        """One upstream call: send, then read as far as the verdict needs."""
        deadline = run.deadline
        first_byte = run.policy.first_byte_timeout
        stall = run.policy.stall_timeout
        now = run.sent_at = self.clock()
        caller_read = None
        if deadline is not None or first_byte is not None or stall is not None:
            caller_read = (request.extensions.get("timeout") or {}).get("read")
            request.extensions = dict(request.extensions)
            request.extensions["timeout"] = self._timeouts(request, run, first_byte, now)
        fb_deadline = deadline
        if first_byte is not None:
            fb_deadline = now + first_byte if deadline is None else min(deadline, now + first_byte)
        try:
            response = yield Send(request, fb_deadline)
        except Exception as exc:
            return _Outcome(self._classify_error(request, exc, run), exc)
        status = response.status_code
        if status < 400 and not self._custom_classifier:
            verdict = _SUCCESS
        else:
            body = b""
            routed = not run.endpoint
            if c11n.needs_body(status) and (routed or self._custom_classifier):
                try:
                    head, _ = yield Read(response, request, BODY_PREFIX_LIMIT, deadline)
                    encoding = response.headers.get("content-encoding")
                    body = decoded_head(head, encoding, BODY_PREFIX_LIMIT)
                except Exception as exc:
                    yield Close(response)
                    return _Outcome(self._classify_error(request, exc, run), exc)
                except BaseException:
                    yield Close(response)  # cancelled mid-read: the connection must not leak
                    raise
            verdict = self._classify(
                Exchange(
                    method=request.method,
                    request_headers=request.headers,
                    status=status,
                    response_headers=response.headers,
                    body=body,
                    retry_ambiguous=run.policy.retry_ambiguous,
                    on_context_overflow=run.policy.on_context_overflow,
                    wall_now=time.time(),
                    routed=routed,
                    credentialed=bool(ticket.facts.credential),
                )
            )
        if verdict.kind is not Kind.SUCCESS:
            return _Outcome(verdict, response)
        if isinstance(response.stream, self._byte_stream) or status < 200:
            # the body is here already; or a 101 hands its connection to the caller
            return _Outcome(_SUCCESS, response, committed=True)
        if stall is not None and not self._exact:
            self._stall_reads(request, run, stall, caller_read)
        return (yield from self._commit(run, target, request, ticket, response, fb_deadline))

    def _stall_reads(self, request: Any, run: _Run, stall: float, caller_read: Any) -> None:
        """Bound each socket read of the body by `stall`, where no wait can be cut from outside.

        The headers are in; httpcore takes the read timeout for a body when the
        body starts and applies it to each socket read, so setting it now bounds
        every silence of the body (the first chunk's included) by `stall`,
        while the headers were waited for within the first-byte limit.
        """
        timeouts = request.extensions.get("timeout")
        if not isinstance(timeouts, dict):
            return
        bound = stall if caller_read is None else min(caller_read, stall)
        if run.deadline is not None:
            bound = min(bound, max(0.0, run.deadline - self.clock()))
        timeouts["read"] = bound

    def _commit(
        self,
        run: _Run,
        target: CompiledTarget,
        request: Any,
        ticket: Ticket,
        response: Any,
        fb_deadline: float | None,
    ) -> Generator[Any, Any, _Outcome]:
        """Wait for the commit point: the first body byte (or the whole body; or, for
        an unrouted request, nothing: it has no other candidate).

        A probe's success is recorded at the commit point, which frees its slot
        early; any other request's verdict waits for the end of its body, so an
        upstream that always breaks off mid-body still counts as failing.
        """
        route = run.cands.route
        defer = not ticket.probes

        def on_error(exc: BaseException) -> Generator[Any, Any, None]:
            return self._body_failed(ticket, target, run, request, exc)

        def on_end() -> Generator[Any, Any, None]:
            return self._record(ticket, _SUCCESS, target, run)

        end = on_end if defer else None
        stall = run.policy.stall_timeout
        try:
            if route is not None and route.commit_complete:
                # the first byte within its own limit, then the rest within the request's
                body, ended = yield Read(response, request, 1, fb_deadline, stall=stall)
                if not ended:
                    limit = route.max_buffered_bytes
                    body, ended = yield Read(
                        response, request, limit, run.deadline, on_error, end, stall
                    )
                if ended and route.validate:
                    invalid = self._invalid(response, request, body, route.max_buffered_bytes)
                    if invalid is not None:
                        yield Close(response)
                        error = InvalidUpstreamBody(target.name, invalid, route=run.route_name)
                        verdict = Verdict(
                            Kind.FAILURE,
                            c11n.UNAVAILABLE,
                            ScopeKind.MODEL,
                            failover=True,
                            status=response.status_code,
                        )
                        return _Outcome(verdict, error)
            elif run.endpoint:
                # Unrouted: no other candidate to move to, so nothing to wait for. The
                # response goes to the caller at its headers, as plain httpx hands it
                # over (a long poll may stay quiet for minutes); its end is the verdict.
                _, ended = yield Read(response, request, 0, None, on_error, end, stall)
            else:
                _, ended = yield Read(response, request, 1, fb_deadline, on_error, end, stall)
        except Exception as exc:
            yield Close(response)
            return _Outcome(self._classify_error(request, exc, run), exc)
        except BaseException:
            yield Close(response)  # cancelled before the commit point: nothing leaks
            raise
        return _Outcome(_SUCCESS, response, committed=True, deferred=defer and not ended)

    @staticmethod
    def _invalid(response: Any, request: Any, body: list[bytes], limit: int) -> str | None:
        """What is wrong with a whole buffered 2xx body (see `_validate`); None if nothing."""
        status = response.status_code
        if not 200 <= status < 300 or status in (204, 205) or request.method == "HEAD":
            return None  # no body to judge
        headers = response.headers
        return body_problem(
            headers.get("content-type"),
            headers.get("content-encoding"),
            b"".join(body),
            request.url.path,
            limit,
        )

    # -- verdicts -------------------------------------------------------------------

    def _classify_error(self, request: Any, exc: BaseException, run: _Run) -> Verdict:
        kind = self.flavour.error_kind(exc)
        if kind is ErrorKind.CONNECT and self.via_proxy(request.url):
            kind = ErrorKind.PROXY  # the proxy could not be reached: it is not the upstream
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

    def _classify(self, exchange: Exchange) -> Verdict:
        verdict = self.classifier(exchange)
        if verdict.kind is Kind.SUSPEND and verdict.reason not in c11n.SUSPENSION_REASONS:
            # A replacement classifier named a reason with no window: count it as an outage.
            scope = verdict.scope or ScopeKind.MODEL
            return replace(verdict, kind=Kind.FAILURE, reason=c11n.UNAVAILABLE, scope=scope)
        return verdict

    @staticmethod
    def _avoid_rate_limit(outcome: _Outcome) -> _Outcome:
        """A success that spent its window's last request suspends its scope now (opt-in).

        The response still goes to the caller. The suspension is its verdict,
        recorded at once: a success deferred to the body's end would come too
        late to spare the next request its 429.
        """
        if outcome.verdict is not _SUCCESS:
            return outcome
        response = outcome.result
        verdict = c11n.rate_limit_ahead(response.status_code, response.headers, time.time())
        if verdict is None:
            return outcome
        return _Outcome(verdict, response, committed=True)

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
        self, verdict: Verdict, policy: FailoverPolicy, n: int, run: _Run
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
        self, ticket: Ticket, verdict: Verdict, target: CompiledTarget, run: _Run
    ) -> Generator[Any, Any, None]:
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

    def _unrouted(self, verdict: Verdict, origin: str, endpoint: str, ticket: Ticket) -> Verdict:
        """Where an unrouted request's result counts: its endpoint first.

        A failure after the request was sent (a 5xx, a read timeout) is the
        endpoint's: a caller's short timeout on one slow path must not cut off
        the paths that answer. It counts toward the origin too when it is the
        first failure of that endpoint since the origin last answered well,
        so the origin opens once `failure_threshold` different endpoints fail
        in a row, and a host silent on one path opens that endpoint: either
        way within a bounded number of calls. A probe of the origin's own
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
            if len(self._failing) >= _CACHE_LIMIT:
                self._failing.clear()
            failing = self._failing[origin] = set()
        if endpoint in failing and not any(k.kind is not ScopeKind.ENDPOINT for k in ticket.probes):
            return replace(verdict, scope=ScopeKind.ENDPOINT)  # counted for the origin already
        if len(failing) <= self.breaker.failure_threshold:
            failing.add(endpoint)
        return replace(verdict, scope=ScopeKind.ENDPOINT, also=ScopeKind.MODEL)

    def _body_failed(
        self, ticket: Ticket, target: CompiledTarget, run: _Run, request: Any, exc: BaseException
    ) -> Generator[Any, Any, None]:
        """A committed body broke off: an availability failure of that scope, raised as it is."""
        verdict = self._classify_error(request, exc, run)
        if verdict.kind is Kind.FAILURE:
            ticket.done = False  # a probe's success was recorded at the commit point
            yield from self._record(ticket, verdict, target, run)

    # -- endings --------------------------------------------------------------------

    def _attribute(self, response: Any, run: _Run, target: CompiledTarget, index: int) -> Any:
        if index or not run.cands.direct:  # a rewritten target: its answer in the client's terms
            raw = client_view(response.headers.raw, target, run.request.url, run.cands)
            if raw is not None:
                response.headers = type(response.headers)(raw)
        response.extensions["sidestep"] = {
            "route": run.route_name,
            "target": target.name,
            "attempts": run.attempts,
            "failover": index > 0,
        }
        return response

    def _final(self, result: Any, run: _Run, target: CompiledTarget, index: int) -> Any:
        if isinstance(result, BaseException):
            raise result
        return self._attribute(result, run, target, index)

    def _all_suspended(self, run: _Run) -> Any:
        error = AllCandidatesSuspended(tuple(s for s, _ in run.skipped), route=run.route_name)
        emit(
            "all_candidates_suspended",
            self._episode(run),
            route=run.route_name,
            targets=[s.target for s, _ in run.skipped],
            retry_in_s=error.retry_after,
        )
        if run.policy.on_all_suspended == "raise":
            raise error
        headers = unavailable_headers(error)
        if error.retry_after is not None:
            headers.append(("retry-after-ms", str(math.ceil(error.retry_after * 1000))))
        headers += [("x-sidestep", "all_candidates_suspended"), ("x-should-retry", "false")]
        return self.flavour.Response(
            503,
            headers=headers,
            content=unavailable_body(error),
            request=run.request,
            extensions={
                "sidestep": {
                    "route": run.route_name,
                    "target": None,
                    "attempts": 0,
                    "failover": False,
                }
            },
        )

    def _episode(self, run: _Run) -> int | None:
        """The level to log an all-suspended request at: WARNING once per episode.

        An episode is one set of refusals (which targets, in which state and
        for what reason, until when, give or take a second for stores that
        answer in relative time); it changes only with a transition, so an
        outage logs as many warnings as it has transitions, whatever the
        traffic. Repeats are DEBUG (None: the event's own level).
        """
        episode = tuple((s.target, s.state, s.reason, until) for s, until in run.skipped)
        key = run.route_name if run.cands.route else run.cands.origin
        if _same_episode(self._quiet.get(key), episode):
            return logging.DEBUG
        if len(self._quiet) >= _QUIET_LIMIT:
            self._quiet.clear()
        self._quiet[key] = episode
        return None

    # -- candidates and rewriting --------------------------------------------------------

    def _start(self, request: Any) -> _Run:
        url = request.url
        try:
            # The parsed parts both flavours keep: plain tuple fields, far cheaper
            # per request than the public properties, which decode on each access.
            ref = url._uri_reference
            where = (ref.scheme, ref.host, ref.port)
            path = ref.path or "/"  # still percent-encoded, as it goes on the wire
        except AttributeError:
            where = (url.scheme, url.host, url.port)
            path = url.raw_path.decode("ascii").partition("?")[0]
        origin = self._origins.get(where)
        if origin is None:
            origin = origin_key(url.scheme, url.host, url.port)
            if len(self._origins) < _CACHE_LIMIT:
                self._origins[where] = origin
        cands = None
        if self.router.routes:
            cands = self._matched.get((origin, path))
            if cands is None:
                cands = self.router.match(origin, path)
                if cands is not None and len(self._matched) < _CACHE_LIMIT:
                    self._matched[(origin, path)] = cands  # the same answer every time
        if cands is None:
            cands = self._own_origin(origin, url)
        policy = cands.route.policy if cands.route else self.config.failover
        deadline = self.clock() + policy.total_timeout if policy.total_timeout else None
        content = getattr(request, "_content", None)
        if content is not None:
            body = content
        elif len(cands.targets) > 1 or policy.max_attempts_per_target > 1:
            body = self._streamed_body(request)  # it may have to be sent again
        else:
            body = None  # sent once, as it streams: nothing is read ahead
        return _Run(request, cands, policy, body, deadline, "" if cands.route else path)

    def _own_origin(self, origin: str, url: Any) -> Candidates:
        """An unrouted request: one candidate, its own origin (cached; bounded)."""
        cands = self._own.get(origin)
        if cands is None:
            scheme, host, port = url.scheme, url.host, url.port
            shown = display_origin(scheme, host, port)
            target = CompiledTarget(shown, scheme, host, port, "", origin, shown)
            cands = Candidates(None, (target,), "", origin, direct=True)
            if len(self._own) < _CACHE_LIMIT:
                self._own[origin] = cands
        return cands

    def _streamed_body(self, request: Any) -> bytes | None:
        """The body of a request whose content is not in memory yet, when it can be replayed."""
        if isinstance(request.stream, (self.flavour.multipart, self._byte_stream)):
            # in-memory parts, or bytes passed as a stream (a followed redirect's body)
            return request.read()  # type: ignore[no-any-return]
        return None

    def _rewrite(self, run: _Run, target: CompiledTarget) -> tuple[Any, Any, bytes | None]:
        """The request rebuilt for `target`: (request, its headers, its body).

        Credentials — credential headers, URL userinfo, credential query
        parameters — go to another origin only when the target inherits them.
        """
        request = run.request
        keep = target.origin == run.cands.origin or target.inherit_credentials
        headers = rewrite_headers(
            list(request.headers.multi_items()), target, keep_credentials=keep
        )
        body = run.body
        if body is not None and target.json_fields:
            body = merge_json(body, target.json_fields)
        query: bytes = request.url.query
        if query and not keep:
            query = without_credentials(query)
        url = request.url.copy_with(
            scheme=target.scheme,
            host=target.host,
            port=target.port,
            raw_path=(target.path + run.cands.rest).encode("ascii")
            + (b"?" + query if query else b""),
        )
        if not keep and url.userinfo:
            url = url.copy_with(userinfo=b"")
        extensions = {k: v for k, v in request.extensions.items() if k != "sni_hostname"}
        rebuilt = type(request)(
            request.method,
            url,
            headers=headers,
            content=body if body is not None else request.stream,
            extensions=extensions,
        )
        return rebuilt, rebuilt.headers, body

    # -- helpers -------------------------------------------------------------------------

    def _discard(self, result: Any) -> Generator[Any, Any, None]:
        if not isinstance(result, BaseException):
            yield Close(result)

    def _expired(self, run: _Run) -> bool:
        return run.deadline is not None and self.clock() >= run.deadline

    def _lease(self, run: _Run, request: Any) -> float | None:
        """How long a probe on a shared store may hold its slot: its time to first byte.

        A probe's verdict is recorded at the commit point, so the lease covers
        the attempts on one target up to their first byte, with their waits;
        None (the store's default) when some timeout is unbounded.
        """
        if run.deadline is not None:
            return max(0.0, run.deadline - self.clock())
        timeouts = request.extensions.get("timeout") or {}
        first_byte = run.policy.first_byte_timeout
        phases: list[float | None] = [timeouts.get(k) for k in ("pool", "connect", "write")]
        phases.append(first_byte if first_byte is not None else timeouts.get("read"))
        per_attempt = 0.0
        for phase in phases:
            if phase is None:
                return None
            per_attempt += phase
        attempts = run.policy.max_attempts_per_target
        return per_attempt * attempts + run.policy.max_retry_wait * (attempts - 1)

    def _timeouts(
        self, request: Any, run: _Run, first_byte: float | None, now: float
    ) -> dict[str, float | None]:
        """The attempt's timeouts, shrunk to the total and first-byte limits.

        Shrinking connect, write and pool lets the transport raise its own typed
        error (nothing sent, or a local pool wait) rather than a generic deadline.
        """
        timeouts: dict[str, float | None] = dict(request.extensions.get("timeout") or {})
        left = max(0.0, run.deadline - now) if run.deadline is not None else None
        for key in _TIMEOUT_KEYS:
            bound = left
            if first_byte is not None and (key != "read" or not self._exact):
                bound = first_byte if bound is None else min(bound, first_byte)
            if bound is not None:
                value = timeouts.get(key)
                timeouts[key] = bound if value is None else min(value, bound)
        return timeouts

    def _skip(self, run: _Run, target: CompiledTarget, admission: Admission) -> None:
        refusal = admission.refusal
        assert refusal is not None
        now = self.clock()
        retry_in = None if math.isinf(refusal.retry_at) else max(0.0, refusal.retry_at - now)
        status = CandidateStatus(target.name, refusal.state.value, refusal.reason, retry_in)
        run.skipped.append((status, refusal.retry_at if refusal.state is State.OPEN else None))
        emit(
            "candidate.skipped",
            route=run.route_name,
            target=target.name,
            scope=refusal.scope.kind.value,
            state=refusal.state.value,
            reason=refusal.reason,
            retry_in_s=retry_in,
        )

    def _observe_skip(self, run: _Run, target: CompiledTarget, admission: Admission) -> None:
        refusal = admission.refusal
        assert refusal is not None
        emit(
            "candidate.skipped",
            route=run.route_name,
            target=target.name,
            scope=refusal.scope.kind.value,
            state=refusal.state.value,
            reason=refusal.reason,
            enforced=False,
        )

    def _announce(
        self, transitions: tuple[Transition, ...], target: CompiledTarget, run: _Run
    ) -> None:
        for t in transitions:
            emit(
                _TRANSITION_EVENTS[t.state],
                route=run.route_name,
                target=target.name,
                scope=t.scope.kind.value,
                state=t.state.value,
                previous=t.previous.value,
                reason=t.reason,
                failures=t.failures,
                retry_in_s=t.retry_in,
            )
