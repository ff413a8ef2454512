"""Timeouts fail over at once, and `stall_timeout` bounds a body's silences: all four transports.

Each timing bound sits at what the behaviour without the rule would take at
the least — a second wait, or half the caller's own 60 s timeout — so a busy
machine only makes a passing test slower. A limit that a healthy answer must
also meet (the backup's first byte) is `IN_TIME`; one that only a silent
upstream meets is short.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable
from typing import Any

import pytest

from drivers import MakeDriver, elapsed, route
from upstream import CLIENT_TIMEOUT, IN_TIME, Hang, HeadersThenHang, Respond, Seen, Stream, Upstream

FIRST_BYTE = IN_TIME  # the backup's answer meets it too


def pair(a: Upstream, b: Upstream, **extra: Any) -> dict[str, Any]:
    return route(("a", a.url + "/v1"), ("b", b.url + "/v1"), **extra)


RETRYING = {"max_attempts_per_target": 2, "retry_ambiguous": True}
STREAMED = {"q": 1, "stream": True}  # a request body asking for a streamed answer


@pytest.mark.parametrize(
    "silence",
    [lambda _: Hang(), lambda _: Stream([b"late"], first_delay=5 * FIRST_BYTE)],
    ids=["silent", "slow-first-token"],
)
def test_a_target_past_its_first_byte_timeout_is_not_retried_in_place(
    make: MakeDriver, a: Upstream, b: Upstream, silence: Callable[[Seen], Any]
) -> None:
    """With two attempts per target allowed, a target silent past first_byte_timeout on a request that asks to stream is tried once, and B answers before a second wait could have ended."""
    a.behaviour = silence
    d = make(pair(a, b, failover={**RETRYING, "first_byte_timeout": FIRST_BYTE}))
    r, took = elapsed(lambda: d.post(a.url + "/v1/chat", json=STREAMED))
    assert (r.text, a.calls, b.calls) == ("b", 1, 1)
    assert took < 2 * FIRST_BYTE  # a second wait on A would end no sooner


def test_a_connect_timeout_is_not_retried_in_place(make: MakeDriver, b: Upstream) -> None:
    """A target whose connect times out (within the first-byte limit of a request that asks to stream) is tried once, then the next one at once."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(0)
    port = hole.getsockname()[1]
    fillers = []
    for _ in range(4):  # fill the accept queue: further connects hang
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    try:
        dead = f"http://127.0.0.1:{port}"
        config = route(
            ("a", dead + "/v1"),
            ("b", b.url + "/v1"),
            failover={**RETRYING, "first_byte_timeout": FIRST_BYTE},
        )
        d = make(config)
        r, took = elapsed(lambda: d.post(dead + "/v1/x", json=STREAMED))
        assert r.text == "b"
        assert r.extensions["sidestep"]["attempts"] == 2  # one on A, one on B
        assert took < 2 * FIRST_BYTE  # a second connect on A would end no sooner
    finally:
        for s in (*fillers, hole):
            s.close()


def test_a_429_with_a_short_retry_after_is_still_retried_in_place(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A 429 whose Retry-After fits max_retry_wait is a quick answer: A is asked again and answers."""
    answers = iter([Respond(429, "slow down", {"retry-after": "1"}), Respond(body="a")])
    a.behaviour = lambda _: next(answers)
    d = make(pair(a, b, failover={**RETRYING, "max_retry_wait": 5}))
    r = d.post(a.url + "/v1/chat", json={"q": 1})
    assert (r.text, a.calls, b.calls) == ("a", 2, 0)


def test_a_503_is_still_retried_in_place(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """A quick 5xx keeps its retry on the same target: A is asked again and answers."""
    answers = iter([Respond(503, "down"), Respond(body="a")])
    a.behaviour = lambda _: next(answers)
    d = make(pair(a, b, failover=RETRYING))
    r = d.post(a.url + "/v1/chat", json={"q": 1})
    assert (r.text, a.calls, b.calls) == ("a", 2, 0)


STALL = 0.5  # only A's stalls meet it: every chunk before them comes with the headers
STALLED = [b"one ", b"two ", b"three ", b"four"]


def test_a_stream_stalled_while_buffered_fails_over_after_stall_timeout(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """With commit: complete, A's stream goes quiet after two chunks: B answers after about stall_timeout, A tried once."""
    a.behaviour = lambda _: Stream(STALLED, stall_after=2)
    config = pair(a, b, route={"commit": "complete"}, failover={**RETRYING, "stall_timeout": STALL})
    d = make(config)
    r, took = elapsed(lambda: d.post(a.url + "/v1/chat", json={"q": 1}))
    assert (r.text, a.calls, b.calls) == ("b", 1, 1)
    assert STALL * 0.9 <= took < CLIENT_TIMEOUT / 2


def test_a_committed_stream_that_stalls_ends_with_a_read_timeout_after_stall_timeout(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """With commit: first_byte, the caller has two chunks, then its flavour's ReadTimeout after about stall_timeout; A's scope records the failure."""
    a.behaviour = lambda _: Stream(STALLED, stall_after=2)
    config = pair(a, b, breaker={"failure_threshold": 1}, failover={"stall_timeout": STALL})
    d = make(config)
    got: list[bytes] = []
    with pytest.raises(d.http.ReadTimeout) as caught:
        d.stream("POST", a.url + "/v1/chat", got.append, json={"q": 1})
    assert b"".join(got) == b"one two "
    if d.is_async:  # sidestep's own bound; the sync one is the transport's read timeout
        assert "stall_timeout" in str(caught.value)
    assert b.calls == 0  # committed: nothing else is tried
    [scope] = [s for s in d.transport.suspensions() if s.target == "a"]
    assert (scope.state, scope.failures) == ("open", 1)


def test_a_committed_stall_is_reported_within_stall_timeout_not_the_callers_timeout(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """The ReadTimeout of a stalled committed stream comes after about stall_timeout, far before the caller's own 10 s."""
    a.behaviour = lambda _: Stream(STALLED, stall_after=2)
    d = make(pair(a, b, failover={"stall_timeout": STALL}))

    def read() -> None:
        with pytest.raises(d.http.ReadTimeout):
            d.stream("GET", a.url + "/v1/x", lambda _: None)

    _, took = elapsed(read)
    assert STALL * 0.9 <= took < CLIENT_TIMEOUT / 2


def test_a_slow_stream_within_stall_timeout_is_read_whole(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Chunks closer together than stall_timeout, however long the whole body takes (here longer than the limit), are never cut."""
    chunks = [b"%d " % n for n in range(30)]  # 29 gaps of a twentieth of the limit
    a.behaviour = lambda _: Stream(chunks, delay=IN_TIME / 20)
    d = make(pair(a, b, failover={"stall_timeout": IN_TIME}))  # each gap meets it
    r = d.stream("GET", a.url + "/v1/x", lambda _: None)
    assert (r.body, b.calls) == (b"".join(chunks), 0)


def test_stall_timeout_configured_globally_bounds_unrouted_streams(
    make: MakeDriver, a: Upstream
) -> None:
    """An unrouted stream that goes quiet raises a ReadTimeout after about the global stall_timeout."""
    a.behaviour = lambda _: Stream(STALLED, stall_after=1)
    d = make({"failover": {"stall_timeout": STALL}})

    def read() -> None:
        with pytest.raises(d.http.ReadTimeout):
            d.stream("GET", a.url + "/x", lambda _: None)

    _, took = elapsed(read)
    assert took < CLIENT_TIMEOUT / 2


def test_headers_then_silence_counts_as_a_stall_while_buffering(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """stall_timeout counts from the headers: a body that never starts fails over after it, with no first_byte_timeout set."""
    a.behaviour = lambda _: HeadersThenHang()
    config = pair(a, b, route={"commit": "complete"}, failover={"stall_timeout": STALL})
    d = make(config)
    r, took = elapsed(lambda: d.get(a.url + "/v1/x"))
    assert (r.text, a.calls) == ("b", 1)
    assert took < CLIENT_TIMEOUT / 2


@pytest.fixture
def make(make: MakeDriver) -> MakeDriver:
    """The shared `make`, with the caller's own timeout far above every limit under test."""
    return functools.partial(make, timeout=CLIENT_TIMEOUT)
