"""Closing a client cuts short a request's wait to be retried, and leaves the failure
before the retry counted however the close falls.

An upstream answers 503 with a long `Retry-After`, which the route waits out
in place (`max_retry_wait` above it). The client is closed during that wait:
the request ends at once with the `ReadError` of a request in flight on a
closed client, nothing more is sent, and the 503 counts. Real upstreams on
127.0.0.1, real clients of both flavours, sync (closed from another thread)
and async (closed from another task, under asyncio and trio).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import pytest

from differential import FLAVOURS, KINDS
from drivers import route
from test_closing import (
    CLOCKS,
    assert_only_a_open,
    client_over,
    closed_after_a_503,
    closing,
    execute,
    failover_transport,
    flavour_of,
)
from upstream import Respond, Upstream

WAIT = 30.0  # the upstream's Retry-After: far longer than any close takes to land


def waiting_long(h: Any, sync: bool, a: Upstream, b: Upstream, **kw: Any) -> Any:
    """A transport over route "chat" (A then B, two attempts each), A answering 503 with
    `Retry-After: 30`, which the route waits out in place (`max_retry_wait: 60`)."""
    a.behaviour = lambda _: Respond(503, body="busy", headers={"retry-after": str(int(WAIT))})
    config = route(
        ("a", a.url + "/v1"),
        ("b", b.url + "/v1"),
        breaker={"failure_threshold": 1},
        failover={"max_attempts_per_target": 2, "max_retry_wait": 2 * WAIT},
    )
    inner = h.HTTPTransport() if sync else h.AsyncHTTPTransport()
    return failover_transport(h, sync, config, inner, **kw)


@pytest.mark.parametrize("clock", sorted(CLOCKS))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_close_ends_a_request_waiting_to_retry_at_once(
    flavour: str, kind: str, clock: str, a: Upstream, b: Upstream
) -> None:
    """Closed while its request waits out a 30 s `Retry-After`, the client gets the
    request back at once — with the flavour's ReadError, well before the wait would
    have ended — and neither A nor B is sent anything more; the 503 counts (A open)."""
    h = flavour_of(flavour)
    transport = waiting_long(h, kind == "sync", a, b, **CLOCKS[clock])
    seen, took = closed_after_a_503(kind, h, transport, a.url + "/v1/x")
    assert seen == ("raised", "ReadError")
    assert took < WAIT / 2
    assert (a.calls, b.calls) == (1, 0)
    assert_only_a_open(transport)


@pytest.mark.parametrize("kind", ["asyncio", "trio"])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_transport_closed_and_used_again_waits_out_a_later_retry(
    flavour: str, kind: str, a: Upstream, b: Upstream
) -> None:
    """A close wakes only the waits under way: a request sent through the same transport
    after it was closed waits out its own retry wait (a short one here) and is retried,
    as before any close."""
    h = flavour_of(flavour)
    transport = waiting_long(h, False, a, b)
    calls: list[float] = []
    a.behaviour = lambda _: (
        calls.append(time.monotonic())
        or Respond(503, body="busy", headers={"retry-after-ms": "300"})
    )

    async def go() -> None:
        await transport.aclose()  # nothing in flight: nothing to wake
        async with h.AsyncClient(transport=transport, timeout=5.0) as client:
            with anyio.fail_after(10.0):
                response = await client.get(a.url + "/v1/x")
        assert response.status_code == 200  # B answered, after A's two attempts

    execute(kind, go)
    assert len(calls) == 2
    assert calls[1] - calls[0] >= 0.25  # the 0.3 s wait, less the clocks' resolution
    assert b.calls == 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_close_under_a_retry_in_place_leaves_the_failure_before_it_counted(
    flavour: str, kind: str, a: Upstream, b: Upstream
) -> None:
    """A answers 503 with a short `retry-after-ms`, then holds its answer to the retry; the
    client is closed while that retry is in flight. The request ends with the flavour's
    ReadError, B is sent nothing, and A's 503 counts (A open), as it does when the close
    comes during the wait: the close itself is neutral, the failure before it was not."""
    h = flavour_of(flavour)
    sync = kind == "sync"
    gate = threading.Event()
    first = iter([Respond(503, body="busy", headers={"retry-after-ms": "50"})])
    a.behaviour = lambda _: next(first, None) or Respond(body="late", gate=gate)
    config = route(
        ("a", a.url + "/v1"),
        ("b", b.url + "/v1"),
        breaker={"failure_threshold": 1},
        failover={"max_attempts_per_target": 2},
    )
    inner = h.HTTPTransport() if sync else h.AsyncHTTPTransport()
    transport = failover_transport(h, sync, config, inner)
    seen: list[tuple[str, Any]] = []

    async def go() -> None:
        c = client_over(h, sync, transport)
        seen.append(await closing(sync, c.get(a.url + "/v1/x"), c.close, lambda: a.calls == 2))

    try:
        execute(kind, go)
    finally:
        gate.set()
    assert seen == [("raised", "ReadError")]
    assert (a.calls, b.calls) == (2, 0)
    assert_only_a_open(transport)
