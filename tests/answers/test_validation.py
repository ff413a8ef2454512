"""`commit: complete` refuses malformed 2xx bodies: the pure checks, then all four transports."""

from __future__ import annotations

import gzip
import json
import pickle
from typing import Any

import httpx
import httpx2
import pytest

import sidestep
from drivers import MakeDriver, route
from sidestep._answers.validate import body_problem
from upstream import Respond, Stream, Upstream

SSE = "text/event-stream"
LIMIT = 1 << 20


def sse(*payloads: str, events: tuple[str | None, ...] = ()) -> bytes:
    out = b""
    for n, payload in enumerate(payloads):
        name = events[n] if n < len(events) else None
        out += (f"event: {name}\n" if name else "").encode() + f"data: {payload}\n\n".encode()
    return out


def chat(*pieces: str) -> list[str]:
    return [
        json.dumps({"object": "chat.completion.chunk", "choices": [{"delta": {"content": p}}]})
        for p in pieces
    ]


def responses(*types: str) -> tuple[list[str], tuple[str, ...]]:
    return [json.dumps({"type": t}) for t in types], types


def messages(*types: str) -> tuple[list[str], tuple[str, ...]]:
    return [json.dumps({"type": t}) for t in types], types


# (dialect, path, valid body, body with an invalid JSON event, body cut before its end)
CHAT_OK = sse(*chat("a", "b"), "[DONE]")
CHAT_BAD = sse(*chat("a"), '{"object": "chat.completion.chunk", "choi', *chat("b"), "[DONE]")
CHAT_CUT = sse(*chat("a", "b"))
R_OK = sse(
    *responses("response.created", "response.output_text.delta", "response.completed")[0],
    events=responses("response.created", "response.output_text.delta", "response.completed")[1],
)
R_BAD = sse(
    '{"type": "response.created"}',
    "{not json",
    '{"type": "response.completed"}',
    events=("response.created", "response.output_text.delta", "response.completed"),
)
R_CUT = sse(
    '{"type": "response.created"}',
    '{"type": "response.output_text.delta"}',
    events=("response.created", "response.output_text.delta"),
)
M_OK = sse(
    '{"type": "message_start"}',
    '{"type": "content_block_delta"}',
    '{"type": "message_stop"}',
    events=("message_start", "content_block_delta", "message_stop"),
)
M_BAD = sse(
    '{"type": "message_start"}',
    '{"type": "content_block_delta"',
    '{"type": "message_stop"}',
    events=("message_start", "content_block_delta", "message_stop"),
)
M_CUT = sse(
    '{"type": "message_start"}',
    '{"type": "content_block_delta"}',
    events=("message_start", "content_block_delta"),
)

DIALECTS = {
    "openai-chat": ("/v1/chat/completions", CHAT_OK, CHAT_BAD, CHAT_CUT),
    "openai-responses": ("/v1/responses", R_OK, R_BAD, R_CUT),
    "anthropic-messages": ("/v1/messages", M_OK, M_BAD, M_CUT),
}


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_each_dialect_tells_a_valid_stream_from_an_invalid_event_and_a_cut(dialect: str) -> None:
    """A whole stream passes; one invalid JSON event, or a stream ending before its end event, does not."""
    path, ok, bad, cut = DIALECTS[dialect]
    assert body_problem(SSE, None, ok, path, LIMIT) is None
    assert "not JSON" in (body_problem(SSE, None, bad, path, LIMIT) or "")
    assert "ends before" in (body_problem(SSE, None, cut, path, LIMIT) or "")


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_the_dialect_is_read_from_the_events_whatever_the_path(dialect: str) -> None:
    """A stream behind an unrelated path is still held to its own end: its events name its dialect."""
    _, ok, _, cut = DIALECTS[dialect]
    assert body_problem(SSE, None, ok, "/proxy/x", LIMIT) is None
    assert body_problem(SSE, None, cut, "/proxy/x", LIMIT) is not None


def test_an_unknown_dialect_needs_only_its_clean_end() -> None:
    """Plain-text events, or JSON events of an unknown shape without any end marker, pass."""
    assert body_problem(SSE, None, sse("hello", "world"), "/events", LIMIT) is None
    assert body_problem(SSE, None, sse('{"n": 1}', '{"n": 2}'), "/events", LIMIT) is None
    assert (
        body_problem(SSE, None, b": keep-alive\n\nretry: 5\nid: 3\ndata: x\n\n", "/e", LIMIT)
        is None
    )


def test_an_unknown_dialect_of_json_events_still_needs_each_to_parse() -> None:
    """Once a stream's payloads are JSON, one that is not fails it, whatever its dialect."""
    problem = body_problem(SSE, None, sse('{"n": 1}', '{"n": '), "/events", LIMIT)
    assert problem is not None and "event 2" in problem


def test_a_page_served_as_an_event_stream_is_refused() -> None:
    """An HTML page with the event-stream type (a proxy's error page) is refused: in an SDK's dialect it never reaches the stream's end (the SDKs ignore its lines), elsewhere it is malformed."""
    page = b"<html><body>Bad gateway</body></html>\n"
    assert "ends before" in (body_problem(SSE, None, page, "/v1/chat/completions", LIMIT) or "")
    assert "malformed" in (body_problem(SSE, None, page, "/events", LIMIT) or "")


def test_a_json_body_must_parse() -> None:
    """application/json and +json bodies are parsed; a cut one fails, other types are not judged."""
    whole = json.dumps({"a": [1, 2, 3]}).encode()
    assert body_problem("application/json; charset=utf-8", None, whole, "/x", LIMIT) is None
    assert body_problem("application/problem+json", None, whole[:-3], "/x", LIMIT) is not None
    assert body_problem("application/json", None, whole[:-3], "/x", LIMIT) is not None
    assert body_problem("text/plain", None, whole[:-3], "/x", LIMIT) is None
    assert body_problem(None, None, whole[:-3], "/x", LIMIT) is None


def test_an_encoded_body_is_judged_decoded() -> None:
    """A gzip body is decoded first: a valid one passes, invalid JSON inside fails, a cut gzip fails, a bomb past the limit is not judged."""
    whole = json.dumps({"a": 1}).encode()
    assert body_problem("application/json", "gzip", gzip.compress(whole), "/x", LIMIT) is None
    assert body_problem("application/json", "gzip", gzip.compress(whole[:-1]), "/x", LIMIT)
    assert body_problem("application/json", "gzip", gzip.compress(whole)[:-9], "/x", LIMIT)
    bomb = gzip.compress(b"[" * (4 * LIMIT))
    assert body_problem("application/json", "gzip", bomb, "/x", LIMIT) is None


def test_a_problem_never_quotes_the_body() -> None:
    """No byte of an invalid body appears in the problem it is described by."""
    secret = "sk-do-not-echo"
    body = sse(json.dumps({"object": "chat.completion.chunk", "x": secret}), '{"' + secret)
    problem = body_problem(SSE, None, body, "/v1/chat/completions", LIMIT)
    assert problem is not None and secret not in problem and "do-not" not in problem


# -- through the transports ---------------------------------------------------------------


def complete(a: Upstream, b: Upstream, **route_extra: Any) -> dict[str, Any]:
    return route(
        ("a", a.url + "/v1"),
        ("b", b.url + "/v1"),
        route={"commit": "complete", **route_extra},
        breaker={"failure_threshold": 10},  # every request here tries A
        failover={"retry_ambiguous": True},
    )


def stream_of(body: bytes) -> Stream:
    # the events split across chunks, as a network delivers them
    return Stream(
        [body[i : i + 40] for i in range(0, len(body), 40)], headers={"content-type": SSE}
    )


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_an_invalid_or_cut_stream_fails_over_and_a_whole_one_is_delivered(
    make: MakeDriver, a: Upstream, b: Upstream, dialect: str
) -> None:
    """A's stream with an invalid event, or cut before its end, is replaced by B's whole one; A's whole one is delivered as it came."""
    path, ok, bad, cut = DIALECTS[dialect]
    d = make(complete(a, b))
    b.behaviour = lambda _: stream_of(ok)
    for body in (bad, cut):
        a.behaviour = lambda _, body=body: stream_of(body)
        r = d.post(a.url + path, json={"stream": True})
        assert (r.body, r.extensions["sidestep"]["target"]) == (ok, "b")
    a.behaviour = lambda _: stream_of(ok)
    r = d.post(a.url + path, json={"stream": True})
    assert (r.body, r.extensions["sidestep"]["target"]) == (ok, "a")


def test_a_json_body_cut_mid_way_fails_over(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """A's JSON answer ends mid-document (its length honest): B's answer is the one delivered."""
    a.behaviour = lambda _: Respond(
        body=b'{"choices": [{"text": "hal', headers={"content-type": "application/json"}
    )
    b.behaviour = lambda _: Respond(body={"choices": [{"text": "whole"}]})
    d = make(complete(a, b))
    r = d.post(a.url + "/v1/completions", json={"q": 1})
    assert json.loads(r.body) == {"choices": [{"text": "whole"}]}
    assert (a.calls, b.calls) == (1, 1)


def test_a_gzip_body_is_validated_decoded_and_delivered_raw(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A's gzip body holds invalid JSON and fails over; B's valid gzip body reaches the caller decoded by its client."""
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    a.behaviour = lambda _: Respond(body=gzip.compress(b'{"a": '), headers=dict(headers))
    b.behaviour = lambda _: Respond(body=gzip.compress(b'{"b": 1}'), headers=dict(headers))
    d = make(complete(a, b))
    r = d.post(a.url + "/v1/x", json={"q": 1})
    assert (r.body, r.extensions["sidestep"]["target"]) == (b'{"b": 1}', "b")


SECRET_BODY = b'{"object": "chat.completion.chunk", "echo": "PRIVATE-TEXT'


def test_when_every_target_answers_invalid_bodies_the_caller_gets_invalid_upstream_body(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Both targets send malformed JSON: InvalidUpstreamBody, a TransportError of the flavour, names the last target and quotes no body byte."""
    for upstream in (a, b):
        upstream.behaviour = lambda _: Respond(
            body=SECRET_BODY, headers={"content-type": "application/json"}
        )
    d = make(complete(a, b))
    with pytest.raises(sidestep.InvalidUpstreamBody) as caught:
        d.post(a.url + "/v1/chat/completions", json={"q": 1})
    error = caught.value
    assert isinstance(error, d.http.TransportError)
    assert (error.target, error.route) == ("b", "chat")
    assert "PRIVATE" not in str(error) and "PRIVATE" not in repr(error)
    assert "echo" not in str(error)
    again = pickle.loads(pickle.dumps(error))  # noqa: S301  # our own object
    assert str(again) == str(error)


def test_validate_none_hands_over_what_came(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """With validate: none the malformed body is delivered from A, as before validation existed."""
    a.behaviour = lambda _: Respond(body=SECRET_BODY, headers={"content-type": "application/json"})
    d = make(complete(a, b, validate="none"))
    r = d.post(a.url + "/v1/x", json={"q": 1})
    assert (r.body, b.calls) == (SECRET_BODY, 0)


def test_a_body_past_max_buffered_bytes_is_handed_over_unvalidated(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A stream larger than max_buffered_bytes streams on from A, unjudged, as before."""
    body = CHAT_CUT * 20
    a.behaviour = lambda _: stream_of(body)
    d = make(complete(a, b, max_buffered_bytes=len(body) // 2))
    r = d.post(a.url + "/v1/chat/completions", json={"stream": True})
    assert (r.body, b.calls) == (body, 0)


def test_first_byte_routes_do_not_validate(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """With a streaming commit point (first_token, the default) nothing is buffered, so nothing is judged: A's body is delivered."""
    a.behaviour = lambda _: Respond(body=SECRET_BODY, headers={"content-type": "application/json"})
    d = make(route(("a", a.url + "/v1"), ("b", b.url + "/v1")))
    assert d.post(a.url + "/v1/x", json={"q": 1}).body == SECRET_BODY


def test_the_error_is_a_transport_error_of_both_flavours() -> None:
    """Code that catches httpx.TransportError or httpx2.TransportError catches InvalidUpstreamBody."""
    assert issubclass(sidestep.InvalidUpstreamBody, httpx.TransportError)
    assert issubclass(sidestep.InvalidUpstreamBody, httpx2.TransportError)
    assert issubclass(sidestep.InvalidUpstreamBody, sidestep.SidestepError)
