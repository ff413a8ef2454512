"""The SSE parser and the commit point of a streamed answer (`sse`, `first_token`,
`error_events`, the core's watch): pure."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from drivers import FakeClock
from sidestep._answers import classify as c11n
from sidestep._answers.classify import Exchange, Kind
from sidestep._answers.error_events import error_answer
from sidestep._answers.first_token import ACTIVE, COMMIT, ERROR, HELD, Head, head_for
from sidestep._answers.sse import CHAT, MESSAGES, RESPONSES, UNDECODABLE, EventParser
from sidestep._common.scopes import ScopeKind
from sidestep._core.commit import _Watch
from sidestep._core.flavour import Flavour


def sse(data: Any, name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def chat(finish: str | None = None, **delta: Any) -> bytes:
    return sse(
        {"object": "chat.completion.chunk", "choices": [{"delta": delta, "finish_reason": finish}]}
    )


def msg(kind: str, **fields: Any) -> bytes:
    return sse({"type": kind, **fields}, kind)


def resp(kind: str, **fields: Any) -> bytes:
    return sse({"type": kind, **fields}, kind)


KEEPALIVE = b": keep-alive\n\n"
PING = msg("ping")
OVERLOADED = sse({"type": "error", "error": {"type": "overloaded_error", "message": "x"}}, "error")

# (dialect, what is held before the content, the first content)
HEADS = {
    "chat": (
        CHAT,
        KEEPALIVE
        + b"\n\n"
        + chat(role="assistant", content="", refusal=None)
        + sse({"object": "chat.completion.chunk", "choices": [], "prompt_filter_results": []}),
        chat(content="Hi"),
    ),
    "chat-tool-call": (
        CHAT,
        chat(role="assistant", content=None, tool_calls=[]),
        chat(tool_calls=[{"index": 0, "id": "call_1", "function": {"name": "f", "arguments": ""}}]),
    ),
    "responses": (
        RESPONSES,
        KEEPALIVE
        + resp("response.created", response={"id": "r"})
        + resp("response.in_progress", response={"id": "r"})
        + resp("response.output_item.added", item={"type": "message", "id": "m", "content": []})
        + resp("response.content_part.added", part={"type": "output_text", "text": ""}),
        resp("response.output_text.delta", delta="Hi"),
    ),
    "responses-function-call": (
        RESPONSES,
        resp("response.created", response={"id": "r"}),
        resp("response.output_item.added", item={"type": "function_call", "name": "f"}),
    ),
    "messages": (
        MESSAGES,
        KEEPALIVE
        + PING
        + msg("message_start", message={"id": "m", "content": []})
        + b"event: ping\ndata:\n\n"
        + b"data: heartbeat\n\n"
        + msg("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        msg("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hi"}),
    ),
    "messages-tool-use": (
        MESSAGES,
        msg("message_start", message={"id": "m"}),
        msg("content_block_start", content_block={"type": "tool_use", "id": "t", "name": "f"}),
    ),
}


def feed_all(head: Head, chunks: list[bytes]) -> list[int]:
    return [head.feed(chunk) for chunk in chunks]


@pytest.mark.parametrize("case", sorted(HEADS))
def test_a_stream_commits_in_the_chunk_that_completes_its_first_content(case: str) -> None:
    """Whatever the chunks, everything before the first content is held and the chunk that completes it commits."""
    dialect, held, content = HEADS[case]
    body = held + content + KEEPALIVE
    end = len(held) + len(content)  # the content's blank line completes it
    for split in range(1, len(body)):
        head = Head(dialect)
        first, second = body[:split], body[split:]
        steps = feed_all(head, [first, second])
        assert steps == ([COMMIT, HELD] if split >= end else [HELD, COMMIT]), split


@pytest.mark.parametrize("case", sorted(HEADS))
def test_fed_a_byte_at_a_time_a_stream_commits_at_its_first_contents_last_byte(case: str) -> None:
    """Byte by byte, the commit point is the last byte of the first content event, never earlier."""
    dialect, held, content = HEADS[case]
    body = held + content
    steps = feed_all(Head(dialect), [body[i : i + 1] for i in range(len(body))])
    assert steps.index(COMMIT) == len(body) - 1
    assert set(steps[:-1]) == {HELD}


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"])
def test_every_line_end_is_read_alike(line_end: bytes) -> None:
    """LF, CRLF and CR line ends, a CRLF split between two chunks included, give the same commit point."""
    _, held, content = HEADS["messages"]
    body = (held + content).replace(b"\n", line_end)
    head = Head(MESSAGES)
    cut = body.index(b"\r\n") + 1 if line_end == b"\r\n" else len(body) // 2
    assert feed_all(head, [body[:cut], body[cut:]]) == [HELD, COMMIT]


@pytest.mark.parametrize(
    "chunks",
    [
        [b"data: 1\r", b"\n", b"\n"],
        [b"data: 1\r", b"\n\r", b"\n"],
        [b"da", b"ta: 1", b"\r", b"\r"],
        [b"data: 1\n", b"", b"\n"],
        [b"data: 1\r\n\r", b"\n"],
    ],
    ids=["crlf-then-lf", "crlf-then-crlf", "cr-cr", "empty-chunk", "crlf-crlf"],
)
def test_line_ends_split_between_chunks_dispatch_once(chunks: list[bytes]) -> None:
    """However a line end falls between chunks, the event is dispatched once, at its blank line."""
    parser = EventParser()
    events = [event for chunk in chunks for event in parser.feed(chunk)]
    assert [event.data for event in events] == ["1"]


def test_an_empty_chunk_between_a_cr_and_its_lf_ends_no_line() -> None:
    """A CRLF split by an empty chunk is still one line end, as the SDKs read it: the event's second data line is not cut off into an event of its own."""
    parser = EventParser()
    chunks = [b"data: 1\r", b"", b"\ndata: 2\r\n\r\n"]
    events = [event for chunk in chunks for event in parser.feed(chunk)]
    assert [event.data for event in events] == ["1\n2"]


def test_an_error_event_before_any_content_is_an_error() -> None:
    """Anthropic's overload after a ping fails the head and keeps the error's payload."""
    head = Head(MESSAGES)
    assert feed_all(head, [PING + msg("message_start", message={}), OVERLOADED]) == [HELD, ERROR]
    assert head.failed and head.error["error"]["type"] == "overloaded_error"


@pytest.mark.parametrize(
    ("dialect", "event"),
    [
        (MESSAGES, b"event: error\ndata: not json\n\n"),
        (MESSAGES, sse({"type": "error", "error": {"type": "api_error"}}, "message")),
        (CHAT, sse({"error": {"message": "boom", "type": "server_error"}})),
        (RESPONSES, resp("error", code="server_error", message="boom")),
        (RESPONSES, resp("response.failed", response={"error": {"code": "server_error"}})),
    ],
    ids=["anthropic-not-json", "anthropic-payload", "chat", "responses-error", "responses-failed"],
)
def test_each_dialects_error_events_are_errors(dialect: str, event: bytes) -> None:
    """An error as each dialect sends it, before any content, is an error."""
    head = Head(dialect)
    assert head.feed(event) == ERROR and head.failed


def test_after_the_commit_point_only_real_events_count() -> None:
    """After the first content, keep-alives, pings and unnamed events are HELD, a real event ACTIVE, and an error is no longer judged."""
    head = Head(MESSAGES)
    _, held, content = HEADS["messages"]
    assert head.feed(held + content) == COMMIT
    assert head.feed(KEEPALIVE + PING + b"data: x\n\n") == HELD
    assert head.feed(OVERLOADED) == ACTIVE
    assert head.feed(msg("content_block_delta", delta={"text": "more"})) == ACTIVE
    chat_head = Head(CHAT)
    assert chat_head.feed(chat(content="Hi")) == COMMIT
    assert chat_head.feed(KEEPALIVE) == HELD
    assert chat_head.feed(b"data: [DONE]\n\n") == ACTIVE


@pytest.mark.parametrize(
    "first",
    [b"data: [DONE]\n\n", b"data: not json\n\n", sse([1, 2]), sse({"no": "choices"}), chat("stop")],
    ids=["done", "not-json", "not-an-object", "unknown-shape", "finish-reason"],
)
def test_what_a_chat_head_does_not_understand_commits(first: bytes) -> None:
    """An end, a payload that is no JSON object or no chunk, or a finish reason: the answer is handed over there."""
    assert Head(CHAT).feed(first) == COMMIT


def test_a_line_that_is_not_utf8_commits() -> None:
    """A head does not judge what the SDK could not read: the answer is handed over."""
    assert Head(MESSAGES).feed(b"event: \xff\n\n") == COMMIT


def test_a_json_body_holds_only_its_leading_whitespace() -> None:
    """Blank lines and spaces before a JSON body are held; its first other byte commits; then every chunk counts."""
    head = Head(None)
    assert feed_all(head, [b"\n", b"  \r\n\t", b' {"a"', b": 1}"]) == [HELD, HELD, COMMIT, ACTIVE]


@pytest.mark.parametrize(
    ("content_type", "encoding", "path", "reads"),
    [
        ("text/event-stream", None, "/v1/chat/completions", True),
        ("text/event-stream; charset=utf-8", None, "/v1/messages", True),
        ("text/event-stream", None, "/openai/deployments/d/chat/completions", True),
        ("text/event-stream", None, "/v1/responses/", True),
        ("text/event-stream", None, "/v1/events", False),
        ("text/event-stream", "gzip", "/v1/messages", False),
        ("application/json", None, "/v1/anything", True),
        ("application/problem+json", "identity", "/x", True),
        ("application/json", "br", "/v1/chat/completions", False),
        ("text/plain", None, "/v1/chat/completions", False),
        (None, None, "/v1/chat/completions", False),
    ],
)
def test_which_answers_commit_at_their_first_token(
    content_type: str | None, encoding: str | None, path: str, reads: bool
) -> None:
    """Event streams of a dialect the path names and JSON bodies have a head; other types, paths and encoded bodies commit at their first byte."""
    assert (head_for(content_type, encoding, path) is not None) == reads


def test_after_the_commit_point_a_line_keeps_only_its_first_bytes() -> None:
    """However long an event's data after the commit point, the parser keeps at most a line's first bytes."""
    parser = EventParser(keep=False)
    assert parser.feed(b"data: " + b"x" * 100_000) == []
    assert len(parser._line) <= 64
    [event] = parser.feed(b"y" * 100_000 + b"\n\n")
    assert event.data == "" and len(parser._line) == 0


def test_a_line_that_is_not_utf8_is_marked_where_it_stands() -> None:
    """The parser returns UNDECODABLE in the place of a line that is not UTF-8, and goes on."""
    events = EventParser().feed(b"data: 1\n\ndata: \xff\n\ndata: 2\n\n")
    assert [e if e is UNDECODABLE else e.data for e in events] == ["1", UNDECODABLE, "2"]


# -- an error event as the answer it stands for ---------------------------------------------


def judged(payload: Any) -> c11n.Verdict:
    status, body = error_answer(payload)
    return c11n.classify(Exchange("POST", {}, status=status, body=body))


def test_an_overload_event_is_judged_as_a_529() -> None:
    """Anthropic's overloaded_error after a 200 is an availability failure of the origin+model scope that fails over."""
    verdict = judged(OVERLOADED_PAYLOAD)
    assert (verdict.kind, verdict.reason, verdict.scope, verdict.failover) == (
        Kind.FAILURE,
        c11n.UNAVAILABLE,
        ScopeKind.MODEL,
        True,
    )
    assert error_answer(OVERLOADED_PAYLOAD)[0] == 529


OVERLOADED_PAYLOAD = {"type": "error", "error": {"type": "overloaded_error", "message": "x"}}


@pytest.mark.parametrize(
    ("payload", "status", "reason"),
    [
        ({"type": "error", "error": {"type": "rate_limit_error"}}, 429, c11n.RATE_LIMITED),
        ({"error": {"type": "requests", "code": "rate_limit_exceeded"}}, 429, c11n.RATE_LIMITED),
        ({"error": {"type": "insufficient_quota"}}, 429, c11n.QUOTA_EXHAUSTED),
        ({"type": "error", "error": {"type": "api_error"}}, 500, c11n.UNAVAILABLE),
        ({"error": {"message": "boom", "type": "server_error"}}, 500, c11n.UNAVAILABLE),
        ({"type": "error", "code": "server_error", "message": "x"}, 500, c11n.UNAVAILABLE),
        (
            {"type": "response.failed", "response": {"error": {"code": "rate_limit_exceeded"}}},
            429,
            c11n.RATE_LIMITED,
        ),
        ({"error": {"code": 502, "message": "bad gateway"}}, 502, c11n.UNAVAILABLE),
        ({"error": {"type": "something_new"}}, 500, c11n.UNAVAILABLE),
        (None, 500, c11n.UNAVAILABLE),
        ({"type": "error", "error": {"type": "invalid_request_error"}}, 400, c11n.CLIENT_ERROR),
        (
            {"error": {"type": "invalid_request_error", "code": "context_length_exceeded"}},
            400,
            c11n.CONTEXT_OVERFLOW,
        ),
    ],
    ids=[
        "anthropic-rate-limit",
        "openai-rate-limit",
        "openai-quota",
        "anthropic-api-error",
        "openai-server-error",
        "responses-error-event",
        "responses-failed",
        "gateway-status",
        "unknown",
        "not-json",
        "request-at-fault",
        "context-overflow",
    ],
)
def test_an_error_event_is_judged_as_its_plain_answer(
    payload: Any, status: int, reason: str
) -> None:
    """Each error, streamed, gets the status and verdict the same error gets as a plain answer."""
    assert error_answer(payload)[0] == status
    assert judged(payload).reason == reason


# -- the core's watch: a head and a clock -----------------------------------------------------

FLAVOUR = Flavour(httpx)
REQUEST = httpx.Request("POST", "http://a.example/v1/messages")


def watch(clock: FakeClock, deadline: float | None = None, stall: float | None = None) -> _Watch:
    return _Watch(Head(MESSAGES), clock, deadline, stall, FLAVOUR, REQUEST)


def test_keepalives_past_the_first_byte_deadline_raise_a_read_timeout() -> None:
    """A ping arriving once the first-byte deadline has passed, with no content yet, raises the flavour's ReadTimeout."""
    clock = FakeClock(100.0)
    w = watch(clock, deadline=110.0)
    assert w.feed(PING) is False
    clock.advance(10.0)
    with pytest.raises(httpx.ReadTimeout, match="first-byte"):
        w.feed(PING)


def test_keepalives_do_not_reset_the_stall_bound() -> None:
    """The stall is counted from the last chunk that counted: pings in between neither reset it nor keep the body alive."""
    clock = FakeClock(100.0)
    w = watch(clock, stall=5.0)
    assert w.feed(msg("content_block_delta", delta={"text": "Hi"})) is True
    clock.advance(3.0)
    assert w.feed(PING) is False
    assert w.stall_left() == pytest.approx(2.0)
    clock.advance(1.0)
    assert w.feed(msg("content_block_delta", delta={"text": "more"})) is False
    assert w.stall_left() == pytest.approx(5.0)
    clock.advance(5.0)
    with pytest.raises(httpx.ReadTimeout, match="stall_timeout"):
        w.feed(PING)


def test_held_chunks_do_not_reset_the_stall_before_the_commit_point() -> None:
    """Before the first content, the stall counts from the headers whatever is held meanwhile."""
    clock = FakeClock(100.0)
    w = watch(clock, stall=5.0)
    clock.advance(4.0)
    assert w.feed(PING) is False
    assert w.stall_left() == pytest.approx(1.0)
    clock.advance(1.0)
    with pytest.raises(httpx.ReadTimeout):
        w.feed(msg("message_start", message={}))


def test_an_answer_handed_over_past_the_bound_is_watched_as_committed() -> None:
    """Settled without its commit point, the watch raises no first-byte timeout and counts the stall from then."""
    clock = FakeClock(100.0)
    w = watch(clock, deadline=101.0, stall=5.0)
    w.feed(PING)
    clock.advance(2.0)
    w.settle()
    assert w.feed(PING) is False  # past the first-byte deadline: no longer its business
    assert w.stall_left() == pytest.approx(5.0)
