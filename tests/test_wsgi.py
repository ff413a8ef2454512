"""The WSGI middleware, under werkzeug's server and called directly."""

from __future__ import annotations

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
    """A minimal server side: records start_response calls and hands out a write callable."""

    def __init__(self) -> None:
        self.starts: list[tuple[str, list[tuple[str, str]], Any]] = []
        self.written: list[bytes] = []

    def start_response(
        self, status: str, headers: list[tuple[str, str]], exc_info: Any = None, /
    ) -> Any:
        self.starts.append((status, headers, exc_info))
        return self.written.append


def test_replacement_passes_exc_info() -> None:
    """The 503 start carries the exception, as PEP 3333 requires to replace headers already set."""
    error = suspension()
    server = Server()

    def failing(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        start_response("200 OK", TEXT)
        raise error

    body = SuspensionMiddleware(failing)({}, server.start_response)
    (status, _, _), (status_503, _, exc_info) = server.starts
    assert (status, status_503) == ("200 OK", "503 Service Unavailable")
    assert exc_info[1] is error
    assert b"".join(body).startswith(b'{"error"')


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
