"""Time limits mean what their names say, on all four transports.

`first_byte_timeout` (time to first token) bounds only answers that stream:
a request that asks for a stream, or an answer that is an event stream. An
answer that does not stream is bounded by the caller's own timeout, or by
`response_timeout` where a route sets one. The limits hold on every path: an
error body read to classify it, a body that trickles in, interim (1xx)
responses before the headers.

No test here depends on how fast the machine is: a slow answer is one the
test holds until well past the limit, and an assertion is on what came back,
except where a real socket timeout is the behaviour under test (then only a
generous upper bound, far below the caller's own timeout). A limit that only a
silent or held-back A meets is short (`LIMIT`); one that B's answer, or a
request's way to A, must meet as well is `IN_TIME`, which a healthy upstream
meets however busy the machine.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import httpx
import pytest

from drivers import FakeClock, MakeDriver, elapsed, route
from sidestep._core.attempts import LEASE_MARGIN
from sidestep._core.flavour import Flavour
from sidestep._core.loop import Core
from sidestep._settings.config import Config
from upstream import (
    CLIENT_TIMEOUT,
    IN_TIME,
    Hang,
    Respond,
    Stream,
    Upstream,
    release_after_seen,
    wait_for,
)

LIMIT = 0.2  # the limit under test where no healthy answer has to meet it, in seconds
HELD = 0.6  # how long a held answer is kept back, at least: three times the limit
STREAMED = {"q": 1, "stream": True}  # a request body asking for a streamed answer
EVENT_STREAM = {"accept": "text/event-stream"}
SSE = {"content-type": "text/event-stream"}


def pair(a: Upstream, b: Upstream, **failover: Any) -> dict[str, Any]:
    """A route over A then B, whose one failure opens a scope (so a counted one shows)."""
    return route(
        ("a", a.url + "/v1"),
        ("b", b.url + "/v1"),
        breaker={"failure_threshold": 1},
        failover=failover,
    )


@pytest.fixture
def make(make: MakeDriver) -> MakeDriver:
    """The shared `make`, with the caller's own timeout far above every limit under test."""
    return functools.partial(make, timeout=CLIENT_TIMEOUT)


def scopes(d: Any) -> list[tuple[str, str, str | None]]:
    """The transport's unhealthy scopes: (target, state, reason)."""
    return [(s.target, s.state, s.reason) for s in d.transport.suspensions()]


# -- first_byte_timeout bounds streams only ------------------------------------------------------


def test_a_slow_answer_that_does_not_stream_is_not_cut_by_first_byte_timeout(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A healthy answer to a request that does not ask to stream comes back whole, however long after first_byte_timeout, and counts against nothing."""
    gate = threading.Event()
    a.behaviour = lambda _: Respond(body="a", gate=gate)
    release_after_seen(gate, a, HELD)
    d = make(pair(a, b, first_byte_timeout=LIMIT, retry_ambiguous=True))
    r = d.post(a.url + "/v1/chat", json={"q": 1})
    assert (r.text, a.calls, b.calls) == ("a", 1, 0)
    assert scopes(d) == []


@pytest.mark.parametrize(
    "asks",
    [{"json": STREAMED}, {"json": {"q": 1}, "headers": EVENT_STREAM}],
    ids=["body", "accept"],
)
def test_a_request_that_asks_to_stream_fails_over_past_first_byte_timeout(
    make: MakeDriver, a: Upstream, b: Upstream, asks: dict[str, Any]
) -> None:
    """A request asking to stream (`"stream": true` in its JSON body, or Accept: text/event-stream) that gets nothing within first_byte_timeout goes to B, and A's silence counts."""
    a.behaviour = lambda _: Hang()
    d = make(pair(a, b, first_byte_timeout=IN_TIME, retry_ambiguous=True))  # B meets it
    r = d.post(a.url + "/v1/chat", **asks)
    assert (r.text, a.calls, b.calls) == ("b", 1, 1)
    assert scopes(d) == [("a", "open", "unavailable")]


@pytest.mark.parametrize(
    "accept",
    ["application/json, text/event-stream", "text/event-stream;q=0, application/json", "*/*"],
    ids=["either", "refused", "anything"],
)
def test_a_request_that_merely_accepts_an_event_stream_is_not_cut_by_first_byte_timeout(
    make: MakeDriver, a: Upstream, b: Upstream, accept: str
) -> None:
    """An Accept header that lists text/event-stream beside another type (as MCP clients send it), or refuses it, asks for no stream: a slow JSON answer comes back whole and counts against nothing."""
    gate = threading.Event()
    a.behaviour = lambda _: Respond(body={"a": 1}, gate=gate)
    release_after_seen(gate, a, HELD)
    d = make(pair(a, b, first_byte_timeout=LIMIT, retry_ambiguous=True))
    r = d.post(a.url + "/v1/mcp", json={"q": 1}, headers={"accept": accept})
    assert (r.body, a.calls, b.calls) == (b'{"a": 1}', 1, 0)
    assert scopes(d) == []


def test_an_event_stream_the_request_did_not_ask_for_gets_what_is_left_of_first_byte_timeout(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """An answer that turns out to be an event stream, to a request that did not ask for one, must start within first_byte_timeout of the send: headers then silence go to B."""
    a.behaviour = lambda _: Stream([b"data: late\n\n"], headers=SSE, stall_after=0)
    d = make(pair(a, b, first_byte_timeout=LIMIT))
    r = d.get(a.url + "/v1/x")
    assert (r.text, a.calls, b.calls) == ("b", 1, 1)
    assert scopes(d) == [("a", "open", "unavailable")]


def test_response_timeout_bounds_an_answer_that_does_not_stream(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """With response_timeout set, an answer that does not stream and comes no sooner goes to B, and A's slowness counts."""
    a.behaviour = lambda _: Hang()
    d = make(pair(a, b, first_byte_timeout=10 * IN_TIME, response_timeout=IN_TIME))  # B meets it
    r = d.get(a.url + "/v1/x")
    assert (r.text, b.calls) == ("b", 1)
    wait_for(lambda: a.calls == 1)  # A's server may read the request after B answered
    assert scopes(d) == [("a", "open", "unavailable")]


def test_interim_responses_do_not_stretch_first_byte_timeout(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A's 102 Processing interim responses, one every half limit for two limits, do not keep a stream's first-byte wait going: the request goes to B (a sync client when A's headers come, an async one at the limit)."""
    a.behaviour = lambda _: Respond(body="a", interim=4, interim_every=IN_TIME / 2)
    d = make(pair(a, b, first_byte_timeout=IN_TIME))  # B meets it
    r = d.get(a.url + "/v1/x", headers=EVENT_STREAM)
    assert (r.text, a.calls, b.calls) == ("b", 1, 1)
    assert scopes(d) == [("a", "open", "unavailable")]


def test_interim_responses_before_an_answer_in_time_are_passed_over(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Interim responses before headers that come within the first-byte limit change nothing: A answers."""
    a.behaviour = lambda _: Respond(body="a", interim=2, interim_every=0.01)
    d = make(pair(a, b, first_byte_timeout=5.0))
    r = d.get(a.url + "/v1/x", headers=EVENT_STREAM)
    assert (r.text, a.calls, b.calls) == ("a", 1, 0)


# -- an error body is read within the limits -----------------------------------------------------

STALLED_429 = [b'{"error": {"type": "rate_limit_error", ', b'"message": "slow down"}}']


@pytest.mark.parametrize(
    ("failover", "body"),
    [
        ({"stall_timeout": LIMIT}, {"q": 1}),  # B's body comes with its headers
        ({"first_byte_timeout": IN_TIME}, STREAMED),  # B's first byte meets it
    ],
    ids=["stall", "first-byte"],
)
def test_an_error_body_that_stalls_is_judged_by_its_status(
    make: MakeDriver, a: Upstream, b: Upstream, failover: dict[str, Any], body: dict[str, Any]
) -> None:
    """A 429 whose body stalls is read no longer than stall_timeout (or the first-byte limit of a stream), then judged as the 429 it is: a POST goes to B and A is rate limited."""
    a.behaviour = lambda _: Stream(
        STALLED_429, status=429, headers={"content-type": "application/json"}, stall_after=1
    )
    d = make(pair(a, b, **failover))
    r, took = elapsed(lambda: d.post(a.url + "/v1/chat", json=body))
    assert (r.text, a.calls, b.calls) == ("b", 1, 1)
    assert scopes(d) == [("a", "open", "rate_limited")]
    assert took < CLIENT_TIMEOUT / 2  # a real socket's wait: far below the caller's own timeout


# -- total_timeout holds between chunks ----------------------------------------------------------

# Forty chunks a tenth of a second apart: the body still trickles in when a total_timeout
# of IN_TIME (within which the request surely reaches A) ends.
TRICKLE = [b"%d " % n for n in range(40)]
TRICKLE_EVERY = IN_TIME / 20


def test_total_timeout_ends_a_body_that_trickles_in(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A body whose chunks each come well within every read timeout still ends at total_timeout, with a timeout; the answer was flowing, so A's scope counts nothing."""
    a.behaviour = lambda _: Stream(TRICKLE, delay=TRICKLE_EVERY)
    d = make(pair(a, b, total_timeout=IN_TIME))
    with pytest.raises(d.http.TimeoutException):
        d.get(a.url + "/v1/x")
    assert (a.calls, b.calls) == (1, 0)
    assert scopes(d) == []


def test_total_timeout_ends_a_trickle_being_buffered(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """With commit: complete, a body buffered as it trickles in is given up at total_timeout, before the caller sees any of it."""
    a.behaviour = lambda _: Stream(TRICKLE, delay=TRICKLE_EVERY)
    config = pair(a, b, total_timeout=IN_TIME)
    config["routes"][0]["commit"] = "complete"
    d = make(config)
    with pytest.raises(d.http.TimeoutException):
        d.get(a.url + "/v1/x")
    assert (a.calls, b.calls) == (1, 0)


# -- a probe's lease on a shared store -----------------------------------------------------------


@pytest.mark.parametrize(
    ("asks", "lease"),
    [({}, 3.0 + 100.0 + LEASE_MARGIN), ({"headers": EVENT_STREAM}, 3.0 + LIMIT + LEASE_MARGIN)],
    ids=["json", "stream"],
)
def test_a_probes_lease_covers_the_wait_its_request_may_take(
    asks: dict[str, Any], lease: float
) -> None:
    """A probe's lease counts the first-byte limit for a request that asks to stream, and the read timeout for one that does not, and a margin past them (an attempt runs a little past its limits, and its verdict must still reach the store): it never ends before a slow answer may still come."""
    config = Config.model_validate({"failover": {"first_byte_timeout": LIMIT}})
    core = Core(config, store=None, clock=FakeClock(), flavour=Flavour(httpx), exact_deadlines=True)
    timeout = httpx.Timeout(1.0, read=100.0)
    request = httpx.Request("POST", "http://api.example/v1/chat", json={"q": 1}, **asks)
    request.extensions["timeout"] = timeout.as_dict()
    run = core.decide(request)
    assert not isinstance(run, tuple)
    assert core._lease(run, request) == pytest.approx(lease)
