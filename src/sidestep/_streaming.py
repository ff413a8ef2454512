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

__all__ = ["asks_to_stream", "is_event_stream"]

_EVENT_STREAM = "text/event-stream"


def asks_to_stream(headers: Mapping[str, str], body: bytes | None) -> bool:
    """Whether a request asks for a streamed answer: it accepts ``text/event-stream``, or
    its body is a JSON object whose top-level ``"stream"`` is ``true`` (the OpenAI and
    Anthropic APIs' switch). A body not in memory (`None`: streamed once) tells nothing.
    """
    accept = headers.get("accept")
    if accept is not None and _EVENT_STREAM in accept.lower():
        return True
    if not body or b'"stream"' not in body:
        return False  # most bodies are never parsed: no such key anywhere in them
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError)
        return False
    return isinstance(document, dict) and document.get("stream") is True


def is_event_stream(headers: Mapping[str, str]) -> bool:
    """Whether a response's ``Content-Type`` is ``text/event-stream``."""
    content_type = headers.get("content-type")
    if content_type is None:
        return False
    return content_type.partition(";")[0].strip().lower() == _EVENT_STREAM
