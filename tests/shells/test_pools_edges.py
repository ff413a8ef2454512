"""Pooled routes over real sockets, given what callers and upstreams may send: odd
affinity keys, bodies that name provider state after a redirect, extreme weights,
weights under least in flight, a suspended member beside a slow one, a pool of a
hundred members."""

from __future__ import annotations

import json
import random
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import sidestep
from drivers import Driver, FakeClock, MakeDriver
from sidestep._core.members import Member
from sidestep._settings.routes import MAX_POOL
from upstream import Respond, Seen, Upstream


@pytest.fixture
def c() -> Iterator[Upstream]:
    """A third upstream on 127.0.0.1, named "c"."""
    server = Upstream(name="c")
    yield server
    server.close()


def pooled(*targets: tuple[str, str, dict[str, Any]], **route: Any) -> dict[str, Any]:
    """A config with one pooled route "chat" over (name, url, extra) targets."""
    return {
        "breaker": route.pop("breaker", {"failure_threshold": 1, "cooldown": 600}),
        "routes": [
            {
                "name": "chat",
                "targets": [{"name": n, "url": u, **extra} for n, u, extra in targets],
                **route,
            }
        ],
    }


def members(d: Driver) -> tuple[Member, ...]:
    pool = d.transport._core.router.routes["chat"].pool
    assert pool is not None
    return pool.members


def seeded(d: Driver, n: int = 5) -> Driver:
    d.transport._core._random = random.Random(n).random
    return d


JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    ("affinity", "body"),
    [
        ({"json": "user"}, b'{"model": "m", "user": "u-\\ud800"}'),
        ({"prefix": 64}, b'{"model": "m", "messages": [{"role": "user", "content": "\\udfff"}]}'),
    ],
    ids=["json", "prefix"],
)
def test_an_affinity_key_with_a_lone_surrogate_keeps_its_member(
    make: MakeDriver, a: Upstream, b: Upstream, c: Upstream, affinity: dict[str, Any], body: bytes
) -> None:
    """A JSON body may escape half a surrogate pair (text cut mid-character): the
    request is served, and every request with that key reaches the same member."""
    d = make(pooled(*((u.name, u.url + "/v1", {}) for u in (a, b, c)), affinity=affinity))
    results = [d.post(a.url + "/v1/chat", content=body, headers=JSON) for _ in range(6)]
    assert {r.status for r in results} == {200}
    assert len({r.text for r in results}) == 1
    assert {r.extensions["sidestep"]["balance"] for r in results} == {"affinity"}
    assert [m.in_flight for m in members(d)] == [0, 0, 0]


@pytest.mark.parametrize("affinity", [{"json": "user"}, {"prefix": 64}], ids=["json", "prefix"])
def test_a_body_nested_too_deep_to_parse_is_spread_as_one_without_a_key(
    make: MakeDriver, a: Upstream, b: Upstream, affinity: dict[str, Any]
) -> None:
    """A JSON body nested deeper than the parser goes carries no affinity key: it is
    sent, spread as usual, rather than failing in the transport."""
    deep = b"[" * 200_000 + b"]" * 200_000
    body = b'{"user": ' + deep + b', "messages": ' + deep + b"}"
    d = make(pooled(("a", a.url + "/v1", {}), ("b", b.url + "/v1", {}), affinity=affinity))
    r = d.post(a.url + "/v1/chat", content=body, headers=JSON)
    assert r.status == 200 and r.text in {"a", "b"}
    assert r.extensions["sidestep"]["balance"] != "affinity"
    assert [m.in_flight for m in members(d)] == [0, 0]


def test_a_redirected_body_naming_provider_state_stays_on_its_account(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A POST that a 307 sends on names a stored response in its body: the redirected
    request (its body a stream of bytes, no longer content in memory) keeps the
    route's ranked order, as the same body sent directly does, and never reaches the
    other account."""

    def behaviour(seen: Seen) -> Respond:
        if seen.path == "/v1/old/responses":
            return Respond(307, headers={"location": "/v1/responses"})
        return Respond(body="a")

    a.behaviour = behaviour
    keyed = {"headers": {"authorization": "Bearer key-a"}}
    other = {"headers": {"authorization": "Bearer key-b"}}
    d = seeded(
        make(pooled(("a", a.url + "/v1", keyed), ("b", b.url + "/v1", other), balance="weighted"))
    )
    body = {"model": "m", "previous_response_id": "resp_1", "input": "hi"}
    results = [
        d.post(a.url + "/v1/old/responses", json=body, follow_redirects=True) for _ in range(20)
    ]
    assert {r.text for r in results} == {"a"}
    assert {r.extensions["sidestep"]["balance"] for r in results} == {"provider_state"}
    assert b.calls == 0


def test_a_body_given_as_a_byte_stream_naming_provider_state_is_not_spread(
    a: Upstream, b: Upstream
) -> None:
    """A request whose body is a stream of bytes (replayable, as a redirect's is) is
    looked at for provider state before it is spread, as content is."""
    keyed = {"headers": {"authorization": "Bearer key-a"}}
    other = {"headers": {"authorization": "Bearer key-b"}}
    config = pooled(
        ("a", a.url + "/v1", keyed), ("b", b.url + "/v1", other), balance="weighted", breaker={}
    )
    body = json.dumps({"model": "m", "previous_response_id": "resp_1"}).encode()
    with httpx.Client(transport=sidestep.FailoverTransport(config)) as client:
        client._transport._core._random = random.Random(5).random
        for _ in range(20):
            request = httpx.Request(
                "POST", a.url + "/v1/responses", stream=httpx.ByteStream(body), headers=JSON
            )
            r = client.send(request)
            assert r.text == "a"
            assert r.extensions["sidestep"]["balance"] == "provider_state"
    assert b.calls == 0
    assert all(s.json()["previous_response_id"] == "resp_1" for s in a.seen)


@pytest.mark.parametrize(
    ("weights", "shares"),
    [
        ((1e308, 1e308), (0.5, 0.5)),
        ((1e308, 1e308, None), (1 / 3, 1 / 3, 1 / 3)),
        ((5e-324, 5e-324, 5e-324, 1.0), (0.0, 0.0, 0.0, 1.0)),
        ((1e-300, 3e-300), (0.25, 0.75)),
    ],
    ids=["huge", "huge-and-mean", "tiniest", "tiny"],
)
def test_weights_at_the_ends_of_the_floats_share_by_their_ratio(
    make: MakeDriver, a: Upstream, weights: tuple[float | None, ...], shares: tuple[float, ...]
) -> None:
    """Any weight the settings accept (a finite number above 0) builds a transport, and
    members share a weighted pool by the ratio of their weights, however large or small
    (no sum overflowing, no remainder dividing by zero)."""
    targets = [
        (f"m{i}", f"{a.url}/m{i}", {} if w is None else {"weight": w})
        for i, w in enumerate(weights)
    ]
    a.behaviour = lambda seen: Respond(body=seen.path.split("/")[1])
    d = seeded(make(pooled(*targets, balance="weighted")))
    n = 600
    counts = Counter(d.get(f"{a.url}/m0/chat").text for _ in range(n))
    for i, share in enumerate(shares):
        assert abs(counts[f"m{i}"] / n - share) <= 0.07, counts


def test_least_in_flight_honours_weights_one_request_at_a_time(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """With nothing in flight, least in flight still shares by weight: one request at a
    time, a member of weight 3 beside one of weight 1 gets about three quarters."""
    config = pooled(
        ("a", a.url + "/v1", {"weight": 3}),
        ("b", b.url + "/v1", {"weight": 1}),
        balance="least_in_flight",
    )
    d = seeded(make(config))
    counts = Counter(d.get(a.url + "/v1/chat").text for _ in range(400))
    assert 0.65 <= counts["a"] / 400 <= 0.85, counts


def test_a_suspended_member_leaves_the_slow_one_no_larger_share(
    make: MakeDriver, a: Upstream, b: Upstream, c: Upstream
) -> None:
    """Under latency balance, a member ten times slower than another keeps a small
    share; one more member, suspended, does not change that: the two choices are
    made between members that can take the request."""
    clock = FakeClock()
    took = {"a": 0.1, "b": 0.1, "c": 1.0}

    def answer(name: str) -> Any:
        def behaviour(_: Seen) -> Respond:
            clock.advance(took[name])  # its time to first byte, as the transport sees it
            return Respond(body=name)

        return behaviour

    b.behaviour, c.behaviour = answer("b"), answer("c")
    a.behaviour = lambda _: Respond(503)
    config = pooled(*((u.name, u.url + "/v1", {}) for u in (a, b, c)), balance="latency")
    d = seeded(make(config, clock=clock))
    for _ in range(10):  # every member measured; a's first 503 suspends it
        d.get(a.url + "/v1/chat")
    assert a.calls == 1
    texts = [d.get(a.url + "/v1/chat").text for _ in range(200)]
    assert texts.count("c") <= 20, Counter(texts)


def test_a_pool_of_the_most_members_keeps_little_memory_per_request(a: Upstream) -> None:
    """Requests to a pool of MAX_POOL members (16 keys on one provider) each draw one of
    its orders; what the transport keeps for them stays small: under 4 MB after 500
    requests to one path, under each balance."""
    targets = [(f"k{i}", f"{a.url}/k{i}", {}) for i in range(MAX_POOL)]
    for balance in ("weighted", "least_in_flight", "latency"):
        with httpx.Client(
            transport=sidestep.FailoverTransport(pooled(*targets, balance=balance, breaker={}))
        ) as client:
            for _ in range(20):
                client.get(a.url + "/k0/chat")
            tracemalloc.start()
            try:
                before = tracemalloc.take_snapshot()
                for _ in range(500):
                    assert client.get(a.url + "/k0/chat").status_code == 200
                after = tracemalloc.take_snapshot()
            finally:
                tracemalloc.stop()
        grown = sum(
            s.size_diff
            for s in after.compare_to(before, "filename")
            if "sidestep" in s.traceback[0].filename
        )
        assert grown < 4_000_000, (balance, grown)


def test_a_pool_of_more_than_the_most_members_is_refused(a: Upstream) -> None:
    """A pool of MAX_POOL + 1 members is refused when the configuration is built, naming
    the bound and the count, tiered or not; the same members over two tiers are taken."""
    targets = [(f"k{i}", f"{a.url}/k{i}", {}) for i in range(MAX_POOL + 1)]
    with pytest.raises(sidestep.ConfigError, match=f"at most {MAX_POOL} members"):
        sidestep.FailoverTransport(pooled(*targets, balance="weighted", breaker={}))
    config = pooled(*targets, balance="weighted", breaker={})
    for i, target in enumerate(config["routes"][0]["targets"]):
        target["tier"] = 0 if i < MAX_POOL else 1
    sidestep.FailoverTransport(config).close()


def test_a_body_sent_as_it_streams_is_not_spread_off_its_account(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A body given as a generator is sent once, as it streams, and cannot be looked at
    for provider state before it goes: on a route whose rules read bodies, it goes to
    its own target, as on a ranked route, rather than to another account's."""
    keyed = {"headers": {"authorization": "Bearer key-a"}}
    other = {"headers": {"authorization": "Bearer key-b"}}
    config = pooled(("a", a.url + "/v1", keyed), ("b", b.url + "/v1", other), balance="weighted")
    d = seeded(make(config))
    body = json.dumps({"model": "m", "previous_response_id": "resp_1"}).encode()

    def chunks() -> Iterator[bytes]:
        yield body

    if d.is_async:

        async def go() -> list[str]:
            async def achunks() -> Any:
                yield body

            texts = []
            for _ in range(20):
                r = await d.client.post(a.url + "/v1/responses", content=achunks(), headers=JSON)
                texts.append(r.text)
            return texts

        texts = d.run(go())
    else:
        texts = [
            d.post(a.url + "/v1/responses", content=chunks(), headers=JSON).text for _ in range(20)
        ]
    assert set(texts) == {"a"}
    assert b.calls == 0
