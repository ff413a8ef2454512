"""Tests for the providers' rate-limit signals: reset headers, Google's RetryInfo, spent windows."""

from __future__ import annotations

import calendar
import json
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidestep._answers.classify import (
    BODY_PREFIX_LIMIT,
    QUOTA_EXHAUSTED,
    RATE_LIMITED,
    Exchange,
    Kind,
    classify,
    rate_limit_ahead,
)
from sidestep._answers.ratelimits import (
    LONGEST_RESET,
    parse_duration,
    reset_after,
    retry_delay,
    spent_requests,
)
from sidestep._common.scopes import ScopeKind

# 2024-01-01T00:00:00Z
NOW = float(calendar.timegm((2024, 1, 1, 0, 0, 0)))
HeaderFactory = Callable[[Mapping[str, str]], Mapping[str, str]]
HEADER_TYPES: list[HeaderFactory] = [dict, httpx.Headers, httpx2.Headers]


def gemini_429(delay: object, *, per: str = "PerMinute", array: bool = False) -> bytes:
    """A Gemini 429 body as the API sends it: quota failure, help link, then RetryInfo."""
    error = {
        "error": {
            "code": 429,
            "message": "You exceeded your current quota, please check your plan and billing "
            "details.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [
                        {
                            "quotaMetric": "generativelanguage.googleapis.com/"
                            "generate_content_free_tier_requests",
                            "quotaId": f"GenerateRequests{per}PerProjectPerModel-FreeTier",
                        }
                    ],
                },
                {"@type": "type.googleapis.com/google.rpc.Help", "links": []},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay},
            ],
        }
    }
    return json.dumps([error] if array else error).encode()


def rate_limited(headers: Mapping[str, str] = {}, body: bytes = b"") -> Any:
    return classify(
        Exchange("POST", {}, status=429, response_headers=headers, body=body, wall_now=NOW)
    )


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("6m0s", 360.0),
        ("1.5s", 1.5),
        ("20ms", 0.02),
        ("1h2m3s", 3723.0),
        ("1h2m3.5s", 3723.5),
        ("0s", 0.0),
        ("500us", 0.0005),
        ("500µs", 0.0005),  # Go prints the micro sign
        ("750ns", 7.5e-07),
        ("2", 2.0),
        (" 2.5 ", 2.5),
    ],
)
def test_go_durations(value: str, seconds: float) -> None:
    """Go's duration forms, and a bare number of seconds, read as seconds."""
    assert parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["", "-1s", "+1s", "-2", "s", "1d", "1 s", "1h-2m", "1e3", "abc"])
def test_duration_garbage_is_none(value: str) -> None:
    """Signs, exponents, unknown units and text are not durations."""
    assert parse_duration(value) is None


@pytest.mark.parametrize(
    ("name", "value", "seconds"),
    [
        ("x-ratelimit-reset-requests", "6m0s", 360.0),
        ("x-ratelimit-reset-requests", "1.5s", 1.5),
        ("x-ratelimit-reset-tokens", "20ms", 0.02),
        ("x-ratelimit-reset-tokens", "1h2m3s", 3723.0),
        ("anthropic-ratelimit-requests-reset", "2024-01-01T00:00:17Z", 17.0),
        ("anthropic-ratelimit-tokens-reset", "2024-01-01T00:00:17.250Z", 17.25),
        ("anthropic-ratelimit-input-tokens-reset", "2024-01-01T01:00:30+01:00", 30.0),
        ("anthropic-ratelimit-output-tokens-reset", "2023-12-31T23:59:00-00:01", 0.0),
        ("anthropic-ratelimit-requests-reset", "2023-12-31T23:00:00Z", 0.0),  # past: now
    ],
)
def test_each_reset_header_times_a_429(name: str, value: str, seconds: float) -> None:
    """Without Retry-After, each provider's reset header sets the 429's wait."""
    verdict = rate_limited({name: value})
    assert (verdict.kind, verdict.reason, verdict.scope) == (
        Kind.SUSPEND,
        RATE_LIMITED,
        ScopeKind.CREDENTIAL_MODEL,
    )
    assert verdict.retry_after == pytest.approx(seconds)


@pytest.mark.parametrize("make", HEADER_TYPES)
def test_reset_headers_are_found_in_any_case(make: HeaderFactory) -> None:
    """Header names match case-insensitively, in a plain dict as in both header types."""
    assert rate_limited(make({"X-RateLimit-Reset-Requests": "3s"})).retry_after == 3.0


@pytest.mark.parametrize(
    "headers",
    [
        {"retry-after": "2", "x-ratelimit-reset-requests": "30s"},
        {"retry-after-ms": "2000", "anthropic-ratelimit-requests-reset": "2024-01-01T00:00:30Z"},
    ],
)
def test_retry_after_wins_over_reset_headers(headers: dict[str, str]) -> None:
    """Retry-After (or retry-after-ms) is the 429's own answer: reset headers do not override it."""
    assert rate_limited(headers).retry_after == 2.0


@pytest.mark.parametrize(
    "value",
    [
        "-5s",
        "soon",
        "1e3",
        "NaN",
        "inf",
        "1704067200",  # an epoch timestamp, not a wait: absurd
        "100000h",
        "2024-13-01T00:00:00Z",
        "2024-01-01T25:00:00Z",
        "2024-01-01 00:00:17",  # no offset
        "2025-06-01T00:00:00Z",  # months away: absurd
        "",
    ],
)
def test_garbage_reset_is_ignored(value: str) -> None:
    """An unparseable, negative or absurd reset leaves the wait to the reason's window (None)."""
    for name in ("x-ratelimit-reset-requests", "anthropic-ratelimit-requests-reset"):
        assert rate_limited({name: value}).retry_after is None


def test_garbage_beside_a_good_reset_leaves_the_good_one() -> None:
    """One garbage reset header does not spoil another that reads."""
    headers = {"x-ratelimit-reset-requests": "-1s", "x-ratelimit-reset-tokens": "4s"}
    assert rate_limited(headers).retry_after == 4.0


def test_the_spent_limit_decides_between_resets() -> None:
    """With requests left and tokens at 0, the 429 is about tokens: their reset, though shorter."""
    headers = {
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "50s",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "6s",
    }
    assert reset_after(headers, NOW) == 6.0
    assert rate_limited(headers).retry_after == 6.0


def test_longest_spent_reset_when_several_are_spent() -> None:
    """Several limits at 0: the longest of their resets, since all must have reset."""
    headers = {
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2024-01-01T00:00:05Z",
        "anthropic-ratelimit-input-tokens-remaining": "0",
        "anthropic-ratelimit-input-tokens-reset": "2024-01-01T00:00:40Z",
        "anthropic-ratelimit-output-tokens-remaining": "1000",
        "anthropic-ratelimit-output-tokens-reset": "2024-01-01T00:00:59Z",
    }
    assert reset_after(headers, NOW) == 40.0


def test_longest_reset_when_none_reads_spent() -> None:
    """No remaining header at 0 (or none sent): the longest reset given."""
    headers = {
        "x-ratelimit-remaining-requests": "3",
        "x-ratelimit-reset-requests": "2s",
        "x-ratelimit-reset-tokens": "9s",
    }
    assert reset_after(headers, NOW) == 9.0


@pytest.mark.parametrize("delay", ["17s", "17.5s", "0.000340012s", {"seconds": 17, "nanos": 0}])
@pytest.mark.parametrize("array", [False, True])
def test_google_retry_info_times_a_429(delay: object, array: bool) -> None:
    """Gemini's RetryInfo.retryDelay sets the wait, from an object body or a stream's array."""
    verdict = rate_limited(body=gemini_429(delay, array=array))
    assert verdict.reason == RATE_LIMITED
    expected = {"17s": 17.0, "17.5s": 17.5, "0.000340012s": 0.000340012}.get(str(delay), 17.0)
    assert verdict.retry_after == pytest.approx(expected)


@pytest.mark.parametrize("delay", ["-3s", "17", "seventeen", "1e2s", "999999999s", 17, None])
def test_google_retry_info_garbage_is_ignored(delay: object) -> None:
    """A retryDelay that is not a non-negative protobuf duration within bounds is ignored."""
    assert rate_limited(body=gemini_429(delay)).retry_after is None


def test_retry_info_of_a_daily_quota_does_not_time_it() -> None:
    """A per-day quota is exhausted quota: a rate limit's retryDelay does not shorten its window."""
    verdict = rate_limited(body=gemini_429("17s", per="PerDay"))
    assert (verdict.reason, verdict.retry_after) == (QUOTA_EXHAUSTED, None)


def test_retry_info_must_be_typed() -> None:
    """A retryDelay outside a RetryInfo detail (echoed text, another type) is not read."""
    document = {
        "error": {
            "message": '"retryDelay": "17s"',
            "details": [{"@type": "type.googleapis.com/google.rpc.Help", "retryDelay": "17s"}],
        }
    }
    assert retry_delay(document) is None
    assert rate_limited(body=json.dumps(document).encode()).retry_after is None


def test_reset_headers_win_over_retry_info() -> None:
    """Headers are read before the body: a provider sending both is timed by its headers."""
    verdict = rate_limited({"x-ratelimit-reset-requests": "3s"}, gemini_429("17s"))
    assert verdict.retry_after == 3.0


def test_retry_info_past_the_prefix_limit_is_not_read() -> None:
    """A RetryInfo after the first BODY_PREFIX_LIMIT bytes is never read, even if passed in whole."""
    padding = "x" * BODY_PREFIX_LIMIT
    document = {
        "error": {
            "message": padding,
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "9s"}],
        }
    }
    whole = json.dumps(document).encode()
    assert retry_delay(json.loads(whole)) == 9.0  # the parser sees it when given all
    assert rate_limited(body=whole).retry_after is None


@pytest.mark.parametrize("status", [503, 529, 403, 400])
def test_reset_hints_time_only_rate_limits(status: int) -> None:
    """Reset headers and RetryInfo on anything but a 429 leave its verdict's wait unset."""
    verdict = classify(
        Exchange(
            "POST",
            {},
            status=status,
            response_headers={"x-ratelimit-reset-requests": "3s"},
            body=gemini_429("17s", per="PerMinute"),
            wall_now=NOW,
        )
    )
    assert verdict.retry_after is None


def test_unrouted_429_stays_the_callers() -> None:
    """An unrouted 429 is neutral whatever its reset headers say: the caller's to handle."""
    verdict = classify(
        Exchange(
            "GET",
            {},
            status=429,
            response_headers={"x-ratelimit-reset-requests": "3s"},
            routed=False,
        )
    )
    assert (verdict.kind, verdict.retry_after) == (Kind.NEUTRAL, None)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1.5s"}, 1.5),
        (
            {
                "anthropic-ratelimit-requests-remaining": "0",
                "anthropic-ratelimit-requests-reset": "2024-01-01T00:00:12Z",
            },
            12.0,
        ),
        ({"x-ratelimit-remaining-requests": "0"}, None),  # no reset: the reason's initial
        ({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "-1s"}, None),
    ],
)
def test_a_spent_success_asks_for_a_suspension(
    headers: dict[str, str], expected: float | None
) -> None:
    """A success with no request left suspends its credential+model scope until the reset, without failing over."""
    verdict = rate_limit_ahead(200, headers, NOW)
    assert verdict is not None
    assert (verdict.kind, verdict.reason, verdict.scope, verdict.failover, verdict.status) == (
        Kind.SUSPEND,
        RATE_LIMITED,
        ScopeKind.CREDENTIAL_MODEL,
        False,
        200,
    )
    assert verdict.retry_after == expected


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"x-ratelimit-remaining-requests": "1", "x-ratelimit-reset-requests": "1s"},
        {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "1s"},
        {"anthropic-ratelimit-requests-remaining": "none"},
        {"x-ratelimit-remaining-requests": ""},
    ],
)
def test_a_success_with_requests_left_asks_for_nothing(headers: dict[str, str]) -> None:
    """Requests left, unsaid, or unreadable: no suspension (spent tokens alone do not count)."""
    assert rate_limit_ahead(200, headers, NOW) is None
    assert spent_requests(headers, NOW) == (False, None)


_HEADER_NAMES = st.sampled_from(
    [
        "x-ratelimit-reset-requests",
        "x-ratelimit-reset-tokens",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-remaining-tokens",
        "anthropic-ratelimit-requests-reset",
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-output-tokens-reset",
    ]
)


@given(
    st.dictionaries(_HEADER_NAMES, st.text(max_size=40), max_size=6),
    st.floats(allow_nan=False, allow_infinity=False, min_value=0, max_value=4e9),
)
def test_reset_parsing_is_total_and_bounded(headers: dict[str, str], wall_now: float) -> None:
    """Any header values give None or a wait within [0, LONGEST_RESET], never an error."""
    for value in (reset_after(headers, wall_now), spent_requests(headers, wall_now)[1]):
        assert value is None or 0.0 <= value <= LONGEST_RESET


@given(
    st.recursive(
        st.none() | st.text() | st.integers(), lambda c: st.lists(c) | st.dictionaries(st.text(), c)
    )
)
def test_retry_delay_is_total(document: object) -> None:
    """Any JSON-like document gives None or a bounded wait, never an error."""
    value = retry_delay(document)
    assert value is None or 0.0 <= value <= LONGEST_RESET
