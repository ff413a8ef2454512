"""The providers' rate-limit signals over real sockets: how long a 429 suspends, and avoiding the 429."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from typing import Any

import pytest

from drivers import Driver, FakeClock, MakeDriver, route
from sidestep._answers.classify import BODY_PREFIX_LIMIT
from upstream import Respond, Seen, Stream, Upstream

INITIAL = 5.0  # the rate_limited window when no signal reads
MAX = 40.0  # the longest rate_limited window
MODEL = {"model": "m"}


def config(a: Upstream, b: Upstream, **route_extra: Any) -> dict[str, Any]:
    """A then B; a rate limit suspends for INITIAL when unsaid, MAX at most; no retry in place."""
    return route(
        ("a", a.url + "/v1"),
        ("b", b.url + "/v1"),
        failover={"max_retry_wait": 0},
        suspensions={"rate_limited": {"initial": INITIAL, "max": MAX}},
        route=route_extra,
    )


def rfc3339_in(seconds: float) -> str:
    at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)
    return at.isoformat(timespec="microseconds").replace("+00:00", "Z")


def retry_info(delay: str, padding: int = 0) -> bytes:
    """A Gemini 429 body whose RetryInfo comes after `padding` bytes of message."""
    return json.dumps(
        {
            "error": {
                "code": 429,
                "message": "Resource has been exhausted (e.g. check quota)." + " " * padding,
                "status": "RESOURCE_EXHAUSTED",
                "details": [
                    {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}
                ],
            }
        }
    ).encode()


def ask(d: Driver, a: Upstream, headers: dict[str, str] | None = None) -> str:
    """One chat request routed by A's URL; the body of the answer."""
    return d.post(a.url + "/v1/chat", json=MODEL, headers=headers).text


def opens_for(d: Driver, a: Upstream, clock: FakeClock, window: float) -> None:
    """A's scope reopens exactly after `window` seconds: B answers until then, A right after."""
    a.behaviour = lambda _: Respond(body="a")
    clock.advance(window - 0.01)
    assert ask(d, a) == "b"
    clock.advance(0.01)
    assert ask(d, a) == "a"


SIGNALS: dict[str, tuple[Callable[[], Respond], float]] = {
    "openai requests": (
        lambda: Respond(429, "slow down", {"x-ratelimit-reset-requests": "17s"}),
        17,
    ),
    "openai tokens": (
        lambda: Respond(429, "slow down", {"x-ratelimit-reset-tokens": "1m2.5s"}),
        62.5,
    ),
    "openai ms": (lambda: Respond(429, "slow down", {"x-ratelimit-reset-requests": "1500ms"}), 1.5),
    "google retry info": (lambda: Respond(429, retry_info("17s")), 17),
}


@pytest.mark.parametrize("signal", ["openai requests", "openai ms", "google retry info"])
def test_a_providers_reset_sets_the_window(
    signal: str, make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A 429 without Retry-After suspends A for the provider's own reset, and A reopens exactly after it."""
    answer, window = SIGNALS[signal]
    a.behaviour = lambda _: answer()
    clock = FakeClock()
    d = make(config(a, b), clock=clock)
    assert ask(d, a) == "b"
    (s,) = d.transport.suspensions()
    assert (s.target, s.reason, s.scope, s.retry_in) == (
        "a",
        "rate_limited",
        "origin+credential+model",
        window,
    )
    opens_for(d, a, clock, window)


@pytest.mark.parametrize("name", ["requests", "tokens", "input-tokens", "output-tokens"])
def test_an_anthropic_reset_time_sets_the_window(
    name: str, make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """An anthropic-ratelimit-*-reset time 20 s ahead suspends A for 20 s, give or take the wall clock's drift."""
    header = f"anthropic-ratelimit-{name}-reset"
    a.behaviour = lambda _: Respond(429, "slow down", {header: rfc3339_in(20)})
    clock = FakeClock()
    d = make(config(a, b), clock=clock)
    assert ask(d, a) == "b"
    (s,) = d.transport.suspensions()
    assert s.retry_in is not None and 19 < s.retry_in <= 20
    opens_for(d, a, clock, s.retry_in)


def test_the_window_is_bounded_by_the_reasons_max(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A reset an hour away suspends A for the rate_limited max, not the hour."""
    a.behaviour = lambda _: SIGNALS["openai tokens"][0]()  # 62.5 s, past MAX
    clock = FakeClock()
    d = make(config(a, b), clock=clock)
    assert ask(d, a) == "b"
    (s,) = d.transport.suspensions()
    assert s.retry_in == MAX
    opens_for(d, a, clock, MAX)


@pytest.mark.parametrize(
    "answer",
    [
        Respond(429, "slow down", {"x-ratelimit-reset-requests": "-17s"}),
        Respond(429, "slow down", {"x-ratelimit-reset-requests": "1704067200"}),
        Respond(429, "slow down", {"anthropic-ratelimit-requests-reset": "tomorrow"}),
        Respond(429, retry_info("seventeen")),
    ],
    ids=["negative", "absurd", "unparseable", "retry-info"],
)
def test_garbage_leaves_the_reasons_initial_window(
    answer: Respond, make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A reset that does not read leaves the rate_limited window at its initial length."""
    a.behaviour = lambda _: answer
    clock = FakeClock()
    d = make(config(a, b), clock=clock)
    assert ask(d, a) == "b"
    (s,) = d.transport.suspensions()
    assert (s.reason, s.retry_in) == ("rate_limited", INITIAL)


def test_retry_info_past_the_body_prefix_is_not_read(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A RetryInfo placed after the first 16 KiB of the body is never read: the initial window applies."""
    body = retry_info("17s", padding=BODY_PREFIX_LIMIT)
    assert body.index(b"retryDelay") > BODY_PREFIX_LIMIT
    a.behaviour = lambda _: Respond(429, body, {"content-type": "application/json"})
    d = make(config(a, b), clock=FakeClock())
    assert ask(d, a) == "b"
    (s,) = d.transport.suspensions()
    assert s.retry_in == INITIAL


@pytest.mark.parametrize(("reset", "served_by"), [("20ms", "a"), ("5s", "b")])
def test_a_reset_within_max_retry_wait_is_waited_out_in_place(
    reset: str, served_by: str, make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """With a second attempt allowed, a 429 whose reset fits max_retry_wait is retried on A; a longer one fails over at once."""
    answers = iter([Respond(429, "slow down", {"x-ratelimit-reset-requests": reset})])
    a.behaviour = lambda _: next(answers, Respond(body="a"))
    cfg = config(a, b)
    cfg["failover"] = {"max_attempts_per_target": 2, "max_retry_wait": 1}
    d = make(cfg)
    assert ask(d, a) == served_by
    assert a.calls == (2 if served_by == "a" else 1)


# -- avoiding the 429 ------------------------------------------------------------------------


def allows(
    n: int, upstream: Upstream, headers: Callable[[int], dict[str, str]]
) -> Callable[[Seen], Any]:
    """An upstream allowing `n` requests: each success says how many are left, then 429s."""

    def behaviour(_: Seen) -> Respond:
        calls = upstream.calls  # this request included
        if calls > n:
            return Respond(429, "rate limited", {"x-ratelimit-reset-requests": "30s"})
        return Respond(body=upstream.name, headers=headers(n - calls))

    return behaviour


def openai_left(left: int) -> dict[str, str]:
    return {"x-ratelimit-remaining-requests": str(left), "x-ratelimit-reset-requests": "30s"}


def test_a_spent_success_moves_the_next_request_without_a_429(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """With avoid_rate_limits, A's answer saying no request is left suspends A until its reset; A sees no request to 429."""
    a.behaviour = allows(2, a, openai_left)
    clock = FakeClock()
    d = make(config(a, b, avoid_rate_limits=True), clock=clock)
    assert [ask(d, a) for _ in range(4)] == ["a", "a", "b", "b"]
    assert a.calls == 2  # no 429 collected
    (s,) = d.transport.suspensions()
    assert (s.target, s.reason, s.scope, s.retry_in) == (
        "a",
        "rate_limited",
        "origin+credential+model",
        30,
    )
    opens_for(d, a, clock, 30)


def test_without_avoid_rate_limits_the_429_is_collected_first(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Off by default: A's spent answer suspends nothing, so the next request collects A's 429 before B answers."""
    a.behaviour = allows(1, a, openai_left)
    d = make(config(a, b), clock=FakeClock())
    assert [ask(d, a) for _ in range(2)] == ["a", "b"]
    assert a.calls == 2  # the second one was a 429


def test_an_anthropic_spent_success_without_a_reset_uses_the_initial_window(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """anthropic-ratelimit-requests-remaining: 0 with no reset suspends A for the rate_limited initial window."""
    a.behaviour = allows(1, a, lambda left: {"anthropic-ratelimit-requests-remaining": str(left)})
    d = make(config(a, b, avoid_rate_limits=True), clock=FakeClock())
    assert [ask(d, a) for _ in range(2)] == ["a", "b"]
    assert a.calls == 1
    (s,) = d.transport.suspensions()
    assert (s.reason, s.retry_in) == ("rate_limited", INITIAL)


def test_a_streamed_spent_success_suspends_at_its_first_byte(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A stream whose headers say no request is left suspends A before its body ends, and the caller still gets A's stream."""
    a.behaviour = lambda _: Stream([b"a1", b"a2"], headers=openai_left(0), stall_after=1)
    d = make(config(a, b, avoid_rate_limits=True), clock=FakeClock())
    assert d.first_chunk("POST", a.url + "/v1/chat", json=MODEL) == b"a1"
    (s,) = d.transport.suspensions()
    assert (s.target, s.reason, s.retry_in) == ("a", "rate_limited", 30)
    assert ask(d, a) == "b"
    assert a.calls == 1


def test_a_spent_success_suspends_only_its_own_credential(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Another API key on the same origin and model is not suspended by one key's spent window."""
    a.behaviour = lambda seen: Respond(
        body=f"a:{seen.headers['authorization']}",
        headers=openai_left(0 if seen.headers["authorization"] == "Bearer one" else 9),
    )
    d = make(config(a, b, avoid_rate_limits=True), clock=FakeClock())
    one, two = {"authorization": "Bearer one"}, {"authorization": "Bearer two"}
    assert ask(d, a, one) == "a:Bearer one"
    assert ask(d, a, two) == "a:Bearer two"
    assert ask(d, a, one) == "b"


def test_a_spent_success_suspends_through_a_shared_store(
    make: MakeDriver, a: Upstream, b: Upstream, redis_url: str
) -> None:
    """Through a RedisStore the spent answer suspends A too: a second transport on that store skips A at once."""
    from redis_server import fresh_prefix
    from sidestep import RedisStore

    prefix = fresh_prefix()
    a.behaviour = allows(1, a, openai_left)
    cfg = config(a, b, avoid_rate_limits=True)
    stores = [RedisStore(redis_url, prefix=prefix) for _ in range(2)]
    first, second = (make(cfg, store=store) for store in stores)
    try:
        assert ask(first, a) == "a"
        assert ask(second, a) == "b"
        assert a.calls == 1
        (s,) = second.transport.suspensions()
        assert (s.target, s.reason) == ("a", "rate_limited")
        assert s.retry_in is not None and 29 < s.retry_in <= 30
    finally:
        for d, store in zip((first, second), stores, strict=True):
            if d.is_async:
                d.run(store.aclose())
            else:
                store.close()
