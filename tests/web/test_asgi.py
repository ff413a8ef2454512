"""The ASGI middleware, under uvicorn and called directly."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from servers import read_cut_off, serve_asgi
from sidestep.asgi import Message, SuspensionMiddleware
from suspensions import assert_unavailable, raise_as_sdk, suspension


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    app.state.started = True
    yield


def make_app() -> FastAPI:
    app = FastAPI(lifespan=lifespan)
    app.add_middleware(SuspensionMiddleware)

    @app.get("/suspended")
    async def suspended() -> None:
        raise suspension(11.2)

    @app.get("/indefinite")
    async def indefinite() -> None:
        raise suspension(None)

    @app.get("/sdk")
    async def sdk() -> None:
        raise_as_sdk(suspension(11.2))

    @app.get("/other")
    async def other() -> None:
        raise RuntimeError("not a suspension")

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"first chunk"
            raise suspension(11.2)

        return StreamingResponse(chunks(), media_type="text/plain")

    @app.get("/started")
    async def started() -> dict[str, bool]:
        return {"started": app.state.started}

    return app


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve_asgi(make_app()) as url:
        yield url


@pytest.fixture
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=5.0) as client:
        yield client


def test_suspension_becomes_503(client: httpx.Client) -> None:
    """An endpoint raising AllCandidatesSuspended answers the documented 503 with Retry-After."""
    assert_unavailable(client.get("/suspended"), retry_after=12)


def test_sdk_error_raised_from_a_suspension_becomes_503(client: httpx.Client) -> None:
    """openai.APIConnectionError raised from the suspension is seen through."""
    assert_unavailable(client.get("/sdk"), retry_after=12)


def test_unknown_retry_after_leaves_the_header_out(client: httpx.Client) -> None:
    """An indefinite suspension answers without Retry-After and with retry_after null."""
    assert_unavailable(client.get("/indefinite"), retry_after=None)


def test_other_errors_stay_500(client: httpx.Client) -> None:
    """Any other error reaches the framework's own 500 untouched."""
    response = client.get("/other")
    assert response.status_code == 500
    assert response.text == "Internal Server Error"
    assert "retry-after" not in response.headers


def test_started_stream_is_broken_not_replaced(client: httpx.Client) -> None:
    """A stream that fails after its first chunk keeps its 200 and ends broken, never completed."""
    assert read_cut_off(client, "/stream") == (200, b"first chunk")


def test_lifespan_passes_through(client: httpx.Client) -> None:
    """Lifespan startup runs through the middleware."""
    assert client.get("/started").json() == {"started": True}


class Recorder:
    """An ASGI app that records its call, sends `messages`, then raises `error`."""

    def __init__(self, messages: list[Message], error: Exception | None = None) -> None:
        self.messages = messages
        self.error = error
        self.calls: list[tuple[Any, Any, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls.append((scope, receive, send))
        for message in self.messages:
            await send(message)
        if self.error is not None:
            raise self.error


async def receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


@pytest.mark.anyio
@pytest.mark.parametrize("scope_type", ["websocket", "lifespan"])
async def test_other_scopes_go_straight_through(scope_type: str) -> None:
    """Non-HTTP scopes reach the app with the server's own callables, and errors are not mapped."""
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    error = suspension()
    app = Recorder([{"type": "websocket.accept"}], error)
    scope = {"type": scope_type}
    with pytest.raises(type(error)) as raised:
        await SuspensionMiddleware(app)(scope, receive, send)
    assert raised.value is error
    assert app.calls == [(scope, receive, send)]
    assert sent == [{"type": "websocket.accept"}]


@pytest.mark.anyio
async def test_started_response_reraises_the_same_error() -> None:
    """Once the response has started, the very same exception is re-raised and nothing is added."""
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    error = suspension()
    start = {"type": "http.response.start", "status": 200, "headers": []}
    with pytest.raises(type(error)) as raised:
        await SuspensionMiddleware(Recorder([start], error))({"type": "http"}, receive, send)
    assert raised.value is error
    assert sent == [start]


@pytest.mark.anyio
async def test_unstarted_response_gets_the_503_messages() -> None:
    """Before the start, the middleware sends exactly one 503 start and one complete body."""
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await SuspensionMiddleware(Recorder([], suspension(0.3)))({"type": "http"}, receive, send)
    start, body = sent
    assert start["type"] == "http.response.start"
    assert start["status"] == 503
    assert (b"retry-after", b"1") in start["headers"]
    assert body["type"] == "http.response.body"
    assert body.get("more_body", False) is False
    assert b'"retry_after": 1' in body["body"]
