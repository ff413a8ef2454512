"""One target's attempts, sans I/O: each sent, read as far as its verdict needs, retried.

`_try_target` makes up to `max_attempts_per_target` attempts on one
candidate, with their waits; `_attempt` is one upstream call, on timeouts
shrunk to the request's total limit and its wait for a first byte, its error
body read only as far as the classifier needs, a success taken to its commit
point (`commit`). A probe's lease on a shared store comes from the same limits.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import replace
from typing import Any

from .._answers import classify as c11n
from .._answers.classify import BODY_PREFIX_LIMIT, Kind
from .._answers.encodings import decoded_head
from .._state.protocol import Ticket
from .commit import Committing
from .effects import Close, Read, Send, Sleep
from .faults import ATTEMPT, injected
from .rebuild import with_extensions
from .routes import CompiledTarget
from .run import SUCCESS, Outcome, Run
from .spreading import answered, landed, member_of, took_off
from .streaming import asks_to_stream, is_event_stream

__all__ = ["LEASE_MARGIN", "Attempting"]

_TIMEOUT_KEYS = ("connect", "read", "write", "pool")
# Seconds past its deadline a sync attempt's headers may still come (the async shells give
# the transport's own typed timeouts as long to fire first).
_LATE = 0.1
_LATE_HEADERS = "sidestep: the answer's headers came after the attempt's deadline"
# Seconds a probe's lease outlasts the limits it is worked out from: an attempt may run a
# little past them (`_LATE`, the async shells' grace for the transport's own timeouts),
# and its verdict still has to reach the store, which then frees the slot itself.
LEASE_MARGIN = 1.0
# The least read timeout set for a body: a socket's timeout of 0 does not wait at all, and
# fails as a read error rather than a timeout.
_LEAST_READ = 0.001


class Attempting(Committing):
    """One target's attempts: each sent, read as far as its verdict needs, retried."""

    # `Watching`'s: `_attempt` between its events, when someone listens.
    _watched_attempt: Callable[[Run, CompiledTarget, Any, Ticket], Generator[Any, Any, Outcome]]

    def _try_target(
        self, run: Run, target: CompiledTarget, request: Any, ticket: Ticket
    ) -> Generator[Any, Any, Outcome]:
        """Up to `max_attempts_per_target` attempts on one target; the last outcome."""
        policy = run.policy
        outcome: Outcome | None = None
        for n in range(policy.max_attempts_per_target):
            if outcome is not None:
                closes = self.closes  # a close from now on cuts the wait short (`Sleep`)
                if run.body is None or self._closed_since(run):
                    break  # a one-shot body cannot be sent again; a closed transport sends none
                wait = self._retry_wait(outcome.verdict, policy, n, run)
                if wait is None:
                    break
                if run.allowance is not None and not run.allowance.take():
                    break  # a race's hedge spent the request's last attempt
                yield from self._discard(outcome.result)
                if wait > 0:
                    yield Sleep(wait, closes)
                if self._closed_since(run):
                    # closed while it waited, its failure let go already: it ends as a
                    # request in flight on a closed client does (the failure still counts)
                    return Outcome(outcome.verdict, self._closed_error(request))
            run.attempts += 1
            attempt = self._watched_attempt if run.watched else self._attempt
            failed, outcome = outcome, (yield from attempt(run, target, request, ticket))
            if failed is not None and outcome.verdict is c11n.CLOSED_LOCALLY:
                # closed under the retry, or as it was about to go: the failure before it
                # was real, and counts, as when the close comes during the wait
                return Outcome(failed.verdict, outcome.result)
            if outcome.committed or not self._retryable(outcome.verdict):
                return outcome
            if run.attempts >= policy.max_total_attempts or self._expired(run):
                break
        assert outcome is not None  # max_attempts_per_target >= 1 is validated
        return outcome

    def _attempt(
        self, run: Run, target: CompiledTarget, request: Any, ticket: Ticket
    ) -> Generator[Any, Any, Outcome]:
        """One upstream call (`_exchange`); on a pool member, counted in flight from its
        send (or `decide`'s) to its verdict, however it ends."""
        if run.cands.members is None:
            return (yield from self._exchange(run, target, request, ticket))
        if run.received is None:
            took_off(run, member_of(run.cands, target))
        try:
            return (yield from self._exchange(run, target, request, ticket))
        finally:
            landed(run)

    def _exchange(
        self, run: Run, target: CompiledTarget, request: Any, ticket: Ticket
    ) -> Generator[Any, Any, Outcome]:
        """One upstream call: send, then read as far as the verdict needs."""
        deadline = run.deadline
        policy = run.policy
        first_byte = policy.first_byte_timeout
        stall = policy.stall_timeout
        received, run.received = run.received, None
        if received is None and run.attempts > 1 and self._closed_since(run):
            # closed since the previous attempt (another thread may close a sync client
            # at any moment): nothing more goes through it, as if closed under this one
            return Outcome(c11n.CLOSED_LOCALLY, self._closed_error(request))
        now = self.clock()
        if received is None:
            run.sent_at = now  # else `decide` set it, before the shell sent the request
            run.closes_seen = self.closes
        # how long this attempt may wait for its first body byte (None: the caller's timeouts)
        limit = policy.response_timeout if first_byte is None else self._wait_limit(run)
        caller_read = None
        if deadline is not None or first_byte is not None or limit is not None or stall is not None:
            # this attempt's own timeouts, on a copy: the request it was given (the
            # caller's, or the one kept for the next attempt) keeps its own
            caller_read = (request.extensions.get("timeout") or {}).get("read")
            extensions = dict(request.extensions)
            extensions["timeout"] = self._timeouts(request, run, limit, now)
            request = with_extensions(request, extensions)
        if self.injecting and run.route_name is not None:
            # the route and target this attempt goes to, for the fault plan's layer (which
            # takes it off before the request goes on): a URL may be several targets'
            extensions = dict(request.extensions)
            extensions[ATTEMPT] = (run.route_name, target.name)
            request = with_extensions(request, extensions)
        fb_deadline = deadline
        if limit is not None:
            fb_deadline = now + limit if deadline is None else min(deadline, now + limit)
        try:
            if received is None:
                response = yield Send(request, fb_deadline)
            elif isinstance(received, BaseException):
                raise received  # what sending raised in the shell, as if raised here
            else:
                response = received
        except Exception as exc:
            if self.injecting:
                run.injected = injected(exc)
            return Outcome(self._classify_error(request, exc, run), exc)
        if self.injecting:
            run.injected = injected(response)
        if run.aloft is not None:  # a pool member's answer: its latency, its rate limits
            at = self.clock()
            answered(run.cands, run.aloft, at - run.sent_at, response.headers, at)
        if fb_deadline is not None and not self._exact and self.clock() > fb_deadline + _LATE:
            # A sync shell bounds the wait for the headers by the read timeout, which
            # httpcore arms again for each interim (1xx) response, and separately from
            # the connect and the write: headers that came after the deadline are an
            # answer the async shells would have cut short, and fail as it would.
            yield Close(response)
            late = self.flavour.read_timeout(_LATE_HEADERS, request=request)
            return Outcome(self._classify_error(request, late, run), late)
        status = response.status_code
        if status < 400 and not self._custom_classifier:
            verdict = SUCCESS
        else:
            body = b""
            stalled: BaseException | None = None
            if c11n.needs_body(status) and not run.endpoint:  # an unrouted answer is as it is
                if stall is not None and not self._exact:
                    self._shrink_read(request, stall)  # each socket read of the error body
                try:
                    head, _ = yield Read(
                        response,
                        request,
                        BODY_PREFIX_LIMIT,
                        fb_deadline,
                        stall=stall,
                        end_by=deadline,
                    )
                    encoding = response.headers.get("content-encoding")
                    body = decoded_head(head, encoding, BODY_PREFIX_LIMIT)
                except Exception as exc:
                    yield Close(response)
                    if not self.flavour.is_timeout(exc) or self._closed_since(run):
                        return Outcome(self._classify_error(request, exc, run), exc)
                    stalled = exc  # judged by its status and headers alone (below)
                except BaseException:
                    yield Close(response)  # cancelled mid-read: the connection must not leak
                    raise
            verdict = self._judge(run, request, ticket, status, response.headers, body)
            if stalled is not None:
                # An error body that did not come in time: the verdict is still its
                # status's (a 429 is a rate limit, a 403 without its explanation a 403),
                # and the target, which kept the request waiting, is not asked again.
                if verdict.kind is not Kind.SUCCESS:
                    verdict = replace(verdict, timeout=True)
                return Outcome(verdict, stalled)
        if verdict.kind is not Kind.SUCCESS:
            return Outcome(verdict, response)
        if isinstance(response.stream, self._byte_stream) or status < 200:
            # the body is here already; or a 101 hands its connection to the caller
            return Outcome(SUCCESS, response, committed=True)
        if first_byte is not None and not run.streams and is_event_stream(response.headers):
            # A stream the request did not ask for: its first byte within what is left of
            # the first-byte limit, counted from the send.
            unasked = now + first_byte
            fb_deadline = unasked if fb_deadline is None else min(fb_deadline, unasked)
            if stall is None and not self._exact:
                self._shrink_read(request, max(_LEAST_READ, fb_deadline - self.clock()))
        if stall is not None and not self._exact:
            self._stall_reads(request, run, stall, caller_read)
        return (yield from self._commit(run, target, request, ticket, response, fb_deadline))

    # -- helpers -------------------------------------------------------------------------

    def _discard(self, result: Any) -> Generator[Any, Any, None]:
        if not isinstance(result, BaseException):
            yield Close(result)

    def _closed_error(self, request: Any) -> BaseException:
        """What a request the closing of its transport kept from a retry or the next candidate
        ends with."""
        error: BaseException = self.flavour.read_error(
            "sidestep: the transport was closed while the request waited to be sent again",
            request=request,
        )
        return error

    def _expired(self, run: Run) -> bool:
        return run.deadline is not None and self.clock() >= run.deadline

    def _lease(self, run: Run, request: Any) -> float | None:
        """How long a probe on a shared store may hold its slot: its time to first byte,
        and `LEASE_MARGIN`.

        A probe's verdict is recorded at the commit point, so the lease covers
        the attempts on one target up to their first byte, with their waits;
        None (the store's default) when some timeout is unbounded. The wait for
        the first byte is the attempt's own limit (`_wait_limit`): a request
        that does not stream is not bounded by first_byte_timeout, and neither
        is its lease.
        """
        if run.deadline is not None:
            return max(0.0, run.deadline - self.clock()) + LEASE_MARGIN
        timeouts = request.extensions.get("timeout") or {}
        policy = run.policy
        limit = policy.response_timeout
        if policy.first_byte_timeout is not None:
            limit = self._wait_limit(run)
        phases: list[float | None] = [timeouts.get(k) for k in ("pool", "connect", "write")]
        phases.append(limit if limit is not None else timeouts.get("read"))
        per_attempt = 0.0
        for phase in phases:
            if phase is None:
                return None
            per_attempt += phase
        attempts = run.policy.max_attempts_per_target
        return per_attempt * attempts + run.policy.max_retry_wait * (attempts - 1) + LEASE_MARGIN

    def _wait_limit(self, run: Run) -> float | None:
        """How long an attempt of `run` may wait for its first body byte: first_byte_timeout
        when the request asks to stream (`asks_to_stream`, asked once per request), and
        response_timeout for any answer, the shorter when both apply; None for neither."""
        policy = run.policy
        response = policy.response_timeout
        first_byte = policy.first_byte_timeout
        streams = run.streams
        if streams is None:
            streams = run.streams = asks_to_stream(run.request.headers, run.body)
        if not streams or first_byte is None:
            return response
        return first_byte if response is None else min(first_byte, response)

    def _timeouts(
        self, request: Any, run: Run, limit: float | None, now: float
    ) -> dict[str, float | None]:
        """The attempt's timeouts, shrunk to the total limit and its wait for a first byte.

        Shrinking connect, write and pool lets the transport raise its own typed
        error (nothing sent, or a local pool wait) rather than a generic deadline.
        """
        timeouts: dict[str, float | None] = dict(request.extensions.get("timeout") or {})
        left = max(0.0, run.deadline - now) if run.deadline is not None else None
        for key in _TIMEOUT_KEYS:
            bound = left
            if limit is not None and (key != "read" or not self._exact):
                bound = limit if bound is None else min(bound, limit)
            if bound is not None:
                value = timeouts.get(key)
                timeouts[key] = bound if value is None else min(value, bound)
        return timeouts

    @staticmethod
    def _shrink_read(request: Any, bound: float) -> None:
        """Bound each socket read of the body of the attempt's `request` by `bound` (for
        the sync shells, which cannot cut a wait from outside: httpcore takes the read
        timeout when the body starts and applies it to every read of it)."""
        timeouts = request.extensions.get("timeout")
        if isinstance(timeouts, dict):
            read = timeouts.get("read")
            timeouts["read"] = bound if read is None else min(read, bound)
