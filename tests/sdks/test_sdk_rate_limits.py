"""avoid_rate_limits through the real OpenAI and Anthropic SDKs, against fake LLM upstreams on 127.0.0.1."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from typing import Any

import pytest

import sidestep
from llm_upstream import SDKS, Sdk, llm
from upstream import Respond, Seen, Upstream

# What each provider says on the answer that spends its window's last request.
SPENT: dict[str, Callable[[], dict[str, str]]] = {
    "openai": lambda: {
        "x-ratelimit-limit-requests": "1",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "30s",
    },
    "anthropic": lambda: {
        "anthropic-ratelimit-requests-limit": "1",
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": (
            datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=30)
        ).isoformat(timespec="seconds"),
    },
}


@pytest.fixture(params=sorted(SDKS))
def sdk(request: pytest.FixtureRequest) -> Sdk:
    return SDKS[request.param]


@pytest.fixture(params=["sync", "async"])
def is_async(request: pytest.FixtureRequest) -> bool:
    return request.param == "async"


def one_request_per_window(sdk: Sdk, upstream: Upstream) -> Callable[[Seen], Any]:
    """The primary allows one request, saying so as its provider does, then answers 429."""
    answer = llm(upstream.name)

    def behaviour(seen: Seen) -> Any:
        if upstream.calls > 1:
            return Respond(429, {"error": {"type": "rate_limit_error", "message": "slow down"}})
        action = answer(seen)
        action.headers.update(SPENT[sdk.name]())
        return action

    return behaviour


def ask_twice(sdk: Sdk, is_async: bool, a: Upstream, b: Upstream, avoid: bool) -> list[str]:
    config = {
        "routes": [
            {
                "name": "llm",
                "avoid_rate_limits": avoid,
                "targets": [
                    {"name": "primary", "url": a.url + "/v1"},
                    {"name": "backup", "url": b.url + "/v1", "headers": sdk.key("b-key")},
                ],
            }
        ]
    }
    http_client = sidestep.wrap(sdk.default_http_client(is_async), config)
    if not is_async:
        with sdk.client(a.url, is_async=False, http_client=http_client) as client:
            return [sdk.ask(client), sdk.ask(client)]

    async def go() -> list[str]:
        async with sdk.client(a.url, is_async=True, http_client=http_client) as client:
            return [await sdk.ask_async(client), await sdk.ask_async(client)]

    return asyncio.run(go())


@pytest.mark.parametrize("avoid", [True, False], ids=["avoid", "default"])
def test_the_second_call_goes_to_the_backup_without_a_429_when_asked(
    sdk: Sdk, is_async: bool, avoid: bool, a: Upstream, b: Upstream
) -> None:
    """With avoid_rate_limits the SDK's second call is the backup's without reaching the spent primary; by default the primary answers it 429 first."""
    a.behaviour = one_request_per_window(sdk, a)
    b.behaviour = llm("b")
    assert ask_twice(sdk, is_async, a, b, avoid) == ["hello from a", "hello from b"]
    assert (a.calls, b.calls) == (1 if avoid else 2, 1)
