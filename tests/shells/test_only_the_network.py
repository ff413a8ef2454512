"""Only the network is broken for: install() leaves transports that reach no network
alone, and no request is handled by two sidestep transports.

Real upstreams on 127.0.0.1 for what goes over the network; httpx's and
httpx2's own MockTransport, ASGITransport and WSGITransport for what does not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2
import pytest

import sidestep
from sidestep._shells.shell import Shell
from upstream import Respond, Upstream

FLAVOURS = {"httpx": httpx, "httpx2": httpx2}


@pytest.fixture(autouse=True)
def _uninstalled() -> Iterator[None]:
    yield
    sidestep.uninstall()


@pytest.fixture(params=list(FLAVOURS))
def http(request: pytest.FixtureRequest) -> Any:
    return FLAVOURS[request.param]


def routed(primary: str, backup: str, threshold: int = 2) -> dict[str, Any]:
    return {
        "breaker": {"failure_threshold": threshold},
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


def alone(primary: str) -> dict[str, Any]:
    """A route to the primary alone, opened by its third failure: its 503s reach the caller."""
    return {
        "breaker": {"failure_threshold": 3},
        "routes": [{"name": "chat", "targets": [{"name": "primary", "url": primary + "/v1"}]}],
    }


def doubles(http: Any, answer: int) -> dict[str, Any]:
    """A MockTransport, an ASGITransport and a WSGITransport, each answering `answer` with
    the port it was asked for."""

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": answer, "headers": []})
        await send({"type": "http.response.body", "body": str(scope["server"][1]).encode()})

    def wsgi(environ: Any, start_response: Any) -> list[bytes]:
        start_response(f"{answer} Whatever", [])
        return [environ["SERVER_PORT"].encode()]

    return {
        "mock": http.MockTransport(
            lambda request: http.Response(answer, text=str(request.url.port))
        ),
        "asgi": http.ASGITransport(app=asgi),
        "wsgi": http.WSGITransport(app=wsgi),
    }


def send(client: Any, url: str) -> Any:
    if isinstance(client, httpx.AsyncClient | httpx2.AsyncClient):

        async def go() -> Any:
            return await client.get(url)

        return asyncio.run(go())
    return client.get(url)


def test_install_leaves_transports_that_reach_no_network_as_they_are(
    http: Any, a: Upstream, b: Upstream
) -> None:
    """Under install(), clients over a MockTransport, ASGITransport or WSGITransport keep it as it is; a client over the network is wrapped."""
    sidestep.install(routed(a.url, b.url))
    for name, transport in doubles(http, 200).items():
        client = (http.AsyncClient if name == "asgi" else http.Client)(transport=transport)
        assert client._transport is transport, name
    assert isinstance(http.Client()._transport, Shell)


def test_a_test_double_is_never_refused_for_what_the_network_taught(
    http: Any, a: Upstream, b: Upstream
) -> None:
    """Once the primary's circuit is open from real 503s, clients over test doubles still get their own answers for the primary's URL, never the backup's or a refusal."""
    a.behaviour = lambda seen: Respond(503)
    sidestep.install(routed(a.url, b.url))
    with http.Client() as network:
        for _ in range(3):
            assert network.get(a.url + "/v1/chat").text == "b"
        assert a.calls == 2  # open after two failures: the third went to the backup alone
    transports = doubles(http, 200)
    with http.Client(transport=transports["mock"]) as mock:
        assert mock.get(a.url + "/v1/chat").text == str(a.port)
    with http.Client(transport=transports["wsgi"]) as wsgi:
        assert wsgi.get(a.url + "/v1/chat").text == str(a.port)
    asgi = http.AsyncClient(transport=transports["asgi"])
    assert send(asgi, a.url + "/v1/chat").text == str(a.port)


def test_what_a_test_double_answers_teaches_the_network_nothing(
    http: Any, a: Upstream, b: Upstream
) -> None:
    """A MockTransport answering 503 five times for the primary's URL is returned each time, and a network client afterwards is still sent to the primary."""
    sidestep.install(routed(a.url, b.url))
    with http.Client(transport=doubles(http, 503)["mock"]) as mock:
        assert [mock.get(a.url + "/v1/chat").status_code for _ in range(5)] == [503] * 5
    with http.Client() as network:
        assert network.get(a.url + "/v1/chat").text == "a"
    assert (a.calls, b.calls) == (1, 0)


def test_an_explicit_wrap_still_puts_sidestep_over_a_test_double(
    http: Any, a: Upstream, b: Upstream
) -> None:
    """wrap() is asked for by name: a client over a MockTransport answering 503 for the primary fails over to the backup through it."""
    seen: list[str] = []

    def handler(request: Any) -> Any:
        seen.append(request.url.host + str(request.url.port))
        return http.Response(503 if request.url.port == a.port else 200, text="double")

    client = sidestep.wrap(http.Client(transport=http.MockTransport(handler)), routed(a.url, b.url))
    assert client.get(a.url + "/v1/chat").status_code == 200
    assert seen == [f"127.0.0.1{a.port}", f"127.0.0.1{b.port}"]
    assert (a.calls, b.calls) == (0, 0)


def test_an_explicit_wrap_takes_over_a_client_install_wrapped_in_part(
    http: Any, a: Upstream, b: Upstream
) -> None:
    """A client over a MockTransport with a network mount: install() wraps the mount only; an explicit wrap() then wraps both, over the originals."""
    sidestep.install(routed(a.url, b.url))
    mock = http.MockTransport(lambda request: http.Response(200, text="double"))
    wire = http.HTTPTransport()
    client = http.Client(transport=mock, mounts={f"http://127.0.0.1:{b.port}": wire})
    mount = next(iter(client._mounts.values()))
    assert client._transport is mock and isinstance(mount, Shell)
    sidestep.wrap(client, routed(a.url, b.url))
    shells = [client._transport, *client._mounts.values()]
    assert all(isinstance(t, Shell) for t in shells)
    assert [t.inner.own for t in shells] == [mock, wire]
    assert client.get(b.url + "/v1/chat").text == "b"
    client.close()


class _Forward:
    """A transport that hands every request to another client's transport, as an SDK
    does to reuse a client it was given."""

    def __init__(self, to: Any) -> None:
        self.to = to

    def handle_request(self, request: Any) -> Any:
        return self.to.handle_request(request)

    def close(self) -> None:
        pass


def test_a_request_forwarded_to_another_wrapped_client_is_handled_once(
    http: Any, a: Upstream, b: Upstream
) -> None:
    """Through a client that forwards to another wrapped client's transport, each 503 counts once: with a threshold of three, the primary is sent three requests before it opens, and the caller's request carries nothing of sidestep's."""
    a.behaviour = lambda seen: Respond(503)
    store = sidestep.MemoryStore()
    config = alone(a.url)
    inner = sidestep.wrap(http.Client(), config, store=store)
    outer = sidestep.wrap(http.Client(transport=_Forward(inner._transport)), config, store=store)
    statuses = []
    for _ in range(4):
        try:
            response = outer.get(a.url + "/v1/chat")
            statuses.append(response.status_code)
            assert response.request.extensions.keys() == {"timeout"}  # nothing of sidestep's
        except sidestep.AllCandidatesSuspended:
            statuses.append("suspended")
    assert statuses == [503, 503, 503, "suspended"]
    assert a.calls == 3
    outer.close(), inner.close()


def test_an_async_request_forwarded_to_another_wrapped_client_is_handled_once(
    http: Any, a: Upstream, b: Upstream
) -> None:
    """The same through async clients: three 503s reach the caller, the fourth request is refused."""
    a.behaviour = lambda seen: Respond(503)
    store = sidestep.MemoryStore()
    config = alone(a.url)

    class Forward:
        def __init__(self, to: Any) -> None:
            self.to = to

        async def handle_async_request(self, request: Any) -> Any:
            return await self.to.handle_async_request(request)

        async def aclose(self) -> None:
            pass

    async def go() -> list[Any]:
        inner = sidestep.wrap(http.AsyncClient(), config, store=store)
        outer = sidestep.wrap(
            http.AsyncClient(transport=Forward(inner._transport)), config, store=store
        )
        statuses: list[Any] = []
        for _ in range(4):
            try:
                statuses.append((await outer.get(a.url + "/v1/chat")).status_code)
            except sidestep.AllCandidatesSuspended:
                statuses.append("suspended")
        await outer.aclose()
        await inner.aclose()
        return statuses

    assert asyncio.run(go()) == [503, 503, 503, "suspended"]
    assert a.calls == 3


def test_install_survives_a_transport_whose_attributes_raise(http: Any) -> None:
    """A transport of someone else's whose `transport` property raises is left as it is by install(), and the client is built."""

    class Touchy(http.BaseTransport):  # type: ignore[misc]
        @property
        def transport(self) -> Any:
            raise RuntimeError("not configured")

        def handle_request(self, request: Any) -> Any:
            return http.Response(200, text="touchy")

    sidestep.install()
    touchy = Touchy()
    with http.Client(transport=touchy) as client:
        assert client._transport is touchy
        assert client.get("http://127.0.0.1:9/").text == "touchy"
