"""Whether a buffered 2xx body is whole and well-formed (``commit: complete``, ``validate: auto``).

Pure, no I/O. A route that buffers its answers has the whole body in hand
before the caller sees a byte, so it can refuse one a proxy rewrote or an
upstream cut short and fail over instead (DESIGN §3.1):

- a body declared ``application/json`` (or ``…+json``) must parse as JSON;
- a ``text/event-stream`` body must be well-formed server-sent events; every
  ``data:`` payload other than the ``[DONE]`` sentinel must parse as JSON
  when the stream's payloads are JSON; and the stream must reach its
  dialect's end: ``data: [DONE]`` for OpenAI chat and completions, a
  ``response.completed``, ``response.failed`` or ``response.incomplete``
  event for OpenAI Responses, ``message_stop`` for Anthropic Messages. A
  stream of another dialect needs only the clean end of its connection,
  which a buffered body has already reached.

Any other content type passes. What is wrong is said in words: a problem
never quotes the body.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from ._encodings import Undecodable, decoded_body

__all__ = ["body_problem"]

_DONE = "[DONE]"
_LINE_END = re.compile(r"\r\n|\r|\n")  # SSE's own: not str.splitlines' many
_SSE_FIELDS = frozenset({"data", "event", "id", "retry"})
_RESPONSES_ENDS = frozenset({"response.completed", "response.failed", "response.incomplete"})

# The dialects whose end is known, and the end each must reach.
CHAT = "openai-chat"
RESPONSES = "openai-responses"
MESSAGES = "anthropic-messages"


def body_problem(
    content_type: str | None,
    content_encoding: str | None,
    body: bytes,
    path: str,
    limit: int,
) -> str | None:
    """What is wrong with a whole 2xx `body`, in words; None when it is valid or cannot be told.

    `path` is the request's URL path (it names the dialect of a stream that
    says nothing of its own); `limit` bounds the decoded size, past which the
    body is not checked.

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


_FIELD_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def _parses(data: bytes | str) -> bool:
    try:
        json.loads(data)
    except (ValueError, RecursionError):
        return False
    return True


def _events(text: str) -> Iterator[tuple[str | None, str | None]]:
    """Each event's ``(event name, data)``; raises ValueError on a line that is no SSE field.

    Fields the protocol does not know are ignored, as the SSE rules say, when
    their name is a plain token (`x-proxy-note: cached`); a line that is no
    field at all (an HTML page served as a stream) is malformed.
    """
    name: str | None = None
    data: list[str] = []
    for line in _LINE_END.split(text):
        if not line:
            if data or name is not None:
                yield name, "\n".join(data) if data else None
            name, data = None, []
            continue
        if line.startswith(":"):
            continue  # a comment (a keep-alive)
        field, _, value = line.partition(":")
        if field not in _SSE_FIELDS:
            if _FIELD_NAME.fullmatch(field):
                continue  # a field the protocol does not know: ignored, as SSE says
            raise ValueError("a line that is no server-sent event field")
        value = value.removeprefix(" ")
        if field == "data":
            data.append(value)
        elif field == "event":
            name = value
    if data or name is not None:
        yield name, "\n".join(data) if data else None  # the clean end dispatches the last event


def _stream_problem(decoded: bytes, path: str) -> str | None:
    try:
        text = decoded.decode("utf-8").removeprefix("\ufeff")  # one byte-order mark may lead
    except UnicodeDecodeError:
        return "the event stream is not UTF-8"
    try:
        events = list(_events(text))
    except ValueError as exc:
        return f"the event stream is malformed: {exc}"
    payloads: list[object] = []
    invalid = 0
    first_invalid = 0
    done = False
    names: list[str] = []
    for n, (name, data) in enumerate(events, 1):
        if name is not None:
            names.append(name)
        if data is None:
            continue
        if data.strip() == _DONE:
            done = True
            continue
        try:
            payloads.append(json.loads(data))
        except (ValueError, RecursionError):
            payloads.append(None)
            invalid += 1
            first_invalid = first_invalid or n
    dialect = _dialect(path, payloads)
    parsed = [p for p in payloads if isinstance(p, (dict, list))]
    if invalid and (parsed or dialect is not None):
        return f"event {first_invalid} of the stream is not JSON ({invalid} such)"
    types = set(names) | {p.get("type") for p in parsed if isinstance(p, dict)}
    if dialect == CHAT and not done:
        return "the stream ends before its [DONE]"
    if dialect == RESPONSES and not types & _RESPONSES_ENDS:
        return "the stream ends before its response.completed, .failed or .incomplete event"
    if dialect == MESSAGES and "message_stop" not in types:
        return "the stream ends before its message_stop event"
    return None


def _dialect(path: str, payloads: list[object]) -> str | None:
    """The stream's dialect: by its first JSON object's shape, else by the request's path."""
    for payload in payloads:
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
        break
    path = path.rstrip("/")
    if path.endswith(("/chat/completions", "/completions")):
        return CHAT
    if path.endswith("/responses"):
        return RESPONSES
    if path.endswith("/messages"):
        return MESSAGES
    return None
