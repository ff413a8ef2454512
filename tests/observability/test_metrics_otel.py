"""OpenTelemetry metrics and traces from sidestep's events, read through the SDK in memory."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.trace import SpanKind, StatusCode

import sidestep
from drivers import FakeClock, MakeDriver, route
from otel_capture import Captured, captured
from sidestep.metrics import otel as sidestep_otel
from upstream import IN_TIME, Hang, Respond, Seen, Upstream, wait_for


def unavailable(seen: Seen) -> Respond:
    return Respond(503, "down")


@pytest.fixture
def otel() -> Iterator[Captured]:
    with captured() as capture:
        yield capture


def test_a_routed_request_is_a_span_with_a_child_per_attempt(
    make: MakeDriver, a: Upstream, b: Upstream, otel: Captured
) -> None:
    """A fails over to B: one `sidestep chat` span, two attempt children with target, attempt number, resend count, server address and A's error type; the failover and A's opening are span events."""
    a.behaviour = unavailable
    d = make(route(("a", a.url + "/v1"), ("b", b.url + "/v1"), breaker={"failure_threshold": 1}))
    assert d.get(a.url + "/v1/x").text == "b"
    spans = otel.spans()
    (request,) = [s for s in spans if s.name == "sidestep chat"]
    attempts = sorted(
        (s for s in spans if s.parent and s.parent.span_id == request.context.span_id),
        key=lambda s: s.start_time or 0,
    )
    assert [s.attributes["sidestep.target"] for s in attempts] == ["a", "b"]
    first, second = (dict(s.attributes or {}) for s in attempts)
    assert first["sidestep.attempt"] == 1 and "http.request.resend_count" not in first
    assert second["sidestep.attempt"] == 2 and second["http.request.resend_count"] == 1
    assert first["error.type"] == "503" and attempts[0].status.status_code is StatusCode.ERROR
    assert "error.type" not in second
    assert (first["server.address"], first["server.port"]) == ("127.0.0.1", a.port)
    assert request.attributes["sidestep.outcome"] == "served_after_failover"
    events = [e.name for e in request.events]
    assert "circuit.opened" in events and "failover" in events
    assert request.status.status_code is StatusCode.UNSET


def test_otel_metrics_match_the_events(
    make: MakeDriver, a: Upstream, b: Upstream, otel: Captured
) -> None:
    """The OTel instruments count the same things with the same attributes as the Prometheus ones."""
    a.behaviour = unavailable
    clock = FakeClock()
    d = make(
        route(("a", a.url + "/v1"), ("b", b.url + "/v1"), breaker={"failure_threshold": 1}),
        clock=clock,
    )
    for _ in range(3):
        assert d.get(a.url + "/v1/x").text == "b"
    # B answered each time, after a failed A or in place of a skipped one
    assert otel.value("sidestep.requests", route="chat", outcome="served_after_failover") == 3
    assert otel.value("sidestep.attempts", route="chat", target="a", result="unavailable") == 1
    assert (
        otel.value("sidestep.candidates.skipped", route="chat", target="a", reason="unavailable")
        == 2
    )
    assert otel.value("sidestep.failovers", route="chat", from_target="a", to_target="b") == 1
    assert otel.value("sidestep.suspended", target="a", scope="origin", reason="unavailable") == 1
    transition = {
        "target": "a",
        "scope": "origin",
        "from_state": "closed",
        "to_state": "open",
        "reason": "unavailable",
    }
    assert otel.value("sidestep.circuit.transitions", **transition) == 1
    durations = otel.points("sidestep.attempt.duration")
    assert {tuple(sorted(attrs.items())) for attrs, _ in durations} == {
        (("route", "chat"), ("target", "a")),
        (("route", "chat"), ("target", "b")),
    }


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_httpx_instrumentation_spans_nest_under_the_attempt(
    flavour: str, a: Upstream, b: Upstream, otel: Captured
) -> None:
    """With opentelemetry-instrumentation-httpx active, each CLIENT span of the inner transport is a child of sidestep's attempt span for that target."""
    a.behaviour = unavailable
    config = route(("a", a.url + "/v1"), ("b", b.url + "/v1"))
    instrumentor = HTTPXClientInstrumentor()
    instrumentor.instrument(tracer_provider=otel.tracer_provider)
    try:
        if flavour == "sync":
            transport = sidestep.FailoverTransport(config)
            with httpx.Client(transport=transport) as client:
                assert client.get(a.url + "/v1/x").text == "b"
        else:

            async def go() -> str:
                transport = sidestep.AsyncFailoverTransport(config)
                async with httpx.AsyncClient(transport=transport) as client:
                    return (await client.get(a.url + "/v1/x")).text

            assert asyncio.run(go()) == "b"
    finally:
        instrumentor.uninstrument()
    spans = otel.spans()
    by_id = {s.context.span_id: s for s in spans}
    clients = [s for s in spans if s.kind is SpanKind.CLIENT]
    assert len(clients) == 2
    for client_span in clients:
        assert client_span.parent is not None
        parent = by_id[client_span.parent.span_id]
        attributes = dict(client_span.attributes or {})
        port = httpx.URL(str(attributes.get("url.full") or attributes["http.url"])).port
        assert parent.attributes["sidestep.target"] == ("a" if port == a.port else "b")
        grandparent = by_id[parent.parent.span_id]
        assert grandparent.name == "sidestep chat"


def test_a_cancelled_request_ends_its_spans_and_leaves_no_context(
    a: Upstream, otel: Captured
) -> None:
    """Cancelled while waiting for an answer: the attempt and request spans end (cancelled) with no error status nor error.type (the caller gave up; neither upstream nor sidestep failed), the task's current span is no longer sidestep's, and the request and its attempt are counted as cancelled."""
    a.behaviour = lambda seen: Hang()
    after: list[trace.Span] = []

    async def go() -> None:
        transport = sidestep.AsyncFailoverTransport(route(("a", a.url + "/v1")))
        async with httpx.AsyncClient(transport=transport) as client:

            async def call() -> None:
                try:
                    await client.get(a.url + "/v1/x")
                finally:
                    after.append(trace.get_current_span())

            task = asyncio.create_task(call())
            for _ in range(500):  # bounded: the upstream sees the request
                if a.calls:
                    break
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(go())
    spans = {s.name: s for s in otel.spans()}
    assert set(spans) == {"sidestep chat", "sidestep chat a"}
    assert spans["sidestep chat a"].attributes["sidestep.result"] == "cancelled"
    assert spans["sidestep chat"].attributes["sidestep.outcome"] == "cancelled"
    for span in spans.values():
        assert span.status.status_code is StatusCode.UNSET
        assert "error.type" not in (span.attributes or {})
    assert after == [trace.INVALID_SPAN]
    assert otel.value("sidestep.requests", route="chat", outcome="cancelled") == 1
    assert otel.value("sidestep.attempts", route="chat", target="a", result="cancelled") == 1


def test_unrouted_requests_have_no_span_but_count(
    make: MakeDriver, a: Upstream, otel: Captured
) -> None:
    """A request no route matches opens no span; its attempt counts under its origin."""
    d = make(None)
    d.get(a.url + "/path?q=1")
    assert otel.spans() == []
    assert otel.value("sidestep.attempts", route="", target=a.url, result="success") == 1


def test_disable_while_a_request_is_in_flight_still_ends_its_spans(a: Upstream) -> None:
    """`otel.disable()` while a sync request waits for its answer: the request still ends its spans, and its thread's current span is no longer sidestep's; a request after that opens no span."""
    a.behaviour = lambda seen: Hang()
    after: list[trace.Span] = []
    with captured() as capture:
        transport = sidestep.FailoverTransport(route(("a", a.url + "/v1")))
        # the request still waits when otel is disabled, however busy the machine
        with httpx.Client(transport=transport, timeout=IN_TIME) as client:

            def call() -> None:
                with pytest.raises(httpx.ReadTimeout):
                    client.get(a.url + "/v1/x")
                after.append(trace.get_current_span())

            thread = threading.Thread(target=call)
            thread.start()
            wait_for(lambda: a.calls == 1)
            sidestep_otel.disable()
            thread.join(60)
            assert after == [trace.INVALID_SPAN]
            ended = {s.name: s for s in capture.spans()}
            assert set(ended) == {"sidestep chat", "sidestep chat a"}
            assert ended["sidestep chat a"].attributes["sidestep.result"] == "timeout"
            a.behaviour = lambda seen: Respond(body="a")
            assert client.get(a.url + "/v1/x").text == "a"
            assert len(capture.spans()) == 2


def test_a_scope_the_store_forgets_leaves_the_otel_suspended_counter(
    make: MakeDriver, a: Upstream, b: Upstream, otel: Captured
) -> None:
    """A store bounded to one scope forgets A (open) when B opens: `sidestep.suspended` goes back to 0 for A, as Prometheus's gauge does, and the request that made room carries `suspension.forgotten` as a span event."""
    d = make(
        route(("a", a.url + "/v1"), ("b", b.url + "/v1"), breaker={"failure_threshold": 1}),
        clock=FakeClock(),
        store=sidestep.MemoryStore(max_scopes=1),
    )
    a.behaviour = b.behaviour = unavailable
    d.get(a.url + "/v1/x")  # A opens, then B fails once: it opens too, and A is forgotten
    opened = {"scope": "origin", "reason": "unavailable"}
    assert otel.value("sidestep.suspended", target="a", **opened) == 0
    assert otel.value("sidestep.suspended", target="b", **opened) == 1
    (request,) = [s for s in otel.spans() if s.name == "sidestep chat"]
    forgotten = [e for e in request.events if e.name == "suspension.forgotten"]
    assert [dict(e.attributes or {}).get("sidestep.target") for e in forgotten] == ["a"]
