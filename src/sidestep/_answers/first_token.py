"""Where a streamed answer starts: its first token (``commit: first_token``, DESIGN §3.1).

Pure, no I/O. A head finds a routed answer's commit point: for an event
stream of a dialect the request's path names — OpenAI chat completions (and
legacy completions), OpenAI Responses, Anthropic Messages — the first event
carrying content, read with `sse.EventParser`; for a JSON body, its first
byte that is not whitespace. What comes before (comments, blank lines,
pings, metadata events, leading whitespace) is held, and is no sign of life;
an error event before any content is found, for `error_events.error_answer`
to turn into the plain answer the classifier judges.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

from .sse import CHAT, MESSAGES, RESPONSES, UNDECODABLE, Event, EventParser, dialect_of

__all__ = [
    "ACTIVE",
    "COMMIT",
    "ERROR",
    "HELD",
    "HOLD_LIMIT",
    "Head",
    "head_for",
]

HOLD_LIMIT: Final = 256 * 1024
"""The most bytes held before a stream's first content: past it, the answer is handed
over anyway. Ample for metadata: OpenAI's ``response.created`` echoes the request's
instructions and tools, which can run to tens of KiB."""

# What feeding a head a chunk says.
HELD: Final = 0  # nothing that counts: keep-alives, metadata, part of an event
ACTIVE: Final = 1  # after the commit point: a real event (not a keep-alive, not a ping)
COMMIT: Final = 2  # the commit point: the first content, an end, or something not understood
ERROR: Final = 3  # an error event before any content (`Head.error`)

# HELD, COMMIT, or ERROR with the error's payload (None when it is no JSON)
Verdict = int | tuple[int, Any]


def _payload(data: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _filled(value: Any) -> bool:
    return value is not None and value != "" and value != [] and value != {}


def _shell(part: Any, *, but: tuple[str, ...] = ("type", "id", "status", "role")) -> bool:
    """Whether `part` (a block, item or content part just opened) carries nothing yet."""
    return isinstance(part, dict) and not any(_filled(v) for k, v in part.items() if k not in but)


def _openai_error(event: Event, payload: Any) -> bool:
    # what the OpenAI SDK raises on: an "error" at the top of any payload but a thread's
    return bool(payload.get("error")) and not (event.name or "").startswith("thread.")


def _chat(event: Event) -> Verdict:
    """Chat (and legacy) completions: content is a choice with a finish reason, legacy
    text, or a delta carrying anything but its role (text, a refusal, tool calls, reasoning,
    audio). A role-only delta, an empty one and a chunk of no choices (usage, Azure's
    prompt filter results) are metadata."""
    data = event.data
    if not data:
        return HELD  # no data (an id, a retry): nothing to read
    if data.startswith("[DONE]"):
        return COMMIT
    payload = _payload(data)
    if not isinstance(payload, dict):
        return COMMIT
    if _openai_error(event, payload):
        return ERROR, payload
    choices = payload.get("choices")
    if not isinstance(choices, list):
        return COMMIT
    for choice in choices:
        if not isinstance(choice, dict):
            return COMMIT
        if choice.get("finish_reason") is not None or _filled(choice.get("text")):
            return COMMIT
        delta = choice.get("delta")
        if delta is not None and not _shell(delta, but=("role", "obfuscation")):
            return COMMIT
    return HELD


_RESPONSES_OPENED = frozenset({"response.created", "response.in_progress", "response.queued"})
_RESPONSES_METADATA = frozenset(
    {"response.created", "response.in_progress", "response.queued", "response.output_item.added"}
)
_RESPONSES_PARTS = frozenset(
    {"response.content_part.added", "response.reasoning_summary_part.added"}
)


def _responses(event: Event) -> Verdict:
    """OpenAI Responses: ``response.created``, ``.in_progress`` and ``.queued``, an output
    message or reasoning item opened with nothing in it, an empty content or summary part
    opened, are metadata; ``error`` and ``response.failed`` are errors; any other event
    is content (a delta, a function call's item naming it, an end). An event named as
    the first three, or as a delta, is known by its name (the large echo of the request
    in ``response.created`` is not parsed); any other by its data."""
    data = event.data
    if not data:
        return HELD
    name = event.name
    if name in _RESPONSES_OPENED:
        return HELD
    if name is not None and name.endswith(".delta") and name.startswith("response."):
        return COMMIT
    if data.startswith("[DONE]"):
        return COMMIT
    payload = _payload(data)
    if not isinstance(payload, dict):
        return COMMIT
    kind = payload.get("type")
    if _openai_error(event, payload) or kind in ("error", "response.failed"):
        return ERROR, payload
    if kind in _RESPONSES_METADATA:
        item = payload.get("item")
        if item is None or (_shell(item) and item.get("type") in ("message", "reasoning")):
            return HELD
        return COMMIT
    if kind in _RESPONSES_PARTS and _shell(payload.get("part")):
        return HELD
    return COMMIT


_MESSAGES_CONTENT = frozenset(
    {"content_block_delta", "content_block_stop", "message_delta", "message_stop"}
)


def _messages(event: Event) -> Verdict:
    """Anthropic Messages: ``ping``, ``message_start``, a content block opened with
    nothing in it (text or thinking not begun), an unnamed event and one without data
    (the SDK skips both) are metadata; ``error`` is an error; any other event is content
    (a delta, a tool use's block naming it, the message's end)."""
    name = event.name
    if name == "ping" or name is None:
        return HELD
    if name == "error":
        return ERROR, _payload(event.data or "")
    if not event.data or name == "message_start":
        return HELD
    if name in _MESSAGES_CONTENT:
        return COMMIT  # known by its name, as the SDK's events are: no need to parse it
    payload = _payload(event.data)
    if not isinstance(payload, dict):
        return COMMIT
    kind = payload.get("type")
    if kind == "error":
        return ERROR, payload
    if kind == "message_start":
        return HELD
    if kind == "content_block_start" and _shell(payload.get("content_block")):
        return HELD
    return COMMIT


def _openai_real(event: Event) -> bool:
    return event.data is not None


def _messages_real(event: Event) -> bool:
    return event.data is not None and event.name is not None and event.name != "ping"


_DIALECTS: dict[str, tuple[Callable[[Event], Verdict], Callable[[Event], bool]]] = {
    CHAT: (_chat, _openai_real),
    RESPONSES: (_responses, _openai_real),
    MESSAGES: (_messages, _messages_real),
}


class Head:
    """Where a routed answer's commit point is, read chunk by chunk (`feed`).

    Before it, `feed` says `HELD` until a chunk brings the commit point
    (`COMMIT`) or an error before any content (`ERROR`: `failed` is set, and
    `error` holds its payload, None when it was no JSON). After it, `feed` says `ACTIVE` for a
    chunk that completes a real event (data, not a ping) and `HELD` for one
    of keep-alives only.
    """

    __slots__ = ("_judge", "_parser", "_real", "committed", "error", "failed")

    def __init__(self, dialect: str | None) -> None:
        self.committed = False
        self.failed = False
        self.error: Any = None
        self._parser: EventParser | None = None  # None: a JSON body, its leading whitespace held
        self._judge, self._real = _DIALECTS[dialect or CHAT]
        if dialect is not None:
            self._parser = EventParser()

    def __repr__(self) -> str:
        return f"Head(committed={self.committed})"

    def commit(self) -> None:
        """The answer is handed over without its commit point (past `HOLD_LIMIT`)."""
        self.committed = True
        if self._parser is not None:
            self._parser.keep = False

    def feed(self, chunk: bytes) -> int:
        parser = self._parser
        if parser is None:  # a JSON body
            if self.committed:
                return ACTIVE
            if not chunk.strip(b" \t\r\n"):
                return HELD
            self.committed = True
            return COMMIT
        events = parser.feed(chunk)
        if self.committed:
            real = self._real
            for event in events:
                if real(event):
                    return ACTIVE
            return HELD
        for event in events:
            step = COMMIT if event is UNDECODABLE else self._judge(event)
            if step == HELD:
                continue
            self.committed = True
            parser.keep = False  # from here on, only whether events come
            if isinstance(step, tuple):
                step, self.error = step
                self.failed = True
            return step
        return HELD


def head_for(content_type: str | None, content_encoding: str | None, path: str) -> Head | None:
    """The head of a 2xx answer whose commit point is its first token; None: its first byte.

    An event stream of a dialect its path names, or a JSON body; nothing in a
    content encoding (the bytes on the wire are not the events).
    """
    if content_encoding is not None and content_encoding.strip().lower() not in ("", "identity"):
        return None
    media = (content_type or "").partition(";")[0].strip().lower()
    if media == "text/event-stream":
        dialect = dialect_of(path)
        return Head(dialect) if dialect is not None else None
    if media == "application/json" or media.endswith("+json"):
        return Head(None)
    return None
