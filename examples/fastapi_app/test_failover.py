"""The FastAPI example survives its primary's outage: tested with sidestep's pytest plugin.

The app runs as it ships (its own ``sidestep.yaml``, the real ``openai`` SDK); the
plugin's markers make targets fail, for the whole test, under every sidestep transport
the process builds, and close every circuit between tests. Run from the repository root:
``pytest examples/fastapi_app``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from sidestep.testing import FaultPlan, connect_error

from .app import app

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello"}]}


@pytest.fixture
def client(providers: None) -> Iterator[TestClient]:
    with TestClient(app) as client:  # its lifespan builds the transport, within the test
        yield client


@pytest.mark.sidestep_down("primary")
def test_the_backup_answers_while_the_primary_is_down(
    client: TestClient, sidestep_faults: FaultPlan
) -> None:
    """With the primary answering 503, /chat answers 200 with the backup's completion."""
    response = client.post("/chat", json=CHAT)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "from backup"
    assert [fault.target for fault in sidestep_faults.injected] == ["primary"]


@pytest.mark.sidestep_down("primary")
@pytest.mark.sidestep_down("backup")
def test_every_target_down_ends_in_the_documented_503(client: TestClient) -> None:
    """With both down, /chat answers 502 until both circuits open (failure_threshold: 3),
    then 503 all_candidates_suspended with Retry-After, calling no upstream."""
    statuses = [client.post("/chat", json=CHAT).status_code for _ in range(3)]
    assert statuses == [502, 502, 502]
    response = client.post("/chat", json=CHAT)
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "all_candidates_suspended"
    assert int(response.headers["retry-after"]) >= 1


def test_a_plan_inside_the_test(client: TestClient, sidestep_faults: FaultPlan) -> None:
    """The fixture's plan takes rules during the test: two refused connections on the
    primary, then it answers again."""
    sidestep_faults.inject(connect_error(), target="primary", times=2)
    answers = [client.post("/chat", json=CHAT).json() for _ in range(3)]
    contents = [a["choices"][0]["message"]["content"] for a in answers]
    assert contents == ["from backup", "from backup", "from primary"]
