"""The demo's upstreams: `LocalUpstream`, a minimal HTTP/1.1 server on 127.0.0.1.

Each answers as its `Mode` says — healthy, 503, accepting and never answering,
or down for a while and then back — and counts what it received. `sidestep
demo` starts four; the benchmarks reuse them.
"""

from __future__ import annotations

import asyncio
import enum

__all__ = ["LocalUpstream", "Mode"]

_REASONS = {200: "OK", 503: "Service Unavailable"}


class Mode(enum.Enum):
    """How a `LocalUpstream` answers."""

    HEALTHY = "answers 200"
    UNAVAILABLE = "answers 503"
    STALLED = "accepts, never answers"
    FLAPPING = "503 for a while, then 200"


class LocalUpstream:
    """A minimal HTTP/1.1 server on 127.0.0.1, answering as its `mode` says.

    It counts the requests it receives (`calls`); a flapping one is down
    (answers 503) until `down_until` on the event loop's clock, and counts the
    requests that arrived meanwhile (`calls_while_down`) and the time of its
    first 200 after coming back (`first_up_answer`). Call `start()` and
    `stop()` inside one running event loop.
    """

    def __init__(
        self, name: str, mode: Mode, *, delay: float = 0.0, behaviour: str | None = None
    ) -> None:
        self.name = name
        self.mode = mode
        self.behaviour = behaviour or mode.value  # what the demo's view says of it
        self.delay = delay
        self.down_until = 0.0
        self.calls = 0
        self.calls_while_down = 0
        self.down_call_times: list[float] = []
        self.first_up_answer: float | None = None
        self.port = 0
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Transport] = set()

    def __repr__(self) -> str:
        return f"LocalUpstream({self.name!r}, {self.mode.name}, port={self.port})"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def down(self) -> bool:
        if self.mode is Mode.FLAPPING:
            return asyncio.get_running_loop().time() < self.down_until
        return self.mode is not Mode.HEALTHY

    def reset(self, down_for: float = 0.0) -> None:
        """Forget the counts; a flapping upstream goes down for `down_for` seconds from now."""
        self.calls = self.calls_while_down = 0
        self.down_call_times = []
        self.first_up_answer = None
        self.down_until = asyncio.get_running_loop().time() + down_for

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and drop every connection, stalled ones included."""
        if self._server is None:
            return
        self._server.close()
        for transport in list(self._connections):
            transport.abort()
        await self._server.wait_closed()
        self._server = None

    def answer(self, transport: asyncio.Transport) -> None:
        """One complete request arrived on `transport`: count it and answer (or not)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.calls += 1
        status = 200
        if self.down:
            self.calls_while_down += 1
            self.down_call_times.append(now)
            if self.mode is Mode.STALLED:
                return  # the connection stays open, unanswered, until the client gives up
            status = 503
        elif self.mode is Mode.FLAPPING and self.first_up_answer is None:
            self.first_up_answer = now
        body = b'{"ok":true}' if status == 200 else b'{"error":"unavailable"}'
        reply = (
            f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode() + body
        if self.delay and status == 200:
            loop.call_later(self.delay, _write, transport, reply)
        else:
            transport.write(reply)


def _write(transport: asyncio.Transport, data: bytes) -> None:
    if not transport.is_closing():
        transport.write(data)


class _Connection(asyncio.Protocol):
    """One client connection: split the byte stream into requests (keep-alive, no pipelining)."""

    def __init__(self, upstream: LocalUpstream) -> None:
        self._upstream = upstream
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._upstream._connections.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._upstream._connections.discard(self._transport)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while self._transport is not None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            size = _content_length(self._buffer[:end])
            if len(self._buffer) < end + 4 + size:
                return
            self._buffer = self._buffer[end + 4 + size :]
            self._upstream.answer(self._transport)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip() or 0)
    return 0
