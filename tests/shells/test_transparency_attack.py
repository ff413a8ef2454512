"""Unrouted traffic under sidestep at the edges of its promises.

Real upstreams on 127.0.0.1. A host silent on every path opens its origin once
`failure_threshold` different endpoints have failed with no good answer in
between, whatever those endpoints did before the origin last answered well (in
this process, on every store); test doubles mocked below the transport,
network transports of other libraries, forwarded requests and reused request
objects behave as without sidestep.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

import sidestep
from drivers import Driver, FakeClock, outcome
from upstream import Hang, Respond, Upstream, wait_for

THRESHOLD = 3
# seconds a store call may take: on a busy machine a store must not fail open under
# a test that reads back what it wrote
LOADED = 10.0
CONFIG = {"breaker": {"failure_threshold": THRESHOLD, "cooldown": 10}}
TIMEOUT = (5.0, 0.2, 5.0, 5.0)  # a short read budget


@pytest.fixture(autouse=True)
def _uninstalled() -> Iterator[None]:
    yield
    sidestep.uninstall()


@pytest.fixture(params=("memory", "sqlite", "redis"))
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    """A memory store, a SqliteStore in a fresh file, or a Redis store on an emptied Redis."""
    if request.param == "memory":
        yield sidestep.MemoryStore()
        return
    if request.param == "sqlite":
        s = sidestep.SqliteStore(str(tmp_path / "state.db"), timeout=LOADED)
        yield s
        s.close()
        return
    url = request.getfixturevalue("redis_url")
    redis.Redis.from_url(url).flushall()
    s = sidestep.RedisStore(url, fingerprint_key="k", timeout=LOADED)
    yield s
    s.close()


class Host:
    """An upstream's behaviour: answers every path, or is silent on `silent` paths."""

    def __init__(self) -> None:
        self.silent: set[str] | None = set()  # None: silent everywhere

    def __call__(self, seen: Any) -> Any:
        if self.silent is None or seen.path in self.silent:
            return Hang()
        return Respond(body="ok")


def test_an_endpoint_that_failed_before_the_origin_answered_well_counts_again(
    store: Any, a: Upstream
) -> None:
    """/a times out once, then /b answers: the origin answered well. The host then goes silent on every path: /a, /b and /c time out (three different endpoints, no good answer in between) and the origin opens, so /d is failed fast."""
    host = Host()
    a.behaviour = host
    d = Driver("httpx-sync", CONFIG, store=store, clock=FakeClock(), timeout=TIMEOUT)
    try:
        host.silent = {"/a"}
        assert outcome(d, a.url + "/a") == "ReadTimeout"
        assert outcome(d, a.url + "/b") == 200  # the origin answers well
        host.silent = None  # the whole host goes silent
        seen = [outcome(d, a.url + p) for p in ("/a", "/b", "/c", "/d")]
        assert seen == ["ReadTimeout"] * 3 + ["AllCandidatesSuspended"]
    finally:
        d.close()


def routed(primary: str, backup: str) -> dict[str, Any]:
    return {
        "breaker": {"failure_threshold": 2, "cooldown": 10},
        "routes": [
            {
                "name": "chat",
                "targets": [
                    {"name": "primary", "url": primary + "/v1"},
                    {"name": "backup", "url": backup + "/v1"},
                ],
            }
        ],
    }


@pytest.mark.parametrize("flavour", ["httpx", "httpx2"])
def test_one_request_object_sent_twice_at_once_is_handled_each_time(
    flavour: str, a: Upstream, b: Upstream
) -> None:
    """With the primary's circuit open, a program sends one built Request twice at once through its wrapped client (a hedged request): both sends go to the backup, as each send of it alone would; none reaches the open primary."""
    http: Any = __import__(flavour)
    a.behaviour = lambda seen: Respond(503)
    gate = threading.Event()
    b.behaviour = lambda seen: Respond(body="b", gate=gate)

    async def go() -> list[Any]:
        client = sidestep.wrap(http.AsyncClient(timeout=5.0), routed(a.url, b.url))
        try:
            gate.set()
            for _ in range(2):  # two 503s: the primary opens, each request answered by b
                assert (await client.get(a.url + "/v1/chat")).text == "b"
            assert a.calls == 2
            gate.clear()
            request = client.build_request("GET", a.url + "/v1/chat")
            first = asyncio.ensure_future(client.send(request))
            await asyncio.to_thread(wait_for, lambda: b.calls == 3)  # in flight at the backup
            second = asyncio.ensure_future(client.send(request))
            await asyncio.sleep(0.2)
            gate.set()
            return [(r.status_code, r.text) for r in await asyncio.gather(first, second)]
        finally:
            gate.set()
            await client.aclose()

    assert asyncio.run(go()) == [(200, "b"), (200, "b")]
    assert a.calls == 2  # the open primary was sent nothing more


def test_a_respx_mock_is_never_refused_for_what_earlier_mocks_raised() -> None:
    """Under install(), three tests in a row each mock a refused connection with respx for a path of one made-up host; a fourth test mocking a 200 for that host gets its mocked answer, as without sidestep (a suite sharing a base URL runs as plain)."""
    import httpx
    import respx

    sidestep.install({"breaker": {"failure_threshold": THRESHOLD}})
    for n in range(THRESHOLD):
        with respx.mock:
            respx.get(f"http://api.test/r{n}").mock(side_effect=httpx.ConnectError("refused"))
            with httpx.Client() as client, pytest.raises(httpx.ConnectError):
                client.get(f"http://api.test/r{n}")
    with respx.mock:
        respx.get("http://api.test/ok").mock(return_value=httpx.Response(200, text="mocked"))
        with httpx.Client() as client:
            assert client.get("http://api.test/ok").text == "mocked"


def test_install_puts_routes_under_a_client_over_a_retrying_network_transport(
    a: Upstream, b: Upstream
) -> None:
    """Under install() with a route from the primary to a backup, a client over httpx-retries' RetryTransport (which sends over the network through an HTTPTransport of its own) is failed over like any other: the primary's 503 leads to the backup's answer."""
    import httpx
    import httpx_retries

    a.behaviour = lambda seen: Respond(503)
    sidestep.install(routed(a.url, b.url))
    transport = httpx_retries.RetryTransport(retry=httpx_retries.Retry(total=0))
    with httpx.Client(transport=transport) as client:
        assert client.get(a.url + "/v1/chat").text == "b"


def test_install_puts_routes_under_the_openai_sdks_aiohttp_client(a: Upstream, b: Upstream) -> None:
    """Under install() with a route from the primary to a backup, the openai SDK's aiohttp client (another library's network transport, not an httpx class) is failed over: the primary's 503 leads to the backup's answer."""
    import openai

    a.behaviour = lambda seen: Respond(503)
    sidestep.install(routed(a.url, b.url))

    async def go() -> str:
        async with openai.DefaultAioHttpClient() as client:
            return (await client.get(a.url + "/v1/chat")).text

    assert asyncio.run(go()) == "b"


def test_a_transport_that_cannot_be_told_to_reach_the_network_is_left_to_wrap(
    a: Upstream, b: Upstream
) -> None:
    """A transport of its own making that opens connections of its own cannot be told from a test double: install() leaves it as it is (the primary's 503 comes back), and an explicit wrap() fails it over."""
    import httpcore
    import httpx

    class OwnConnections(httpx.AsyncBaseTransport):
        """Sends each request over connections of its own (httpcore's pool here)."""

        def __init__(self) -> None:
            self._pool = httpcore.AsyncConnectionPool()

        async def handle_async_request(self, request: Any) -> Any:
            answer = await self._pool.request(
                request.method,
                str(request.url),
                headers=request.headers.raw,
                content=await request.aread(),
            )
            return httpx.Response(answer.status, headers=answer.headers, content=answer.content)

        async def aclose(self) -> None:
            await self._pool.aclose()

    a.behaviour = lambda seen: Respond(503)
    sidestep.install(routed(a.url, b.url))

    async def go(wrapped: bool) -> int:
        async with httpx.AsyncClient(transport=OwnConnections()) as client:
            if wrapped:
                sidestep.wrap(client, routed(a.url, b.url))
            return (await client.get(a.url + "/v1/chat")).status_code

    assert asyncio.run(go(False)) == 503
    assert asyncio.run(go(True)) == 200
    assert (a.calls, b.calls) == (2, 1)


class _Forward:
    """A transport that hands every request to another client's transport (as a library
    does that reuses a client it was given)."""

    def __init__(self, to: Any) -> None:
        self.to = to

    def handle_request(self, request: Any) -> Any:
        return self.to.handle_request(request)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("flavour", ["httpx", "httpx2"])
def test_a_forwarded_request_keeps_the_routes_of_the_client_it_reaches(
    flavour: str, a: Upstream, b: Upstream
) -> None:
    """A client wrapped with sidestep's defaults (no routes) forwards to the transport of a client wrapped with a route from the primary to a backup: the primary's 503 still leads to the backup's answer, as it does when the routed client is called directly."""
    http: Any = __import__(flavour)
    a.behaviour = lambda seen: Respond(503)
    inner = sidestep.wrap(http.Client(), routed(a.url, b.url))
    outer = sidestep.wrap(http.Client(transport=_Forward(inner._transport)))
    try:
        assert inner.get(a.url + "/v1/chat").text == "b"
        assert outer.get(a.url + "/v1/chat").text == "b"
    finally:
        outer.close()
        inner.close()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("flavour", ["httpx", "httpx2"])
def test_a_request_cancelled_mid_send_is_handled_again_when_sent_again(
    flavour: str, backend: str, a: Upstream, b: Upstream
) -> None:
    """With the primary open, a built Request is sent and cancelled while the backup holds it; sent again, it goes to the backup again (never straight to the open primary), and carries no mark of sidestep afterwards."""
    import anyio

    http: Any = __import__(flavour)
    a.behaviour = lambda seen: Respond(503)
    gate = threading.Event()
    b.behaviour = lambda seen: Respond(body="b", gate=gate)

    async def go() -> Any:
        client = sidestep.wrap(http.AsyncClient(timeout=5.0), routed(a.url, b.url))
        try:
            gate.set()
            for _ in range(2):
                assert (await client.get(a.url + "/v1/chat")).text == "b"
            gate.clear()
            request = client.build_request("GET", a.url + "/v1/chat")
            with anyio.move_on_after(0.3):
                await client.send(request)
            assert not [k for k in request.extensions if "sidestep" in k]
            gate.set()
            response = await client.send(request)
            assert not [k for k in request.extensions if "sidestep" in k]
            return response.text
        finally:
            gate.set()
            await client.aclose()

    assert anyio.run(go, backend=backend) == "b"
    assert a.calls == 2


@pytest.mark.parametrize("status", [404, 503])
def test_a_host_back_with_an_error_answer_is_no_longer_suspended(status: int, a: Upstream) -> None:
    """An unrouted host resets /a, /b and /c: its origin opens. After the cooldown it is back, answering 404 (or 503) to every path: the first request (the probe) gets that answer, and from then on nothing is suspended: a request held by the host does not get the next one refused, each gets the host's answer as without sidestep."""
    from upstream import Reset

    gate = threading.Event()
    state = {"back": False}

    def behaviour(seen: Any) -> Any:
        if not state["back"]:
            return Reset()
        return Respond(status, body="nope", gate=gate if seen.path == "/held" else None)

    a.behaviour = behaviour
    clock = FakeClock()
    d = Driver("httpx-sync", CONFIG, store=sidestep.MemoryStore(), clock=clock, timeout=TIMEOUT)
    try:
        opened = [outcome(d, a.url + p) for p in ("/a", "/b", "/c", "/d")]
        assert opened[-1] == "AllCandidatesSuspended"
        clock.advance(11)
        state["back"] = True
        assert outcome(d, a.url + "/x") == status  # the probe: the host answers
        assert [s.state for s in d.transport.suspensions() if s.scope == "origin"] == []
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(outcome, d, a.url + "/held")
            wait_for(lambda: any(s.path == "/held" for s in a.seen))
            other = outcome(d, a.url + "/y")
            gate.set()
            assert (held.result(timeout=10), other) == (status, status)
    finally:
        gate.set()
        d.close()
