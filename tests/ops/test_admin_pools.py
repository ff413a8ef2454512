"""The admin API and page show each pooled route's members: tier, weight, attempts in
flight, latency, rate-limit room and share, over real sockets, with no secret in them."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest

import sidestep
import sidestep.admin
from drivers import FakeClock
from servers import serve_asgi, serve_wsgi
from sidestep._core import listing
from test_admin import TOKEN, bearer, config_for
from upstream import CLIENT_TIMEOUT, Respond, Upstream, wait_for

KEY_A = "sk-pool-key-a-0123456789abcdef"
KEY_B = "sk-pool-key-b-fedcba9876543210"
SPENT = {
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-reset-requests": "60s",
}
ODD = "<i>fallback</i>"  # a name that is markup, shown as text
MEMBER_KEYS = {
    "target",
    "tier",
    "weight",
    "in_flight",
    "latency_s",
    "rate_limit_room",
    "attempts",
    "share",
}


def pooled(a: Upstream, b: Upstream, c: Upstream) -> dict[str, Any]:
    """Route `chat`: key-a (weight 3, a credential and a deployment path) and key-b (a
    credential) in tier 0, a fallback of tier 1."""
    return {
        "routes": [
            {
                "name": "chat",
                "balance": "weighted",
                "targets": [
                    {
                        "name": "key-a",
                        "url": f"{a.url}/v1/deployments/secret-deployment",
                        "headers": {"authorization": f"Bearer {KEY_A}"},
                        "tier": 0,
                        "weight": 3,
                    },
                    {
                        "name": "key-b",
                        "url": f"{b.url}/v1",
                        "headers": {"x-api-key": KEY_B},
                        "tier": 0,
                    },
                    {"name": ODD, "url": f"{c.url}/v1", "tier": 1},
                ],
            }
        ]
    }


def served(kind: str, transport: Any) -> AbstractContextManager[str]:
    if kind == "asgi":
        return serve_asgi(sidestep.admin.app(transport, token=TOKEN), lifespan="off")
    return serve_wsgi(sidestep.admin.wsgi_app(transport, token=TOKEN))


def no_secret(text: str, *upstreams: Upstream) -> None:
    """`text` names no credential, no path of a target's URL and no upstream's address."""
    for secret in (KEY_A, KEY_B, "secret-deployment", "deployments", "Bearer", "x-api-key"):
        assert secret not in text
    for upstream in upstreams:
        assert f"127.0.0.1:{upstream.port}" not in text


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_the_api_shows_each_members_figures(
    kind: str, a: Upstream, b: Upstream, c: Upstream
) -> None:
    """`GET /suspensions` says each pooled route's balance and, per member in order, its
    tier, weight, attempts in flight (one held at its upstream shows there), latency
    estimate (none before an answer), rate-limit room (none left on the member that
    announced none) and attempts sent with their share — and nothing secret."""
    b.behaviour = lambda _: Respond(body="b", headers=dict(SPENT))
    transport = sidestep.FailoverTransport(pooled(a, b, c))
    url = f"{a.url}/v1/deployments/secret-deployment/chat"
    with (
        httpx.Client(transport=transport, timeout=CLIENT_TIMEOUT) as client,
        served(kind, transport) as admin,
    ):
        for _ in range(30):
            assert client.get(url).status_code == 200
        answer = httpx.get(f"{admin}/suspensions", headers=bearer(TOKEN), timeout=CLIENT_TIMEOUT)
        assert answer.status_code == 200
        body = answer.json()
        assert list(body) == ["routes", "pools", "total", "next", "suspensions"]
        assert body["routes"] == {"chat": ["key-a", "key-b", ODD]}
        (name,) = body["pools"]
        pool = body["pools"][name]
        assert name == "chat" and pool["balance"] == "weighted"
        members = pool["members"]
        assert all(set(m) == MEMBER_KEYS for m in members)
        assert [m["target"] for m in members] == ["key-a", "key-b", ODD]
        assert [m["tier"] for m in members] == [0, 0, 1]
        # as the pool weighs them: one with none weighs its pool's mean (1 alone in its tier)
        assert [m["weight"] for m in members] == [3.0, 3.0, 1.0]
        assert [m["in_flight"] for m in members] == [0, 0, 0]
        assert [m["attempts"] for m in members] == [a.calls, b.calls, 0]
        assert a.calls + b.calls == 30 and b.calls >= 1
        assert members[0]["share"] == round(a.calls / 30, 4)
        assert members[1]["share"] == round(b.calls / 30, 4)
        assert members[2]["share"] == 0.0
        assert [m["rate_limit_room"] for m in members] == [True, False, True]
        assert members[0]["latency_s"] >= 0.0 and members[1]["latency_s"] >= 0.0
        assert members[2]["latency_s"] is None
        no_secret(answer.text, a, b, c)

        gate = threading.Event()
        a.behaviour = lambda _: Respond(body="a", gate=gate)
        b.behaviour = lambda _: Respond(body="b", gate=gate)
        before = a.calls
        held = threading.Thread(target=client.get, args=(url,))
        held.start()
        try:
            wait_for(lambda: a.calls + b.calls == 31)
            again = httpx.get(f"{admin}/suspensions", headers=bearer(TOKEN)).json()
            members = again["pools"]["chat"]["members"]
            holding = 0 if a.calls > before else 1  # the member whose upstream holds it
            assert [m["in_flight"] for m in members] == [int(i == holding) for i in range(3)]
            assert [m["attempts"] for m in members] == [a.calls, b.calls, 0]
        finally:
            gate.set()
            held.join(CLIENT_TIMEOUT)
    transport.close()


def test_a_member_moving_changes_the_tag(a: Upstream, b: Upstream, c: Upstream) -> None:
    """The listing's ETag covers the pools: asked again with nothing moved, it is a 304;
    after one more request, a 200 with the new counts and another tag."""
    clock = FakeClock()  # latency estimates decay on the transport's clock: held still here
    transport = sidestep.FailoverTransport(pooled(a, b, c), clock=clock)
    url = f"{b.url}/v1/chat"
    with (
        httpx.Client(transport=transport, timeout=CLIENT_TIMEOUT) as client,
        served("asgi", transport) as admin,
        httpx.Client(base_url=admin, headers=bearer(TOKEN), timeout=CLIENT_TIMEOUT) as api,
    ):
        client.get(url)
        first = api.get("/suspensions")
        tag = first.headers["etag"]
        assert api.get("/suspensions", headers={"if-none-match": tag}).status_code == 304
        client.get(url)
        again = api.get("/suspensions", headers={"if-none-match": tag})
        assert again.status_code == 200 and again.headers["etag"] != tag
        attempts = [m["attempts"] for m in again.json()["pools"]["chat"]["members"]]
        assert sum(attempts) == 2
    transport.close()


def test_the_pools_are_read_off_the_event_loop(
    a: Upstream, b: Upstream, c: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ASGI app reads the members for the API and the page in a worker thread, never
    on its event loop."""
    seen: list[bool] = []

    def reading(read: Callable[..., Any]) -> Callable[..., Any]:
        def read_where(*args: Any) -> Any:
            try:
                asyncio.get_running_loop()
                seen.append(True)
            except RuntimeError:
                seen.append(False)
            return read(*args)

        return read_where

    monkeypatch.setattr(listing, "pools", reading(listing.pools))
    transport = sidestep.AsyncFailoverTransport(pooled(a, b, c))
    with (
        served("asgi", transport) as admin,
        httpx.Client(base_url=admin, headers=bearer(TOKEN), timeout=CLIENT_TIMEOUT) as api,
    ):
        assert api.get("/suspensions").json()["pools"]["chat"]["balance"] == "weighted"
        assert "key-a" in api.get("/").text
    assert seen == [False, False]


def test_the_page_lists_each_member_escaped_and_nothing_secret(
    a: Upstream, b: Upstream, c: Upstream
) -> None:
    """The status page's HTML has a pools table with a row per member, its name escaped,
    its figures written out, and no credential, path or address; a configuration with no
    pooled route has no such table."""
    b.behaviour = lambda _: Respond(body="b", headers=dict(SPENT))
    transport = sidestep.FailoverTransport(pooled(a, b, c))
    with httpx.Client(transport=transport, timeout=CLIENT_TIMEOUT) as client:
        for _ in range(200):  # until B has answered once: each draws it first half the time
            client.get(f"{b.url}/v1/chat")
            if b.calls:
                break
    with served("wsgi", transport) as admin:
        page = httpx.get(f"{admin}/", headers=bearer(TOKEN)).text
    assert '<table id="pools">' in page
    assert "chat — balance: weighted" in page
    assert ODD not in page and "&lt;i&gt;fallback&lt;/i&gt;" in page
    assert page.count('<tr class="member">') == 2  # key-a and the fallback have room
    assert page.count('<tr class="member full">') == 1  # key-b announced none left
    assert "<td>key-a</td><td>0</td><td>3</td><td>0</td>" in page
    no_secret(page, a, b, c)
    transport.close()

    ranked = sidestep.FailoverTransport(config_for(a, b))
    with served("wsgi", ranked) as admin:
        page = httpx.get(f"{admin}/", headers=bearer(TOKEN)).text
    assert 'id="pools"' not in page and "<h2>Pools</h2>" not in page
    ranked.close()
