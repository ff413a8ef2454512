"""Failover transports against real upstreams on 127.0.0.1, run for all four transports."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import httpx
import httpx2
import pytest

import sidestep
from drivers import Driver, FakeClock, MakeDriver, Result, elapsed, route
from upstream import (
    CLIENT_TIMEOUT,
    IN_TIME,
    Hang,
    HeadersThenHang,
    Reset,
    Respond,
    Seen,
    Stream,
    Upstream,
    free_port,
    wait_for,
)

EVENT_STREAM = {"accept": "text/event-stream"}  # a request that asks for a streamed answer


def pair(a: Upstream, b: Upstream, **extra: Any) -> dict[str, Any]:
    return route(("a", a.url + "/v1"), ("b", b.url + "/v1"), **extra)


def unavailable(_: Seen) -> Respond:
    return Respond(503, "down")


def test_503_fails_over_to_the_next_target(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """A answers 503: B's answer reaches the caller and the attribution shows the failover."""
    a.behaviour = unavailable
    d = make(pair(a, b))
    r = d.get(a.url + "/v1/items?page=2")
    assert (r.status, r.text) == (200, "b")
    assert r.extensions["sidestep"] == {
        "route": "chat",
        "target": "b",
        "attempts": 2,
        "failover": True,
    }
    assert b.seen[0].path == "/v1/items?page=2"
    assert b.seen[0].headers["host"] == f"127.0.0.1:{b.port}"


def test_healthy_first_target_answers_without_failover(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A healthy first candidate answers; nothing reaches the second."""
    d = make(pair(a, b))
    r = d.get(a.url + "/v1/x")
    assert (r.text, r.extensions["sidestep"]["failover"], b.calls) == ("a", False, 0)


def test_open_circuit_skips_the_target_until_its_window_ends(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """After failure_threshold failures A gets no calls until the window ends, then one probe."""
    a.behaviour = unavailable
    clock = FakeClock()
    d = make(pair(a, b, breaker={"failure_threshold": 2, "cooldown": 10}), clock=clock)
    for _ in range(2):
        assert d.get(a.url + "/v1/x").text == "b"
    assert a.calls == 2
    for _ in range(20):
        r = d.get(a.url + "/v1/x")
        assert r.text == "b"
        assert r.extensions["sidestep"]["attempts"] == 1
    assert a.calls == 2
    clock.advance(10)
    a.behaviour = lambda _: Respond(body="a again")
    assert d.get(a.url + "/v1/x").text == "a again"
    assert a.calls == 3


def test_exactly_the_configured_probes_reach_a_recovering_target(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """200 requests arriving together after the window: exactly half_open_probes reach A."""
    a.behaviour = unavailable
    clock = FakeClock()
    d = make(pair(a, b, breaker={"half_open_probes": 2}), clock=clock, timeout=CLIENT_TIMEOUT)
    for _ in range(2):
        d.get(a.url + "/v1/x")
    gate = threading.Event()
    a.behaviour = lambda _: Respond(body="a", gate=gate)
    clock.advance(10)
    calls_before = a.calls
    done: list[Any] = []
    runner = threading.Thread(target=lambda: done.append(d.many(200, "GET", a.url + "/v1/x")))
    runner.start()
    wait_for(lambda: b.calls == 2 + 198 and a.calls - calls_before == 2)
    gate.set()
    runner.join(30)
    results = done[0]
    assert all(isinstance(r, Result) and r.status == 200 for r in results)
    assert a.calls - calls_before == 2
    assert sum(1 for r in results if isinstance(r, Result) and r.text == "a") == 2


def test_hang_fails_over_only_for_idempotent_requests(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A accepts and never answers: a GET fails over, a POST without Idempotency-Key gets the timeout."""
    a.behaviour = lambda _: Hang()
    d = make(pair(a, b, breaker={"failure_threshold": 10}), timeout=IN_TIME)
    assert d.get(a.url + "/v1/x").text == "b"
    with pytest.raises(d.http.ReadTimeout):
        d.post(a.url + "/v1/x", json={"q": 1})
    assert b.calls == 1
    r = d.post(a.url + "/v1/x", json={"q": 1}, headers={"idempotency-key": "k-1"})
    assert r.text == "b"


def test_retry_ambiguous_lets_a_post_fail_over(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """With failover.retry_ambiguous a hung POST moves on to the next target."""
    a.behaviour = lambda _: Hang()
    d = make(pair(a, b, failover={"retry_ambiguous": True}), timeout=IN_TIME)
    assert d.post(a.url + "/v1/x", json={"q": 1}).text == "b"


def test_connect_that_hangs_past_first_byte_timeout_fails_over_a_post(
    make: MakeDriver, b: Upstream
) -> None:
    """A connect that never completes is "nothing sent": even a POST that asks to stream fails over at the first-byte limit, long before the caller's own connect timeout."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(0)
    fillers = []
    port = hole.getsockname()[1]
    for _ in range(4):  # fill the accept queue: further connects hang
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    try:
        dead = f"http://127.0.0.1:{port}"
        d = make(
            route(
                ("a", dead + "/v1"), ("b", b.url + "/v1"), failover={"first_byte_timeout": IN_TIME}
            ),
            timeout=CLIENT_TIMEOUT,
        )
        r, took = elapsed(lambda: d.post(dead + "/v1/x", json={"q": 1, "stream": True}))
        assert r.text == "b"
        assert took < CLIENT_TIMEOUT / 2
    finally:
        for s in (*fillers, hole):
            s.close()


def test_connection_refused_fails_over_and_opens_the_origin(make: MakeDriver, b: Upstream) -> None:
    """Nothing listens at A: the request fails over and A's origin scope opens."""
    dead = f"http://127.0.0.1:{free_port()}"
    d = make(route(("a", dead + "/v1"), ("b", b.url + "/v1"), breaker={"failure_threshold": 1}))
    assert d.get(dead + "/v1/x").text == "b"
    (s,) = d.transport.suspensions()
    assert (s.target, s.scope, s.state, s.reason) == ("a", "origin", "open", "unavailable")
    r = d.post(dead + "/v1/x", json={"model": "other"})
    assert r.extensions["sidestep"]["attempts"] == 1  # skipped for every model


def test_retry_after_suspends_the_scope_for_that_long(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """429 with Retry-After: 2 skips that scope for 2 s on the transport's clock, then probes it."""
    a.behaviour = lambda _: Respond(429, "slow down", {"retry-after": "2"})
    clock = FakeClock()
    d = make(pair(a, b), clock=clock)
    assert d.get(a.url + "/v1/x").text == "b"
    a.behaviour = lambda _: Respond(body="a")
    clock.advance(1.9)
    assert d.get(a.url + "/v1/x").text == "b"
    assert a.calls == 1
    clock.advance(0.1)
    assert d.get(a.url + "/v1/x").text == "a"


def test_401_suspends_the_credential_and_never_leaks_it(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A rejects the key: B answers with its own key, and A's key never reaches B's server."""
    a.behaviour = lambda _: Respond(401, "bad key")
    config = pair(a, b, targets={"b": {"headers": {"authorization": "Bearer key-for-b"}}})
    d = make(config)
    r = d.get(
        a.url + "/v1/x", headers={"authorization": "Bearer key-for-a", "x-api-key": "a-secret"}
    )
    assert r.text == "b"
    seen = b.seen[0].headers
    assert seen["authorization"] == "Bearer key-for-b"
    assert "x-api-key" not in seen
    assert "key-for-a" not in json.dumps(seen)
    (s,) = d.transport.suspensions()
    assert (s.scope, s.reason) == ("origin+credential", "invalid_credential")
    # a fresh key is a fresh scope: no restart, no manual clear
    assert (
        d.get(a.url + "/v1/x", headers={"authorization": "Bearer new"}).extensions["sidestep"][
            "attempts"
        ]
        == 2
    )


def test_credentials_carried_only_when_the_target_inherits_them(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """inherit_credentials: true carries the caller's credential to another origin."""
    a.behaviour = unavailable
    d = make(pair(a, b, targets={"b": {"inherit_credentials": True}}))
    d.get(a.url + "/v1/x", headers={"authorization": "Bearer shared"})
    assert b.seen[0].headers["authorization"] == "Bearer shared"


def test_dead_model_does_not_block_another_model(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """503 for model X on a live host opens X's scope only; model Y still reaches A."""
    a.behaviour = lambda s: Respond(503) if s.json()["model"] == "x" else Respond(body="a")
    d = make(pair(a, b))
    for _ in range(3):
        assert d.post(a.url + "/v1/chat", json={"model": "x"}).text == "b"
    assert a.calls == 2
    assert d.post(a.url + "/v1/chat", json={"model": "y"}).text == "a"
    assert a.calls == 3


def test_target_json_fields_override_the_model(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """B's `json` fields are merged into the body with a correct Content-Length."""
    a.behaviour = unavailable
    d = make(pair(a, b, targets={"b": {"json": {"model": "big"}}}))
    d.post(a.url + "/v1/chat", json={"model": "small", "messages": ["hi"]})
    seen = b.seen[0]
    assert seen.json() == {"model": "big", "messages": ["hi"]}
    assert int(seen.headers["content-length"]) == len(seen.body)
    assert a.seen[0].json()["model"] == "small"


def test_streamed_answer_from_the_backup_arrives_whole(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """After A's 503 the client reads every chunk of B's server-sent events."""
    a.behaviour = unavailable
    events = [f"data: {i}\n\n".encode() for i in range(10)]
    b.behaviour = lambda _: Stream(
        events, headers={"content-type": "text/event-stream"}, delay=0.01
    )
    d = make(pair(a, b))
    r = d.stream("GET", a.url + "/v1/stream", on_chunk=lambda _: None)
    assert r.body == b"".join(events)
    assert r.extensions["sidestep"]["target"] == "b"


def test_first_byte_timeout_fails_over_a_stalled_stream(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A sends 200 headers and then nothing to a request that accepts an event stream: B answers after first_byte_timeout, long before the caller's own timeout."""
    a.behaviour = lambda _: HeadersThenHang()
    d = make(pair(a, b, failover={"first_byte_timeout": IN_TIME}), timeout=CLIENT_TIMEOUT)
    r, took = elapsed(lambda: d.get(a.url + "/v1/x", headers=EVENT_STREAM))
    assert r.text == "b"
    assert took < CLIENT_TIMEOUT / 2


def test_first_chunk_reaches_the_caller_before_the_rest_is_sent(
    make: MakeDriver, a: Upstream
) -> None:
    """A answers at once: its first chunk is handed over while A still holds the rest."""
    release = threading.Event()
    a.behaviour = lambda _: Stream([b"first", b"second", b"third"], release=release)
    d = make(route(("a", a.url + "/v1")))
    got: list[bytes] = []

    def on_chunk(chunk: bytes) -> None:
        got.append(chunk)
        release.set()  # A sends the rest only after the caller saw the first chunk

    r = d.stream("GET", a.url + "/v1/x", on_chunk=on_chunk)
    assert got[0] == b"first"
    assert r.body == b"firstsecondthird"


def test_cut_stream_is_an_error_never_a_short_body(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Without commit: complete, a stream cut after the first bytes reaches the caller as an error."""
    a.behaviour = lambda _: Stream([b"one", b"two", b"three"], cut_after=2)
    d = make(pair(a, b))
    with pytest.raises(d.http.TransportError):
        d.get(a.url + "/v1/x")
    assert b.calls == 0


def test_commit_complete_fails_over_a_cut_stream(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """With commit: complete, A's cut stream fails over and the caller gets B's complete body."""
    a.behaviour = lambda _: Stream([b"one", b"two", b"three"], cut_after=2)
    b.behaviour = lambda _: Stream([b"B1", b"B2", b"B3"])
    d = make(pair(a, b, route={"commit": "complete"}, failover={"retry_ambiguous": True}))
    r = d.post(a.url + "/v1/x", json={"q": 1})
    assert r.body == b"B1B2B3"


def test_context_overflow_moves_on_without_touching_the_circuit(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A's 400 context_length_exceeded: B answers, and A's circuit is untouched."""
    overflow = {"error": {"code": "context_length_exceeded", "message": "maximum context length"}}
    a.behaviour = lambda _: Respond(400, overflow)
    d = make(pair(a, b, breaker={"failure_threshold": 1}))
    for _ in range(3):
        assert d.post(a.url + "/v1/chat", json={"model": "m"}).text == "b"
    assert a.calls == 3
    assert d.transport.suspensions() == []


def test_other_400_reaches_the_caller_and_b_is_not_called(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A 400 for another reason is the request's fault: returned as-is, no failover."""
    a.behaviour = lambda _: Respond(400, {"error": {"message": "bad field"}})
    d = make(pair(a, b))
    r = d.post(a.url + "/v1/chat", json={"model": "m"})
    assert r.status == 400
    assert json.loads(r.body) == {"error": {"message": "bad field"}}
    assert b.calls == 0


def test_error_body_read_for_classification_reaches_the_caller_whole(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """When every target answers 429, the caller gets the last 429 with its whole body."""
    big = {"error": {"type": "rate_limit", "message": "x" * 40_000}}
    a.behaviour = b.behaviour = lambda _: Respond(429, big)
    d = make(pair(a, b))
    r = d.get(a.url + "/v1/x")
    assert r.status == 429
    assert json.loads(r.body) == big
    assert r.extensions["sidestep"]["target"] == "b"


def test_generator_body_is_not_replayed(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """A one-shot body goes to one target only; the caller gets that target's failure."""
    a.behaviour = unavailable
    d = make(pair(a, b))

    if d.is_async:

        async def body() -> Any:
            yield b"part-1;"
            yield b"part-2"
    else:

        def body() -> Any:  # type: ignore[misc]
            yield b"part-1;"
            yield b"part-2"

    r = d.post(a.url + "/v1/x", content=body())
    assert r.status == 503
    assert a.seen[0].body == b"part-1;part-2"
    assert b.calls == 0


def test_all_candidates_suspended_raises_one_typed_error(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Every candidate open: AllCandidatesSuspended, no upstream call, retry_after from the earliest window."""
    a.behaviour = b.behaviour = unavailable
    clock = FakeClock()
    d = make(pair(a, b, breaker={"failure_threshold": 1, "cooldown": 10}), clock=clock)
    r = d.get(a.url + "/v1/x")
    assert r.status == 503
    clock.advance(3)
    calls = a.calls + b.calls
    with pytest.raises(sidestep.AllCandidatesSuspended) as caught:
        d.get(a.url + "/v1/x")
    assert a.calls + b.calls == calls
    error = caught.value
    assert error.retry_after == pytest.approx(7)
    assert [c.target for c in error.candidates] == ["a", "b"]
    assert isinstance(error, d.http.TransportError)
    assert a.url not in str(error) and "127.0.0.1" not in repr(error)


def test_respond_mode_answers_a_synthetic_503(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """on_all_suspended: respond returns the 503 with Retry-After and the SDK hints."""
    a.behaviour = b.behaviour = unavailable
    clock = FakeClock()
    config = pair(a, b, breaker={"failure_threshold": 1}, failover={"on_all_suspended": "respond"})
    d = make(config, clock=clock)
    d.get(a.url + "/v1/x")
    clock.advance(2.5)
    r = d.get(a.url + "/v1/x")
    assert r.status == 503
    assert r.headers["retry-after"] == "8"
    assert r.headers["retry-after-ms"] == "7500"
    assert r.headers["x-should-retry"] == "false"
    assert r.headers["x-sidestep"] == "all_candidates_suspended"
    assert json.loads(r.body)["error"]["type"] == "all_candidates_suspended"


def test_sync_transport_under_32_threads_sends_exactly_one_probe(a: Upstream, b: Upstream) -> None:
    """32 threads hammering a recovering target: exactly one probe reaches it."""
    a.behaviour = unavailable
    clock = FakeClock()
    d = Driver("httpx-sync", pair(a, b), clock=clock, timeout=CLIENT_TIMEOUT)
    try:
        d.get(a.url + "/v1/x")
        d.get(a.url + "/v1/x")
        gate = threading.Event()
        a.behaviour = lambda _: Respond(body="a", gate=gate)
        clock.advance(10)
        before = a.calls
        results: list[Any] = []
        runner = threading.Thread(target=lambda: results.extend(d.many(64, "GET", a.url + "/v1/x")))
        runner.start()
        wait_for(lambda: a.calls - before == 1 and b.calls == 2 + 63)
        gate.set()
        runner.join(30)
        assert a.calls - before == 1
        assert all(isinstance(r, Result) and r.status == 200 for r in results)
    finally:
        d.close()


def test_failover_traffic_leaks_no_connections(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """1000 requests failing over, 32 at a time, leave no socket open at A, and at B exactly the client's pool of idle keep-alive connections (at most its 20): none held by a finished request, none open outside the pool."""
    a.behaviour = unavailable
    d = make(pair(a, b, breaker={"failure_threshold": 100000}), timeout=CLIENT_TIMEOUT)
    results = d.many(1000, "GET", a.url + "/v1/x", concurrency=32)
    assert all(isinstance(r, Result) and r.text == "b" for r in results)
    assert a.calls == 1000
    # each discarded 503 was closed unread, so its connection was closed, not left open
    wait_for(lambda: a.open_connections == 0)
    # what stays at B is the client's pool of idle keep-alive connections...
    pooled = d.pooled(b.port)
    assert all(pooled) and len(pooled) <= 20
    # ...and nothing more: B's server counts exactly those open once it has taken in every
    # close (the pool closes surplus idle connections all through the run, and B's server
    # thread may see the last of those closes a while after the client made them)
    wait_for(lambda: b.open_connections == len(pooled))


def test_suspensions_and_clear(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """An operator lists the unhealthy scopes and closes one by hand."""
    a.behaviour = unavailable
    d = make(pair(a, b, breaker={"failure_threshold": 2}))
    d.get(a.url + "/v1/x")
    d.get(a.url + "/v1/x")
    (s,) = d.transport.suspensions()
    assert s.state == "open" and s.target == "a" and s.retry_in is not None
    assert d.transport.clear(s.scope_id)
    assert d.transport.suspensions() == []
    assert not d.transport.clear(s.scope_id)
    d.get(a.url + "/v1/x")
    assert a.calls == 3


def test_retry_after_within_max_retry_wait_retries_the_same_target(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A 429 asking for a short wait is retried on the same target when attempts allow."""
    answers = iter([Respond(429, "wait", {"retry-after-ms": "50"}), Respond(body="a")])
    a.behaviour = lambda _: next(answers)
    d = make(pair(a, b, failover={"max_attempts_per_target": 2}))
    r = d.get(a.url + "/v1/x")
    assert r.text == "a"
    assert r.extensions["sidestep"]["attempts"] == 2
    assert b.calls == 0


def test_max_total_attempts_bounds_the_request(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """Attempts over all targets stop at max_total_attempts; the last failure is returned."""
    a.behaviour = b.behaviour = unavailable
    d = make(
        pair(
            a,
            b,
            breaker={"failure_threshold": 50},
            failover={"max_attempts_per_target": 3, "max_total_attempts": 4},
        )
    )
    r = d.get(a.url + "/v1/x")
    assert r.status == 503
    assert (a.calls, b.calls) == (3, 1)
    assert r.extensions["sidestep"]["attempts"] == 4


def test_total_timeout_bounds_the_whole_request(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """total_timeout caps hanging attempts on every target together: far sooner than the caller's own timeout on one of them."""
    a.behaviour = b.behaviour = lambda _: Hang()
    config = pair(a, b, failover={"total_timeout": 0.6, "retry_ambiguous": True})
    d = make(config, timeout=CLIENT_TIMEOUT)
    with pytest.raises(d.http.TimeoutException):
        d.get(a.url + "/v1/x")
    start = time.monotonic()
    with pytest.raises(d.http.TimeoutException):
        d.get(a.url + "/v1/x")
    assert time.monotonic() - start < CLIENT_TIMEOUT / 2


def test_unrouted_requests_break_per_host(make: MakeDriver, a: Upstream) -> None:
    """Without routes every origin has its own circuit, and its own AllCandidatesSuspended: two paths that reset their connections open the host for a third."""
    a.behaviour = lambda seen: Reset()
    d = make({"breaker": {"failure_threshold": 2}})
    for path in ("/x", "/y"):
        with pytest.raises((httpx.TransportError, httpx2.TransportError)) as reset:
            d.get(a.url + path)
        assert not isinstance(reset.value, sidestep.AllCandidatesSuspended)
    with pytest.raises(sidestep.AllCandidatesSuspended) as caught:
        d.get(a.url + "/z")
    assert caught.value.candidates[0].target == f"http://127.0.0.1:{a.port}"
    assert a.calls == 2


def test_match_alias_is_a_virtual_upstream(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """A request to a `match` prefix goes to the route's targets in order, without the caller's credential."""
    config = pair(a, b, route={"match": ["http://llm.internal/v1"]})
    d = make(config)
    r = d.post(
        "http://llm.internal/v1/chat",
        json={"model": "m"},
        headers={"authorization": "Bearer alias"},
    )
    assert r.text == "a"
    assert a.seen[0].path == "/v1/chat"
    assert "authorization" not in a.seen[0].headers


def test_prefix_matches_on_segment_boundaries(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """/v1 does not match /v10: that request is unrouted and does not fail over."""
    a.behaviour = unavailable
    d = make(pair(a, b))
    assert d.get(a.url + "/v10/x").status == 503
    assert b.calls == 0


def test_upstream_that_always_breaks_off_mid_body_opens_its_circuit(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Bodies cut after the first chunk count as failures: failure_threshold of them open A."""
    a.behaviour = lambda _: Stream([b"one", b"two", b"three"], cut_after=1)
    d = make(pair(a, b, breaker={"failure_threshold": 2}))
    for _ in range(2):
        with pytest.raises(d.http.TransportError):
            d.get(a.url + "/v1/x")
    assert d.get(a.url + "/v1/x").text == "b"
    assert a.calls == 2


def test_percent_encoded_path_survives_failover(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """An encoded slash or question mark reaches the backup encoded, never as a new segment or query."""
    a.behaviour = unavailable
    d = make(pair(a, b))
    d.get(a.url + "/v1/docs/a%2Fb?x=1")
    d.get(a.url + "/v1/docs/what%3Fadmin=1")
    assert [s.path for s in b.seen] == ["/v1/docs/a%2Fb?x=1", "/v1/docs/what%3Fadmin=1"]


def test_commit_complete_still_honours_first_byte_timeout(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """With commit: complete, headers followed by silence fail over after first_byte_timeout (a request that accepts an event stream)."""
    a.behaviour = lambda _: HeadersThenHang()
    config = pair(a, b, route={"commit": "complete"}, failover={"first_byte_timeout": IN_TIME})
    d = make(config, timeout=CLIENT_TIMEOUT)
    r, took = elapsed(lambda: d.get(a.url + "/v1/x", headers=EVENT_STREAM))
    assert r.text == "b"
    assert took < CLIENT_TIMEOUT / 2


def test_first_target_gets_its_own_headers_and_json(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """The matched target's headers and json fields apply when it is tried first, not only after failover."""
    config = pair(
        a,
        b,
        targets={"a": {"headers": {"authorization": "Bearer A-KEY"}, "json": {"model": "a-model"}}},
    )
    d = make(config)
    d.post(a.url + "/v1/chat", json={"model": "asked", "n": 1})
    seen = a.seen[0]
    assert seen.headers["authorization"] == "Bearer A-KEY"
    assert seen.json() == {"model": "a-model", "n": 1}


def test_no_credential_of_any_shape_crosses_origins(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Provider-specific key headers, credential query parameters and userinfo stay with their origin."""
    a.behaviour = unavailable
    d = make(pair(a, b))
    d.get(
        a.url.replace("http://", "http://user:pw@") + "/v1/m:go?key=AIzaSECRET&alt=sse",
        headers={"x-goog-api-key": "AIzaSECRET", "x-auth-token": "tok", "idempotency-key": "i-1"},
    )
    seen = b.seen[0]
    assert seen.path == "/v1/m:go?alt=sse"
    assert "x-goog-api-key" not in seen.headers
    assert "x-auth-token" not in seen.headers
    assert "authorization" not in seen.headers  # the userinfo became basic auth for A only
    assert seen.headers["idempotency-key"] == "i-1"
    assert "AIza" not in json.dumps(seen.headers) + seen.path


def test_unknown_suspension_reason_from_a_custom_classifier_counts_as_an_outage(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A replacement classifier naming a reason without a window neither crashes nor leaks: it is a failure."""
    from sidestep._answers.classify import Kind, Verdict, classify

    def overloaded(x: Any) -> Verdict:
        if x.status == 503:
            return Verdict(Kind.SUSPEND, "overloaded", None, failover=True, status=503)
        return classify(x)

    a.behaviour = unavailable
    d = make({**pair(a, b, breaker={"failure_threshold": 1}), "classifier": overloaded})
    assert d.get(a.url + "/v1/x").text == "b"
    (s,) = d.transport.suspensions()
    assert (s.target, s.state, s.reason) == ("a", "open", "unavailable")


def test_a_stream_closed_early_counts_as_the_success_it_was(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Leaving a healthy stream after its first chunk resets the failure count like reading it all."""
    answers = iter(
        [Respond(500), Stream([b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]), Respond(500)]
    )
    a.behaviour = lambda _: next(answers)
    b.behaviour = lambda _: Respond(body="b")
    d = make(pair(a, b, breaker={"failure_threshold": 2}))
    assert d.get(a.url + "/v1/x").text == "b"  # failure 1
    assert d.first_chunk("GET", a.url + "/v1/x") == b"data: 1\n\n"  # a success, left early
    assert d.get(a.url + "/v1/x").text == "b"  # failure 1 again, not 2
    assert d.transport.suspensions()[0].state == "closed"
