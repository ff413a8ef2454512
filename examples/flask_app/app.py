"""A Flask chat service whose OpenAI calls fail over from a primary upstream to a backup.

``POST /chat`` forwards an OpenAI chat-completions request (``model``,
``messages``) through the real ``openai`` SDK, running on sidestep's sync
httpx2 transport with the route of ``sidestep.yaml``. When every upstream is
suspended, ``sidestep.flask.init_app`` answers ``503 all_candidates_suspended``
with ``Retry-After``. ``GET /suspensions`` lists the circuits that are not
healthy; ``GET /healthz`` says the service is up.

Run from the repository root (``flask`` finds ``create_app`` by itself)::

    PRIMARY_URL=... PRIMARY_API_KEY=... BACKUP_URL=... BACKUP_API_KEY=... \\
        flask --app examples.flask_app.app run
"""

from __future__ import annotations

import atexit
import dataclasses
import os
from pathlib import Path
from typing import Any

import flask
import httpx2
import openai
import structlog

import sidestep
import sidestep.flask
import sidestep.httpx2
import sidestep.logging


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


def create_app() -> flask.Flask:
    """The app, with one transport and one OpenAI client shared by every request thread."""
    configure_logging()
    transport = sidestep.httpx2.FailoverTransport(sidestep.load_config(config_path()))
    client = openai.OpenAI(
        base_url=os.environ["PRIMARY_URL"],
        api_key=os.environ["PRIMARY_API_KEY"],
        http_client=httpx2.Client(transport=transport),
        # sidestep already retries and fails over; SDK retries on top would
        # multiply the upstream calls, and sleep before the 503 of a suspension.
        max_retries=0,
    )
    # WSGI has no shutdown hook: close the client's connections when the process exits.
    atexit.register(client.close)

    app = flask.Flask(__name__)
    sidestep.flask.init_app(app)

    @app.errorhandler(openai.APIStatusError)
    def upstream_error(exc: openai.APIStatusError) -> tuple[dict[str, Any], int]:
        """The last upstream's error, once no candidate was left: only its status is passed on.

        There is deliberately no handler for ``openai.APIConnectionError`` (or
        its base ``openai.APIError``): ``init_app``'s handler must see it to
        answer the 503.
        """
        return {"error": {"type": "upstream_error", "status": exc.status_code}}, 502

    @app.post("/chat")
    def chat() -> dict[str, Any]:
        body = flask.request.get_json(silent=True)
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("model"), str)
            or not isinstance(body.get("messages"), list)
        ):
            flask.abort(400, "expected a JSON object with 'model' and 'messages'")
        completion = client.chat.completions.create(model=body["model"], messages=body["messages"])
        return completion.model_dump(mode="json")

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/suspensions")
    def suspensions() -> list[dict[str, Any]]:
        """The operator's view: scopes that are open or half-open, by target name."""
        return [dataclasses.asdict(s) for s in transport.suspensions()]

    return app
