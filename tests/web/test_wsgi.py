"""The WSGI middleware, under werkzeug's server and called directly."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from servers import read_cut_off, serve_wsgi
from sidestep.wsgi import SuspensionMiddleware
from suspensions import assert_unavailable, raise_as_sdk, suspension
from upstream import wait_for

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

TEXT = [("content-type", "text/plain")]


class Body:
    """An app's iterable: yields `chunks`, then raises `error`; records whether it was closed."""

    def __init__(self, chunks: list[bytes], error: Exception | None = None) -> None:
        self.chunks = chunks
        self.error = error
        self.closes = 0

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.closes += 1


bodies: dict[str, Body] = {}


def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
    path = environ["PATH_INFO"]
    if path == "/suspended":
        raise suspension(11.2)
    if path == "/indefinite":
        raise suspension(None)
    if path == "/sdk":
        raise_as_sdk(suspension(11.2))
    if path == "/other":
        raise RuntimeError("not a suspension")
    if path == "/written":
        start_response("200 OK", TEXT)(b"first chunk")
        raise suspension(11.2)
    start_response("200 OK", TEXT)
    if path == "/headers-set":  # headers set, nothing sent yet
        body = Body([], suspension(11.2))
    elif path == "/started":
        body = Body([b"first chunk"], suspension(11.2))
    else:
        body = Body([b"fine"])
    bodies[path] = body
    return body


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve_wsgi(SuspensionMiddleware(app)) as url:
        yield url


@pytest.fixture
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=5.0) as client:
        yield client


def test_suspension_from_the_call_becomes_503(client: httpx.Client) -> None:
    """An app raising AllCandidatesSuspended answers the documented 503 with Retry-After."""
    assert_unavailable(client.get("/suspended"), retry_after=12)


def test_sdk_error_raised_from_a_suspension_becomes_503(client: httpx.Client) -> None:
    """openai.APIConnectionError raised from the suspension is seen through."""
    assert_unavailable(client.get("/sdk"), retry_after=12)


def test_unknown_retry_after_leaves_the_header_out(client: httpx.Client) -> None:
    """An indefinite suspension answers without Retry-After and with retry_after null."""
    assert_unavailable(client.get("/indefinite"), retry_after=None)


def test_headers_set_but_unsent_are_replaced(client: httpx.Client) -> None:
    """A suspension before the first chunk replaces the app's 200 and closes its body."""
    response = client.get("/headers-set")
    assert_unavailable(response, retry_after=12)
    assert response.headers.get("content-type") == "application/json"
    assert bodies["/headers-set"].closes == 1


def test_other_errors_stay_500(client: httpx.Client) -> None:
    """Any other error reaches the server, which answers its own 500."""
    response = client.get("/other")
    assert response.status_code == 500
    assert "retry-after" not in response.headers


def test_started_body_is_broken_not_replaced(client: httpx.Client) -> None:
    """A body that fails after its first chunk keeps its 200 and ends broken, never completed."""
    assert read_cut_off(client, "/started") == (200, b"first chunk")
    wait_for(lambda: bodies["/started"].closes == 1)  # the server closes after it answered


def test_written_body_is_broken_not_replaced(client: httpx.Client) -> None:
    """After the app wrote through write(), the response stays its own, broken."""
    assert read_cut_off(client, "/written") == (200, b"first chunk")


def test_healthy_responses_pass_unchanged(client: httpx.Client) -> None:
    """A response without errors goes through as the app made it, and its body is closed once."""
    response = client.get("/fine")
    assert response.status_code == 200
    assert response.text == "fine"
    wait_for(lambda: bodies["/fine"].closes == 1)  # the server closes after it answered


class Server:
    """A minimal server side: records start_response calls and writes, in order.

    Like a PEP 3333 server, it re-raises an ``exc_info`` it is given once
    `headers_sent` is set.
    """

    def __init__(self) -> None:
        self.starts: list[tuple[str, list[tuple[str, str]], Any]] = []
        self.written: list[bytes] = []
        self.events: list[str] = []
        self.headers_sent = False

    def start_response(
        self, status: str, headers: list[tuple[str, str]], exc_info: Any = None, /
    ) -> Any:
        if exc_info is not None and self.headers_sent:
            raise exc_info[1].with_traceback(exc_info[2])
        self.starts.append((status, headers, exc_info))
        self.events.append(f"start {status}")
        return self.write

    def write(self, data: bytes) -> None:
        self.written.append(data)
        self.events.append("write")


def test_503_is_the_only_start_and_without_exc_info() -> None:
    """Headers the app set but never sent are dropped: the 503 is the server's one start, without exc_info."""
    server = Server()

    def failing(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        start_response("200 OK", TEXT)
        raise suspension()

    body = SuspensionMiddleware(failing)({}, server.start_response)
    [(status, headers, exc_info)] = server.starts
    assert (status, exc_info) == ("503 Service Unavailable", None)
    assert ("content-type", "application/json") in headers and TEXT[0] not in headers
    assert b"".join(body).startswith(b'{"error"')


def test_start_is_held_until_the_first_chunk() -> None:
    """The app's start reaches the server only when its first chunk is produced, unchanged."""
    server = Server()

    def plain(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        start_response("200 OK", TEXT)
        return Body([b"first", b"second"])

    chunks = iter(SuspensionMiddleware(plain)({}, server.start_response))
    assert server.starts == []
    assert next(chunks) == b"first"
    assert server.starts == [("200 OK", TEXT, None)]
    assert list(chunks) == [b"second"]
    assert len(server.starts) == 1


def test_empty_body_starts_before_iteration_ends() -> None:
    """An empty body still gives the server the app's start before its iteration ends."""
    server = Server()

    def empty(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        start_response("204 No Content", [])
        return Body([])

    chunks = iter(SuspensionMiddleware(empty)({}, server.start_response))
    with pytest.raises(StopIteration):
        next(chunks)
    assert server.starts == [("204 No Content", [], None)]


def test_write_starts_the_response_first() -> None:
    """The app's write() passes the held start to the server before the data, then writes through."""
    server = Server()

    def writing(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        write = start_response("200 OK", TEXT)
        write(b"one")
        write(b"two")
        return Body([b"three"])

    body = SuspensionMiddleware(writing)({}, server.start_response)
    assert server.events == ["start 200 OK", "write", "write"]
    assert list(body) == [b"three"]
    assert server.written == [b"one", b"two"]
    assert len(server.starts) == 1


def test_new_start_with_exc_info_replaces_the_held_one() -> None:
    """Before anything was sent, a start with exc_info replaces the held one: the server sees only it."""
    server = Server()

    def handling(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        start_response("200 OK", TEXT)
        try:
            raise RuntimeError("the app's own error")
        except RuntimeError:
            start_response("500 Internal Server Error", [("x-error", "1")], sys.exc_info())
        return [b"sorry"]

    assert list(SuspensionMiddleware(handling)({}, server.start_response)) == [b"sorry"]
    [(status, headers, exc_info)] = server.starts
    assert (status, headers) == ("500 Internal Server Error", [("x-error", "1")])
    assert isinstance(exc_info[1], RuntimeError)  # the app's own, passed on as it gave it


def test_second_start_without_exc_info_is_an_error() -> None:
    """A second start without exc_info raises AssertionError, as wsgiref does, and reaches no server."""
    server = Server()

    def twice(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        start_response("200 OK", TEXT)
        start_response("201 Created", TEXT)
        return [b"never"]

    with pytest.raises(AssertionError, match="second time"):
        SuspensionMiddleware(twice)({}, server.start_response)
    assert server.starts == []


def test_exc_info_after_headers_were_sent_is_reraised() -> None:
    """Once the start went to the server, a start with exc_info goes straight to it, which re-raises the error."""
    server = Server()
    error = RuntimeError("after the headers")

    def late(environ: WSGIEnvironment, start_response: StartResponse) -> Iterator[bytes]:
        start_response("200 OK", TEXT)
        yield b"first"
        try:
            raise error
        except RuntimeError:
            start_response("500 Internal Server Error", [], sys.exc_info())
        yield b"never"

    chunks = iter(SuspensionMiddleware(late)({}, server.start_response))
    assert next(chunks) == b"first"
    server.headers_sent = True
    with pytest.raises(RuntimeError) as raised:
        next(chunks)
    assert raised.value is error
    assert len(server.starts) == 1


def test_started_body_reraises_the_same_error() -> None:
    """Once a chunk has gone to the server, the very same exception is re-raised."""
    error = suspension()
    server = Server()
    inner = Body([b"first"], error)

    def streaming(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        start_response("200 OK", TEXT)
        return inner

    chunks = iter(SuspensionMiddleware(streaming)({}, server.start_response))
    assert next(chunks) == b"first"
    with pytest.raises(type(error)) as raised:
        next(chunks)
    assert raised.value is error
    assert len(server.starts) == 1


def test_written_response_reraises_the_same_error() -> None:
    """Once the app wrote through write(), the very same exception is re-raised, nothing started."""
    error = suspension()
    server = Server()

    def writing(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        start_response("200 OK", TEXT)(b"first")
        raise error

    with pytest.raises(type(error)) as raised:
        SuspensionMiddleware(writing)({}, server.start_response)
    assert raised.value is error
    assert server.written == [b"first"]
    assert len(server.starts) == 1


def test_unread_body_is_closed_once() -> None:
    """A server that closes the response without reading it closes the app's iterable, once."""
    inner = Body([b"never read"])

    def plain(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        start_response("200 OK", TEXT)
        return inner

    body: Any = SuspensionMiddleware(plain)({}, Server().start_response)
    body.close()
    body.close()
    assert inner.closes == 1
