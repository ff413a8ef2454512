"""Server-sent events as the LLM SDKs read them, and where a streamed answer starts.

Pure, no I/O. `EventParser` is the one SSE parser sidestep has, fed bytes
chunk by chunk (lines split across chunks, CR, LF or CRLF): it reads lines
and dispatches events exactly as the decoder the OpenAI and Anthropic SDKs
share does (both copied httpx-sse): a leading byte-order mark is not
stripped, so the first line's field is one nobody knows and is ignored; a
blank line dispatches when an event name, data, a retry or an id was ever
seen (an id is never forgotten); each line must be UTF-8. `_validate` reads
a whole buffered body with it; the heads below read a streamed answer as it
comes.

A head finds a routed answer's commit point (``commit: first_token``, DESIGN
§3.1): for an event stream of a dialect the request's path names — OpenAI
chat completions (and legacy completions), OpenAI Responses, Anthropic
Messages — the first event carrying content; for a JSON body, its first byte
that is not whitespace. What comes before (comments, blank lines, pings,
metadata events, leading whitespace) is held, and is no sign of life; an
error event before any content is found, with the status and body its error
would have had as a plain answer (`error_answer`), for the classifier.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from typing import Any, Final

__all__ = [
    "ACTIVE",
    "CHAT",
    "COMMIT",
    "ERROR",
    "HELD",
    "HOLD_LIMIT",
    "MESSAGES",
    "RESPONSES",
    "UNDECODABLE",
    "Event",
    "EventParser",
    "Head",
    "dialect_of",
    "error_answer",
    "head_for",
]

# The dialects whose streams sidestep reads.
CHAT: Final = "openai-chat"
RESPONSES: Final = "openai-responses"
MESSAGES: Final = "anthropic-messages"

HOLD_LIMIT: Final = 256 * 1024
"""The most bytes held before a stream's first content: past it, the answer is handed
over anyway. Ample for metadata: OpenAI's ``response.created`` echoes the request's
instructions and tools, which can run to tens of KiB."""

# What feeding a head a chunk says.
HELD: Final = 0  # nothing that counts: keep-alives, metadata, part of an event
ACTIVE: Final = 1  # after the commit point: a real event (not a keep-alive, not a ping)
COMMIT: Final = 2  # the commit point: the first content, an end, or something not understood
ERROR: Final = 3  # an error event before any content (`Head.error`)

_FIELD_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_BOM = "\ufeff"
_LINE_KEPT = 64  # bytes of a line kept after the commit point: enough for its field and name


class Event:
    """One dispatched event: its ``event`` field (None when unset or empty, as the SDKs
    read it) and its ``data`` lines joined by newlines (None when it had none)."""

    __slots__ = ("data", "name")

    def __init__(self, name: str | None, data: str | None) -> None:
        self.name = name
        self.data = data

    def __repr__(self) -> str:
        # never the data: it is a body
        return f"Event(name={self.name!r}, data={'…' if self.data else self.data!r})"


UNDECODABLE: Final = Event(None, None)
"""Where a line that is not UTF-8 was met (the SDKs raise there): `EventParser.feed`
returns this very object in its place."""


class EventParser:
    """Server-sent events from bytes fed chunk by chunk, as the SDKs dispatch them.

    `keep` False (after an answer's commit point) keeps no data and at most a
    line's first bytes: memory stays bounded whatever the stream, and events
    say only whether they had data. `malformed` counts lines that are no
    field at all (an HTML page served as a stream), which SSE ignores.
    """

    __slots__ = (
        "_cr",
        "_data",
        "_event",
        "_id",
        "_line",
        "_retry",
        "_started",
        "keep",
        "malformed",
    )

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.malformed = 0
        self._line = bytearray()  # the line being read, across chunks
        self._cr = False  # the last chunk ended in CR: an LF opening the next ends no line
        self._started = False  # a line was read (a byte-order mark can only lead the first)
        self._event = ""
        self._data: list[str] = []
        self._id = ""
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[Event]:
        """The events `chunk` completes, in order (`UNDECODABLE` where a line is not UTF-8)."""
        if not chunk:
            return []  # (an empty chunk between a CR and its LF ends no line)
        if self._cr:
            self._cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]  # the LF of a CRLF split between two chunks
                if not chunk:
                    return []
        lines = chunk.splitlines()  # on CR, LF and CRLF only, for bytes: SSE's own line ends
        last = chunk[-1]
        self._cr = last == 13
        tail = lines.pop() if last != 10 and last != 13 else None  # a line still being read
        if self._line and lines:
            lines[0] = bytes(self._line) + lines[0]  # the line begun in an earlier chunk
            self._line.clear()
        events: list[Event] = []
        keep = self.keep
        for line in lines:
            event = self._read(line if keep else line[:_LINE_KEPT])
            if event is not None:
                events.append(event)
        if tail is not None:
            self._line += tail if keep else tail[: max(0, _LINE_KEPT - len(self._line))]
        return events

    def finish(self) -> list[Event]:
        """At the body's end: a last line with no line end is read (it dispatches nothing)."""
        if not self._line:
            return []
        line = bytes(self._line)
        self._line.clear()
        event = self._read(line)
        return [event] if event is not None else []

    def _read(self, raw: bytes) -> Event | None:
        first = not self._started
        self._started = True
        if not raw:
            return self._dispatch()
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            if self.keep:
                return UNDECODABLE
            line = raw.decode("utf-8", "replace")  # cut short on purpose: only its field matters
        if line[0] == ":":
            return None  # a comment (a keep-alive)
        field, _, value = line.partition(":")
        if value[:1] == " ":
            value = value[1:]
        if field == "data":
            if self.keep:
                self._data.append(value)
            elif not self._data:
                self._data.append("")
        elif field == "event":
            self._event = value
        elif field == "id":
            if "\0" not in value:
                self._id = value
        elif field == "retry":
            with contextlib.suppress(ValueError):  # not a number: ignored
                self._retry = int(value)
        else:
            name = field.removeprefix(_BOM) if first else field
            if name and not _FIELD_NAME.fullmatch(name):
                self.malformed += 1  # ignored, as every other field SSE does not know
        return None

    def _dispatch(self) -> Event | None:
        if not (self._event or self._data or self._id or self._retry is not None):
            return None
        event = Event(self._event or None, "\n".join(self._data) if self._data else None)
        self._event, self._data, self._retry = "", [], None  # the id stays, as SSE says
        return event


def dialect_of(path: str) -> str | None:
    """The stream dialect a request's URL path names, if any."""
    path = path.rstrip("/")
    if path.endswith(("/chat/completions", "/completions")):
        return CHAT
    if path.endswith("/responses"):
        return RESPONSES
    if path.endswith("/messages"):
        return MESSAGES
    return None


# -- where a streamed answer starts --------------------------------------------------------

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


# -- an error event as the plain answer it stands for -------------------------------------

# The error's type or code -> the status the provider answers it with when not streaming.
_ERROR_STATUSES = {
    "invalid_request_error": 400,
    "invalid_prompt": 400,
    "context_length_exceeded": 400,
    "authentication_error": 401,
    "invalid_api_key": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    "requests": 429,
    "tokens": 429,
    "api_error": 500,
    "server_error": 500,
    "service_unavailable": 503,
    "timeout_error": 504,
    "overloaded_error": 529,
}
_UNKNOWN_ERROR = 500  # an error before any content that says nothing known: the upstream's


def error_answer(dialect_payload: Any) -> tuple[int, bytes]:
    """The status and JSON body an error event before any content stands for.

    The body is the error as the provider's plain answer carries it
    (``{"error": {...}}``, Anthropic's ``{"type": "error", "error": {...}}``),
    so the classifier judges it as it judges that answer: an overload as a
    529, a rate limit as a 429 (with its quota signals), a request at fault
    as a 400. An error of no known type or code is a 500.
    """
    payload = dialect_payload if isinstance(dialect_payload, dict) else {}
    error: Any = payload.get("error")
    if not isinstance(error, dict):
        response = payload.get("response")
        if payload.get("type") == "response.failed" and isinstance(response, dict):
            error = response.get("error")  # OpenAI Responses: the failed response's error
        else:
            error = {k: v for k, v in payload.items() if k in ("code", "message", "param")}
    if not isinstance(error, dict):
        error = {}
    status = _UNKNOWN_ERROR
    for key in ("code", "type"):
        value = error.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 400 <= value < 600:
            status = value  # a gateway's HTTP status as the code
            break
        found = _ERROR_STATUSES.get(value) if isinstance(value, str) else None
        if found is not None:
            status = found
            break
    body = payload if payload.get("type") == "error" and "error" in payload else {"error": error}
    return status, json.dumps(body).encode()
