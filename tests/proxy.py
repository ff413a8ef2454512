"""A small real HTTP forward proxy on 127.0.0.1 for socket-level tests.

`Proxy` forwards plain-HTTP requests in absolute form (one request per client
connection: it answers with `Connection: close`) and tunnels `CONNECT`. It
records what it was asked for (`proxy.seen`: method and target, in order).
`dead_proxy_url()` gives the URL of a port nothing listens on.
"""

from __future__ import annotations

import contextlib
import io
import socket
import socketserver
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

from upstream import free_port

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te"}
_TIMEOUT = 10.0


def dead_proxy_url() -> str:
    """A proxy URL on a loopback port that refuses connections (bound once, then closed)."""
    return f"http://127.0.0.1:{free_port()}"


class Proxy:
    """A threaded forward proxy; `url` is its address, `seen` the (method, target) it served."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with contextlib.suppress(OSError, ValueError):
                    outer._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), name="proxy", daemon=True
        )
        self._thread.start()

    def reset(self) -> None:
        with self._lock:
            self.seen.clear()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def _serve(self, client: socket.socket) -> None:
        client.settimeout(_TIMEOUT)
        reader = client.makefile("rb")
        head = _read_head(reader)
        if head is None:
            return
        request_line, headers = head
        method, target, _ = request_line.split(" ", 2)
        with self._lock:
            self.seen.append((method, target))
        if method == "CONNECT":
            self._tunnel(client, target)
        else:
            self._forward(client, reader, method, target, headers)

    def _tunnel(self, client: socket.socket, target: str) -> None:
        host, _, port = target.rpartition(":")
        try:
            upstream = socket.create_connection((host, int(port)), timeout=_TIMEOUT)
        except OSError:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
            return
        with upstream:
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
            back.start()
            _pipe(client, upstream)
            back.join(_TIMEOUT)

    def _forward(
        self,
        client: socket.socket,
        reader: io.BufferedReader,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
    ) -> None:
        parts = urlsplit(target)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        body = _read_body(reader, headers)
        kept = [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP]
        lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in kept)]
        lines.append("connection: close")
        try:
            upstream = socket.create_connection(
                (parts.hostname or "", parts.port or 80), timeout=_TIMEOUT
            )
        except OSError:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
            return
        with upstream:
            upstream.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
            answer = upstream.makefile("rb")
            got = _read_head(answer)
            if got is None:
                return
            status_line, answer_headers = got
            kept = [(k, v) for k, v in answer_headers if k.lower() not in _HOP_BY_HOP]
            out = [status_line, *(f"{k}: {v}" for k, v in kept), "connection: close"]
            client.sendall(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
            while chunk := answer.read1(65536):
                client.sendall(chunk)


def _read_head(reader: io.BufferedReader) -> tuple[str, list[tuple[str, str]]] | None:
    first = reader.readline()
    if not first:
        return None
    headers: list[tuple[str, str]] = []
    while True:
        line = reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    return first.decode("latin-1").rstrip("\r\n"), headers


def _read_body(reader: io.BufferedReader, headers: list[tuple[str, str]]) -> bytes:
    """The request body, as it came (chunked framing included: the header goes along)."""
    fields = {k.lower(): v for k, v in headers}
    if "content-length" in fields:
        return reader.read(int(fields["content-length"]))
    if fields.get("transfer-encoding", "").lower() == "chunked":
        raw = bytearray()
        while True:
            size_line = reader.readline()
            size = int(size_line.split(b";")[0].strip(), 16)
            data = reader.read(size + 2)
            raw += b"%x\r\n" % size + data
            if size == 0:
                break
        return bytes(raw)
    return b""


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def running_proxy() -> Iterator[Proxy]:
    """A `Proxy` for the duration of the block."""
    proxy = Proxy()
    try:
        yield proxy
    finally:
        proxy.close()
