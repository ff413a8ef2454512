"""Scenario, first_token: what holding a stream to its first token costs its time to first token.

With ``commit: first_token`` (the default) sidestep reads an LLM event
stream up to its first content before handing it over, where ``commit:
first_byte`` hands it over at its first chunk; the caller then reads the
held chunks, replayed, as it would have read them. The added time is the
scanning: the events before the content parsed and judged.

Two measures, each on the head of a typical stream of each dialect
(Anthropic: a keep-alive, ``message_start``, a ping, a text block opened,
the first delta; OpenAI chat: a role-only chunk, then the first text;
OpenAI Responses: ``response.created`` and ``.in_progress`` echoing a
request with instructions and tools, an output item and a part opened, the
first delta — one event a chunk, as upstreams send them):

- *scan*: the core's watch fed that head, alone (µs per stream);
- *time to first token*: a sync client over ``httpx.MockTransport`` (no
  network: only sidestep's own time differs) with ``first_byte_timeout``
  and ``stall_timeout`` set, from the request to the caller holding the
  chunk with the first content, ``first_token`` minus ``first_byte``,
  interleaved, the median of the rounds' differences.

The target: under 1 ms added to the time to first token.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx

import _bench as b
import sidestep
from _bench import Row
from sidestep._answers.first_token import head_for
from sidestep._core.commit import _Watch
from sidestep._core.flavour import Flavour

SCENARIO = "first_token"
SSE = {"content-type": "text/event-stream"}
LIMIT_US = 1000.0


def _event(data: dict[str, Any], name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def _messages() -> list[bytes]:
    message = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 1200, "output_tokens": 1},
    }
    return [
        b": keep-alive\n\n",
        _event({"type": "message_start", "message": message}, "message_start"),
        _event({"type": "ping"}, "ping"),
        _event(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            "content_block_start",
        ),
        _event(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Hi"},
            },
            "content_block_delta",
        ),
    ]


def _chat() -> list[bytes]:
    def chunk(delta: dict[str, Any]) -> bytes:
        return _event(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "gpt",
                "system_fingerprint": "fp",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
            }
        )

    return [chunk({"role": "assistant", "content": "", "refusal": None}), chunk({"content": "Hi"})]


def _responses() -> list[bytes]:
    tools = [
        {"type": "function", "name": f"tool_{n}", "parameters": {"type": "object"}}
        for n in range(8)
    ]
    response = {
        "id": "resp_1",
        "object": "response",
        "status": "in_progress",
        "instructions": "You are a helpful assistant. " * 40,
        "tools": tools,
        "output": [],
    }
    item = {
        "type": "message",
        "id": "msg_1",
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }
    at = {"item_id": "msg_1", "output_index": 0, "content_index": 0}

    def event(kind: str, **fields: Any) -> bytes:
        return _event({"type": kind, "sequence_number": 0, **fields}, kind)

    return [
        event("response.created", response=response),
        event("response.in_progress", response=response),
        event("response.output_item.added", output_index=0, item=item),
        event("response.content_part.added", **at, part={"type": "output_text", "text": ""}),
        event("response.output_text.delta", **at, delta="Hi"),
    ]


HEADS = {
    "anthropic messages": ("/v1/messages", _messages(), b"content_block_delta"),
    "openai chat": ("/v1/chat/completions", _chat(), b'"Hi"'),
    "openai responses": ("/v1/responses", _responses(), b"output_text.delta"),
}


def _scan_us(path: str, chunks: list[bytes], calls: int) -> float:
    """µs to feed one stream head through the core's watch (a new watch each time)."""
    flavour = Flavour(httpx)
    request = httpx.Request("POST", "http://a.example" + path)
    clock = time.monotonic
    best = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            head = head_for("text/event-stream", None, path)
            assert head is not None
            watch = _Watch(head, clock, None, 30.0, flavour, request)
            for chunk in chunks:
                if watch.feed(chunk):
                    break
        best.append((time.perf_counter() - start) / calls * 1e6)
    return b.median(best)


def _client(commit: str, chunks: list[bytes]) -> httpx.Client:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=SSE, content=iter(chunks))

    config = {
        "failover": {"first_byte_timeout": 30, "stall_timeout": 30},
        "routes": [
            {
                "name": "llm",
                "commit": commit,
                "targets": [{"name": "a", "url": "http://a.example/v1"}],
            }
        ],
    }
    transport = sidestep.FailoverTransport(config, transport=httpx.MockTransport(answer))
    return httpx.Client(transport=transport)


def _ttft(client: httpx.Client, path: str, marker: bytes) -> Callable[[], float]:
    url = "http://a.example" + path

    def one() -> float:
        start = time.perf_counter()
        with client.stream("POST", url, json={"stream": True}) as response:
            for chunk in response.iter_raw():
                if marker in chunk:
                    took = time.perf_counter() - start
                    break
            else:
                raise AssertionError("no content")
        return took

    return one


def run(quick: bool) -> list[Row]:
    rounds, per_round, scans = (3, 20, 200) if quick else (15, 200, 5000)
    rows: list[Row] = []
    worst = 0.0
    for name, (path, chunks, marker) in HEADS.items():
        scan = _scan_us(path, chunks, scans)
        rows.append(
            b.row(
                SCENARIO, f"{name}: scan of the head", scan, "µs", f"{sum(map(len, chunks))} bytes"
            )
        )
        clients = {commit: _client(commit, chunks) for commit in ("first_byte", "first_token")}
        try:
            calls = {commit: _ttft(c, path, marker) for commit, c in clients.items()}
            for call in calls.values():
                call()  # warm: the route's candidates cached, the pools made
            samples: dict[str, list[float]] = {commit: [] for commit in calls}
            for _ in range(rounds):
                for commit, call in calls.items():  # interleaved, round by round
                    samples[commit].append(b.median(call() for _ in range(per_round)))
        finally:
            for c in clients.values():
                c.close()
        base = b.median(samples["first_byte"]) * 1e6
        added = b.paired_difference(samples["first_token"], samples["first_byte"]) * 1e6
        worst = max(worst, added)
        rows.append(b.row(SCENARIO, f"{name}: time to first token, first_byte", base, "µs"))
        rows.append(
            b.row(SCENARIO, f"{name}: added by first_token", added, "µs", "median of paired rounds")
        )
    rows.append(
        b.verdict(
            SCENARIO,
            "first_token adds under 1 ms to the time to first token",
            worst,
            "µs",
            worst < LIMIT_US,
            "the worst of the three dialects",
        )
    )
    return rows
