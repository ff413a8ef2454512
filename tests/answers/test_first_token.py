"""`commit: first_token`: an LLM stream is handed over with its first content, on all four transports.

Keep-alives, pings and metadata before it are held, count for no timer and
reach the caller byte for byte with that content; an error event before it
fails over like the error status it stands for. Time bounds are generous:
each test's upstream keeps going for over twice the limit under test, and a
limit that a healthy answer must meet too (B's first token, the gap between
two of A's tokens) is `IN_TIME` above what that answer takes.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from drivers import MakeDriver, route
from upstream import IN_TIME, Respond, Stream, Upstream

SSE = {"content-type": "text/event-stream"}
FIRST_BYTE = IN_TIME  # B's first token meets it
STALL = 1.0  # only A's pings meet it
MESSAGES = "/v1/messages"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"


def sse(data: Any, name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def msg(kind: str, **fields: Any) -> bytes:
    return sse({"type": kind, **fields}, kind)


def chat(**delta: Any) -> bytes:
    return sse({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]})


KEEPALIVE = b": keep-alive\n\n"
PING = msg("ping")
START = msg("message_start", message={"id": "m", "content": []})
BLOCK = msg("content_block_start", index=0, content_block={"type": "text", "text": ""})
TOKEN = msg("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hi"})
END = msg("message_stop")
OVERLOADED = sse({"type": "error", "error": {"type": "overloaded_error", "message": "x"}}, "error")


def b_answers(seen: Any) -> Stream:
    return Stream([START + BLOCK + TOKEN, END], headers=SSE)


B_BODY = START + BLOCK + TOKEN + END


def pair(a: Upstream, b: Upstream, **extra: Any) -> dict[str, Any]:
    failover = {"retry_ambiguous": True, **extra.pop("failover", {})}
    breaker = {"failure_threshold": 1, **extra.pop("breaker", {})}
    return route(
        ("a", a.url + "/v1"), ("b", b.url + "/v1"), failover=failover, breaker=breaker, **extra
    )


@pytest.fixture
def make(make: MakeDriver) -> MakeDriver:
    """The shared `make`, with the caller's own timeout far above every limit under test."""
    return functools.partial(make, timeout=10.0)


def test_pings_and_keepalives_do_not_count_as_the_first_token(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A sends its metadata and then a ping every 0.1 s for 5 s: first_byte_timeout (2 s) still fails it over, and B's stream is delivered."""
    a.behaviour = lambda _: Stream([KEEPALIVE + START, *[PING] * 50, TOKEN], headers=SSE, delay=0.1)
    b.behaviour = b_answers
    d = make(pair(a, b, failover={"first_byte_timeout": FIRST_BYTE}))
    r = d.post(a.url + MESSAGES, json={"stream": True})
    assert (r.body, r.extensions["sidestep"]["target"], a.calls) == (B_BODY, "b", 1)


def test_a_role_only_chat_chunk_then_silence_fails_over(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A chat stream whose first chunk only names the role, then goes quiet, fails over after first_byte_timeout."""
    a.behaviour = lambda _: Stream(
        [chat(role="assistant", content=""), chat(content="late")], headers=SSE, stall_after=1
    )
    b.behaviour = lambda _: Stream([chat(role="assistant", content="b"), b"data: [DONE]\n\n"])
    d = make(pair(a, b, failover={"first_byte_timeout": FIRST_BYTE}))
    r = d.post(a.url + CHAT, json={"stream": True})
    assert (r.extensions["sidestep"]["target"], a.calls) == ("b", 1)


def test_held_bytes_reach_the_caller_with_the_first_token_byte_for_byte(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Comments, blank lines, pings and metadata over many chunks (a CRLF split between two) come before the content, all of them, in order, from A."""
    held = [
        KEEPALIVE,
        b"\r",
        b"\n",
        PING,
        START[:10],
        START[10:],
        b"event: ping\r\ndata:\r\n\r\n",
        BLOCK,
    ]
    chunks = [*held, TOKEN, END]
    a.behaviour = lambda _: Stream(chunks, headers=SSE, delay=0.01)
    d = make(pair(a, b))
    got: list[bytes] = []
    r = d.stream("POST", a.url + MESSAGES, got.append, json={"stream": True})
    assert r.body == b"".join(chunks)
    assert (r.extensions["sidestep"]["target"], b.calls) == ("a", 0)


def test_a_stream_cut_before_its_first_token_fails_over(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A sends a keep-alive, a ping and its metadata, then drops the connection: nothing of A reached the caller, so B answers."""
    a.behaviour = lambda _: Stream([KEEPALIVE + PING + START, TOKEN], headers=SSE, cut_after=1)
    b.behaviour = b_answers
    d = make(pair(a, b))
    r = d.post(a.url + MESSAGES, json={"stream": True})
    assert (r.body, r.extensions["sidestep"]["target"]) == (B_BODY, "b")


@pytest.mark.parametrize(
    ("commit", "path"), [("first_byte", MESSAGES), ("first_token", "/v1/events")]
)
def test_a_keepalive_is_the_commit_point_with_first_byte_or_an_unknown_dialect(
    make: MakeDriver, a: Upstream, b: Upstream, commit: str, path: str
) -> None:
    """With commit: first_byte, or a stream whose path names no dialect, A's keep-alive is handed over: its cut reaches the caller and B is never asked."""
    a.behaviour = lambda _: Stream([KEEPALIVE + PING, TOKEN], headers=SSE, cut_after=1)
    d = make(pair(a, b, route={"commit": commit}))
    with pytest.raises(d.http.TransportError):
        d.stream("POST", a.url + path, lambda _: None, json={"stream": True})
    assert b.calls == 0


def test_past_the_hold_limit_the_answer_is_handed_over(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """More than 256 KiB of keep-alives before any content: the stream is handed over anyway, and its cut reaches the caller."""
    comment = b":" + b"x" * 1022 + b"\n"
    a.behaviour = lambda _: Stream([comment * 64] * 5 + [TOKEN], headers=SSE, cut_after=5)
    d = make(pair(a, b))
    with pytest.raises(d.http.TransportError):
        d.stream("POST", a.url + MESSAGES, lambda _: None, json={"stream": True})
    assert b.calls == 0


def test_leading_whitespace_of_a_json_answer_is_held(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A JSON answer that sends blank lines while queued and is then cut fails over; one that answers is delivered whitespace and all."""
    json_type = {"content-type": "application/json"}
    a.behaviour = lambda _: Stream([b"\n", b"  \n", b'{"a": 1}'], headers=json_type, cut_after=2)
    b.behaviour = lambda _: Respond(body={"b": 1})
    d = make(pair(a, b, breaker={"failure_threshold": 2}))  # A's failure leaves it open to try
    assert d.post(a.url + "/v1/x", json={}).extensions["sidestep"]["target"] == "b"
    a.behaviour = lambda _: Stream([b"\n", b"  \n", b'{"a": 1}'], headers=json_type, delay=0.01)
    r = d.post(a.url + "/v1/x", json={})
    assert (r.body, r.extensions["sidestep"]["target"]) == (b'\n  \n{"a": 1}', "a")


def test_json_whitespace_does_not_count_as_the_first_byte(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Whitespace every 0.1 s for 5 s does not keep a JSON answer (one that does not stream) from failing over after response_timeout."""
    json_type = {"content-type": "application/json"}
    a.behaviour = lambda _: Stream([b"\n"] * 50 + [b"{}"], headers=json_type, delay=0.1)
    b.behaviour = lambda _: Respond(body={"b": 1})
    d = make(pair(a, b, failover={"response_timeout": FIRST_BYTE}))
    assert d.post(a.url + "/v1/x", json={}).extensions["sidestep"]["target"] == "b"


def test_after_the_first_token_pings_do_not_reset_stall_timeout(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A sends its first token, then only pings every 0.1 s for 6 s: the caller gets the token, then a ReadTimeout for the stall, and A's scope counts it."""
    a.behaviour = lambda _: Stream(
        [START + BLOCK + TOKEN, *[PING] * 60, END], headers=SSE, delay=0.1
    )
    d = make(pair(a, b, failover={"stall_timeout": STALL}))
    got: list[bytes] = []
    with pytest.raises(d.http.ReadTimeout):
        d.stream("POST", a.url + MESSAGES, got.append, json={"stream": True})
    assert b"".join(got).startswith(START + BLOCK + TOKEN)
    assert END not in b"".join(got)
    [scope] = [s for s in d.transport.suspensions() if s.target == "a"]
    assert scope.state == "open"


def test_real_events_keep_a_slow_stream_alive_past_stall_timeout(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Tokens closer together than stall_timeout, with pings between them, are read whole however long the answer (here longer than the limit)."""
    body = [START + BLOCK + TOKEN, *[PING, TOKEN] * 30, END]  # 61 gaps of 0.05 s
    a.behaviour = lambda _: Stream(body, headers=SSE, delay=IN_TIME / 40)
    d = make(pair(a, b, failover={"stall_timeout": IN_TIME}))  # each gap meets it
    r = d.stream("POST", a.url + MESSAGES, lambda _: None, json={"stream": True})
    assert r.body == b"".join(body)


# -- an error event before any content --------------------------------------------------------


def test_an_overload_event_after_a_200_fails_over_and_counts_against_the_target(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Anthropic's 200 then event: error overloaded_error fails over to B, and opens A's origin+model scope as unavailable."""
    a.behaviour = lambda _: Stream([PING + START, OVERLOADED], headers=SSE)
    b.behaviour = b_answers
    d = make(pair(a, b))
    r = d.post(a.url + MESSAGES, json={"model": "m", "stream": True})
    assert (r.body, r.extensions["sidestep"]["target"]) == (B_BODY, "b")
    [scope] = [s for s in d.transport.suspensions() if s.target == "a"]
    assert (scope.scope, scope.reason, scope.state) == ("origin+model", "unavailable", "open")


@pytest.mark.parametrize(
    ("path", "error"),
    [
        (CHAT, sse({"error": {"message": "boom", "type": "server_error", "code": None}})),
        (RESPONSES, msg("response.failed", response={"error": {"code": "server_error"}})),
        (RESPONSES, msg("error", code="server_error", message="boom")),
    ],
    ids=["chat", "responses-failed", "responses-error"],
)
def test_an_openai_error_event_before_content_fails_over(
    make: MakeDriver, a: Upstream, b: Upstream, path: str, error: bytes
) -> None:
    """OpenAI's error chunk, response.failed or error event before any content fails over to B."""
    created = msg("response.created", response={"id": "r"}) if path == RESPONSES else b""
    a.behaviour = lambda _: Stream([created + error], headers=SSE)
    b.behaviour = lambda _: Respond(body={"b": 1})
    d = make(pair(a, b))
    r = d.post(a.url + path, json={"stream": True})
    assert (r.extensions["sidestep"]["target"], a.calls) == ("b", 1)


def test_a_rate_limit_event_suspends_the_target_as_a_429_would(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A streamed rate_limit_error before any content fails over and suspends A as rate_limited."""
    limited = sse({"type": "error", "error": {"type": "rate_limit_error", "message": "x"}}, "error")
    a.behaviour = lambda _: Stream([START + limited], headers=SSE)
    b.behaviour = b_answers
    d = make(pair(a, b))
    r = d.post(a.url + MESSAGES, json={"model": "m", "stream": True})
    assert r.extensions["sidestep"]["target"] == "b"
    [scope] = [s for s in d.transport.suspensions() if s.target == "a"]
    assert scope.reason == "rate_limited"


def test_the_last_candidates_error_stream_reaches_the_caller_as_it_came(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Both targets open with an error event: the caller gets B's 200 and every byte of its stream, held ones first."""
    chunks = [KEEPALIVE, PING + START, OVERLOADED, b": after\n\n"]
    a.behaviour = lambda _: Stream([OVERLOADED], headers=SSE)
    b.behaviour = lambda _: Stream(chunks, headers=SSE)
    d = make(pair(a, b))
    r = d.stream("POST", a.url + MESSAGES, lambda _: None, json={"stream": True})
    assert (r.status, r.body, r.extensions["sidestep"]["target"]) == (200, b"".join(chunks), "b")
    assert {s.target for s in d.transport.suspensions()} == {"a", "b"}


def test_an_error_the_request_is_at_fault_for_is_handed_over(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """An invalid_request_error event is the request's fault, as its 400 would be: A's stream is the answer, B is not asked, nothing is counted."""
    bad = sse(
        {"type": "error", "error": {"type": "invalid_request_error", "message": "x"}}, "error"
    )
    a.behaviour = lambda _: Stream([START, bad], headers=SSE)
    d = make(pair(a, b))
    r = d.stream("POST", a.url + MESSAGES, lambda _: None, json={"stream": True})
    assert (r.body, b.calls, d.transport.suspensions()) == (START + bad, 0, [])


def test_a_buffered_route_fails_an_error_event_over_as_its_plain_answer(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """With commit: complete too, a streamed rate_limit_error suspends A as rate_limited (not as an invalid body) and B's whole stream is delivered."""
    limited = sse({"type": "error", "error": {"type": "rate_limit_error", "message": "x"}}, "error")
    a.behaviour = lambda _: Stream([PING, limited], headers=SSE)
    b.behaviour = b_answers
    d = make(pair(a, b, route={"commit": "complete"}))
    r = d.post(a.url + MESSAGES, json={"stream": True})
    assert (r.body, r.extensions["sidestep"]["target"]) == (B_BODY, "b")
    [scope] = [s for s in d.transport.suspensions() if s.target == "a"]
    assert scope.reason == "rate_limited"
