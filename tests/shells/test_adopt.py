"""wrap(), install() and uninstall() on real httpx and httpx2 clients of both colours."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2
import pytest

import sidestep
import sidestep.httpx2
from sidestep._shells.adopt import _Dispatch
from sidestep._shells.shell import Shell

KINDS = ("httpx-sync", "httpx-async", "httpx2-sync", "httpx2-async")
CLASSES = (httpx.Client, httpx.AsyncClient, httpx2.Client, httpx2.AsyncClient)
PRIMARY = "http://primary.test/v1/chat"
CONFIG = sidestep.Config.model_validate(
    {
        "breaker": {"failure_threshold": 2, "cooldown": 30},
        "routes": [
            {
                "name": "chat",
                "targets": [
                    {"name": "primary", "url": "http://primary.test/v1"},
                    {"name": "backup", "url": "http://backup.test/v1"},
                ],
            }
        ],
    }
)
# the same primary alone: no failover, so a failing primary's answer reaches the caller
ALONE = sidestep.Config.model_validate(
    {
        "routes": [
            {"name": "chat", "targets": [{"name": "primary", "url": "http://primary.test/v1"}]}
        ]
    }
)


class Upstreams:
    """An HTTP transport of one flavour, the kind install() wraps, answering in process:
    primary.test answers 503, any other host its own name (no socket is opened)."""

    def __init__(self, http: Any) -> None:
        self.hosts: list[str] = []
        self.closed = 0
        outer = self

        class Wire(http.HTTPTransport):  # type: ignore[misc]
            def handle_request(self, request: Any) -> Any:
                return outer._handle(request)

            async def handle_async_request(self, request: Any) -> Any:
                return outer._handle(request)

            def close(self) -> None:
                outer.closed += 1

            async def aclose(self) -> None:
                outer.closed += 1

            def __enter__(self) -> Any:
                return self

            def __exit__(self, *exc_info: Any) -> None:
                self.close()

            async def __aenter__(self) -> Any:
                return self

            async def __aexit__(self, *exc_info: Any) -> None:
                await self.aclose()

        self.transport = Wire()
        self.http = http

    def _handle(self, request: Any) -> Any:
        self.hosts.append(request.url.host)
        if request.url.host == "primary.test":
            return self.http.Response(503, text="down")
        return self.http.Response(200, text=request.url.host)


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def _uninstalled() -> Iterator[None]:
    yield
    sidestep.uninstall()


def flavour(kind: str) -> Any:
    return httpx2 if kind.startswith("httpx2") else httpx


def new_client(kind: str, **kw: Any) -> Any:
    http = flavour(kind)
    return (http.AsyncClient if kind.endswith("async") else http.Client)(**kw)


def get(client: Any, url: str = PRIMARY) -> Any:
    """One GET with a client of either colour; the response, read."""
    if isinstance(client, httpx.AsyncClient | httpx2.AsyncClient):
        return asyncio.run(client.get(url))
    return client.get(url)


def close(client: Any) -> None:
    if isinstance(client, httpx.AsyncClient | httpx2.AsyncClient):
        asyncio.run(client.aclose())
    else:
        client.close()


def originals(client: Any) -> list[Any]:
    """What each wrapped slot of `client` sends through, main transport first."""
    slots = [client._transport, *(t for t in client._mounts.values() if t is not None)]
    assert all(isinstance(t, Shell) and isinstance(t.inner, _Dispatch) for t in slots)
    return [t.inner.own for t in slots]


def test_wrap_fails_over_through_the_clients_own_transport(kind: str) -> None:
    """A wrapped client sends every attempt through the transport it was built with, and fails over."""
    ups = Upstreams(flavour(kind))
    client = sidestep.wrap(new_client(kind, transport=ups.transport), CONFIG)
    response = get(client)
    assert (response.status_code, response.text) == (200, "backup.test")
    assert response.extensions["sidestep"]["failover"] is True
    assert ups.hosts == ["primary.test", "backup.test"]
    assert originals(client) == [ups.transport]
    close(client)


def test_wrap_sends_each_target_through_the_mount_the_client_would_use(kind: str) -> None:
    """The backup target goes through the client's mount for the backup host, not the primary's transport."""
    primary, backup = Upstreams(flavour(kind)), Upstreams(flavour(kind))
    client = new_client(
        kind, transport=primary.transport, mounts={"http://backup.test": backup.transport}
    )
    response = get(sidestep.wrap(client, CONFIG))
    assert response.text == "backup.test"
    assert (primary.hosts, backup.hosts) == (["primary.test"], ["backup.test"])
    close(client)


def test_wrap_puts_sidestep_under_every_environment_proxy_mount(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proxy mounts from the environment are wrapped; NO_PROXY entries keep meaning the main transport."""
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "backup.test")
    for name in ("no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    client = new_client(kind)
    proxies = {k: t for k, t in client._mounts.items() if t is not None}
    sidestep.wrap(client, CONFIG)
    assert len(proxies) == 2
    assert originals(client)[1:] == list(proxies.values())
    assert [t for t in client._mounts.values() if t is None] == [None]
    close(client)


def test_wrapping_twice_is_a_no_op(kind: str) -> None:
    """A second wrap() leaves the client's transport and mounts exactly as the first one made them."""
    ups = Upstreams(flavour(kind))
    client = sidestep.wrap(new_client(kind, transport=ups.transport), CONFIG)
    before = (client._transport, dict(client._mounts))
    assert sidestep.wrap(client, ALONE) is client
    assert (client._transport, client._mounts) == before
    assert get(client).extensions["sidestep"]["attempts"] == 2  # one layer, the first config
    close(client)


def test_wrap_refuses_what_is_not_an_httpx_client() -> None:
    """Anything but an httpx or httpx2 client is a TypeError naming its type."""
    with pytest.raises(TypeError, match="not Session"):
        sidestep.wrap(type("Session", (), {})(), CONFIG)


def test_clients_wrapped_with_one_store_share_their_circuits() -> None:
    """What one client learns about an upstream, another wrapped with the same store skips at once."""
    store = sidestep.MemoryStore()
    ups = Upstreams(httpx)
    first = sidestep.wrap(httpx.Client(transport=ups.transport), CONFIG, store=store)
    second = sidestep.wrap(httpx.Client(transport=ups.transport), CONFIG, store=store)
    get(first), get(first)  # two failures open the primary's circuit
    ups.hosts.clear()
    assert get(second).text == "backup.test"
    assert ups.hosts == ["backup.test"]
    first.close(), second.close()


def test_clients_wrapped_without_a_store_keep_their_own_circuits() -> None:
    """Without a shared store, a client still tries an upstream another client has given up on."""
    ups = Upstreams(httpx)
    first = sidestep.wrap(httpx.Client(transport=ups.transport), CONFIG)
    second = sidestep.wrap(httpx.Client(transport=ups.transport), CONFIG)
    get(first), get(first)
    ups.hosts.clear()
    get(second)
    assert ups.hosts == ["primary.test", "backup.test"]
    first.close(), second.close()


def test_closing_a_wrapped_client_closes_each_original_transport_once(kind: str) -> None:
    """Closing the client closes its own transport and each mount once, as it would unwrapped."""
    main, mounted = Upstreams(flavour(kind)), Upstreams(flavour(kind))
    client = new_client(
        kind, transport=main.transport, mounts={"http://backup.test": mounted.transport}
    )
    close(sidestep.wrap(client, CONFIG))
    assert (main.closed, mounted.closed) == (1, 1)


def test_install_wraps_every_client_created_afterwards(kind: str) -> None:
    """After install(), a new client of any flavour and colour fails over; one made before stays plain."""
    ups = Upstreams(flavour(kind))
    before = new_client(kind, transport=ups.transport)
    sidestep.install(CONFIG)
    after = new_client(kind, transport=ups.transport)
    assert get(after).text == "backup.test"
    assert get(before).status_code == 503
    close(before), close(after)


def test_installed_clients_share_one_store_across_flavours() -> None:
    """A circuit opened through an httpx client is honoured by an httpx2 client created later."""
    sidestep.install(CONFIG)
    plain, fork = Upstreams(httpx), Upstreams(httpx2)
    first = httpx.Client(transport=plain.transport)
    get(first), get(first)
    second = httpx2.Client(transport=fork.transport)
    assert get(second).text == "backup.test"
    assert fork.hosts == ["backup.test"]
    first.close(), second.close()


def test_uninstall_restores_the_classes_and_turns_wrapped_clients_into_pass_throughs(
    kind: str,
) -> None:
    """After uninstall(), new clients are plain and clients install() wrapped send straight through."""
    inits = [cls.__init__ for cls in CLASSES]
    ups = Upstreams(flavour(kind))
    sidestep.install(CONFIG)
    wrapped = new_client(kind, transport=ups.transport)
    sidestep.uninstall()
    assert [cls.__init__ for cls in CLASSES] == inits
    assert get(wrapped).status_code == 503
    assert ups.hosts == ["primary.test"]
    fresh = new_client(kind, transport=ups.transport)
    assert fresh._transport is ups.transport
    close(wrapped), close(fresh)


def test_install_twice_wraps_once() -> None:
    """A client created after two install() calls has one sidestep layer, under the latest config."""
    sidestep.install(ALONE)
    sidestep.install(CONFIG)
    ups = Upstreams(httpx)
    client = httpx.Client(transport=ups.transport)
    assert originals(client) == [ups.transport]
    assert get(client).extensions["sidestep"] == {
        "route": "chat",
        "target": "backup",
        "attempts": 2,
        "failover": True,
    }
    client.close()


def test_install_leaves_a_client_built_on_a_sidestep_transport_alone() -> None:
    """A client given a sidestep transport of its own is not wrapped again by install()."""
    sidestep.install(CONFIG)
    own = sidestep.httpx2.FailoverTransport(ALONE, transport=Upstreams(httpx2).transport)
    client = httpx2.Client(transport=own)
    assert client._transport is own
    assert get(client).status_code == 503  # ALONE has no backup: install's config is not used
    client.close()


def test_an_explicit_wrap_takes_over_from_install() -> None:
    """wrap() on a client install() wrapped uses wrap()'s config, and uninstall() leaves it active."""
    sidestep.install(ALONE)
    ups = Upstreams(httpx)
    client = sidestep.wrap(httpx.Client(transport=ups.transport), CONFIG)
    assert originals(client) == [ups.transport]
    sidestep.uninstall()
    assert get(client).text == "backup.test"
    client.close()


def test_wrap_after_uninstall_replaces_the_pass_through() -> None:
    """wrap() on a client that install() wrapped and uninstall() turned off wraps it anew."""
    sidestep.install(ALONE)
    ups = Upstreams(httpx)
    client = httpx.Client(transport=ups.transport)
    sidestep.uninstall()
    sidestep.wrap(client, CONFIG)
    assert originals(client) == [ups.transport]
    assert get(client).text == "backup.test"
    client.close()


def test_uninstall_keeps_a_hook_installed_over_sidesteps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another library's __init__ patch made after install() survives uninstall(); ours then does nothing."""
    sidestep.install(CONFIG)
    ours = httpx.Client.__init__
    calls: list[object] = []

    def theirs(self: httpx.Client, *args: Any, **kwargs: Any) -> None:
        calls.append(self)
        ours(self, *args, **kwargs)

    monkeypatch.setattr(httpx.Client, "__init__", theirs)
    sidestep.uninstall()
    ups = Upstreams(httpx)
    client = httpx.Client(transport=ups.transport)
    assert httpx.Client.__init__ is theirs
    assert calls == [client]
    assert client._transport is ups.transport
    client.close()


def test_concurrent_installs_and_new_clients_wrap_each_client_once() -> None:
    """Threads installing and creating clients at once end with every client wrapped exactly once."""
    inits = [cls.__init__ for cls in CLASSES]
    start = threading.Barrier(16)
    made: list[Any] = []
    lock = threading.Lock()
    transport = Upstreams(httpx2).transport

    def work(n: int) -> None:
        start.wait()
        if n % 2:
            sidestep.install(CONFIG)
        for _ in range(20):
            client = httpx2.Client(transport=transport)
            with lock:
                made.append(client)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wrapped = [c for c in made if isinstance(c._transport, Shell)]
    assert wrapped
    assert all(originals(c) == [transport] for c in wrapped)
    sidestep.uninstall()
    assert [cls.__init__ for cls in CLASSES] == inits
    for client in made:
        client.close()
