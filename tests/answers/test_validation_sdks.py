"""The validator passes an event stream exactly when the SDK's own decoder reads it whole.

Differential: each stream of the corpus below goes through the real OpenAI
or Anthropic SDK (a sync client over an httpx2 `MockTransport` that sends
it in the chunks given, the SDK's own stream iterated to its end), and
through `body_problem`. The one deliberate difference is the dialect's end
(``[DONE]``, ``response.completed``/``.failed``/``.incomplete``,
``message_stop``), which sidestep requires to tell a stream cut short and
the SDKs do not: a stream passes validation exactly when the SDK reads it
whole without an error *and* saw that end, told from what the SDK yields
(and, for ``[DONE]``, which it swallows, from its own decoder).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from openai._streaming import SSEDecoder

from sidestep._answers.validate import body_problem

SSE = "text/event-stream"
LIMIT = 1 << 20
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
RESPONSES_ENDS = {"response.completed", "response.failed", "response.incomplete"}


def ev(data: Any = None, name: str | None = None, *, raw: str | None = None) -> str:
    """One event as text: `event:` when named, then `data:` (JSON-encoded unless `raw`)."""
    head = f"event: {name}\n" if name is not None else ""
    payload = raw if raw is not None else json.dumps(data)
    return f"{head}data: {payload}\n\n"


def chunk(**delta: Any) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
    }


CHAT_BODY = ev(chunk(role="assistant", content="")) + ev(chunk(content="hi"))
CHAT_DONE = "data: [DONE]\n\n"


def resp(kind: str, **fields: Any) -> str:
    return ev({"type": kind, **fields}, kind)


RESPONSES_OPEN = resp("response.created", response={"id": "r", "status": "in_progress"})
RESPONSES_BODY = RESPONSES_OPEN + resp("response.output_text.delta", delta="hi")
RESPONSES_END = resp("response.completed", response={"id": "r", "status": "completed"})


def msg(kind: str, **fields: Any) -> str:
    return ev({"type": kind, **fields}, kind)


MESSAGES_BODY = (
    msg("message_start", message={"id": "m", "content": []})
    + msg("content_block_start", index=0, content_block={"type": "text", "text": ""})
    + msg("content_block_delta", index=0, delta={"type": "text_delta", "text": "hi"})
)
MESSAGES_END = msg("message_stop")

OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}

# (name, dialect, body): every shape an upstream, a proxy or a keep-alive may give.
CORPUS: list[tuple[str, str, bytes]] = []


def case(name: str, dialect: str, text: str | bytes) -> None:
    CORPUS.append((name, dialect, text.encode() if isinstance(text, str) else text))


for d, body, end in (
    ("chat", CHAT_BODY, CHAT_DONE),
    ("responses", RESPONSES_BODY, RESPONSES_END),
    ("messages", MESSAGES_BODY, MESSAGES_END),
):
    whole = body + end
    case("whole", d, whole)
    case("missing-end", d, body)
    case("empty", d, "")
    case("crlf", d, whole.replace("\n", "\r\n"))
    case("cr", d, whole.replace("\n", "\r"))
    case("comments", d, ": keep-alive\n\n" + body + ": keep-alive\n\n" + end)
    case("leading-blank-lines", d, "\n\n\n" + whole)
    case("extra-blank-lines", d, body.replace("\n\n", "\n\n\n\n") + end)
    case("bom", d, "\ufeff" + whole)
    case("bom-before-garbage", d, "\ufeffdata: not json\n\n" + whole)
    case("bom-before-comment", d, "\ufeff: hi\n\n" + whole)
    case("ping-empty-data", d, "event: ping\ndata:\n\n" + whole)
    case("ping-no-data", d, "event: ping\n\n" + whole)
    case("ping-not-json", d, "event: ping\ndata: keep-alive\n\n" + whole)
    case("ping-json", d, ev({"type": "ping"}, "ping") + whole)
    case("unnamed-heartbeat", d, "data: heartbeat\n\n" + whole)
    case("unnamed-empty-data", d, "data:\n\n" + whole)
    case("unnamed-json", d, "data: {}\n\n" + whole)
    case("unknown-event-json", d, body + ev({"type": "vendor.note"}, "vendor.note") + end)
    case("unknown-event-not-json", d, body + "event: vendor.note\ndata: hello\n\n" + end)
    case("not-json-in-content", d, body + ev(name="content", raw='{"choices": [') + end)
    case("not-json-unnamed", d, body + ev(raw="{broken") + end)
    case("json-not-object", d, body + ev([1, 2], "x") + ev(7) + end)
    case("unknown-field", d, "x-proxy-note: cached\n" + whole)
    case("html-line", d, "<html><body>Bad gateway</body></html>\n" + whole)
    case("html-page", d, "<html><body>Bad gateway</body></html>\n")
    case("retry-number", d, "retry: 3000\n\n" + whole)
    case("retry-not-number", d, "retry: soon\n\n" + whole)
    case("id-then-blank-lines", d, "id: 1\n" + body + "\n" + end)
    case("id-with-nul", d, "id: 1\0\n" + body + "\n" + end)
    case("empty-event-name", d, "event:\n" + whole)
    case("multiline-data", d, 'event: x\ndata: {"a":\ndata: 1}\n\n' + whole)
    case("last-event-unterminated", d, whole + "event: x\ndata: not json")
    case("not-utf8-comment", d, b": \xff\n\n" + whole.encode())
    case("not-utf8-after", d, whole.encode() + b"data: \xff\n\n")
    case("done-then-garbage", d, body + CHAT_DONE + "data: <html>\n\n" + end)
    case("done-spaced", d, body + "data:  [DONE]\n\n" + end)
    case("done-unspaced", d, body + "data:[DONE]\n\n" + end)
    case("done-suffixed", d, body + "data: [DONE] bye\n\n" + end)
    case("anthropic-error", d, ev(OVERLOADED, "error") + whole)
    case("anthropic-error-not-json", d, "event: error\ndata: overloaded\n\n" + whole)
    case("anthropic-error-after", d, body + end + ev(OVERLOADED, "error"))
    case("openai-error", d, ev({"error": {"message": "boom", "type": "server_error"}}) + whole)
    case("openai-error-null", d, ev({"error": None, "x": 1}) + whole)
    case("openai-thread-error", d, ev({"error": {"m": 1}}, "thread.run.failed") + whole)
    case("responses-error", d, body + resp("error", code="server_error", message="x") + end)
    case("responses-failed", d, body + resp("response.failed", response={"error": {}}))
    case("messages-stop-name-only", d, body + ev({"type": "message_delta"}, "message_stop"))
    case("messages-stop-unnamed", d, body + ev({"type": "message_stop"}))


def chunks_of(body: bytes, split: str) -> list[bytes]:
    if split == "whole":
        return [body] if body else []
    if split == "bytes":
        return [body[i : i + 1] for i in range(len(body))]
    return [body[i : i + 7] for i in range(0, len(body), 7)]


class Sdks:
    """One sync client per SDK over a MockTransport that sends `self.chunks`."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

        def handler(request: httpx2.Request) -> httpx2.Response:
            return httpx2.Response(200, headers={"content-type": SSE}, content=iter(self.chunks))

        def http() -> httpx2.Client:
            return httpx2.Client(transport=httpx2.MockTransport(handler))

        self.openai = openai.OpenAI(
            api_key="k", base_url="http://sdk.test/v1", http_client=http(), max_retries=0
        )
        self.anthropic = anthropic.Anthropic(
            api_key="k", base_url="http://sdk.test", http_client=http(), max_retries=0
        )

    def read(self, dialect: str, chunks: list[bytes]) -> tuple[bool, bool]:
        """Whether the SDK read the stream whole without an error, and whether it saw its end."""
        self.chunks = chunks
        user = [{"role": "user", "content": "hi"}]
        try:
            if dialect == "chat":
                stream: Any = self.openai.chat.completions.create(
                    model="m", messages=user, stream=True
                )
            elif dialect == "responses":
                stream = self.openai.responses.create(model="m", input="hi", stream=True)
            else:
                stream = self.anthropic.messages.create(
                    model="m", max_tokens=8, messages=user, stream=True
                )
            kinds = [getattr(event, "type", None) for event in stream]
        except Exception:
            return False, False
        if dialect == "chat":
            return True, _done(chunks)
        if dialect == "responses":
            return True, bool(RESPONSES_ENDS & set(kinds))
        return True, "message_stop" in kinds


def _done(chunks: list[bytes]) -> bool:
    """Whether the OpenAI SDK's own decoder meets ``[DONE]``, where its stream stops."""
    try:
        return any(e.data.startswith("[DONE]") for e in SSEDecoder().iter_bytes(iter(chunks)))
    except UnicodeDecodeError:  # only past a [DONE] the stream stopped at, when it read whole
        return True


@pytest.fixture(scope="module")
def sdks() -> Iterator[Sdks]:
    clients = Sdks()
    yield clients
    clients.openai.close()
    clients.anthropic.close()


@pytest.mark.parametrize("split", ["whole", "sevens", "bytes"])
@pytest.mark.parametrize(
    ("name", "dialect", "body"), CORPUS, ids=[f"{d}-{n}" for n, d, _ in CORPUS]
)
def test_the_validator_passes_a_stream_exactly_when_its_sdk_reads_it_whole_to_its_end(
    sdks: Sdks, name: str, dialect: str, body: bytes, split: str
) -> None:
    """body_problem finds nothing exactly when the SDK reads the stream, in these chunks, whole without an error and meets the dialect's end."""
    read_whole, saw_end = sdks.read(dialect, chunks_of(body, split))
    problem = body_problem(SSE, None, body, PATHS[dialect], LIMIT)
    assert (problem is None) == (read_whole and saw_end), (read_whole, saw_end, problem)


def test_the_corpus_holds_each_kind_of_case(sdks: Sdks) -> None:
    """Every dialect's corpus has streams the SDK reads to their end, streams it refuses, and streams it reads whole with no end (the one deliberate difference)."""
    for dialect in PATHS:
        seen = {sdks.read(dialect, [body]) for _, d, body in CORPUS if d == dialect}
        assert seen == {(True, True), (False, False), (True, False)}, dialect
