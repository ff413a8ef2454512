"""The Flask example survives its primary's outage: tested with sidestep's pytest plugin.

The app runs as it ships (its own ``sidestep.yaml``, the real ``openai`` SDK on sync
httpx2); the plugin's markers make targets fail, for the whole test, under every
sidestep transport the process builds. Run from the repository root:
``pytest examples/flask_app``.
"""

from __future__ import annotations

import flask
import pytest

from .app import create_app

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello"}]}


@pytest.fixture
def app(providers: None) -> flask.Flask:
    return create_app()  # builds the transport within the test, where the plugin sees it


@pytest.mark.sidestep_fault("status", status=429, retry_after=30, target="primary")
def test_the_backup_answers_while_the_primary_is_rate_limited(app: flask.Flask) -> None:
    """With the primary answering 429 with Retry-After, /chat answers 200 with the
    backup's completion."""
    response = app.test_client().post("/chat", json=CHAT)
    assert response.status_code == 200
    assert response.get_json()["choices"][0]["message"]["content"] == "from backup"


@pytest.mark.sidestep_down("primary", status=500)
@pytest.mark.sidestep_fault("connect_error", target="backup")
def test_every_target_down_ends_in_the_documented_503(app: flask.Flask) -> None:
    """With the primary answering 500 and the backup unreachable, /chat fails until both
    circuits open, then answers 503 all_candidates_suspended with Retry-After."""
    client = app.test_client()
    statuses = [client.post("/chat", json=CHAT).status_code for _ in range(3)]
    assert 503 not in statuses
    response = client.post("/chat", json=CHAT)
    assert response.status_code == 503
    assert response.get_json()["error"]["type"] == "all_candidates_suspended"
    assert int(response.headers["Retry-After"]) >= 1
