"""Real web servers on 127.0.0.1 for socket-level tests.

`serve_asgi(app)` runs an ASGI app under uvicorn and `serve_wsgi(app)` a WSGI
app under werkzeug's threaded server, each in a thread of its own, on a free
port; `serve_gunicorn("module:app", ...)` runs gunicorn, with its worker
processes, in a process of its own. All are context managers that yield the
base URL once the server accepts requests, and stop the server on exit. `read_cut_off` reads a
response whose body the server breaks off.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx
import pytest
import uvicorn
from werkzeug.serving import WSGIRequestHandler, make_server

from upstream import wait_for

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

_STOP_TIMEOUT = 5.0
TESTS = Path(__file__).parent


@contextlib.contextmanager
def serve_asgi(app: Any, *, lifespan: Literal["auto", "on", "off"] = "on") -> Iterator[str]:
    """Serve `app` with uvicorn; with `lifespan="on"`, startup must succeed first."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # log_config=None: leave the process's logging setup alone; errors still
    # reach the "uvicorn.error" logger, and so pytest's log capture.
    config = uvicorn.Config(app, lifespan=lifespan, ws="none", log_config=None)
    server = uvicorn.Server(config)
    # uvicorn installs no signal handlers outside the main thread.
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive())
        if not server.started:
            raise RuntimeError("uvicorn stopped before it started serving")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(_STOP_TIMEOUT)
        sock.close()
        if thread.is_alive():
            raise RuntimeError("uvicorn did not stop in time")


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Access lines say nothing a test needs; errors are still logged."""


@contextlib.contextmanager
def serve_gunicorn(
    app: str,
    logs: Path,
    *,
    ready: str,
    workers: int = 1,
    env: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """gunicorn serving `app` (``module:attribute``, from tests/) on a socket it inherits.

    Ready once `ready` (a path) answers 200; a gunicorn that exits first fails
    the test with its error log.
    """
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    environ = {**os.environ, **(env or {})}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), environ.get("PYTHONPATH")]))
    command = [
        sys.executable,
        "-m",
        "gunicorn",
        "--bind",
        f"fd://{sock.fileno()}",
        "--workers",
        str(workers),
        "--error-logfile",
        str(logs),
        app,
    ]
    process = subprocess.Popen(  # noqa: S603 -- a fixed command line
        command, env=environ, cwd=TESTS, pass_fds=(sock.fileno(),), stdin=subprocess.DEVNULL
    )
    sock.close()
    url = f"http://127.0.0.1:{port}"
    try:

        def answers() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"gunicorn exited: {logs.read_text()}")
            try:
                return httpx.get(url + ready, timeout=1.0).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(answers, timeout=60.0)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def serve_wsgi(app: WSGIApplication) -> Iterator[str]:
    """Serve `app` with werkzeug's threaded HTTP/1.1 server (chunked bodies without a length)."""
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=_QuietHandler)
    # A short poll interval, so that shutdown() returns promptly.
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.shutdown()
        thread.join(_STOP_TIMEOUT)
        server.server_close()


def read_cut_off(client: httpx.Client, path: str) -> tuple[int, bytes]:
    """GET `path`, whose body must break off: the status, and the bytes before the break."""
    received = bytearray()
    with client.stream("GET", path) as response, pytest.raises(httpx.RemoteProtocolError):
        _read_into(response, received)
    return response.status_code, bytes(received)


def _read_into(response: httpx.Response, received: bytearray) -> None:
    for chunk in response.iter_raw():
        received += chunk
