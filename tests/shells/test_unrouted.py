"""Traffic no route names: sidestep is a breaker for dead or hung hosts, and nothing else.

Real upstreams on 127.0.0.1, the four transports, the memory and Redis stores.
A request that matched no route has one candidate, its own origin: a host
that cannot be reached opens the origin; a failure after the request was
sent (a read timeout, a 5xx) is its endpoint's (path and read budget), and
the origin's too once `failure_threshold` different endpoints failed in a
row. Every 4xx goes back to the caller untouched and suspends nothing.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import sidestep
from drivers import KINDS, Driver, FakeClock, route
from upstream import Hang, Respond, Upstream, free_port

STORES = ("memory", "redis")
THRESHOLD = 3
# seconds a store call may take: on a busy machine a store must not fail open under
# a test that reads back what it wrote
LOADED = 10.0


def make_store(kind: str, redis_url: str | None) -> Any:
    if kind == "memory":
        return sidestep.MemoryStore()
    assert redis_url is not None
    redis.Redis.from_url(redis_url).flushall()
    return sidestep.RedisStore(redis_url, fingerprint_key="k", timeout=LOADED)


@pytest.fixture(params=[(k, s) for k in KINDS for s in STORES], ids=lambda p: f"{p[0]}-{p[1]}")
def driver(request: pytest.FixtureRequest) -> Iterator[Driver]:
    """An unrouted client (defaults: no routes) of each kind over each store, on a fake clock."""
    kind, store_kind = request.param
    redis_url = request.getfixturevalue("redis_url") if store_kind == "redis" else None
    store = make_store(store_kind, redis_url)
    d = Driver(
        kind,
        {"breaker": {"failure_threshold": THRESHOLD}},
        store=store,
        clock=FakeClock(),
        timeout=(5.0, 0.2, 5.0, 5.0),  # a short read budget; connects are not what is timed
    )
    yield d
    if store_kind == "redis":
        if d.is_async:
            d.run(store.aclose())  # its asyncio client lives on the driver's loop
        store.close()
    d.close()


def outcome(d: Driver, path: str, base: str, **kw: Any) -> Any:
    """The status of GET `path`, or the exception's class."""
    try:
        return d.get(base + path, **kw).status
    except Exception as exc:
        return type(exc).__name__


def test_a_host_silent_on_every_path_opens_within_the_threshold(
    driver: Driver, a: Upstream
) -> None:
    """A host that answers nothing, asked on a new path each time, is failed fast after failure_threshold calls."""
    a.behaviour = lambda seen: Hang()
    seen = [outcome(driver, f"/item/{n}", a.url) for n in range(THRESHOLD + 2)]
    assert seen == ["ReadTimeout"] * THRESHOLD + ["AllCandidatesSuspended"] * 2
    assert a.calls == THRESHOLD


def test_a_host_silent_on_one_path_opens_that_path_only(driver: Driver, a: Upstream) -> None:
    """A path that never answers is failed fast after failure_threshold calls; the origin's other paths still answer."""
    a.behaviour = lambda seen: Hang() if seen.path == "/hung" else Respond(body="ok")
    seen = [outcome(driver, "/hung", a.url) for _ in range(THRESHOLD + 1)]
    assert seen == ["ReadTimeout"] * THRESHOLD + ["AllCandidatesSuspended"]
    assert [outcome(driver, p, a.url) for p in ("/ok", "/other", "/ok")] == [200, 200, 200]
    assert [s.path for s in a.seen].count("/hung") == THRESHOLD


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408, 529])
def test_every_5xx_returns_as_it_came_and_opens_nothing(
    driver: Driver, a: Upstream, status: int
) -> None:
    """Unrouted 5xx (and 408) answers reach the caller as they came, every time, and open neither the path nor the origin: a fast answer failed fast would save the caller nothing."""
    a.behaviour = lambda seen: Respond(status, headers={"retry-after": "3600"})
    seen = [outcome(driver, "/broken", a.url) for _ in range(THRESHOLD * 2)]
    assert seen == [status] * (THRESHOLD * 2)
    assert a.calls == THRESHOLD * 2
    assert driver.transport.suspensions() == []


def test_an_endpoint_opened_at_a_short_budget_is_still_tried_with_a_longer_one(
    driver: Driver, a: Upstream
) -> None:
    """An endpoint that timed out within 0.2 s is failed fast at that budget, but a caller giving it 5 s is still sent."""
    a.behaviour = lambda seen: Hang()
    for _ in range(THRESHOLD):
        outcome(driver, "/hung", a.url)
    assert outcome(driver, "/hung", a.url) == "AllCandidatesSuspended"
    a.behaviour = lambda seen: Respond(body="late but there")
    assert outcome(driver, "/hung", a.url, timeout=5) == 200
    assert a.calls == THRESHOLD + 1


@pytest.mark.parametrize("status", [401, 402, 403, 404, 409, 422, 429])
def test_every_4xx_returns_as_it_came_and_suspends_nothing(
    driver: Driver, a: Upstream, status: int
) -> None:
    """Unrouted 4xx answers, with or without a credential and with a long Retry-After, are returned each time and never suspend."""
    a.behaviour = lambda seen: Respond(
        status, body={"error": {"code": "insufficient_quota"}}, headers={"retry-after": "3600"}
    )
    headers = {"authorization": "Bearer k"}
    seen = [driver.get(a.url + "/x", headers=headers).status for _ in range(THRESHOLD + 2)]
    assert seen == [status] * (THRESHOLD + 2)
    assert a.calls == THRESHOLD + 2
    assert driver.transport.suspensions() == []


def test_endpoint_scopes_name_no_path(driver: Driver, a: Upstream, request: Any) -> None:
    """An open endpoint scope is listed and stored without its path: only the origin and an opaque id."""
    secret = "/v1/users/S3CR3T-token-abc"
    a.behaviour = lambda seen: Hang()
    for _ in range(THRESHOLD):
        outcome(driver, secret, a.url)
    rows = driver.transport.suspensions()
    assert {(r.scope, r.state) for r in rows} >= {("origin+endpoint", "open")}
    assert "S3CR3T" not in repr(rows)
    if "redis" in request.node.callspec.id:
        client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
        stored = [repr(client.dump(k)) + repr(k) for k in client.keys("*")]
        assert stored and not any("S3CR3T" in s for s in stored)


# -- routed traffic: challenges and proxies -------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_challenge_to_a_request_without_credentials_is_returned_on_a_route(
    kind: str, a: Upstream, b: Upstream
) -> None:
    """On a route, a 401 to a request that carried no credential is an auth challenge: returned as-is, no failover, no suspension."""
    a.behaviour = lambda seen: Respond(401, headers={"www-authenticate": 'Basic realm="x"'})
    d = Driver(kind, route(("a", a.url), ("b", b.url)))
    try:
        for _ in range(3):
            r = d.get(a.url + "/v1/x")
            assert (r.status, r.headers["www-authenticate"]) == (401, 'Basic realm="x"')
        assert (a.calls, b.calls) == (3, 0)
        assert d.transport.suspensions() == []
    finally:
        d.close()


@pytest.mark.parametrize("flavour", ["httpx", "httpx2"])
def test_a_dead_proxy_fails_over_without_condemning_the_target(
    flavour: str, a: Upstream, b: Upstream
) -> None:
    """A route's first target reached through a dead proxy fails over to the next, and no circuit is kept for the first target."""
    http: Any = importlib.import_module(flavour)
    dead = f"http://127.0.0.1:{free_port()}"
    config = route(("a", a.url), ("b", b.url))

    def answers(client: Any) -> list[str]:
        return [client.get(a.url + "/v1/x").text for _ in range(4)]

    client = sidestep.wrap(http.Client(mounts={a.url: http.HTTPTransport(proxy=dead)}), config)
    with client:
        assert answers(client) == ["b"] * 4
        assert client._transport.suspensions() == []

    async def in_async() -> list[str]:
        mounts = {a.url: http.AsyncHTTPTransport(proxy=dead)}
        async with sidestep.wrap(http.AsyncClient(mounts=mounts), config) as client:
            seen = [(await client.get(a.url + "/v1/x")).text for _ in range(4)]
            assert await client._transport.asuspensions() == []
            return seen

    assert asyncio.run(in_async()) == ["b"] * 4
    assert (a.calls, b.calls) == (0, 8)


# -- logging in an outage -------------------------------------------------------------------


@pytest.mark.usefixtures("default_structlog")
@pytest.mark.parametrize("kind", KINDS)
def test_an_outage_logs_per_transition_not_per_request(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """During a sustained outage the INFO-and-above lines follow the transitions, however many requests are refused."""
    clock = FakeClock()
    dead = f"http://127.0.0.1:{free_port()}"
    d = Driver(kind, {"breaker": {"failure_threshold": THRESHOLD, "cooldown": 10}}, clock=clock)
    try:
        with caplog.at_level(logging.DEBUG, logger="sidestep"):
            for _ in range(2):  # two episodes: open, then a failed probe and open again
                for _ in range(200):
                    with pytest.raises(d.http.TransportError):
                        d.get(dead + "/x")
                clock.advance(11)
    finally:
        d.close()
    loud = [
        (r.levelname, r.getMessage().split()[0])
        for r in caplog.records
        if r.levelno >= logging.INFO
    ]
    assert loud == [
        ("WARNING", "circuit.opened"),
        ("WARNING", "all_candidates_suspended"),
        ("INFO", "circuit.half_open"),
        ("WARNING", "circuit.opened"),
        ("WARNING", "all_candidates_suspended"),
    ]
    debug = [r.getMessage().split()[0] for r in caplog.records if r.levelno == logging.DEBUG]
    assert debug.count("candidate.skipped") == 400 - THRESHOLD - 1
