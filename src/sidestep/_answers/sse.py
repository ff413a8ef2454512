"""Server-sent events as the LLM SDKs read them: the one SSE parser sidestep has.

Pure, no I/O. `EventParser` is fed bytes chunk by chunk (lines split across
chunks, CR, LF or CRLF): it reads lines and dispatches events exactly as the
decoder the OpenAI and Anthropic SDKs share does (both copied httpx-sse): a
leading byte-order mark is not stripped, so the first line's field is one
nobody knows and is ignored; a blank line dispatches when an event name,
data, a retry or an id was ever seen (an id is never forgotten); each line
must be UTF-8. `validate` reads a whole buffered body with it; the heads of
`first_token` read a streamed answer as it comes. `dialect_of` names the
dialect a request's path asks for.
"""

from __future__ import annotations

import contextlib
import re
from typing import Final

__all__ = [
    "CHAT",
    "MESSAGES",
    "RESPONSES",
    "UNDECODABLE",
    "Event",
    "EventParser",
    "dialect_of",
]

# The dialects whose streams sidestep reads.
CHAT: Final = "openai-chat"
RESPONSES: Final = "openai-responses"
MESSAGES: Final = "anthropic-messages"

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
