"""Whether a request asks for a streamed answer, and whether a response is an event stream."""

from __future__ import annotations

import pytest

from sidestep._core.streaming import asks_to_stream, is_event_stream


@pytest.mark.parametrize(
    ("headers", "body", "streams"),
    [
        ({}, b'{"model": "m", "stream": true}', True),
        ({}, b'{"model": "m", "stream" : true, "n": 1}', True),
        ({"accept": "text/event-stream"}, None, True),
        ({"accept": "Text/Event-Stream; q=0.5, application/json; q=0.4"}, b"", True),
        ({"accept": "text/event-stream, */*;q=0.1"}, None, True),
        ({"accept": "application/json, Text/Event-Stream; q=0.5"}, b"", False),
        ({"accept": "application/json, text/event-stream"}, None, False),
        ({"accept": "text/event-stream;q=0"}, None, False),
        ({}, b'{"model": "m", "stream": false}', False),
        ({}, b'{"model": "m", "stream": "true"}', False),
        ({}, b'{"model": "m", "options": {"stream": true}}', False),
        ({}, b'{"messages": [{"content": "say \\"stream\\": true"}]}', False),
        ({}, b'[{"stream": true}]', False),
        ({}, b'{"stream": true', False),
        ({}, b"\xff\xfe not json", False),
        ({}, None, False),
        ({"accept": "application/json"}, b'{"model": "m"}', False),
    ],
)
def test_asks_to_stream(headers: dict[str, str], body: bytes | None, streams: bool) -> None:
    """A request asks to stream by rating text/event-stream above every other type its Accept names, or with a top-level `"stream": true` in a JSON object body; nothing else counts."""
    assert asks_to_stream(headers, body) is streams


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        ("text/event-stream", True),
        ("Text/Event-Stream; charset=utf-8", True),
        ("application/json", False),
        (None, False),
    ],
)
def test_is_event_stream(content_type: str | None, expected: bool) -> None:
    """A response is an event stream when its Content-Type, parameters aside, says text/event-stream."""
    headers = {} if content_type is None else {"content-type": content_type}
    assert is_event_stream(headers) is expected
