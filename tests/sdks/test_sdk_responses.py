"""The real OpenAI SDK's Responses API over sidestep, against fake upstreams on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import sidestep
from llm_upstream import OPENAI, llm, unavailable
from sidestep._settings.values import SidestepConfigWarning
from upstream import Upstream

COLOURS = ("sync", "async")
FAULTS = ("invalid", "cut")


@pytest.fixture(params=COLOURS)
def is_async(request: pytest.FixtureRequest) -> bool:
    return request.param == "async"


@pytest.fixture(autouse=True)
def scripted(a: Upstream, b: Upstream) -> None:
    """Both upstreams answer whole; a test spoils the primary's stream."""
    a.behaviour = llm("a")
    b.behaviour = llm("b")


@pytest.fixture(autouse=True)
def _uninstalled() -> Iterator[None]:
    yield
    sidestep.uninstall()


def responses_config(
    a: Upstream, b: Upstream, *, commit: str = "complete", validate: str = "auto"
) -> sidestep.Config:
    """Route "llm": the primary `a` (the SDK's base URL), then the backup `b` with its own key."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)  # threshold 1: one failure opens
        return sidestep.Config.model_validate(
            {
                "breaker": {"failure_threshold": 1, "cooldown": 30},
                "failover": {"retry_ambiguous": True},  # a POST that was answered may go again
                "routes": [
                    {
                        "name": "llm",
                        "commit": commit,
                        "validate": validate,
                        "targets": [
                            {"name": "primary", "url": a.url + "/v1"},
                            {
                                "name": "backup",
                                "url": b.url + "/v1",
                                "headers": OPENAI.key("b-key"),
                            },
                        ],
                    }
                ],
            }
        )


def _text_of(events: list[Any]) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def ask(
    is_async: bool, a: Upstream, config: sidestep.Config, *, stream: bool = True
) -> tuple[str, list[str], dict[str, Any]]:
    """One `responses.create` through a wrapped default client: the text, the event types, and the attribution."""
    http_client = sidestep.wrap(OPENAI.default_http_client(is_async), config)
    kw: dict[str, Any] = {"model": "m", "input": "hi"}
    if not is_async:
        with OPENAI.client(a.url, is_async=False, http_client=http_client) as client:
            if not stream:
                raw = client.responses.with_raw_response.create(**kw)
                answer = raw.parse()
                return answer.output_text, [], raw.http_response.extensions["sidestep"]
            with client.responses.create(**kw, stream=True) as events:
                seen = list(events)
                attribution = events.response.extensions["sidestep"]
        return _text_of(seen), [e.type for e in seen], attribution

    async def go() -> tuple[str, list[str], dict[str, Any]]:
        async with OPENAI.client(a.url, is_async=True, http_client=http_client) as client:
            if not stream:
                raw = await client.responses.with_raw_response.create(**kw)
                answer = raw.parse()
                return answer.output_text, [], raw.http_response.extensions["sidestep"]
            async with await client.responses.create(**kw, stream=True) as events:
                seen = [event async for event in events]
                attribution = events.response.extensions["sidestep"]
        return _text_of(seen), [e.type for e in seen], attribution

    return asyncio.run(go())


def assert_answered_by_backup(a: Upstream, b: Upstream, attribution: dict[str, Any]) -> None:
    assert (a.calls, b.calls) == (1, 1)
    assert attribution == {"route": "llm", "target": "backup", "attempts": 2, "failover": True}
    assert b.seen[0].path == "/v1/responses"
    assert b.seen[0].headers["authorization"] == "Bearer b-key"
    assert "primary-key" not in str(b.seen[0].headers)


@pytest.mark.parametrize("fault", FAULTS)
def test_a_malformed_responses_stream_from_the_primary_is_replaced_by_the_backups(
    is_async: bool, fault: str, a: Upstream, b: Upstream
) -> None:
    """A Responses stream with an invalid JSON event or cut before response.completed never reaches the SDK: it reads the backup's whole stream."""
    a.behaviour = llm("a", fault=fault)
    text, types, attribution = ask(is_async, a, responses_config(a, b))
    assert text == "hello from b"
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert_answered_by_backup(a, b, attribution)


def test_a_whole_responses_stream_from_the_primary_is_served_by_it(
    is_async: bool, a: Upstream, b: Upstream
) -> None:
    """A valid Responses stream passes validation: the primary's answer, attributed to it, and the backup never called."""
    text, types, attribution = ask(is_async, a, responses_config(a, b))
    assert text == "hello from a"
    assert types[-1] == "response.completed"
    assert attribution == {"route": "llm", "target": "primary", "attempts": 1, "failover": False}
    assert (a.calls, b.calls) == (1, 0)


def test_a_503_answer_to_a_responses_call_is_answered_by_the_backup(
    is_async: bool, a: Upstream, b: Upstream
) -> None:
    """A non-streamed responses.create whose primary answers 503 returns the backup's Response object."""
    a.behaviour = unavailable
    text, _, attribution = ask(is_async, a, responses_config(a, b), stream=False)
    assert text == "hello from b"
    assert_answered_by_backup(a, b, attribution)


@pytest.mark.parametrize("fault", FAULTS)
def test_a_malformed_responses_stream_is_what_the_sdk_sees_without_validation(
    is_async: bool, fault: str, a: Upstream, b: Upstream
) -> None:
    """The faults are real: with validate: none the SDK raises on the invalid event or ends without response.completed."""
    a.behaviour = llm("a", fault=fault)
    config = responses_config(a, b, validate="none")
    if fault == "invalid":
        with pytest.raises(json.JSONDecodeError):  # raised in the caller's code
            ask(is_async, a, config)
    else:
        text, types, attribution = ask(is_async, a, config)
        assert text == "hello from a"  # a truncated "success"
        assert "response.completed" not in types
        assert attribution["target"] == "primary"
    assert (a.calls, b.calls) == (1, 0)
