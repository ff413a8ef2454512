"""The WSGI middleware under real servers and the in-process test clients people use.

Every request is made twice through the same server or client: to the app
behind the middleware, and to the bare app (`/bare/...`, see wsgi_apps.py).
Only a suspension before the body may differ, and there the client must get
the 503 of DESIGN §3.4: gunicorn, werkzeug's server and wsgiref on
127.0.0.1, and in process `httpx.WSGITransport`, werkzeug's test `Client`
and Flask's test client, which re-raise any `exc_info` they are given.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import flask
import httpx
import pytest
from werkzeug.test import Client

import sidestep.flask
from servers import serve_gunicorn, serve_wsgi
from sidestep import AllCandidatesSuspended
from sidestep.wsgi import SuspensionMiddleware
from suspensions import assert_unavailable, suspension
from wsgi_apps import FIRST_CHUNK, PLAIN_BODY, PLAIN_CHUNKS, PLAIN_HEADERS, WRITTEN, application

_STOP_TIMEOUT = 10.0


@dataclass(frozen=True)
class Outcome:
    """What a client saw of one request: the response as far as it came, and the error that ended it."""

    status: int | None
    headers: tuple[tuple[str, str], ...]
    body: bytes
    error: type[BaseException] | None

    def response(self) -> httpx.Response:
        """The outcome as an httpx response, for `assert_unavailable`."""
        assert self.status is not None, self
        assert self.error is None, self
        return httpx.Response(self.status, headers=list(self.headers), content=self.body)


Fetch = Callable[[str], Outcome]


@dataclass(frozen=True)
class Runner:
    """One way to run `wsgi_apps.application` and request it."""

    fetch: Fetch
    # The error the client sees when the body breaks after its first chunk.
    cut_off_error: type[BaseException] | None
    # Whether the body an app hands to write() reaches the client.
    keeps_writes: bool = True


# --- fetching -----------------------------------------------------------------------------


def _fetch_httpx(client: httpx.Client, path: str) -> Outcome:
    """GET `path`; a body cut off (or an app error, in process) ends the outcome."""
    status: int | None = None
    headers: tuple[tuple[str, str], ...] = ()
    received = bytearray()
    try:
        with client.stream("GET", path) as response:
            status = response.status_code
            # The date may tick between two requests; nothing else may differ.
            headers = tuple((k, v) for k, v in response.headers.multi_items() if k != "date")
            for chunk in response.iter_raw():
                received += chunk
    except Exception as exc:
        return Outcome(status, headers, bytes(received), type(exc))
    return Outcome(status, headers, bytes(received), None)


def _fetch_werkzeug(client: Client, path: str) -> Outcome:
    """GET `path` with werkzeug's test client, reading the body chunk by chunk."""
    status: int | None = None
    headers: tuple[tuple[str, str], ...] = ()
    received = bytearray()
    try:
        response = client.get(path)
        status = response.status_code
        headers = tuple(response.headers.to_wsgi_list())
        try:
            for chunk in response.response:
                received += chunk
        finally:
            response.close()
    except Exception as exc:
        return Outcome(status, headers, bytes(received), type(exc))
    return Outcome(status, headers, bytes(received), None)


# --- servers ------------------------------------------------------------------------------


@contextlib.contextmanager
def _gunicorn(logs: Path) -> Iterator[str]:
    """gunicorn serving `wsgi_apps:application`, one worker."""
    with serve_gunicorn("wsgi_apps:application", logs, ready="/bare/plain") as url:
        yield url


class _QuietWSGIRefHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Access lines say nothing a test needs; errors are still logged."""


@contextlib.contextmanager
def _wsgiref() -> Iterator[str]:
    """The standard library's reference server (HTTP/1.0), in a thread."""
    server = make_server("127.0.0.1", 0, application, handler_class=_QuietWSGIRefHandler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(_STOP_TIMEOUT)
        server.server_close()


@contextlib.contextmanager
def _over_http(server: contextlib.AbstractContextManager[str]) -> Iterator[Fetch]:
    with server as url, httpx.Client(base_url=url, timeout=10.0) as client:
        yield lambda path: _fetch_httpx(client, path)


@pytest.fixture(
    scope="module",
    params=["gunicorn", "werkzeug-server", "wsgiref", "httpx-wsgitransport", "werkzeug-client"],
)
def runner(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runner]:
    """`wsgi_apps.application` under one server or in-process client."""
    name = request.param
    if name == "gunicorn":
        logs = tmp_path_factory.mktemp("gunicorn") / "error.log"
        with _over_http(_gunicorn(logs)) as fetch:
            yield Runner(fetch, httpx.RemoteProtocolError)
    elif name == "werkzeug-server":
        with _over_http(serve_wsgi(application)) as fetch:
            yield Runner(fetch, httpx.RemoteProtocolError)
    elif name == "wsgiref":
        # HTTP/1.0 without a length: the body ends when the connection closes,
        # so a broken body cannot be told from a complete one.
        with _over_http(_wsgiref()) as fetch:
            yield Runner(fetch, None)
    elif name == "httpx-wsgitransport":
        transport = httpx.WSGITransport(app=application)
        with httpx.Client(transport=transport, base_url="http://testserver") as client:
            # httpx's write() callable drops what it is given, with or without the middleware.
            yield Runner(lambda path: _fetch_httpx(client, path), AllCandidatesSuspended, False)
    else:
        client = Client(application)
        yield Runner(lambda path: _fetch_werkzeug(client, path), AllCandidatesSuspended)


# --- the 503 ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/suspended", "/headers-set", "/first-chunk-fails"])
def test_suspension_before_the_body_reaches_the_client_as_503(runner: Runner, path: str) -> None:
    """A suspension raised before any body, from the call or the first chunk, reaches the client as the 503 with Retry-After and the JSON body."""
    outcome = runner.fetch(path)
    assert_unavailable(outcome.response(), retry_after=12)
    names = [name.lower() for name, _ in outcome.headers]
    assert names.count("content-type") == 1  # none of the app's unsent headers survive


# --- everything else is the bare app's own outcome ----------------------------------------


@pytest.mark.parametrize(
    "path", ["/plain", "/empty", "/written", "/other", "/after-first-chunk-fails"]
)
def test_outcome_is_the_bare_apps(runner: Runner, path: str) -> None:
    """Without a suspension before the body, the client sees exactly what the bare app gives it."""
    assert runner.fetch(path) == runner.fetch(f"/bare{path}")


def test_normal_response_passes_byte_for_byte(runner: Runner) -> None:
    """A healthy response arrives with the app's status, headers (repeated ones included, in order) and exact bytes."""
    outcome = runner.fetch("/plain")
    assert (outcome.status, outcome.body, outcome.error) == (200, PLAIN_BODY, None)
    expected = [(name.lower(), value) for name, value in PLAIN_HEADERS]
    received = [(name.lower(), value) for name, value in outcome.headers]
    assert [header for header in received if header in expected] == expected


def test_written_response_passes(runner: Runner) -> None:
    """An app that answers through write() gets its status and its written bytes through."""
    outcome = runner.fetch("/written")
    assert (outcome.status, outcome.error) == (200, None)
    assert outcome.body == (b"".join(WRITTEN) if runner.keeps_writes else b"")


def test_empty_body_still_starts_the_response(runner: Runner) -> None:
    """An app whose body is empty still answers its own status and headers."""
    outcome = runner.fetch("/empty")
    assert (outcome.status, outcome.body, outcome.error) == (200, b"", None)
    assert ("content-length", "0") in [(k.lower(), v) for k, v in outcome.headers]


def test_failure_after_the_first_chunk_is_not_replaced(runner: Runner) -> None:
    """A suspension after the first chunk keeps the app's 200 and first chunk, and ends the response with the error, as without the middleware."""
    outcome = runner.fetch("/after-first-chunk-fails")
    assert (outcome.status, outcome.error) == (200, runner.cut_off_error)
    assert outcome.body == FIRST_CHUNK


# --- Flask's test client ------------------------------------------------------------------


def _flask_app(*, middleware: bool) -> flask.Flask:
    """A Flask app with `init_app`, and, with `middleware`, `wsgi_app` behind the middleware."""
    app = flask.Flask(__name__)
    sidestep.flask.init_app(app)
    if middleware:
        app.wsgi_app = SuspensionMiddleware(app.wsgi_app)  # type: ignore[method-assign]

    @app.get("/suspended")
    def suspended() -> str:
        raise suspension(11.2)

    @app.get("/first-chunk-fails")
    def first_chunk_fails() -> flask.Response:
        def body() -> Iterator[bytes]:
            raise suspension(11.2)
            yield b"never"  # a generator: the error comes while Flask's response streams

        return flask.Response(body(), mimetype="text/plain")

    @app.get("/after-first-chunk-fails")
    def after_first_chunk_fails() -> flask.Response:
        def body() -> Iterator[bytes]:
            yield FIRST_CHUNK
            raise suspension(11.2)

        return flask.Response(body(), mimetype="text/plain")

    @app.get("/plain")
    def plain() -> flask.Response:
        return flask.Response(PLAIN_CHUNKS, headers=PLAIN_HEADERS)

    return app


@pytest.fixture(scope="module")
def flask_clients() -> tuple[Client, Client]:
    """Flask's test clients of the app with the middleware, and of the same app without it."""
    return (
        _flask_app(middleware=True).test_client(),
        _flask_app(middleware=False).test_client(),
    )


def test_flask_view_suspension_reaches_the_test_client_as_503(
    flask_clients: tuple[Client, Client],
) -> None:
    """A view raising a suspension answers the 503 through init_app, with the middleware around it too."""
    for client in flask_clients:
        assert_unavailable(_fetch_werkzeug(client, "/suspended").response(), retry_after=12)


def test_flask_streamed_suspension_reaches_the_test_client_as_503(
    flask_clients: tuple[Client, Client],
) -> None:
    """A streamed body failing with a suspension before its first chunk answers the 503 through the middleware."""
    wrapped, _ = flask_clients
    assert_unavailable(_fetch_werkzeug(wrapped, "/first-chunk-fails").response(), retry_after=12)


@pytest.mark.parametrize("path", ["/plain", "/after-first-chunk-fails"])
def test_flask_outcome_is_the_bare_apps(flask_clients: tuple[Client, Client], path: str) -> None:
    """Without a suspension before the body, Flask's test client sees what the app without the middleware gives."""
    wrapped, bare = flask_clients
    assert _fetch_werkzeug(wrapped, path) == _fetch_werkzeug(bare, path)


def test_flask_normal_response_passes_byte_for_byte(flask_clients: tuple[Client, Client]) -> None:
    """A healthy Flask response arrives with its headers and exact bytes behind the middleware."""
    wrapped, _ = flask_clients
    outcome = _fetch_werkzeug(wrapped, "/plain")
    assert (outcome.status, outcome.body, outcome.error) == (200, PLAIN_BODY, None)
    for header in PLAIN_HEADERS:
        assert header in outcome.headers


def test_flask_failure_after_the_first_chunk_propagates(
    flask_clients: tuple[Client, Client],
) -> None:
    """A suspension after the first streamed chunk is raised to the test client, not turned into a 503."""
    wrapped, _ = flask_clients
    outcome = _fetch_werkzeug(wrapped, "/after-first-chunk-fails")
    assert (outcome.status, outcome.body, outcome.error) == (
        200,
        FIRST_CHUNK,
        AllCandidatesSuspended,
    )
