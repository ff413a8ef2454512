"""The Flask integration, under werkzeug's server and Flask's test client."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator

import flask
import httpx
import pytest

import sidestep.flask
from servers import serve_wsgi
from suspensions import assert_unavailable, raise_as_sdk, suspension


def make_app() -> flask.Flask:
    app = flask.Flask(__name__)

    @app.get("/suspended")
    def suspended() -> str:
        raise suspension(11.2)

    @app.get("/indefinite")
    def indefinite() -> str:
        raise suspension(None)

    @app.get("/sdk")
    def sdk() -> str:
        raise_as_sdk(suspension(11.2))

    @app.get("/other")
    def other() -> str:
        raise RuntimeError("not a suspension")

    @app.get("/teapot")
    def teapot() -> str:
        flask.abort(418)

    @app.get("/fine")
    def fine() -> str:
        return "fine"

    return app


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    app = make_app()
    sidestep.flask.init_app(app)
    with serve_wsgi(app) as url:
        yield url


@pytest.fixture
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=5.0) as client:
        yield client


def test_suspension_becomes_503(client: httpx.Client) -> None:
    """A view raising AllCandidatesSuspended answers the documented 503 with Retry-After."""
    assert_unavailable(client.get("/suspended"), retry_after=12)


def test_sdk_error_raised_from_a_suspension_becomes_503(client: httpx.Client) -> None:
    """openai.APIConnectionError raised from the suspension is seen through."""
    assert_unavailable(client.get("/sdk"), retry_after=12)


def test_unknown_retry_after_leaves_the_header_out(client: httpx.Client) -> None:
    """An indefinite suspension answers without Retry-After and with retry_after null."""
    assert_unavailable(client.get("/indefinite"), retry_after=None)


def test_other_errors_stay_flasks_500(client: httpx.Client) -> None:
    """Any other error still becomes Flask's own 500 page."""
    response = client.get("/other")
    assert response.status_code == 500
    assert "Internal Server Error" in response.text
    assert "retry-after" not in response.headers


@pytest.mark.parametrize(("path", "status"), [("/missing", 404), ("/teapot", 418), ("/fine", 200)])
def test_http_errors_and_answers_are_unchanged(
    client: httpx.Client, path: str, status: int
) -> None:
    """Routing and abort() errors keep Flask's own responses; plain answers pass through."""
    response = client.get(path)
    assert response.status_code == status
    assert "retry-after" not in response.headers
    assert response.headers["content-type"].startswith("text/html" if status >= 400 else "text/")


def test_testing_mode_propagates_other_errors_only() -> None:
    """Under TESTING other errors propagate, as Flask does; a suspension still gets the 503."""
    app = make_app()
    app.testing = True
    sidestep.flask.init_app(app)
    test_client = app.test_client()
    with pytest.raises(RuntimeError, match="not a suspension"):
        test_client.get("/other")
    response = test_client.get("/suspended")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "12"


def test_earlier_exception_handler_still_gets_the_rest() -> None:
    """An Exception handler registered before init_app still answers non-suspension errors."""
    app = make_app()
    app.register_error_handler(Exception, lambda error: (f"handled {type(error).__name__}", 599))
    sidestep.flask.init_app(app)
    test_client = app.test_client()
    assert test_client.get("/other").status_code == 599
    assert test_client.get("/other").text == "handled RuntimeError"
    assert test_client.get("/suspended").status_code == 503


def test_more_specific_handlers_keep_precedence() -> None:
    """A handler for a narrower class or for 404 wins over the catch-all."""
    app = make_app()
    sidestep.flask.init_app(app)
    app.register_error_handler(RuntimeError, lambda error: ("runtime", 597))
    app.register_error_handler(404, lambda error: ("nothing here", 404))
    test_client = app.test_client()
    assert test_client.get("/other").status_code == 597
    assert test_client.get("/missing").text == "nothing here"


def test_suspension_escaping_another_handler_becomes_503() -> None:
    """A suspension raised by the app's own error handler, on Flask's 500 path, gets the 503."""
    app = make_app()
    sidestep.flask.init_app(app)

    def failing_handler(error: Exception) -> str:
        raise suspension(2.5)

    app.register_error_handler(RuntimeError, failing_handler)
    response = app.test_client().get("/other")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "3"


def test_init_app_twice_registers_once() -> None:
    """A second init_app changes nothing."""
    app = make_app()
    sidestep.flask.init_app(app)
    handlers = dict(app.error_handler_spec[None][None])
    sidestep.flask.init_app(app)
    assert app.error_handler_spec[None][None] == handlers
    assert app.test_client().get("/other").status_code == 500


def test_missing_flask_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Flask, importing sidestep.flask fails with the install command."""
    monkeypatch.setitem(sys.modules, "flask", None)
    monkeypatch.delitem(sys.modules, "sidestep.flask")
    with pytest.raises(ImportError, match=r"pip install 'sidestep\[flask\]'"):
        importlib.import_module("sidestep.flask")
