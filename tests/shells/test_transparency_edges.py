"""Programs that behave one way plain and another under `sidestep.install()` (unrouted traffic).

Each test runs an ordinary httpx program against a small raw-socket server on
127.0.0.1 under `install()` with its defaults, where the transparency
contract says it must observe what it observes plain.
"""

from __future__ import annotations

import contextlib
import io
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import httpx
import pytest

import sidestep
from drivers import FakeClock
from sidestep.wsgi import SuspensionMiddleware
from suspensions import assert_unavailable, suspension
from upstream import IN_TIME, Reset, Upstream

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

Handler = Callable[[socket.socket], None]


@pytest.fixture(autouse=True)
def _installed() -> Iterator[None]:
    sidestep.install()
    yield
    sidestep.uninstall()


@contextlib.contextmanager
def raw_server(handler: Handler) -> Iterator[str]:
    """Serve each connection with `handler(conn)` in a thread of its own; yield the base URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    threads: list[threading.Thread] = []

    def serve(conn: socket.socket) -> None:
        with conn:
            handler(conn)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=serve, args=(conn,), daemon=True)
            threads.append(thread)
            thread.start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        listener.close()
        acceptor.join(5)
        for thread in threads:
            thread.join(5)


def read_head(conn: socket.socket) -> bytes:
    """The request head (through the blank line), and whatever body bytes came with it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


# --- a response's headers reach the caller before its body ----------------------------------


def test_streamed_response_headers_arrive_before_the_first_body_byte() -> None:
    """An unrouted `client.stream()` returns at the response headers, as plain httpx does, not at the first body byte."""
    go = threading.Event()

    def long_poll(conn: socket.socket) -> None:
        read_head(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        # the event comes once the caller has seen the headers; a caller waiting for the
        # body before it returns them has timed out by then
        go.wait(2 * IN_TIME)
        conn.sendall(b"5\r\nhello\r\n0\r\n\r\n")

    with (
        raw_server(long_poll) as url,
        httpx.Client(timeout=IN_TIME) as client,
        client.stream("GET", url + "/watch") as response,
    ):
        assert response.status_code == 200
        go.set()
        assert response.read() == b"hello"


@pytest.mark.anyio
async def test_async_streamed_response_headers_arrive_before_the_first_body_byte() -> None:
    """The same for an async client: headers first, body when the upstream has something to say."""
    go = threading.Event()

    def long_poll(conn: socket.socket) -> None:
        read_head(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        go.wait(2 * IN_TIME)
        conn.sendall(b"5\r\nhello\r\n0\r\n\r\n")

    with raw_server(long_poll) as url:
        async with (
            httpx.AsyncClient(timeout=IN_TIME) as client,
            client.stream("GET", url + "/watch") as response,
        ):
            assert response.status_code == 200
            go.set()
            assert await response.aread() == b"hello"


def test_a_long_poll_whose_caller_waits_for_headers_opens_no_circuit() -> None:
    """Waiting for headers of an event stream that is quiet for a while never counts as a failure of its endpoint."""
    gates = [threading.Event() for _ in range(4)]
    served = iter(gates)

    def long_poll(conn: socket.socket) -> None:
        gate = next(served)
        read_head(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        gate.wait(2 * IN_TIME)  # past the caller's timeout, unless it has the headers by then
        conn.sendall(b"2\r\nok\r\n0\r\n\r\n")

    with raw_server(long_poll) as url, httpx.Client(timeout=IN_TIME) as client:
        for gate in gates:
            with client.stream("GET", url + "/events") as response:
                gate.set()
                assert response.read() == b"ok"


# --- 101 Switching Protocols -------------------------------------------------------------------


def test_upgrade_hands_the_connection_over_untouched() -> None:
    """A 101 answer's `network_stream` is usable, as plain (httpx-ws and similar libraries rely on it)."""

    def echo_after_upgrade(conn: socket.socket) -> None:
        read_head(conn)
        conn.sendall(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n"
        )
        conn.sendall(b"echo:" + conn.recv(100))  # the client speaks first after the upgrade

    headers = {"Upgrade": "echo", "Connection": "Upgrade"}
    with (
        raw_server(echo_after_upgrade) as url,
        httpx.Client(timeout=2.0) as client,
        client.stream("GET", url + "/ws", headers=headers) as response,
    ):
        assert response.status_code == 101
        stream = response.extensions["network_stream"]
        stream.write(b"hi")
        assert stream.read(100) == b"echo:hi"


# --- uploads -------------------------------------------------------------------------------------


class _Big(io.RawIOBase):
    """A large readable file that remembers how far it has been read."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self.size - self.pos)
        buffer[:n] = b"x" * n
        self.pos += n
        return n


def test_unrouted_multipart_file_upload_is_streamed_not_buffered() -> None:
    """An unrouted multipart upload of a file is streamed as plain: the file is not read whole before the request goes out."""
    size = 32 * 1024 * 1024  # more than loopback socket buffers hold
    upload = _Big(size)
    seen_at_head: list[int] = []

    def receive(conn: socket.socket) -> None:
        head = read_head(conn)
        seen_at_head.append(upload.pos)
        # the body is chunked (the file's size is not known): drain it to its last chunk
        tail = head.partition(b"\r\n\r\n")[2][-5:]
        while tail != b"0\r\n\r\n":
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            tail = (tail + chunk)[-5:]
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    with raw_server(receive) as url, httpx.Client(timeout=30.0) as client:
        response = client.post(url + "/upload", files={"f": ("big.bin", upload)})
    assert response.status_code == 200
    assert seen_at_head[0] < size


# --- a half-open origin and the endpoints that failed before it opened --------------------------


def test_failed_probe_on_a_known_failing_endpoint_reopens_the_origin(a: Upstream) -> None:
    """A half-open origin's probe that fails (a reset) reopens the origin, whichever endpoint it went to, so the next call is failed fast."""
    a.behaviour = lambda seen: Reset()
    clock = FakeClock()
    config = {"breaker": {"failure_threshold": 3, "cooldown": 10, "half_open_probes": 1}}
    transport = sidestep.FailoverTransport(config, clock=clock)
    with httpx.Client(transport=transport, timeout=2.0) as client:
        for path in ("/a", "/b", "/c"):  # three different endpoints: the origin opens
            with pytest.raises(httpx.TransportError) as reset:
                client.get(a.url + path)
            assert not isinstance(reset.value, sidestep.AllCandidatesSuspended)
        with pytest.raises(sidestep.AllCandidatesSuspended):
            client.get(a.url + "/d")
        clock.advance(11)  # the window ends: one probe
        with pytest.raises(httpx.TransportError) as reset:
            client.get(a.url + "/a")
        assert not isinstance(reset.value, sidestep.AllCandidatesSuspended)
        calls = a.calls
        with pytest.raises(sidestep.AllCandidatesSuspended):
            client.get(a.url + "/b")
        assert a.calls == calls


# --- WSGI: an app whose body starts with an empty chunk ----------------------------------------


def test_wsgi_empty_first_chunk_still_allows_the_503() -> None:
    """An app whose body yields b"" before raising AllCandidatesSuspended still answers the 503: PEP 3333 servers send nothing for an empty chunk."""

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        start_response("200 OK", [("content-type", "text/plain")])

        def body() -> Iterator[bytes]:
            yield b""
            raise suspension(11.2)

        return body()

    transport = httpx.WSGITransport(app=SuspensionMiddleware(app))
    with httpx.Client(transport=transport, base_url="http://app") as client:
        response = client.get("/")
    assert_unavailable(response)
