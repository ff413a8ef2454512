"""Whether an answer streams: what a request asks for, and what a response says.

A time-to-first-token limit (`first_byte_timeout`) means something only for
an answer that streams: the first byte of any other answer is the whole
answer, which a reasoning model may take minutes to write. The core asks
`asks_to_stream` once per request, and only when such a limit is set;
`is_event_stream` tells a stream the request did not announce.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

__all__ = ["asks_to_stream", "is_event_stream", "prefers_event_stream"]

_EVENT_STREAM = "text/event-stream"


def asks_to_stream(headers: Mapping[str, str], body: bytes | None) -> bool:
    """Whether a request asks for a streamed answer: its ``Accept`` prefers
    ``text/event-stream`` (`prefers_event_stream`), or its body is a JSON object whose
    top-level ``"stream"`` is ``true`` (the OpenAI and Anthropic APIs' switch). A body
    not in memory (`None`: streamed once) tells nothing.
    """
    accept = headers.get("accept")
    if accept is not None and prefers_event_stream(accept):
        return True
    if not body or b'"stream"' not in body:
        return False  # most bodies are never parsed: no such key anywhere in them
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError)
        return False
    return isinstance(document, dict) and document.get("stream") is True


def prefers_event_stream(accept: str) -> bool:
    """Whether an ``Accept`` value asks for an event stream: it rates ``text/event-stream``
    above every other type it names. One that lists another beside it as high (MCP
    clients send ``application/json, text/event-stream``) leaves the choice to the
    server, and one that rates it ``q=0`` refuses it: neither asks for a stream.
    """
    lowered = accept.lower()
    if _EVENT_STREAM not in lowered:
        return False  # the usual case: nothing to parse
    stream = other = 0.0
    for accepted in lowered.split(","):
        media, *params = accepted.split(";")
        media = media.strip()
        if not media:
            continue
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 1.0  # not a weight: as if none were given
                if not 0.0 <= q <= 1.0:
                    q = 1.0
        if media == _EVENT_STREAM:
            stream = max(stream, q)
        else:
            other = max(other, q)
    return stream > other


def is_event_stream(headers: Mapping[str, str]) -> bool:
    """Whether a response's ``Content-Type`` is ``text/event-stream``."""
    content_type = headers.get("content-type")
    if content_type is None:
        return False
    return content_type.partition(";")[0].strip().lower() == _EVENT_STREAM
