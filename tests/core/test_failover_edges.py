"""Edges of timeouts, stalls, validation, recovery and rate-limit signals, over real sockets.

Timing bounds are generous (seconds above the limit under test) and each sits
well below what the wrong behaviour would take (the client's own 60 s timeout, or
a wait it could not have ended sooner); a limit that a healthy answer must meet
too is `IN_TIME`.
"""

from __future__ import annotations

import functools
import json
import pickle
import threading
import time
import warnings
from typing import Any

import pytest

import sidestep
from drivers import Driver, FakeClock, MakeDriver, elapsed, route
from sidestep._settings.values import SidestepConfigWarning
from upstream import CLIENT_TIMEOUT, IN_TIME, Hang, Respond, Seen, Stream, Upstream, wait_for

SSE = "text/event-stream"
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"


def pair(a: Upstream, b: Upstream, **extra: Any) -> dict[str, Any]:
    return route(("a", a.url + "/v1"), ("b", b.url + "/v1"), **extra)


def complete(a: Upstream, b: Upstream, **route_extra: Any) -> dict[str, Any]:
    return pair(
        a,
        b,
        route={"commit": "complete", **route_extra},
        breaker={"failure_threshold": 10},
        failover={"retry_ambiguous": True},
    )


def chat_stream(*pieces: str, bom: bool = False) -> bytes:
    out = "\ufeff" if bom else ""
    for p in pieces:
        chunk = {"object": "chat.completion.chunk", "choices": [{"delta": {"content": p}}]}
        out += f"data: {json.dumps(chunk)}\n\n"
    return (out + "data: [DONE]\n\n").encode()


# -- Google RetryInfo with hostile values ----------------------------------------------------


@pytest.mark.parametrize(
    "delay",
    [{"seconds": 10**400}, {"seconds": "9" * 400}, {"seconds": "9" * 5000}],
    ids=["huge-int", "huge-digit-string", "digit-string-past-int-limit"],
)
def test_a_hostile_retry_delay_is_garbage_and_the_429_fails_over(
    make: MakeDriver, a: Upstream, b: Upstream, delay: dict[str, Any]
) -> None:
    """A 429 whose RetryInfo.retryDelay holds an absurd number is ignored as garbage and B answers; no exception escapes."""
    body = json.dumps(
        {"error": {"code": 429, "details": [{"@type": RETRY_INFO, "retryDelay": delay}]}}
    )
    a.behaviour = lambda _: Respond(429, body[:16000], {"content-type": "application/json"})
    d = make(pair(a, b), clock=FakeClock())
    r = d.post(a.url + "/v1/chat", json={"q": 1})
    assert (r.status, r.text) == (200, "b")


# -- validation: what a valid event stream may look like --------------------------------------


def test_an_event_stream_opening_with_a_byte_order_mark_is_valid(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A chat stream that begins with a U+FEFF (which the SDKs read as part of the first line, and ignore that line) is delivered from A, not failed over."""
    body = chat_stream("hi", bom=True)
    a.behaviour = lambda _: Respond(body=body, headers={"content-type": SSE})
    d = make(complete(a, b))
    r = d.post(a.url + "/v1/chat/completions", json={"stream": True})
    assert (r.body, r.extensions["sidestep"]["target"], b.calls) == (body, "a", 0)


def test_an_event_stream_with_an_unknown_field_is_valid(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """SSE ignores a field it does not know, so A's whole chat stream carrying one is delivered from A, not failed over."""
    body = b"x-proxy-note: cached\n" + chat_stream("hi")
    a.behaviour = lambda _: Respond(body=body, headers={"content-type": SSE})
    d = make(complete(a, b))
    r = d.post(a.url + "/v1/chat/completions", json={"stream": True})
    assert (r.body, r.extensions["sidestep"]["target"], b.calls) == (body, "a", 0)


def test_an_event_stream_with_crlf_comments_and_multiline_data_is_valid(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """CRLF line ends, keep-alive comments, event: lines and a JSON payload over two data: lines make a valid stream A delivers."""
    body = (
        b": keep-alive\r\n\r\n"
        b'event: chunk\r\ndata: {"object": "chat.completion.chunk",\r\n'
        b'data:  "choices": []}\r\n\r\n'
        b"data: [DONE]\r\n\r\n"
    )
    a.behaviour = lambda _: Stream([body[:7], body[7:50], body[50:]], headers={"content-type": SSE})
    d = make(complete(a, b))
    r = d.post(a.url + "/v1/chat/completions", json={"stream": True})
    assert (r.body, r.extensions["sidestep"]["target"]) == (body, "a")


def test_a_partial_content_answer_is_not_judged_as_a_whole_document(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A 206 carries a range of a JSON document, which need not parse on its own: A's part is delivered, not failed over."""
    a.behaviour = lambda _: Respond(
        206,
        b'{"items": [1, 2',
        {"content-type": "application/json", "content-range": "bytes 0-14/40"},
    )
    d = make(complete(a, b))
    r = d.get(a.url + "/v1/file.json", headers={"range": "bytes=0-14"})
    assert (r.status, r.body, b.calls) == (206, b'{"items": [1, 2', 0)


def test_invalid_upstream_body_carries_no_body_byte_in_its_chain(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """When every target answers invalid JSON, neither InvalidUpstreamBody nor its __cause__/__context__ chain holds a byte of the body or the URL's path or query."""
    secret = b'{"echo": "PRIVATE-TEXT'
    for upstream in (a, b):
        upstream.behaviour = lambda _: Respond(
            body=secret, headers={"content-type": "application/json"}
        )
    d = make(complete(a, b))
    with pytest.raises(sidestep.InvalidUpstreamBody) as caught:
        d.post(a.url + "/v1/secret-path?token=QUERYSECRET", json={"q": 1})
    error: BaseException | None = caught.value
    seen = 0
    while error is not None and seen < 10:
        for text in (str(error), repr(error), repr(error.args)):
            for leak in ("PRIVATE", "echo", "secret-path", "QUERYSECRET"):
                assert leak not in text, (type(error), leak)
        error = error.__cause__ or error.__context__
        seen += 1
    again = pickle.loads(pickle.dumps(caught.value))  # noqa: S301  # our own object
    assert "PRIVATE" not in repr(again.__dict__)


# -- stalls ----------------------------------------------------------------------------------


def test_a_stall_past_max_buffered_bytes_ends_in_a_read_timeout(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A complete-commit body past max_buffered_bytes is handed over; its later stall ends in the flavour's ReadTimeout after stall_timeout, not the client's timeout."""
    a.behaviour = lambda _: Stream([b"x" * 1500] * 3, stall_after=2)
    d = make(
        pair(
            a,
            b,
            route={"commit": "complete", "max_buffered_bytes": 1024},
            failover={"stall_timeout": 1.0},
        )
    )
    began = time.monotonic()
    with pytest.raises(d.http.ReadTimeout):
        d.post(a.url + "/v1/chat", json={"q": 1})
    assert time.monotonic() - began < CLIENT_TIMEOUT / 2
    assert b.calls == 0


def test_total_timeout_shorter_than_stall_timeout_wins(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """With first_byte commit, a stream stalled after its first chunk ends by total_timeout (2 s, within which its first chunk surely comes), well before stall_timeout (30 s)."""
    a.behaviour = lambda _: Stream([b"a1", b"a2"], stall_after=1)
    stall = 30.0
    d = make(pair(a, b, failover={"stall_timeout": stall, "total_timeout": IN_TIME}))
    began = time.monotonic()
    with pytest.raises(d.http.TimeoutException):
        d.post(a.url + "/v1/chat", json={"q": 1})
    assert time.monotonic() - began < stall / 2


def test_a_stalled_probe_fails_over_and_grows_the_window(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A half-open probe whose complete-commit body stalls fails over to B, and (a timeout) reopens A for longer than cooldown."""
    clock = FakeClock()
    a.behaviour = lambda _: Respond(503)
    d = make(
        pair(
            a,
            b,
            route={"commit": "complete"},
            failover={"stall_timeout": 0.5},
            breaker={"failure_threshold": 2, "cooldown": 10, "max_cooldown": 600},
        ),
        clock=clock,
    )
    for _ in range(2):
        assert d.get(a.url + "/v1/x").text == "b"
    clock.advance(10)
    a.behaviour = lambda _: Stream([b"a1", b"a2"], stall_after=1)
    r = d.get(a.url + "/v1/x")
    assert (r.text, a.calls) == ("b", 3)
    (s,) = d.transport.suspensions()
    assert s.state == "open"
    assert s.retry_in is not None and s.retry_in > 10


# -- retry in place --------------------------------------------------------------------------


def test_a_503_then_a_silence_ends_the_targets_attempts(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """With three attempts per target, A's 503 is retried in place, but the next attempt's first-byte timeout (the request asks to stream) moves to B at once (A tried twice, and B answered before a third wait could have ended)."""
    a.behaviour = lambda _: Respond(503) if a.calls == 1 else Hang()
    d = make(
        pair(
            a,
            b,
            failover={
                "max_attempts_per_target": 3,
                "retry_ambiguous": True,
                "first_byte_timeout": IN_TIME,  # B meets it
            },
        )
    )
    r, took = elapsed(lambda: d.post(a.url + "/v1/chat", json={"q": 1, "stream": True}))
    assert (r.text, a.calls, b.calls) == ("b", 2, 1)
    assert took < 2 * IN_TIME  # a third attempt on A would wait out the limit again


def test_a_one_shot_body_is_not_retried_in_place(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A generator body answered 503 is never re-sent to A empty: A sees it once, whole, and the caller gets a response, no exception."""
    a.behaviour = lambda _: Respond(503)
    d = make(pair(a, b, failover={"max_attempts_per_target": 3}))

    if d.is_async:

        async def gen() -> Any:
            yield b"one-"
            yield b"shot"

    else:

        def gen() -> Any:  # type: ignore[misc]
            yield b"one-"
            yield b"shot"

    r = d.post(a.url + "/v1/chat", content=gen())
    assert [s.body for s in a.seen] == [b"one-shot"]
    assert r.status in (200, 503)
    assert all(s.body == b"one-shot" for s in b.seen)


# -- avoid_rate_limits -----------------------------------------------------------------------


def test_a_burst_of_spent_successes_suspends_the_scope_once(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Ten concurrent successes from A that all say no request is left give ten 200s from A and exactly one rate_limited suspension."""
    gate = threading.Event()
    spent = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "30s"}
    a.behaviour = lambda _: Respond(body="a", headers=dict(spent), gate=gate)
    d = make(
        pair(a, b, route={"avoid_rate_limits": True}), clock=FakeClock(), timeout=CLIENT_TIMEOUT
    )
    opener = threading.Thread(target=lambda: (wait_for(lambda: a.calls == 10), gate.set()))
    opener.start()
    results = d.many(10, "POST", a.url + "/v1/chat", json={"q": 1})
    opener.join(5)
    assert all(not isinstance(r, BaseException) for r in results), results
    assert {r.text for r in results if not isinstance(r, BaseException)} == {"a"}
    (s,) = d.transport.suspensions()
    assert (s.target, s.reason, s.retry_in) == ("a", "rate_limited", 30)
    assert d.post(a.url + "/v1/chat", json={"q": 1}).text == "b"


@pytest.mark.parametrize(
    "reset", ["inf", "nan", "-5s", "1e9", "9" * 400, "1" * 16000 + "s", "2999-01-01T00:00:00Z"]
)
def test_a_spent_success_with_a_garbage_reset_uses_the_initial_window(
    make: MakeDriver, a: Upstream, b: Upstream, reset: str
) -> None:
    """A spent success whose reset header is garbage still answers from A and suspends A for a bounded window, never forever."""
    a.behaviour = lambda _: Respond(
        body="a",
        headers={"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": reset},
    )
    d = make(pair(a, b, route={"avoid_rate_limits": True}), clock=FakeClock())
    assert d.post(a.url + "/v1/chat", json={"q": 1}).text == "a"
    (s,) = d.transport.suspensions()
    assert s.reason == "rate_limited"
    assert s.retry_in is not None and 0 < s.retry_in <= 3600


# -- recovery on both stores -----------------------------------------------------------------


@pytest.mark.parametrize("store_kind", ["memory", "redis"])
def test_quick_failed_probes_reopen_for_cooldown_and_a_slow_one_grows_it(
    a: Upstream, b: Upstream, request: pytest.FixtureRequest, store_kind: str
) -> None:
    """On the memory and Redis stores alike, a quickly failed probe reopens A for exactly cooldown, a slow one for longer."""
    clock = FakeClock()
    store: Any = None
    if store_kind == "redis":
        from redis_server import fresh_prefix
        from sidestep import RedisStore

        store = RedisStore(request.getfixturevalue("redis_url"), prefix=fresh_prefix())
        store._caller_clock = True
    a.behaviour = lambda _: Respond(503)
    cfg = pair(a, b, breaker={"failure_threshold": 2, "cooldown": 10, "max_cooldown": 600})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)
        d = Driver("httpx-sync", cfg, timeout=CLIENT_TIMEOUT, clock=clock, store=store)
    try:
        for _ in range(2):
            assert d.get(a.url + "/v1/x").text == "b"
        windows = []
        for _ in range(3):
            clock.advance(10)
            assert d.get(a.url + "/v1/x").text == "b"
            (s,) = d.transport.suspensions()
            windows.append(s.retry_in)
        assert windows == [10, 10, 10]

        def slow(_: Seen) -> Respond:
            clock.advance(2)  # past breaker.slow_failure (1 s)
            return Respond(503)

        a.behaviour = slow
        clock.advance(10)
        assert d.get(a.url + "/v1/x").text == "b"
        (s,) = d.transport.suspensions()
        assert s.retry_in is not None and s.retry_in > 10
    finally:
        d.close()


@pytest.fixture
def make(make: MakeDriver) -> MakeDriver:
    """The shared `make`, with the caller's own timeout far above every limit under test."""
    return functools.partial(make, timeout=CLIENT_TIMEOUT)
