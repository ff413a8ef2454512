"""Whether a buffered 2xx body is whole and well-formed (``commit: complete``, ``validate: auto``).

Pure, no I/O. A route that buffers its answers has the whole body in hand
before the caller sees a byte, so it can refuse one a proxy rewrote or an
upstream cut short and fail over instead (DESIGN §3.1):

- a body declared ``application/json`` (or ``…+json``) must parse as JSON;
- a ``text/event-stream`` body of a dialect the LLM SDKs read (the path
  names it, else its first JSON payload's shape does) passes exactly when
  that SDK's own decoder reads it whole without an error (`sse` parses it
  as they do) — and reaches its dialect's end, which the SDKs do not ask
  for but which tells a stream cut short: ``data: [DONE]`` for OpenAI chat
  and completions, a ``response.completed``, ``response.failed`` or
  ``response.incomplete`` event for OpenAI Responses, ``message_stop`` for
  Anthropic Messages. What the SDKs refuse: a line that is not UTF-8, a
  payload the SDK parses that is not JSON, an error (OpenAI: a payload with
  an ``error``; Anthropic: an ``error`` event); what they pass over passes
  (OpenAI: everything after ``[DONE]``; Anthropic: pings, unnamed events,
  events without data);
- a stream of another dialect must be well-formed server-sent events (every
  line a comment or a field; fields SSE does not know are ignored when their
  name is a plain token), and every ``data:`` payload but ``[DONE]`` must
  parse as JSON when the stream's payloads are JSON. It needs only the clean
  end of its connection, which a buffered body has already reached.

Any other content type passes. What is wrong is said in words: a problem
never quotes the body.
"""

from __future__ import annotations

import json

from .encodings import Undecodable, decoded_body
from .sse import CHAT, MESSAGES, RESPONSES, UNDECODABLE, Event, EventParser, dialect_of

__all__ = ["body_problem"]

_DONE = "[DONE]"
_RESPONSES_ENDS = frozenset({"response.completed", "response.failed", "response.incomplete"})
_NOT_UTF8 = "the event stream is not UTF-8"


def body_problem(
    content_type: str | None,
    content_encoding: str | None,
    body: bytes,
    path: str,
    limit: int,
) -> str | None:
    """What is wrong with a whole 2xx `body`, in words; None when it is valid or cannot be told.

    `path` is the request's URL path, which names a stream's dialect (else
    its first JSON object's shape does); `limit` bounds the decoded size,
    past which the body is not checked.

    >>> body_problem("application/json", None, b'{"a": 1', "/v1/x", 1024)
    'the JSON body does not parse'
    """
    media = (content_type or "").partition(";")[0].strip().lower()
    is_json = media == "application/json" or media.endswith("+json")
    if not is_json and media != "text/event-stream":
        return None
    try:
        decoded = decoded_body(body, content_encoding, limit)
    except Undecodable as exc:
        return str(exc)
    if decoded is None:
        return None  # an encoding not decodable here, or larger than the limit: not checked
    if is_json:
        return None if _parses(decoded) else "the JSON body does not parse"
    return _stream_problem(decoded, path)


def _parses(data: bytes | str) -> bool:
    try:
        json.loads(data)
    except (ValueError, RecursionError):
        return False
    return True


def _json(data: str) -> tuple[bool, object]:
    try:
        return True, json.loads(data)
    except (ValueError, RecursionError):
        return False, None


def _events(body: bytes) -> tuple[list[Event], int]:
    parser = EventParser()
    events = parser.feed(body)
    events += parser.finish()
    return events, parser.malformed


def _stream_problem(body: bytes, path: str) -> str | None:
    events, malformed = _events(body)
    dialect = dialect_of(path) or _shape(events)
    if dialect == MESSAGES:
        return _messages_problem(events)
    if dialect is not None:
        return _openai_problem(events, dialect)
    return _other_problem(events, malformed)


def _openai_problem(events: list[Event], dialect: str) -> str | None:
    """As the OpenAI SDK's stream reads it: up to ``[DONE]``, every event's data JSON,
    none carrying an ``error`` (but a thread's)."""
    done = False
    types: set[str] = set()
    for n, event in enumerate(events, 1):
        if event is UNDECODABLE:
            return _NOT_UTF8
        data = event.data or ""
        if data.startswith(_DONE):
            done = True
            break
        parsed, payload = _json(data)
        if not parsed:
            return f"event {n} of the stream is not JSON"
        if isinstance(payload, dict):
            if payload.get("error") and not (event.name or "").startswith("thread."):
                return f"event {n} of the stream is an error"
            kind = payload.get("type")
            if isinstance(kind, str):
                types.add(kind)
    if dialect == CHAT and not done:
        return "the stream ends before its [DONE]"
    if dialect == RESPONSES and not types & _RESPONSES_ENDS:
        return "the stream ends before its response.completed, .failed or .incomplete event"
    return None


def _messages_problem(events: list[Event]) -> str | None:
    """As the Anthropic SDK's stream reads it: pings, unnamed events and events without
    data passed over, an ``error`` event refused, every other event's data JSON."""
    stopped = False
    for n, event in enumerate(events, 1):
        if event is UNDECODABLE:
            return _NOT_UTF8
        if event.name is None or event.name == "ping":
            continue
        if event.name == "error":
            return f"event {n} of the stream is an error"
        if not event.data:
            continue
        parsed, payload = _json(event.data)
        if not parsed:
            return f"event {n} of the stream is not JSON"
        if isinstance(payload, dict) and payload.get("type") == "message_stop":
            stopped = True
    return None if stopped else "the stream ends before its message_stop event"


def _other_problem(events: list[Event], malformed: int) -> str | None:
    if malformed:
        return "the event stream is malformed: a line that is no server-sent event field"
    invalid = 0
    first_invalid = 0
    parsed = False
    for n, event in enumerate(events, 1):
        if event is UNDECODABLE:
            return _NOT_UTF8
        data = event.data
        if data is None or data.strip() == _DONE:
            continue
        ok, payload = _json(data)
        if not ok:
            invalid += 1
            first_invalid = first_invalid or n
        parsed = parsed or isinstance(payload, (dict, list))
    if invalid and parsed:
        return f"event {first_invalid} of the stream is not JSON ({invalid} such)"
    return None


def _shape(events: list[Event]) -> str | None:
    """A stream's dialect by its first JSON object's shape, when its path names none."""
    for event in events:
        if event is UNDECODABLE or not event.data:
            continue
        _, payload = _json(event.data)
        if not isinstance(payload, dict):
            continue
        kind = payload.get("type")
        if payload.get("object") in ("chat.completion.chunk", "text_completion"):
            return CHAT
        if isinstance(kind, str) and kind.startswith("response."):
            return RESPONSES
        if kind in ("message_start", "ping") or (
            isinstance(kind, str) and kind.startswith(("content_block_", "message_"))
        ):
            return MESSAGES
        return None
    return None
