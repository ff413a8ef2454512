"""The commit point, sans I/O: when an attempt's response is handed to the caller.

A routed response is handed over at its first token (``commit: first_token``,
the default: an event stream of a known dialect at its first content, a JSON
body at its first byte that is not whitespace, any other body at its first
byte), at its first byte (``commit: first_byte``) or, with ``commit:
complete``, whole and validated; always within the first-byte and stall
limits. An unrouted one is handed over at its headers, as plain httpx hands
it over. Until then a failure may still move the request to the next
candidate — an error event before any content too, judged as the plain
answer it stands for; after it, the body's end is the verdict.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import replace
from typing import Any

from .._answers import classify as c11n
from .._answers.classify import Kind, Verdict
from .._answers.error_events import error_answer
from .._answers.first_token import HELD, HOLD_LIMIT, Head, head_for
from .._answers.validate import body_problem
from .._common.errors import InvalidUpstreamBody
from .._common.scopes import ScopeKind
from .._state.protocol import Ticket
from .effects import Clock, Close, Read
from .flavour import Flavour
from .routes import CompiledTarget
from .run import SUCCESS, Outcome, Run
from .verdicts import Verdicts

__all__ = ["Committing"]

_NO_TOKEN = "sidestep: no content within the first-byte limit (keep-alives do not count)"  # noqa: S105  # a message
_STALLED = "sidestep: the body stalled for longer than stall_timeout (keep-alives do not count)"


class _Watch:
    """A routed answer read up to its first token, and watched after it (a `Scan`).

    Its `Head` says where the commit point is; this adds the clock. A chunk
    that holds nothing but keep-alives, pings or metadata is no sign of life:
    `since`, when the body last did something that counts, stays where it was,
    and a stall counts from there (`stall_left`, which the async shells bound
    each wait by). Shells that cannot bound a wait from outside (sync) learn
    of a stall, or of a first-byte deadline passed while keep-alives kept the
    socket busy, when the next chunk comes: `feed` raises the flavour's
    ReadTimeout then.
    """

    __slots__ = ("_clock", "_deadline", "_flavour", "_request", "_stall", "head", "since")

    def __init__(
        self,
        head: Head,
        clock: Clock,
        deadline: float | None,
        stall: float | None,
        flavour: Flavour,
        request: Any,
    ) -> None:
        self.head = head
        self._clock = clock
        self._deadline = deadline
        self._stall = stall
        self._flavour = flavour
        self._request = request
        self.since = clock()  # the headers: the body has done nothing yet

    def __repr__(self) -> str:
        return f"_Watch({self.head!r})"

    def feed(self, chunk: bytes) -> bool:
        head = self.head
        committed = head.committed
        step = head.feed(chunk)
        now = self._clock()
        if step != HELD:
            self.since = now  # the commit point, an error before it, or a real event
            return not committed
        if not committed and self._deadline is not None and now >= self._deadline:
            raise self._flavour.read_timeout(_NO_TOKEN, request=self._request)
        if self._stall is not None and now - self.since >= self._stall:
            raise self._flavour.read_timeout(_STALLED, request=self._request)
        return False

    def settle(self) -> None:
        """The head is read: an answer handed over without its commit point (past the
        bound, or at the body's end) is watched from now on as one after it."""
        if not self.head.committed:
            self.head.commit()
            self.since = self._clock()

    def stall_left(self) -> float:
        if self._stall is None:
            return math.inf
        return max(0.0, self.since + self._stall - self._clock())


def _nothing() -> Generator[Any, Any, None]:
    return
    yield  # a generator with nothing to do


class Committing(Verdicts):
    """Waiting for a response's commit point, and what a body read meanwhile says."""

    def _stall_reads(self, request: Any, run: Run, stall: float, caller_read: Any) -> None:
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
        run: Run,
        target: CompiledTarget,
        request: Any,
        ticket: Ticket,
        response: Any,
        fb_deadline: float | None,
    ) -> Generator[Any, Any, Outcome]:
        """Wait for the commit point: the first token, or byte (or the whole body; or, for
        an unrouted request, nothing: it has no other candidate).

        A probe's success is recorded at the commit point, which frees its slot
        early; any other request's verdict waits for the end of its body, so an
        upstream that always breaks off mid-body still counts as failing. An
        error event before the commit point is the verdict instead, recorded
        by the loop: the body's end or failure then records nothing more.
        """
        route = run.cands.route
        defer = not ticket.probes
        armed = True  # the body's end or failure is still to give its verdict

        def on_error(exc: BaseException) -> Generator[Any, Any, None]:
            if not armed:
                return _nothing()
            return self._body_failed(ticket, target, run, request, exc)

        def on_end() -> Generator[Any, Any, None]:
            if not armed:
                return _nothing()
            return self._record(ticket, SUCCESS, target, run)

        end = on_end if defer else None
        stall = run.policy.stall_timeout
        watch = None
        if route is not None and route.first_token:
            watch = self._watch(request, response, fb_deadline, stall)
        head = 1 if watch is None else HOLD_LIMIT  # the head read before the commit point
        try:
            if route is not None and route.commit_complete:
                # the first token within its own limit, then the rest within the request's
                body, ended = yield Read(
                    response, request, head, fb_deadline, stall=stall, scan=watch
                )
                failed = self._error_event(run, request, ticket, response, watch)
                if failed is not None:
                    return failed  # (no verdict was due from this read's body)
                if watch is not None:
                    watch.settle()
                if not ended:
                    limit = route.max_buffered_bytes
                    body, ended = yield Read(
                        response, request, limit, run.deadline, on_error, end, stall, run.deadline
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
                        return Outcome(verdict, error)
            elif run.endpoint:
                # Unrouted: no other candidate to move to, so nothing to wait for. The
                # response goes to the caller at its headers, as plain httpx hands it
                # over (a long poll may stay quiet for minutes); its end is the verdict.
                _, ended = yield Read(
                    response, request, 0, None, on_error, end, stall, run.deadline
                )
            else:
                _, ended = yield Read(
                    response,
                    request,
                    head,
                    fb_deadline,
                    on_error,
                    end,
                    stall,
                    run.deadline,
                    watch,
                )
                failed = self._error_event(run, request, ticket, response, watch)
                if failed is not None:
                    armed = False  # its verdict is the error's, recorded by the loop
                    return failed
                if watch is not None:
                    watch.settle()
        except Exception as exc:
            yield Close(response)
            return Outcome(self._classify_error(request, exc, run), exc)
        except BaseException:
            yield Close(response)  # cancelled before the commit point: nothing leaks
            raise
        return Outcome(SUCCESS, response, committed=True, deferred=defer and not ended)

    def _watch(
        self, request: Any, response: Any, deadline: float | None, stall: float | None
    ) -> _Watch | None:
        """The watch over a routed 2xx answer whose commit point is its first token; None
        for one handed over at its first byte (no dialect known, no JSON, encoded)."""
        if not 200 <= response.status_code < 300:
            return None
        headers = response.headers
        head = head_for(
            headers.get("content-type"), headers.get("content-encoding"), request.url.path
        )
        if head is None:
            return None
        return _Watch(head, self.clock, deadline, stall, self.flavour, request)

    def _error_event(
        self, run: Run, request: Any, ticket: Ticket, response: Any, watch: _Watch | None
    ) -> Outcome | None:
        """The outcome of an answer whose stream opened with an error event (None: it did not).

        Judged as the plain answer the error stands for (`error_events.error_answer`)
        by the classifier, so an overload fails over like a 529 and a rate
        limit suspends like a 429; the status the verdict carries is the
        answer's own. The response goes back as it came, held bytes and all:
        closed when the request moves on, handed over when nothing is left.
        """
        if watch is None or not watch.head.failed:
            return None
        status, body = error_answer(watch.head.error)
        verdict = self._judge(run, request, ticket, status, response.headers, body)
        if verdict.kind is Kind.SUCCESS:
            return None  # a replacement classifier's word: the answer, as it is
        return Outcome(replace(verdict, status=response.status_code), response)

    @staticmethod
    def _invalid(response: Any, request: Any, body: list[bytes], limit: int) -> str | None:
        """What is wrong with a whole buffered 2xx body (`_answers.validate`); None if nothing."""
        status = response.status_code
        if not 200 <= status < 300 or status in (204, 205, 206) or request.method == "HEAD":
            return None  # no body to judge, or only a part of one
        headers = response.headers
        return body_problem(
            headers.get("content-type"),
            headers.get("content-encoding"),
            b"".join(body),
            request.url.path,
            limit,
        )
