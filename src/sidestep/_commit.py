"""The commit point, sans I/O: when an attempt's response is handed to the caller.

A routed response is handed over at its first body byte (or, with
``commit: complete``, its whole body, validated), within the first-byte and
stall limits; an unrouted one at its headers, as plain httpx hands it over.
Until then a failure may still move the request to the next candidate; after
it, the body's end is the verdict.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from . import _classify as c11n
from ._classify import Kind, Verdict
from ._effects import Close, Read
from ._errors import InvalidUpstreamBody
from ._routes import CompiledTarget
from ._run import SUCCESS, Outcome, Run
from ._scopes import ScopeKind
from ._store import Ticket
from ._validate import body_problem
from ._verdicts import Verdicts

__all__ = ["Committing"]


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
            return self._record(ticket, SUCCESS, target, run)

        end = on_end if defer else None
        stall = run.policy.stall_timeout
        try:
            if route is not None and route.commit_complete:
                # the first byte within its own limit, then the rest within the request's
                body, ended = yield Read(response, request, 1, fb_deadline, stall=stall)
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
                    response, request, 1, fb_deadline, on_error, end, stall, run.deadline
                )
        except Exception as exc:
            yield Close(response)
            return Outcome(self._classify_error(request, exc, run), exc)
        except BaseException:
            yield Close(response)  # cancelled before the commit point: nothing leaks
            raise
        return Outcome(SUCCESS, response, committed=True, deferred=defer and not ended)

    @staticmethod
    def _invalid(response: Any, request: Any, body: list[bytes], limit: int) -> str | None:
        """What is wrong with a whole buffered 2xx body (see `_validate`); None if nothing."""
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
