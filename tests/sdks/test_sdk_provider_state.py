"""The real OpenAI SDK over sidestep: provider state never moves to an Azure-like second
target, so the SDK's own retry of a transient 503 reaches the provider that keeps it."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import sidestep
from llm_upstream import OPENAI, _responses_json, llm
from upstream import Action, Respond, Seen, Upstream

COLOURS = ("sync", "async")


@pytest.fixture(params=COLOURS)
def is_async(request: pytest.FixtureRequest) -> bool:
    return request.param == "async"


@pytest.fixture(autouse=True)
def _uninstalled() -> Iterator[None]:
    yield
    sidestep.uninstall()


def transient(seen: Seen) -> Action:
    """A 503 the SDK retries after a millisecond (its own `retry-after-ms` rule)."""
    body = {"error": {"type": "server_error", "message": "overloaded"}}
    return Respond(503, body, {"retry-after-ms": "1"})


def stored(seen: Seen) -> Action:
    """The stored response resp_1, as OpenAI keeps it."""
    return Respond(body={**_responses_json("hello from a"), "id": "resp_1"})


def primary(*answers: Callable[[Seen], Action]) -> Callable[[Seen], Action]:
    """The provider that keeps resp_1: `answers` in turn, the last one for good."""
    turns = itertools.chain(answers, itertools.repeat(answers[-1]))
    return lambda seen: next(turns)(seen)


def azure_like(seen: Seen) -> Action:
    """Another provider: it keeps no response of the primary's, and answers chat."""
    if "/responses" in seen.path:
        return Respond(404, {"error": {"code": "not_found", "message": "No response found"}})
    return llm("azure")(seen)


def config(a: Upstream, b: Upstream, **route: Any) -> sidestep.Config:
    """Route "openai": the primary `a` (the SDK's base URL), then an Azure-like `b` with its own key and deployment."""
    return sidestep.Config.model_validate(
        {
            "routes": [
                {
                    "name": "openai",
                    "targets": [
                        {"name": "openai", "url": a.url + "/v1"},
                        {
                            "name": "azure",
                            "url": b.url + "/openai/v1",
                            "headers": {"api-key": "azure-key"},
                            "json": {"model": "my-deployment"},
                        },
                    ],
                    **route,
                }
            ]
        }
    )


def call(is_async: bool, a: Upstream, cfg: sidestep.Config, ask: Callable[[Any], Any]) -> Any:
    """`ask(client)` through an SDK client with its default two retries, sidestep wrapped under it."""
    http_client = sidestep.wrap(OPENAI.default_http_client(is_async), cfg)
    if not is_async:
        with OPENAI.client(a.url, is_async=False, http_client=http_client, max_retries=2) as c:
            return ask(c)

    async def go() -> Any:
        async with OPENAI.client(a.url, is_async=True, http_client=http_client, max_retries=2) as c:
            return await ask(c)

    return asyncio.run(go())


def test_retrieving_a_stored_response_is_retried_by_the_sdk_on_its_provider(
    is_async: bool, a: Upstream, b: Upstream
) -> None:
    """responses.retrieve(id) meets a transient 503: the SDK's retry reaches the primary and gets the response; the Azure target never sees a request."""
    a.behaviour = primary(transient, stored)
    b.behaviour = azure_like
    answer = call(is_async, a, config(a, b), lambda c: c.responses.retrieve("resp_1"))
    assert (answer.id, answer.output_text) == ("resp_1", "hello from a")
    assert [s.path for s in a.seen] == ["/v1/responses/resp_1"] * 2
    assert a.seen[1].headers["x-stainless-retry-count"] == "1"  # the SDK's own retry
    assert b.calls == 0


def test_continuing_a_stored_response_is_retried_by_the_sdk_on_its_provider(
    is_async: bool, a: Upstream, b: Upstream
) -> None:
    """responses.create(previous_response_id=...) meets a transient 503: the SDK's retry reaches the primary; the Azure target never sees a request."""
    a.behaviour = primary(transient, stored)
    b.behaviour = azure_like

    def ask(c: Any) -> Any:
        return c.responses.create(model="m", input="and then?", previous_response_id="resp_0")

    answer = call(is_async, a, config(a, b), ask)
    assert answer.output_text == "hello from a"
    assert [s.json()["previous_response_id"] for s in a.seen] == ["resp_0"] * 2
    assert b.calls == 0


def test_a_chat_completion_still_fails_over_to_the_azure_target(
    is_async: bool, a: Upstream, b: Upstream
) -> None:
    """chat.completions.create names no stored state: the primary's 503 never reaches the SDK, the Azure target answers with its own key and deployment."""
    a.behaviour = transient
    b.behaviour = azure_like

    def ask(c: Any) -> Any:
        return c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])

    answer = call(is_async, a, config(a, b), ask)
    assert answer.choices[0].message.content == "hello from azure"
    assert (a.calls, b.calls) == (1, 1)
    assert (b.seen[0].path, b.seen[0].headers["api-key"]) == (
        "/openai/v1/chat/completions",
        "azure-key",
    )
    assert b.seen[0].json()["model"] == "my-deployment"


def test_without_the_rules_the_stored_response_is_lost_to_the_other_provider(
    is_async: bool, a: Upstream, b: Upstream
) -> None:
    """The fault is real: with provider_state: none the 503 fails over to Azure, whose 404 is final for the SDK."""
    openai = OPENAI.module
    a.behaviour = primary(transient, stored)
    b.behaviour = azure_like
    with pytest.raises(openai.NotFoundError):
        call(is_async, a, config(a, b, provider_state="none"), lambda c: c.responses.retrieve("r"))
    assert (a.calls, b.calls) == (1, 1)
