"""Spans from sidestep's events: one per routed request, a child per attempt.

`request.started` opens ``sidestep <route>`` and makes it current;
`attempt.started` opens a child span, current while the inner transport
sends, so the spans of an HTTP client instrumentation
(``opentelemetry-instrumentation-httpx``) nest under the attempt. The core
emits each ``*.finished`` in the thread or task of its ``*.started``, also
when cancelled, so each span ends and its context is detached where it was
attached. Skips, candidates left out for provider state, failovers, probes and
circuit transitions are events of the innermost open span. A request that
matches no route has no span of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import context, trace
from opentelemetry.trace import Span, Status, StatusCode

from ..logging import remove_observer

__all__ = ["Spans"]

_SERVED = frozenset({"served", "served_after_failover"})
_OK = frozenset({"success", "cancelled"})
# The fields a span event carries: names and enumerations, never a URL or a value.
_EVENT_FIELDS = (
    "target",
    "previous",
    "scope",
    "state",
    "reason",
    "enforced",
    "retry_in_s",
    "own",
    "rule",
)
_EVENTS = frozenset(
    {
        "candidate.skipped",
        "candidate.excluded",
        "failover",
        "probe.admitted",
        "circuit.opened",
        "circuit.half_open",
        "circuit.closed",
        "all_candidates_suspended",
        "suspension.forgotten",
    }
)

_Open = tuple[Span, object, bool]  # the span, its context token, whether it is an attempt's


class Spans:
    """The observer for traces; its open spans are per thread or task (a context variable).

    `close()` opens no more spans, and leaves the observers once every span
    still open has ended, so a request in flight still ends its spans and
    detaches its context where it attached it.
    """

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer
        self._open: ContextVar[tuple[_Open, ...]] = ContextVar(f"sidestep_spans_{id(self)}")
        self._servers: dict[str, tuple[str, int] | tuple[()]] = {}
        self._lock = threading.Lock()
        self._count = 0  # spans open now, in every thread and task
        self._closing = False

    def close(self) -> None:
        """Open no more spans; stop observing once the last open one has ended."""
        with self._lock:
            self._closing = True
            drained = self._count == 0
        if drained:
            remove_observer(self)

    def __call__(self, event: str, fields: Mapping[str, Any], /) -> None:
        if event == "attempt.started":
            self._attempt(fields)
        elif event == "attempt.finished":
            self._end_attempt(fields)
        elif event == "request.started":
            route = fields.get("route")
            if isinstance(route, str):
                attributes = {"sidestep.route": route}
                method = fields.get("method")
                if isinstance(method, str):
                    attributes["http.request.method"] = method
                self._start(f"sidestep {route}", attributes, attempt=False)
        elif event == "request.finished":
            self._end_request(fields)
        elif event in _EVENTS:
            opened = self._open.get(())
            if opened:
                opened[-1][0].add_event(event, _event_attributes(fields))

    def _start(self, name: str, attributes: dict[str, Any], *, attempt: bool) -> None:
        """Open a span and make it current, unless closing."""
        with self._lock:
            if self._closing:
                return
            self._count += 1
        try:
            span = self._tracer.start_span(name, attributes=attributes)
            token = context.attach(trace.set_span_in_context(span))
        except BaseException:
            self._ended()
            raise
        self._open.set((*self._open.get(()), (span, token, attempt)))

    def _ended(self) -> None:
        with self._lock:
            self._count -= 1
            drained = self._closing and self._count == 0
        if drained:
            remove_observer(self)

    def _pop(self, *, attempt: bool) -> Span | None:
        opened = self._open.get(())
        if not opened or opened[-1][2] is not attempt:
            return None
        span, token, _ = opened[-1]
        self._open.set(opened[:-1])
        context.detach(token)  # type: ignore[arg-type]
        self._ended()
        return span

    def _attempt(self, fields: Mapping[str, Any]) -> None:
        opened = self._open.get(())
        if not opened or opened[-1][2]:
            return  # no request span: an unrouted request
        target = fields.get("target")
        number = fields.get("attempt")
        attributes: dict[str, Any] = {"sidestep.target": str(target)}
        if isinstance(number, int):
            attributes["sidestep.attempt"] = number
            if number > 1:
                attributes["http.request.resend_count"] = number - 1
        origin = fields.get("origin")
        if isinstance(origin, str):
            server = self._servers.get(origin)
            if server is None:
                server = self._servers[origin] = _server(origin)  # routed targets: bounded
            if server:
                attributes["server.address"], attributes["server.port"] = server
        if fields.get("probe"):
            attributes["sidestep.probe"] = True
        name = f"sidestep {fields.get('route')} {target}"
        self._start(name, attributes, attempt=True)

    def _end_attempt(self, fields: Mapping[str, Any]) -> None:
        span = self._pop(attempt=True)
        if span is None:
            return
        result = fields.get("result")
        span.set_attribute("sidestep.result", str(result))
        status = fields.get("status")
        if isinstance(status, int):
            span.set_attribute("http.response.status_code", status)
        if result not in _OK:
            error = fields.get("error") or (str(status) if status is not None else result)
            span.set_attribute("error.type", str(error))
            span.set_status(Status(StatusCode.ERROR, str(result)))
        span.end()

    def _end_request(self, fields: Mapping[str, Any]) -> None:
        span = self._pop(attempt=False)
        if span is None:
            return
        outcome = fields.get("outcome")
        span.set_attribute("sidestep.outcome", str(outcome))
        attempts = fields.get("attempts")
        if isinstance(attempts, int):
            span.set_attribute("sidestep.attempts", attempts)
        if outcome not in _SERVED and outcome != "cancelled":
            span.set_attribute("error.type", str(fields.get("error") or outcome))
            span.set_status(Status(StatusCode.ERROR, str(outcome)))
        span.end()


def _server(origin: str) -> tuple[str, int] | tuple[()]:
    """(`server.address`, `server.port`) of an origin; () when it has no host."""
    parts = urlsplit(origin)
    if not parts.hostname:
        return ()
    try:
        port = parts.port
    except ValueError:
        port = None
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def _event_attributes(fields: Mapping[str, Any]) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    for key in _EVENT_FIELDS:
        value = fields.get(key)
        if isinstance(value, (str, bool, int, float)):
            attributes[f"sidestep.{key}"] = value
    return attributes
