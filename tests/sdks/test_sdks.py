"""The real OpenAI and Anthropic SDKs over sidestep, against fake LLM upstreams on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

import sidestep
from llm_upstream import SDKS, ForwardingProxy, Sdk, llm, unavailable
from sidestep._settings.values import SidestepConfigWarning
from sidestep._shells.shell import Shell
from upstream import (
    IN_TIME,
    Action,
    Behaviour,
    Hang,
    Respond,
    Seen,
    Stream,
    Upstream,
    release_after_seen,
)

COLOURS = ("sync", "async")
RETRY_AFTER = 30  # seconds: the cooldown, and the Retry-After of an all-suspended answer


@pytest.fixture(params=sorted(SDKS))
def sdk(request: pytest.FixtureRequest) -> Sdk:
    return SDKS[request.param]


@pytest.fixture(params=COLOURS)
def is_async(request: pytest.FixtureRequest) -> bool:
    return request.param == "async"


@pytest.fixture(autouse=True)
def scripted(a: Upstream, b: Upstream) -> None:
    """The primary (the SDK's base URL) is down; the backup answers with its own key."""
    a.behaviour = unavailable
    b.behaviour = llm("b")


@pytest.fixture(autouse=True)
def _uninstalled() -> Iterator[None]:
    yield
    sidestep.uninstall()


def llm_config(sdk: Sdk, a: Upstream, b: Upstream, **failover: Any) -> sidestep.Config:
    """Route "llm": the primary `a` (the SDK's base URL), then the backup `b` with its own key."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)  # threshold 1: one 503 opens
        return sidestep.Config.model_validate(
            {
                "breaker": {"failure_threshold": 1, "cooldown": RETRY_AFTER},
                "failover": failover,
                "routes": [
                    {
                        "name": "llm",
                        "targets": [
                            {"name": "primary", "url": a.url + "/v1"},
                            {"name": "backup", "url": b.url + "/v1", "headers": sdk.key("b-key")},
                        ],
                    }
                ],
            }
        )


def ask(
    sdk: Sdk,
    is_async: bool,
    a: Upstream,
    http_client: Any = None,
    *,
    stream: bool = False,
    on_first: Any = None,
    **kw: Any,
) -> str:
    """One question through a new SDK client (its default one when `http_client` is None)."""
    if not is_async:
        with sdk.client(a.url, is_async=False, http_client=http_client, **kw) as client:
            return sdk.ask(client, stream=stream, on_first=on_first)

    async def go() -> str:
        async with sdk.client(a.url, is_async=True, http_client=http_client, **kw) as client:
            return await sdk.ask_async(client, stream=stream, on_first=on_first)

    return asyncio.run(go())


def assert_answered_by_backup(sdk: Sdk, a: Upstream, b: Upstream, text: str) -> None:
    assert text == "hello from b"
    assert (a.calls, b.calls) == (1, 1)
    assert b.seen[0].headers[sdk.key_header] == sdk.key("b-key")[sdk.key_header]
    assert "primary-key" not in str(b.seen[0].headers)


@pytest.mark.parametrize("adopt", ["wrap", "install"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_503_from_the_primary_is_answered_by_the_backup(
    sdk: Sdk, is_async: bool, stream: bool, adopt: str, a: Upstream, b: Upstream
) -> None:
    """The primary answers 503 and the SDK call returns the backup's answer, streamed chunk by chunk."""
    config = llm_config(sdk, a, b)
    release = threading.Event()  # the backup holds its later events until the caller has the first
    b.behaviour = llm("b", release=release)
    if adopt == "wrap":
        http_client = sidestep.wrap(sdk.default_http_client(is_async), config)
    else:
        sidestep.install(config)
        http_client = None
    text = ask(sdk, is_async, a, http_client, stream=stream, on_first=release.set)
    assert_answered_by_backup(sdk, a, b, text)
    assert release.is_set() == stream


def test_a_wrapped_sdk_client_fails_over_behind_an_environment_proxy(
    sdk: Sdk, is_async: bool, a: Upstream, b: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With HTTP_PROXY set, both attempts go through the proxy mount, which sidestep wraps."""
    proxy = ForwardingProxy()
    for name in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, proxy.url)
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    try:
        http_client = sidestep.wrap(
            sdk.default_http_client(is_async, trust_env=True), llm_config(sdk, a, b)
        )
        assert any(t is not None for t in http_client._mounts.values())
        assert_answered_by_backup(sdk, a, b, ask(sdk, is_async, a, http_client))
        assert [s.path.partition("/v1/")[0] for s in proxy.seen] == [a.url, b.url]
    finally:
        proxy.close()


class RequestCounter:
    """An httpx2 request event hook of either colour: how many requests the SDK sent."""

    def __init__(self, is_async: bool) -> None:
        self.count = 0
        self.hook: Any = self._async if is_async else self._sync

    def _sync(self, _request: Any) -> None:
        self.count += 1

    async def _async(self, _request: Any) -> None:
        self.count += 1


def suspend_both(sdk: Sdk, is_async: bool, a: Upstream, b: Upstream, **failover: Any) -> Any:
    """Open both targets' circuits with one 503 each; returns a maker of clients sharing that store."""
    b.behaviour = unavailable
    config = llm_config(sdk, a, b, **failover)
    store = sidestep.MemoryStore()
    with pytest.raises(sdk.module.InternalServerError):
        ask(sdk, is_async, a, sidestep.wrap(sdk.default_http_client(is_async), config, store=store))
    assert (a.calls, b.calls) == (1, 1)

    def http_client(**kw: Any) -> Any:
        return sidestep.wrap(sdk.default_http_client(is_async, **kw), config, store=store)

    return http_client


def test_raise_mode_gives_a_connection_error_caused_by_the_suspension(
    sdk: Sdk, is_async: bool, a: Upstream, b: Upstream
) -> None:
    """Every candidate suspended: APIConnectionError with AllCandidatesSuspended as its cause, and no upstream call."""
    http_client = suspend_both(sdk, is_async, a, b)
    with pytest.raises(sdk.module.APIConnectionError) as caught:
        ask(sdk, is_async, a, http_client(), max_retries=1)  # the retry reaches no upstream either
    suspended = caught.value.__cause__
    assert isinstance(suspended, sidestep.AllCandidatesSuspended)
    assert suspended.retry_after is not None and 0 < suspended.retry_after <= RETRY_AFTER
    assert [c.target for c in suspended.candidates] == ["primary", "backup"]
    assert (a.calls, b.calls) == (1, 1)


def test_respond_mode_gives_a_503_in_one_call_without_waiting(
    sdk: Sdk, is_async: bool, a: Upstream, b: Upstream
) -> None:
    """Every candidate suspended under respond: the SDK's 503 status error at once, with its default retries unused (one would first wait out the Retry-After)."""
    http_client = suspend_both(sdk, is_async, a, b, on_all_suspended="respond")
    counter = RequestCounter(is_async)
    start = time.monotonic()
    with pytest.raises(sdk.module.APIStatusError) as caught:
        ask(
            sdk,
            is_async,
            a,
            http_client(event_hooks={"request": [counter.hook]}),
            max_retries=2,  # the SDKs' default
        )
    took = time.monotonic() - start
    response = caught.value.response
    assert (caught.value.status_code, response.headers["x-sidestep"]) == (
        503,
        "all_candidates_suspended",
    )
    assert 0 < int(response.headers["retry-after"]) <= RETRY_AFTER
    assert counter.count == 1
    assert took < RETRY_AFTER / 2
    assert (a.calls, b.calls) == (1, 1)


def test_uninstall_leaves_a_new_sdk_client_untouched(sdk: Sdk, a: Upstream, b: Upstream) -> None:
    """An SDK client created after uninstall() has its plain transport and sees the primary's 503."""
    sidestep.install(llm_config(sdk, a, b))
    sidestep.uninstall()
    with sdk.client(a.url, is_async=False) as client:
        assert not isinstance(client._client._transport, Shell)
        with pytest.raises(sdk.module.InternalServerError):
            sdk.ask(client)
    assert (a.calls, b.calls) == (1, 0)


def test_install_twice_wraps_an_sdk_client_once(sdk: Sdk, a: Upstream, b: Upstream) -> None:
    """After two install() calls the SDK's default client has one sidestep layer: two attempts, one failover."""
    sidestep.install(llm_config(sdk, a, b))
    sidestep.install(llm_config(sdk, a, b))
    with sdk.client(a.url, is_async=False) as client:
        transport = client._client._transport
        assert not isinstance(transport.inner.own, Shell)
        response = sdk.ask_raw(client)
    assert response.extensions["sidestep"] == {
        "route": "llm",
        "target": "backup",
        "attempts": 2,
        "failover": True,
    }


def test_install_does_not_wrap_a_wrapped_sdk_client_again(
    sdk: Sdk, a: Upstream, b: Upstream
) -> None:
    """An SDK client over a client wrap() wrapped keeps that one layer and its config under install()."""
    sidestep.install({})  # no routes: install alone would never reach the backup
    http_client = sidestep.wrap(sdk.default_http_client(False), llm_config(sdk, a, b))
    transport = http_client._transport
    with sdk.client(a.url, is_async=False, http_client=http_client) as client:
        assert client._client._transport is transport
        assert not isinstance(transport.inner.own, Shell)
        assert_answered_by_backup(sdk, a, b, sdk.ask(client))


@pytest.mark.parametrize("fault", ["invalid", "cut"])
def test_a_malformed_stream_from_the_primary_is_replaced_by_the_backups(
    sdk: Sdk, is_async: bool, fault: str, a: Upstream, b: Upstream
) -> None:
    """With commit: complete, a stream with an invalid JSON event or cut before its end event never reaches the SDK: it reads the backup's whole answer."""
    a.behaviour = llm("a", fault=fault)
    config = llm_config(sdk, a, b, retry_ambiguous=True)
    route = config.routes[0].model_copy(update={"commit": "complete"})
    config = config.model_copy(update={"routes": [route]})
    http_client = sidestep.wrap(sdk.default_http_client(is_async), config)
    text = ask(sdk, is_async, a, http_client, stream=True)
    assert_answered_by_backup(sdk, a, b, text)


@pytest.mark.parametrize("fault", ["invalid", "cut"])
def test_a_malformed_stream_is_what_the_sdk_sees_without_validation(
    sdk: Sdk, fault: str, a: Upstream, b: Upstream
) -> None:
    """The faults are real: with validate: none the SDK reads the primary's broken or truncated stream."""
    a.behaviour = llm("a", fault=fault)
    config = llm_config(sdk, a, b, retry_ambiguous=True)
    route = config.routes[0].model_copy(update={"commit": "complete", "validate_body": "none"})
    config = config.model_copy(update={"routes": [route]})
    http_client = sidestep.wrap(sdk.default_http_client(False), config)
    if fault == "invalid":
        with pytest.raises(json.JSONDecodeError):  # raised in the caller's code
            ask(sdk, False, a, http_client, stream=True)
    else:
        assert (
            ask(sdk, False, a, http_client, stream=True) == "hello from a"
        )  # a truncated "success"
    assert b.calls == 0


# The Anthropic SDK's two ways of sending its key: `auth_token` as
# `Authorization: Bearer`, and its key-header auth (the Foundry client's), which
# sends the key as `x-api-key` and again as `api-key`.
ANTHROPIC_AUTH = {
    "authorization": ("Anthropic", "AsyncAnthropic", "auth_token"),
    "x-api-key": ("AnthropicFoundry", "AsyncAnthropicFoundry", "api_key"),
}


@pytest.mark.parametrize("auth", sorted(ANTHROPIC_AUTH))
def test_the_second_key_target_sends_the_second_key_alone(
    auth: str, is_async: bool, a: Upstream
) -> None:
    """docs/sdks.md's second-key target: the SDK's main key gets a 429, and the same origin's
    second-key attempt reaches the upstream carrying the second key only — none of the
    SDK's own credential headers, which an upstream reading them would serve as the
    rate-limited main key again."""
    anthropic = SDKS["anthropic"].module
    credentials = ("authorization", "x-api-key", "api-key")

    def by_key(seen: Seen) -> Action:
        if any("MAIN-KEY" in seen.headers.get(name, "") for name in credentials):
            return Respond(429, {"type": "error", "error": {"type": "rate_limit_error"}})
        return llm("a")(seen)

    a.behaviour = by_key
    config = {
        "routes": [
            {
                "name": "anthropic",
                "targets": [
                    {"name": "main-key", "url": a.url + "/v1"},
                    {
                        "name": "second-key",
                        "url": a.url + "/v1",
                        "headers": {"x-api-key": "SECOND-KEY"},
                    },
                ],
            }
        ]
    }
    sync_cls, async_cls, argument = ANTHROPIC_AUTH[auth]
    cls = getattr(anthropic, async_cls if is_async else sync_cls)
    http_client = sidestep.wrap(SDKS["anthropic"].default_http_client(is_async), config)
    client = cls(base_url=a.url, max_retries=0, http_client=http_client, **{argument: "MAIN-KEY"})
    if is_async:

        async def go() -> str:
            async with client:
                return await SDKS["anthropic"].ask_async(client)

        text = asyncio.run(go())
    else:
        with client:
            text = SDKS["anthropic"].ask(client)
    assert text == "hello from a"
    main, second = a.seen
    assert main.headers[auth].endswith("MAIN-KEY")
    assert {name for name, _ in second.raw} & set(credentials) == {"x-api-key"}
    assert second.headers["x-api-key"] == "SECOND-KEY"
    assert "MAIN-KEY" not in json.dumps(second.raw)


# -- the commit point at the first token ------------------------------------------------------

SSE = {"content-type": "text/event-stream"}
KEEPALIVE = b": keep-alive\n\n"


def event(name: str | None, **data: Any) -> bytes:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


PING = event("ping", type="ping")
MESSAGE_START = event(
    "message_start",
    type="message_start",
    message={"id": "m", "type": "message", "role": "assistant", "model": "m", "content": []},
)


def test_an_anthropic_stream_of_pings_past_first_byte_timeout_is_answered_by_the_backup(
    is_async: bool, a: Upstream, b: Upstream
) -> None:
    """The primary sends message_start, then a ping every 0.1 s and no content: after first_byte_timeout the SDK reads the backup's stream."""
    sdk = SDKS["anthropic"]
    pings = [KEEPALIVE + MESSAGE_START, *[PING] * 50, event("message_stop", type="message_stop")]
    a.behaviour = lambda _: Stream(pings, headers=SSE, delay=0.1)
    config = llm_config(sdk, a, b, first_byte_timeout=IN_TIME, retry_ambiguous=True)
    http_client = sidestep.wrap(sdk.default_http_client(is_async), config)
    assert_answered_by_backup(sdk, a, b, ask(sdk, is_async, a, http_client, stream=True))


def test_an_anthropic_overload_after_a_200_is_answered_by_the_backup(
    is_async: bool, a: Upstream, b: Upstream
) -> None:
    """The primary answers 200, a ping, then event: error overloaded_error: the SDK never sees it, and yields the backup's stream."""
    sdk = SDKS["anthropic"]
    error = {"type": "overloaded_error", "message": "Overloaded"}
    a.behaviour = lambda _: Stream(
        [PING + MESSAGE_START, event("error", type="error", error=error)], headers=SSE
    )
    http_client = sidestep.wrap(sdk.default_http_client(is_async), llm_config(sdk, a, b))
    assert_answered_by_backup(sdk, a, b, ask(sdk, is_async, a, http_client, stream=True))


def test_an_openai_chat_stream_that_names_its_role_then_stalls_is_answered_by_the_backup(
    is_async: bool, a: Upstream, b: Upstream
) -> None:
    """The primary's first chunk carries only the assistant role, then nothing: after first_byte_timeout the SDK reads the backup's stream."""
    sdk = SDKS["openai"]
    role = event(
        None,
        id="c",
        object="chat.completion.chunk",
        created=0,
        model="m",
        choices=[
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        ],
    )
    a.behaviour = lambda _: Stream([role, b"data: [DONE]\n\n"], headers=SSE, stall_after=1)
    config = llm_config(sdk, a, b, first_byte_timeout=IN_TIME, retry_ambiguous=True)
    http_client = sidestep.wrap(sdk.default_http_client(is_async), config)
    assert_answered_by_backup(sdk, a, b, ask(sdk, is_async, a, http_client, stream=True))


# -- first_byte_timeout is a time to first token: for streams only -----------------------------

FIRST_TOKEN = 0.2  # first_byte_timeout where no healthy answer has to meet it, in seconds
THINKING = 0.6  # how long a held answer is kept back, at least


def held(behaviour: Behaviour, gate: threading.Event) -> Behaviour:
    """`behaviour`, each of its answers that does not stream held until `gate` is set."""

    def holding(seen: Seen) -> Action:
        action = behaviour(seen)
        return replace(action, gate=gate) if isinstance(action, Respond) else action

    return holding


def test_a_slow_answer_that_does_not_stream_is_returned_and_opens_no_circuit(
    sdk: Sdk, is_async: bool, a: Upstream, b: Upstream
) -> None:
    """A non-streaming call whose healthy answer comes well after first_byte_timeout (a reasoning model thinking) returns that answer at the first attempt, and the primary's circuit stays closed."""
    gate = threading.Event()
    a.behaviour = held(llm("a"), gate)
    release_after_seen(gate, a, THINKING)
    config = llm_config(sdk, a, b, retry_ambiguous=True, first_byte_timeout=FIRST_TOKEN)
    http_client = sidestep.wrap(sdk.default_http_client(is_async), config)
    assert ask(sdk, is_async, a, http_client) == "hello from a"
    assert (a.calls, b.calls) == (1, 0)
    assert http_client._transport.suspensions() == []


def test_a_stream_with_no_first_token_in_time_is_answered_by_the_backup(
    sdk: Sdk, is_async: bool, a: Upstream, b: Upstream
) -> None:
    """A streaming call whose primary sends nothing within first_byte_timeout reads the backup's stream, and the primary's silence opens its circuit."""
    a.behaviour = lambda _: Hang()
    config = llm_config(sdk, a, b, retry_ambiguous=True, first_byte_timeout=IN_TIME)  # B meets it
    http_client = sidestep.wrap(sdk.default_http_client(is_async), config)
    assert_answered_by_backup(sdk, a, b, ask(sdk, is_async, a, http_client, stream=True))
    assert [s.target for s in http_client._transport.suspensions()] == ["primary"]


def test_the_sdks_own_retries_run_as_without_sidestep_on_unrouted_traffic(
    sdk: Sdk, is_async: bool, a: Upstream
) -> None:
    """Under install() with no routes, an endpoint answering 500 four times, then its answer, is got through by the SDK's own max_retries=4 (five requests reach it), and a call right after is answered too."""
    answer = llm("a")

    def recovers(seen: Seen) -> Action:
        if a.calls <= 4:  # the retry hint keeps the SDK's own waits short
            return Respond(500, {"error": {"type": "server_error"}}, {"retry-after-ms": "1"})
        return answer(seen)

    a.behaviour = recovers
    sidestep.install()
    assert ask(sdk, is_async, a, max_retries=4) == "hello from a"
    assert a.calls == 5
    assert ask(sdk, is_async, a) == "hello from a"
    assert a.calls == 6
