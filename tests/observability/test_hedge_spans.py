"""A hedged request's traces: both attempts are children of the request's span, overlapping."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from drivers import MakeDriver, route
from otel_capture import Captured, captured
from sidestep._settings.values import SidestepConfigWarning
from upstream import Respond, Upstream, wait_for


@pytest.fixture
def otel() -> Iterator[Captured]:
    with captured() as capture:
        yield capture


def test_a_hedged_request_has_two_overlapping_attempt_spans(
    make: MakeDriver, a: Upstream, b: Upstream, otel: Captured
) -> None:
    """The first attempt (held back) and its hedge are sibling spans under the request's span,
    attempts 1 and 2, the hedge started before the first ended; the request is served."""
    gate = threading.Event()
    a.behaviour = lambda seen: Respond(body=b"late", gate=gate)
    config: dict[str, Any] = route(
        ("a", a.url + "/v1"), ("b", b.url + "/v1"), route={"hedge": {"delay": 0.01, "budget": 1}}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)
        d = make(config)
    try:
        assert d.get(a.url + "/v1/x").text == "b"
    finally:
        gate.set()  # a sync loser ends its attempt when its answer comes
    wait_for(lambda: len([s for s in otel.spans() if s.name.startswith("sidestep chat ")]) == 2)
    spans = otel.spans()
    (request,) = [s for s in spans if s.name == "sidestep chat"]
    attempts = {
        s.attributes["sidestep.target"]: s
        for s in spans
        if s.parent and s.parent.span_id == request.context.span_id
    }
    assert set(attempts) == {"a", "b"}
    first, hedge = attempts["a"], attempts["b"]
    assert (first.attributes["sidestep.attempt"], hedge.attributes["sidestep.attempt"]) == (1, 2)
    assert first.end_time is not None and hedge.start_time is not None
    assert hedge.start_time < first.end_time  # side by side, not one after the other
    assert hedge.attributes["sidestep.result"] == "success"
    assert request.attributes["sidestep.outcome"] == "served_after_failover"
