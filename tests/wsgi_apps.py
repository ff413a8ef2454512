"""WSGI apps for the middleware tests, importable by a server in another process.

`application` serves every path of `app` twice: under `/bare/...` as the app
is, and everywhere else behind `SuspensionMiddleware`, so one server (or test
client) shows both outcomes of the same request side by side. gunicorn loads
it as ``wsgi_apps:application``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from sidestep.wsgi import SuspensionMiddleware
from suspensions import suspension

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

TEXT = [("Content-Type", "text/plain")]
# A response whose bytes and headers must arrive exactly as the app made them.
PLAIN_CHUNKS = [b"\x00\x01 first chunk\r\n", b"", b"\xff second chunk"]
PLAIN_BODY = b"".join(PLAIN_CHUNKS)
PLAIN_HEADERS = [
    ("Content-Type", "application/octet-stream"),
    ("Content-Length", str(len(PLAIN_BODY))),
    ("X-Custom", "Kept As-Is"),
    ("Set-Cookie", "a=1"),
    ("Set-Cookie", "b=2"),
]
WRITTEN = [b"written ", b"twice"]
FIRST_CHUNK = b"first chunk"


def _failing(chunks: list[bytes], error: Exception) -> Iterator[bytes]:
    """A body that yields `chunks`, then raises `error`."""
    yield from chunks
    raise error


def _nothing() -> Iterator[bytes]:
    """An empty body that only ends when iterated."""
    yield from ()


def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
    """The app under test; what each path does is in its branch."""
    path = environ["PATH_INFO"]
    if path == "/suspended":  # before start_response
        raise suspension(11.2)
    if path == "/headers-set":  # after start_response, before any body
        start_response("200 OK", TEXT)
        raise suspension(11.2)
    if path == "/other":
        raise RuntimeError("not a suspension")
    if path == "/written":
        write = start_response("200 OK", TEXT)
        for chunk in WRITTEN:
            write(chunk)
        return []
    if path == "/empty":
        start_response("200 OK", [*TEXT, ("Content-Length", "0")])
        return _nothing()
    start_response("200 OK", PLAIN_HEADERS if path == "/plain" else TEXT)
    if path == "/first-chunk-fails":
        return _failing([], suspension(11.2))
    if path == "/after-first-chunk-fails":
        return _failing([FIRST_CHUNK], suspension(11.2))
    return PLAIN_CHUNKS


wrapped = SuspensionMiddleware(app)


def application(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
    """`app` as it is under `/bare/...`, behind the middleware everywhere else."""
    path = environ["PATH_INFO"]
    if path.startswith("/bare/"):
        environ["PATH_INFO"] = path.removeprefix("/bare")
        return app(environ, start_response)
    return wrapped(environ, start_response)
