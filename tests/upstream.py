"""A scriptable HTTP/1.1 upstream on 127.0.0.1 for socket-level tests.

Each `Upstream` runs a small asyncio server in a thread of its own (over TLS
when given a server context). A test sets `upstream.behaviour` to a function
from the received `Seen` request to an action — answer, stream chunk by
chunk, cut a stream, send headers and stall, never answer, reset the
connection or hang up — and reads back what arrived (`upstream.seen`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]  # the last of each name
    body: bytes
    raw: list[tuple[str, str]] = field(default_factory=list)  # every header line, in order

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Respond:
    status: int = 200
    body: bytes | str | dict[str, Any] = b"ok"
    headers: dict[str, str] = field(default_factory=dict)
    gate: threading.Event | None = None  # when given, answer only once it is set
    interim: int = 0  # "102 Processing" interim responses sent first, `interim_every` apart
    interim_every: float = 0.1


@dataclass
class Stream:
    """A chunked body: `chunks` sent with `delay` between them; `cut_after` drops the connection."""

    chunks: list[bytes]
    status: int = 200
    delay: float = 0.0
    cut_after: int | None = None
    stall_after: int | None = (
        None  # send this many chunks, then go quiet (the connection stays open)
    )
    headers: dict[str, str] = field(default_factory=dict)
    release: threading.Event | None = (
        None  # when set, wait for it before the chunks after the first
    )
    first_delay: float = 0.0  # seconds between the headers and the first chunk


@dataclass
class Hang:
    """Read the request and never answer (the connection stays open until the test ends)."""


@dataclass
class HeadersThenHang:
    status: int = 200


@dataclass
class Reset:
    """Read the request, then reset the connection (an RST): no answer, not a byte of one."""


@dataclass
class Hangup:
    """Read the request, then close the connection in order (a FIN): no answer."""


Action = Respond | Stream | Hang | HeadersThenHang | Reset | Hangup
Behaviour = Callable[[Seen], Action]


# A time limit that healthy work on 127.0.0.1 always meets, however busy the machine: a
# first-byte or response timeout that a backup's answer must beat, a total timeout within
# which a request must reach its upstream. A test process on a two-core machine running
# other test suites was seen to stall for over a second; only an upstream that never
# answers (or stalls on purpose) trips a limit this long.
IN_TIME = 2.0

# How long a test's store waits for its SQLite file or its Redis before it fails open to its
# own memory (the shipped defaults are 0.1 s and 0.25 s). On such a machine a store at the
# shipped default would serve a stale local memory, and a test that asserts on the shared
# state would read it. conftest.py gives stores built in the test process this default;
# processes a test starts are given it in their store's settings.
STORE_WAIT = 10.0
# The caller's own timeout where a test holds answers back while other requests run, or
# tells a limit under test from it, or sends many requests from many threads: far above
# either, so that it never decides a test (on a busy machine, 32 threads and the upstream's
# own thread sharing one interpreter take seconds for an answer now and then).
CLIENT_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Upstream:
    """One upstream server; `url` is its base URL."""

    def __init__(
        self,
        behaviour: Behaviour | None = None,
        name: str = "upstream",
        *,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.name = name
        self._tls = tls  # a server context: HTTPS on the same port
        self.behaviour: Behaviour = behaviour or (lambda seen: Respond(body=name))
        self.seen: list[Seen] = []
        self.connections = 0
        self.open_connections = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()  # every connection still open
        self._handlers: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._run, name=f"upstream-{name}", daemon=True)
        self._thread.start()
        self._ready.wait(60)  # bounds a hang only: a busy machine may start it late
        assert self._server is not None
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"{'https' if tls is not None else 'http'}://127.0.0.1:{self.port}"

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self.seen)

    def close(self) -> None:
        def stop() -> None:
            assert self._stop is not None
            self._stop.set()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0, ssl=self._tls)
        self._ready.set()
        await self._stop.wait()
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Every socket closed before the loop is: a handler cancelled before it began
        # never closes its own, and a closing transport's socket goes only on a later turn.
        for writer in self._writers:
            writer.transport.abort()
        closing = [writer.wait_closed() for writer in self._writers]
        await asyncio.gather(*closing, return_exceptions=True)

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)  # at once, before its handler's first step
        task = asyncio.get_running_loop().create_task(self._connection(reader, writer))
        self._handlers.add(task)  # the loop keeps only a weak reference
        task.add_done_callback(self._handlers.discard)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._lock:
            self.connections += 1
            self.open_connections += 1
        try:
            while True:
                seen = await _read_request(reader)
                if seen is None:
                    return
                with self._lock:
                    self.seen.append(seen)
                action = self.behaviour(seen)
                keep = await self._answer(action, reader, writer)
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return
        finally:
            with self._lock:
                self.open_connections -= 1
            with contextlib.suppress(Exception):
                writer.close()
                await writer.wait_closed()
                self._writers.discard(writer)

    async def _answer(
        self, action: Action, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        if isinstance(action, Respond):
            for _ in range(action.interim):
                writer.write(b"HTTP/1.1 102 Processing\r\n\r\n")
                await writer.drain()
                await asyncio.sleep(action.interim_every)
            while action.gate is not None and not action.gate.is_set():  # noqa: ASYNC110  # a thread's Event
                await asyncio.sleep(0.005)
            body = action.body
            if isinstance(body, dict):
                body = json.dumps(body).encode()
                action.headers.setdefault("content-type", "application/json")
            elif isinstance(body, str):
                body = body.encode()
            head = _head(action.status, {**action.headers, "content-length": str(len(body))})
            writer.write(head + body)
            await writer.drain()
            return True
        if isinstance(action, Stream):
            headers = {**action.headers, "transfer-encoding": "chunked"}
            writer.write(_head(action.status, headers))
            await writer.drain()
            for n, chunk in enumerate(action.chunks):
                if action.cut_after is not None and n >= action.cut_after:
                    writer.transport.abort()
                    return False
                if action.stall_after is not None and n >= action.stall_after:
                    await asyncio.sleep(3600)
                if not n and action.first_delay:
                    await asyncio.sleep(action.first_delay)
                if n and action.delay:
                    await asyncio.sleep(action.delay)
                if n == 1 and action.release is not None:
                    while not action.release.is_set():  # noqa: ASYNC110  # a thread's Event
                        await asyncio.sleep(0.005)
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return True
        if isinstance(action, Reset):
            # linger 0: the close sends an RST, not a FIN, as a crashing upstream's kernel does
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        if isinstance(action, Hangup):
            return False  # the caller closes the writer: a FIN
        if isinstance(action, HeadersThenHang):
            writer.write(_head(action.status, {"transfer-encoding": "chunked"}))
            await writer.drain()
        # Say nothing more, until the client goes away (so tests can see it closed).
        while await reader.read(1024):
            pass
        return False


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _read_request(reader: asyncio.StreamReader) -> Seen | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = raw.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    raw_headers = [
        (name.strip().lower(), value.strip())
        for name, _, value in (line.partition(":") for line in lines[1:] if line)
    ]
    headers = dict(raw_headers)
    body = b""
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                break
            parts.append(data[:-2])
        body = b"".join(parts)
    return Seen(method, path, headers, body, raw_headers)


@contextlib.contextmanager
def upstreams(*names: str) -> Iterator[list[Upstream]]:
    servers = [Upstream(name=n) for n in names]
    try:
        yield servers
    finally:
        for s in servers:
            s.close()


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll until `condition()` holds; fail the test after `timeout` seconds.

    The deadline only bounds a hang, so it is generous: on a busy machine a condition
    that holds soon on a quiet one may take seconds, and must not fail the test.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def release_after_seen(gate: threading.Event, upstream: Upstream, seconds: float) -> None:
    """Set `gate` `seconds` after `upstream` has seen its first request (from a thread of
    its own): an answer held by the gate then takes at least that long."""

    def release() -> None:
        wait_for(lambda: upstream.calls >= 1, timeout=60.0)  # a first SDK import may be slow
        time.sleep(seconds)
        gate.set()

    threading.Thread(target=release, name="release", daemon=True).start()
