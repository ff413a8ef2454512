"""What upstreams say in compressed error bodies and in Retry-After on an outage, over real sockets."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable
from typing import Any

import pytest

from drivers import FakeClock, MakeDriver, route
from sidestep._answers.classify import BODY_PREFIX_LIMIT
from sidestep._answers.encodings import decoded_head
from upstream import Respond, Upstream

OVERFLOW = {"error": {"code": "context_length_exceeded", "message": "too long"}}
QUOTA = {"error": {"code": "insufficient_quota", "type": "insufficient_quota"}}


def _brotli(data: bytes) -> bytes:
    import brotli  # the dev extra has it: br bodies are tested, never skipped

    return bytes(brotli.compress(data))


def _zstd(data: bytes) -> bytes:
    import zstandard

    return bytes(zstandard.ZstdCompressor().compress(data))


ENCODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": _brotli,
    "zstd": _zstd,
}


def encoded(status: int, document: dict[str, Any], coding: str) -> Callable[[Any], Respond]:
    """A behaviour answering `document` encoded with `coding` (skips if it cannot be made)."""
    body = ENCODERS[coding](json.dumps(document).encode())
    headers = {"content-type": "application/json", "content-encoding": coding}
    return lambda _: Respond(status, body, headers)


@pytest.mark.parametrize("coding", list(ENCODERS))
def test_compressed_context_overflow_fails_over(
    coding: str, make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A compressed 400 context_length_exceeded is recognised and the request moves to B."""
    a.behaviour = encoded(400, OVERFLOW, coding)
    d = make(route(("a", a.url + "/v1"), ("b", b.url + "/v1")))
    r = d.post(a.url + "/v1/chat", json={"model": "m"})
    assert (r.status, r.text) == (200, "b")


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_compressed_quota_body_suspends_for_quota(
    coding: str, make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A gzip/deflate 429 insufficient_quota is recorded as quota_exhausted, not rate_limited."""
    a.behaviour = encoded(429, QUOTA, coding)
    d = make(route(("a", a.url + "/v1"), ("b", b.url + "/v1")))
    assert d.post(a.url + "/v1/chat", json={"model": "m"}).text == "b"
    (s,) = d.transport.suspensions()
    assert (s.target, s.reason, s.scope) == ("a", "quota_exhausted", "origin+credential")


def test_the_caller_gets_the_compressed_body_as_plain_httpx_would(
    make: MakeDriver, a: Upstream
) -> None:
    """A gzip error body handed back is the raw one, which the caller's client decodes itself."""
    document = {"error": {"code": "invalid_request", "message": "bad field"}}
    a.behaviour = encoded(400, document, "gzip")
    d = make(route(("a", a.url + "/v1")))
    r = d.post(a.url + "/v1/chat", json={"model": "m"})
    assert r.status == 400
    assert r.headers["content-encoding"] == "gzip"
    assert json.loads(r.body) == document


@pytest.mark.parametrize("coding", list(ENCODERS))
def test_a_compression_bomb_costs_no_more_than_the_bound(coding: str) -> None:
    """A small head that inflates to 16 MiB decodes to at most BODY_PREFIX_LIMIT bytes."""
    bomb = ENCODERS[coding](b"\0" * (16 * 1024 * 1024))
    assert len(bomb) < BODY_PREFIX_LIMIT * 2
    head = decoded_head([bomb[:BODY_PREFIX_LIMIT]], coding, BODY_PREFIX_LIMIT)
    assert head == b"\0" * BODY_PREFIX_LIMIT


def test_a_signal_past_the_decoded_bound_is_not_read() -> None:
    """The bound is on decoded bytes: a quota signal after 16 KiB of padding is not seen."""
    body = b" " * BODY_PREFIX_LIMIT + b"insufficient_quota"
    head = decoded_head([gzip.compress(body)], "gzip", BODY_PREFIX_LIMIT)
    assert b"insufficient_quota" not in head
    assert len(head) == BODY_PREFIX_LIMIT


def test_layered_and_unknown_encodings() -> None:
    """Layers are undone last-first; an unknown or corrupt coding leaves the head as it came."""
    layered = zlib.compress(gzip.compress(b"quota"))
    assert decoded_head([layered], "gzip, deflate", 64) == b"quota"
    assert decoded_head([b"plain"], "compress", 64) == b"plain"
    assert decoded_head([b"not gzip"], "gzip", 64) == b"not gzip"
    assert decoded_head([b"pla", b"in"], "identity", 64) == b"plain"


@pytest.mark.parametrize("status", [503, 529])
def test_retry_after_on_an_outage_sets_the_open_window(
    status: int, make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A 503/529 with Retry-After: 30 opens A for 30 s (under max_cooldown), not the 10 s cooldown."""
    a.behaviour = lambda _: Respond(status, "maintenance", {"retry-after": "30"})
    clock = FakeClock()
    config = route(
        ("a", a.url + "/v1"),
        ("b", b.url + "/v1"),
        breaker={"failure_threshold": 1, "cooldown": 10, "max_cooldown": 60},
        failover={"max_retry_wait": 0},
    )
    d = make(config, clock=clock)
    assert d.get(a.url + "/v1/x").text == "b"
    (s,) = d.transport.suspensions()
    assert (s.state, s.retry_in) == ("open", 30)
    a.behaviour = lambda _: Respond(body="a")
    clock.advance(29)
    assert d.get(a.url + "/v1/x").text == "b"
    clock.advance(1)
    assert d.get(a.url + "/v1/x").text == "a"


def test_retry_after_on_an_outage_is_bounded_by_max_cooldown(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A 503 announcing an hour of downtime opens A for max_cooldown at most."""
    a.behaviour = lambda _: Respond(503, "maintenance", {"retry-after": "3600"})
    config = route(
        ("a", a.url + "/v1"),
        ("b", b.url + "/v1"),
        breaker={"failure_threshold": 1, "cooldown": 10, "max_cooldown": 60},
        failover={"max_retry_wait": 0},
    )
    d = make(config, clock=FakeClock())
    assert d.get(a.url + "/v1/x").text == "b"
    (s,) = d.transport.suspensions()
    assert s.retry_in == 60
