"""max_scopes under outside traffic: what routes learned is never forgotten to make room for it.

Real upstreams on 127.0.0.1, the public API (`install()`, `FailoverTransport`)
over every store: memory, a SQLite file, Redis and Redis Cluster. A route's
primary that fails is suspended; then unrouted traffic fails and opens scopes
of its own well past `max_scopes` — thousands of hosts that refuse
connections (127.0.x.y on a closed port), or endpoints of the primary's own
origin. The store forgets unrouted traffic's scopes to make room, never the
route's: its requests keep going straight to the backup.
"""

from __future__ import annotations

import socket
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

import sidestep
from drivers import FakeClock, route
from redis_server import fresh_prefix
from sidestep._settings.values import SidestepConfigWarning
from sidestep.logging import add_observer, remove_observer
from upstream import Reset, Respond, Upstream

STORES = ("memory", "sqlite", "redis", "redis-cluster")
CAP = 200
HOSTS = 2000

# seconds a store call may take: on a busy machine (a cluster's first call learns its
# slots) a store must not fail open under a test that counts on the shared state
LOADED = 10.0


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A store of each kind keeping `CAP` scopes at most (on Redis Cluster: per origin)."""
    kind = request.param
    made: Any
    if kind == "memory":
        made = sidestep.MemoryStore(max_scopes=CAP)
    elif kind == "sqlite":
        made = sidestep.SqliteStore(tmp_path / "state.db", max_scopes=CAP, timeout=LOADED)
    else:
        cluster = kind == "redis-cluster"
        url = request.getfixturevalue("cluster_url" if cluster else "redis_url")
        made = sidestep.RedisStore(url, prefix=fresh_prefix(), max_scopes=CAP, timeout=LOADED)
    yield made
    if kind != "memory":
        assert made.fallbacks == 0  # every operation ran on the shared store
        made.close()


@pytest.fixture
def forgotten() -> Iterator[list[Mapping[str, object]]]:
    """The fields of every `suspension.forgotten` event told while the test runs."""
    told: list[Mapping[str, object]] = []

    def observer(event: str, fields: Mapping[str, object]) -> None:
        if event == "suspension.forgotten":
            told.append(dict(fields))

    add_observer(observer)
    yield told
    remove_observer(observer)


@pytest.fixture
def installed() -> Iterator[None]:
    """`install()` undone after the test."""
    yield
    sidestep.uninstall()


def closed_port() -> int:
    """A port nothing listens on, on any address (so 127.0.x.y refuse it too)."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))  # noqa: S104  # every address: free on each of them
        return int(s.getsockname()[1])


def per_origin(store: Any) -> bool:
    return isinstance(store, sidestep.RedisStore) and store._cluster


def quietly(config: dict[str, Any]) -> sidestep.Config:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)  # failure_threshold 1
        return sidestep.Config.model_validate(config)


@pytest.mark.slow
@pytest.mark.usefixtures("installed")
def test_thousands_of_refusing_hosts_never_make_the_store_forget_a_routes_suspension(
    store: Any, a: Upstream, b: Upstream, forgotten: list[Mapping[str, object]]
) -> None:
    """Under install(), a primary answering 503 is suspended; then 2,000 unrouted hosts refuse
    their connections, each opening its own scope, ten times max_scopes: the store forgets
    only theirs (told by `suspension.forgotten`, no route named), the primary's stays open,
    and its requests go straight to the backup (Redis Cluster caps each origin: nothing is
    forgotten there)."""
    a.behaviour = lambda seen: Respond(503)
    breaker = {"failure_threshold": 1, "cooldown": 600, "max_cooldown": 600}
    sidestep.install(quietly(route(("a", a.url), ("b", b.url), breaker=breaker)), store=store)
    port = closed_port()
    with httpx.Client(timeout=5) as client:
        assert client.get(a.url + "/v1/chat").text == "b"
        for i in range(HOSTS):
            with pytest.raises(httpx.ConnectError):
                client.get(f"http://127.0.{1 + i // 250}.{1 + i % 250}:{port}/")
        assert client.get(a.url + "/v1/chat").text == "b"
        assert client.get(a.url + "/v1/chat").text == "b"
        if not per_origin(store):  # (there, a listing asks each of the 2,001 origins)
            rows = client._transport.suspensions()
            assert len(rows) == len(store) == CAP
            assert [(s.route, s.target, s.state) for s in rows if s.route] == [
                ("chat", "a", "open")
            ]
    assert (a.calls, b.calls) == (1, 3)
    assert not any(f["route"] for f in forgotten)
    assert len(forgotten) == (0 if per_origin(store) else HOSTS - (CAP - 1))


@pytest.mark.slow
def test_failing_endpoints_of_the_primarys_own_origin_never_make_the_store_forget_it(
    store: Any, a: Upstream, b: Upstream, forgotten: list[Mapping[str, object]]
) -> None:
    """A route's model suspended on its primary outlasts unrouted traffic to the same origin
    whose endpoints fail until each opens, twice max_scopes of them (on Redis Cluster too,
    whose cap is this origin's): the store forgets only unrouted traffic's scopes, and the
    route's requests go straight to the backup."""
    endpoints = 2 * CAP

    def behaviour(seen: Any) -> Any:
        if seen.path == "/ok":
            return Respond(body="ok")
        # an unrouted answer counts for nothing: its endpoints fail by resetting
        return Reset() if seen.path.startswith("/broken/") else Respond(503)

    a.behaviour = behaviour
    config = route(
        ("a", a.url + "/v1"),
        ("b", b.url + "/v1"),
        breaker={"failure_threshold": 3, "cooldown": 600, "max_cooldown": 600},
    )
    transport = sidestep.FailoverTransport(config, store=store, clock=FakeClock())
    with httpx.Client(transport=transport, timeout=5) as client:

        def chat() -> str:
            return client.post(a.url + "/v1/chat", json={"model": "m"}).text

        assert [chat() for _ in range(3)] == ["b"] * 3  # the model's scope opens
        for n in range(endpoints):
            for _ in range(10):  # until the endpoint opens: at most a few failures
                try:
                    client.get(f"{a.url}/broken/{n}")
                except sidestep.AllCandidatesSuspended:
                    break
                except httpx.TransportError:
                    continue  # the reset, counted
                raise AssertionError(f"/broken/{n} answered")
            else:
                raise AssertionError(f"/broken/{n} never opened")
            # an answer in between keeps the origin's own scope from opening
            assert client.get(a.url + "/ok").text == "ok"
        assert chat() == "b"
        rows = transport.suspensions()
    assert [s.path for s in a.seen].count("/v1/chat") == 3
    assert {f["scope"] for f in forgotten} <= {"origin+endpoint", "origin"}
    assert len(forgotten) >= endpoints - (CAP - 1)  # every endpoint opened, few are kept
    assert len(rows) == len(store) == CAP
    assert [(s.route, s.target, s.state) for s in rows if s.scope == "origin+model"] == [
        ("chat", "a", "open")
    ]
