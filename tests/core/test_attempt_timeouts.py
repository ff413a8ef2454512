"""An attempt's own timeouts go on a copy of the request: the caller's, and the one
kept for the next attempt, keep theirs.

A real httpx client sends through sidestep to a real upstream on 127.0.0.1;
the inner transport is httpx's own, wrapped to note the timeouts each attempt
was sent with.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

import sidestep
from upstream import Respond, Upstream

CALLER = {"connect": 100.0, "read": 100.0, "write": 100.0, "pool": 100.0}


class Noting(httpx.BaseTransport):
    """httpx's transport, noting each request's timeout extension (the very dict)."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.timeouts: list[dict[str, Any]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.timeouts.append(request.extensions["timeout"])
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


class AsyncNoting(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.timeouts: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.timeouts.append(request.extensions["timeout"])
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_the_callers_request_keeps_its_timeouts_sent_twice(a: Upstream) -> None:
    """Under a total_timeout each attempt is sent with its timeouts shrunk to what is
    left; the caller's request object keeps its own extensions (the same dict, the
    same values), so sending it again starts from the caller's timeouts, not from the
    last attempt's — in a sync and an async client alike."""
    config = {"failover": {"total_timeout": 30.0}}
    noting = Noting()
    with httpx.Client(
        transport=sidestep.FailoverTransport(config, transport=noting), timeout=100.0
    ) as client:
        request = client.build_request("GET", a.url + "/x")
        mine = request.extensions
        for _ in range(2):
            assert client.send(request).status_code == 200
            assert request.extensions is mine and request.extensions["timeout"] == CALLER
    assert len(noting.timeouts) == 2
    assert all(0 < t["read"] <= 30.0 and t is not mine["timeout"] for t in noting.timeouts)

    async def twice() -> AsyncNoting:
        anoting = AsyncNoting()
        transport = sidestep.AsyncFailoverTransport(config, transport=anoting)
        async with httpx.AsyncClient(transport=transport, timeout=100.0) as client:
            request = client.build_request("GET", a.url + "/x")
            mine = request.extensions
            for _ in range(2):
                assert (await client.send(request)).status_code == 200
                assert request.extensions is mine and request.extensions["timeout"] == CALLER
        return anoting

    anoting = asyncio.run(twice())
    assert len(anoting.timeouts) == 2 and all(t["read"] <= 30.0 for t in anoting.timeouts)


def test_a_second_attempt_on_a_target_starts_from_the_callers_timeouts(a: Upstream) -> None:
    """Two attempts on one target (a 429 asking no wait, then a 200) of a request that
    accepts an event stream, with a first-byte and a stall limit: the second attempt's
    body reads are bounded by the stall limit against the caller's read timeout (5 s),
    not against the first attempt's shrunk one (the 2 s first-byte limit, which the
    request kept for the retry carried)."""
    answers = iter([Respond(429, "wait", {"retry-after-ms": "0"}), Respond(body="ok")])
    a.behaviour = lambda _: next(answers)
    config = {
        "routes": [
            {
                "name": "one",
                "match": ["http://api.example/v1"],
                "targets": [{"name": "a", "url": a.url + "/v1"}],
            }
        ],
        "failover": {
            "max_attempts_per_target": 2,
            "first_byte_timeout": 2.0,
            "stall_timeout": 5.0,
        },
    }
    noting = Noting()
    with httpx.Client(
        transport=sidestep.FailoverTransport(config, transport=noting), timeout=100.0
    ) as client:
        response = client.get("http://api.example/v1/x", headers={"accept": "text/event-stream"})
    assert response.text == "ok"
    assert response.extensions["sidestep"]["attempts"] == 2
    first, second = noting.timeouts
    assert first is not second
    assert first["read"] == 2.0  # headers waited for within the first-byte limit
    assert second["read"] == 5.0  # then the body's silences, within the stall limit
