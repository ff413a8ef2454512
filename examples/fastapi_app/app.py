"""A FastAPI chat service whose OpenAI calls fail over from a primary upstream to a backup.

``POST /chat`` forwards an OpenAI chat-completions request (``model``,
``messages``) through the real ``openai`` SDK, running on sidestep's httpx2
transport with the route of ``sidestep.yaml``. When every upstream is
suspended, ``SuspensionMiddleware`` answers ``503 all_candidates_suspended``
with ``Retry-After``. ``GET /suspensions`` lists the circuits that are not
healthy; ``GET /metrics`` serves sidestep's Prometheus metrics; ``GET /healthz``
says the service is up.

Run from the repository root::

    PRIMARY_URL=... PRIMARY_API_KEY=... BACKUP_URL=... BACKUP_API_KEY=... \\
        uvicorn examples.fastapi_app.app:app
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import openai
import prometheus_client
import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

import sidestep
import sidestep.asgi
import sidestep.httpx2
import sidestep.logging


class ChatRequest(BaseModel):
    model: str
    messages: list[dict[str, Any]]


def config_path() -> Path:
    """``$SIDESTEP_CONFIG``, or the ``sidestep.yaml`` next to this file."""
    return Path(os.environ.get("SIDESTEP_CONFIG") or Path(__file__).with_name("sidestep.yaml"))


def configure_logging() -> None:
    """JSON log lines; ``redact`` keeps credentials and URL paths out of every event."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            sidestep.logging.redact,
            structlog.processors.JSONRenderer(),
        ]
    )


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    """One transport and one OpenAI client for the whole process, closed at shutdown."""
    configure_logging()
    transport = sidestep.httpx2.AsyncFailoverTransport(sidestep.load_config(config_path()))
    client = openai.AsyncOpenAI(
        base_url=os.environ["PRIMARY_URL"],
        api_key=os.environ["PRIMARY_API_KEY"],
        http_client=httpx2.AsyncClient(transport=transport),
        # sidestep already retries and fails over; SDK retries on top would
        # multiply the upstream calls, and sleep before the 503 of a suspension.
        max_retries=0,
    )
    async with client:
        # Lifespan state: each request sees it as request.state.<name>.
        yield {"openai": client, "transport": transport}


app = FastAPI(lifespan=lifespan)
app.add_middleware(sidestep.asgi.SuspensionMiddleware)
# sidestep's metrics (`observability: {prometheus: true}` in sidestep.yaml), to scrape.
app.mount("/metrics", prometheus_client.make_asgi_app())


@app.exception_handler(openai.APIStatusError)
async def upstream_error(request: Request, exc: openai.APIStatusError) -> JSONResponse:
    """The last upstream's error, once no candidate was left to try: only its status is passed on.

    There is deliberately no handler for ``openai.APIConnectionError`` (or its
    base ``openai.APIError``): the middleware must see it to answer the 503.
    """
    return JSONResponse(
        {"error": {"type": "upstream_error", "status": exc.status_code}}, status_code=502
    )


@app.post("/chat")
async def chat(body: ChatRequest, request: Request) -> dict[str, Any]:
    client: openai.AsyncOpenAI = request.state.openai
    completion = await client.chat.completions.create(
        model=body.model,
        messages=body.messages,  # type: ignore[arg-type]  # passed on as the caller sent them
    )
    return completion.model_dump(mode="json")


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@app.get("/suspensions")
async def suspensions(request: Request) -> list[dict[str, Any]]:
    """The operator's view: scopes that are open or half-open, by target name."""
    transport: sidestep.httpx2.AsyncFailoverTransport = request.state.transport
    return [dataclasses.asdict(s) for s in transport.suspensions()]
