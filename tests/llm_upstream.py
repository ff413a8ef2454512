"""Fake LLM upstreams in the OpenAI and Anthropic wire formats, the SDKs that call them, and a proxy.

`llm(name)` is an `Upstream` behaviour answering OpenAI chat completions and
responses and Anthropic messages, as JSON or as a server-sent event stream,
with the text ``"hello from <name>"``. An `Sdk` builds a real SDK client of
one colour and asks it one question. `ForwardingProxy` is an HTTP proxy on 127.0.0.1 that
forwards absolute-form requests and records them.

Nothing here imports sidestep: `sidestep run` tests use this module in child
processes that must never import it themselves.
"""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from upstream import Action, Behaviour, Respond, Seen, Stream, Upstream

PIECES = ("hello", " from ", "{name}")


def _sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def _openai_json(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
    }


def _openai_events(pieces: list[str]) -> list[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _sse(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        )

    first = chunk({"role": "assistant", "content": pieces[0]})
    rest = [chunk({"content": piece}) for piece in pieces[1:]]
    return [first, *rest, chunk({}, "stop") + b"data: [DONE]\n\n"]


def _anthropic_json(text: str) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 3},
    }


def _anthropic_events(pieces: list[str]) -> list[bytes]:
    def delta(text: str) -> bytes:
        return _sse(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": text},
            },
            "content_block_delta",
        )

    start = {**_anthropic_json(""), "content": [], "stop_reason": None}
    first = (
        _sse({"type": "message_start", "message": start}, "message_start")
        + _sse(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            "content_block_start",
        )
        + delta(pieces[0])
    )
    end = (
        _sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
        + _sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 3},
            },
            "message_delta",
        )
        + _sse({"type": "message_stop"}, "message_stop")
    )
    return [first, *(delta(piece) for piece in pieces[1:]), end]


def _responses_json(text: str, status: str = "completed") -> dict[str, Any]:
    """An OpenAI Responses API response object holding one assistant message with `text`."""
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    message = {"type": "message", "id": "msg_1", "role": "assistant", "status": status}
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "status": status,
        "model": "m",
        "output": [{**message, "content": content}] if text else [],
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
    }


def _responses_events(pieces: list[str]) -> list[bytes]:
    """A Responses API stream: one output message, a text delta per piece, then response.completed."""
    numbers = iter(range(1 << 16))

    def event(kind: str, **fields: Any) -> bytes:
        return _sse({"type": kind, "sequence_number": next(numbers), **fields}, kind)

    text = "".join(pieces)
    at = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress"}
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}

    def delta(piece: str) -> bytes:
        # the delta comes last, so its closing quote and brace end the payload
        return event("response.output_text.delta", **at, logprobs=[], delta=piece)

    first = (
        event("response.created", response=_responses_json("", "in_progress"))
        + event("response.in_progress", response=_responses_json("", "in_progress"))
        + event("response.output_item.added", output_index=0, item={**item, "content": []})
        + event("response.content_part.added", **at, part=part)
        + delta(pieces[0])
    )
    done = {**item, "status": "completed", "content": [{**part, "text": text}]}
    end = (
        event("response.output_text.done", **at, logprobs=[], text=text)
        + event("response.content_part.done", **at, part={**part, "text": text})
        + event("response.output_item.done", output_index=0, item=done)
        + event("response.completed", response=_responses_json(text))
    )
    return [first, *(delta(piece) for piece in pieces[1:]), end]


def _faulty(events: list[bytes], fault: str | None) -> list[bytes]:
    """`events` as sent, with one event's JSON broken ("invalid") or the end event left out ("cut")."""
    if fault == "invalid":
        broken = events[1].replace(b'"}', b'"', 1)  # a proxy rewrote the event
        return [events[0], broken, *events[2:]]
    if fault == "cut":
        return events[:-1]  # the connection ends cleanly before the protocol's end
    return events


def llm(
    name: str, *, release: threading.Event | None = None, fault: str | None = None
) -> Behaviour:
    """Answer the three APIs as upstream `name`; a stream holds its later events until `release` is set.

    `fault` spoils every stream: "invalid" breaks one event's JSON, "cut" ends
    it before its end event.
    """
    pieces = [piece.format(name=name) for piece in PIECES]
    text = "".join(pieces)

    def behaviour(seen: Seen) -> Action:
        streaming = bool(seen.json().get("stream"))
        sse = {"content-type": "text/event-stream"}
        if seen.path.endswith("/chat/completions"):
            if streaming:
                events = _faulty(_openai_events(pieces), fault)
                return Stream(events, headers=sse, release=release)
            return Respond(body=_openai_json(text))
        if seen.path.endswith("/messages"):
            if streaming:
                events = _faulty(_anthropic_events(pieces), fault)
                return Stream(events, headers=sse, release=release)
            return Respond(body=_anthropic_json(text))
        if seen.path.endswith("/responses"):
            if streaming:
                events = _faulty(_responses_events(pieces), fault)
                return Stream(events, headers=sse, release=release)
            return Respond(body=_responses_json(text))
        return Respond(404, {"error": "not found"})

    return behaviour


def unavailable(_: Seen) -> Action:
    return Respond(503, {"error": {"type": "overloaded", "message": "try later"}})


@dataclass(frozen=True)
class Sdk:
    """One SDK, seen through what the tests do with it."""

    name: str
    key_header: str  # where the SDK puts its API key
    key_prefix: str

    @property
    def module(self) -> Any:
        # imported when first used: a child process pays only for the SDK it calls
        return importlib.import_module(self.name)

    def base_url(self, root: str) -> str:
        # OpenAI's base URL includes the version; Anthropic's paths start with it
        return root + "/v1" if self.name == "openai" else root

    def key(self, secret: str) -> dict[str, str]:
        """The header a route target sets to send `secret` as this SDK's API key."""
        return {self.key_header: self.key_prefix + secret}

    def default_http_client(self, is_async: bool, **kw: Any) -> Any:
        """The SDK's own default httpx2 client, with the SDK's defaults."""
        names = {
            "openai": ("DefaultHttpx2Client", "DefaultAsyncHttpx2Client"),
            "anthropic": ("DefaultHttpxClient", "DefaultAsyncHttpxClient"),
        }
        return getattr(self.module, names[self.name][is_async])(**kw)

    def client(self, root: str, *, is_async: bool, **kw: Any) -> Any:
        """A new SDK client whose base URL is the upstream at `root` (``http://host:port``)."""
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 5.0)
        module = self.module
        if self.name == "openai":
            cls = module.AsyncOpenAI if is_async else module.OpenAI
        else:
            cls = module.AsyncAnthropic if is_async else module.Anthropic
        return cls(base_url=self.base_url(root), api_key="primary-key", **kw)

    def _create(self, client: Any, stream: bool, raw: bool) -> Any:
        if self.name == "openai":
            api = client.chat.completions
            kw: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        else:
            api = client.messages
            kw = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
        if stream:
            kw["stream"] = True
        return (api.with_raw_response if raw else api).create(**kw)

    def _text(self, answer: Any) -> str:
        if self.name == "openai":
            return str(answer.choices[0].message.content)
        return str(answer.content[0].text)

    def _piece(self, event: Any) -> str:
        if self.name == "openai":
            return str(event.choices[0].delta.content or "") if event.choices else ""
        return str(event.delta.text) if event.type == "content_block_delta" else ""

    def ask(
        self, client: Any, *, stream: bool = False, on_first: Callable[[], None] | None = None
    ) -> str:
        """Ask one question with a sync client; `on_first` runs when the first text arrives."""
        if not stream:
            return self._text(self._create(client, False, False))
        pieces: list[str] = []
        with self._create(client, True, False) as events:
            for event in events:
                piece = self._piece(event)
                if piece and not pieces and on_first is not None:
                    on_first()
                if piece:
                    pieces.append(piece)
        return "".join(pieces)

    async def ask_async(
        self, client: Any, *, stream: bool = False, on_first: Callable[[], None] | None = None
    ) -> str:
        """`ask` with an async client."""
        if not stream:
            return self._text(await self._create(client, False, False))
        pieces: list[str] = []
        async with await self._create(client, True, False) as events:
            async for event in events:
                piece = self._piece(event)
                if piece and not pieces and on_first is not None:
                    on_first()
                if piece:
                    pieces.append(piece)
        return "".join(pieces)

    def ask_raw(self, client: Any) -> Any:
        """Ask with a sync client; the httpx2 response, extensions included."""
        return self._create(client, False, True).http_response


OPENAI = Sdk("openai", "authorization", "Bearer ")
ANTHROPIC = Sdk("anthropic", "x-api-key", "")
SDKS = {sdk.name: sdk for sdk in (OPENAI, ANTHROPIC)}


class ForwardingProxy(Upstream):
    """An HTTP proxy for http:// URLs: it forwards each absolute-form request; `seen` lists them."""

    def __init__(self) -> None:
        self._client = httpx.Client(trust_env=False, timeout=5.0)  # never through itself
        super().__init__(self._forward, name="proxy")

    def _forward(self, seen: Seen) -> Action:
        response = self._client.request(
            seen.method,
            seen.path,  # absolute-form: the whole URL
            headers={k: v for k, v in seen.headers.items() if k not in {"host", "content-length"}},
            content=seen.body,
        )
        kept = {k: v for k, v in response.headers.items() if k in {"content-type", "retry-after"}}
        return Respond(response.status_code, response.content, kept)

    def close(self) -> None:
        super().close()
        self._client.close()
