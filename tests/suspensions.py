"""Suspension errors as sidestep raises them, and the 503 the web integrations must answer."""

from __future__ import annotations

import json
from typing import NoReturn

import httpx
import httpx2
import openai

from sidestep._common.errors import AllCandidatesSuspended, CandidateStatus

MESSAGE = "Every upstream candidate for this request is temporarily suspended."


def suspension(retry_after: float | None = 11.2) -> AllCandidatesSuspended:
    """Every candidate of route "chat" suspended, the earliest for `retry_after` seconds."""
    return AllCandidatesSuspended(
        (CandidateStatus("primary", "open", "unavailable", retry_after),), route="chat"
    )


def raise_as_sdk(error: Exception) -> NoReturn:
    """Raise what the OpenAI SDK raises when its transport raised `error`: its connection error."""
    try:
        raise error
    except httpx2.TransportError as exc:
        raise openai.APIConnectionError(request=httpx2.Request("POST", "http://x")) from exc


def assert_unavailable(response: httpx.Response, retry_after: int | None = 12) -> None:
    """`response` is the 503 of DESIGN §3.4, announcing `retry_after` seconds (None: unknown)."""
    assert response.status_code == 503
    assert response.headers["content-type"] == "application/json"
    assert response.headers.get("retry-after") == (
        None if retry_after is None else str(retry_after)
    )
    assert json.loads(response.content) == {
        "error": {
            "type": "all_candidates_suspended",
            "message": MESSAGE,
            "retry_after": retry_after,
        }
    }
    assert int(response.headers["content-length"]) == len(response.content)
