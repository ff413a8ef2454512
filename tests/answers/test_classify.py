"""Tests for the classifier: DESIGN §3.2 row by row, Retry-After and body signals, and the
error kind the core reads from an exception and its chain (a close by our own side)."""

from __future__ import annotations

import calendar
import errno
import json
import math
import ssl
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import httpcore
import httpx
import httpx2
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from sidestep._answers.classify import (
    BODY_PREFIX_LIMIT,
    CLIENT_ERROR,
    CONTEXT_OVERFLOW,
    INVALID_CREDENTIAL,
    QUOTA_EXHAUSTED,
    RATE_LIMITED,
    SUSPENSION_REASONS,
    UNAVAILABLE,
    ErrorKind,
    Exchange,
    Kind,
    Verdict,
    classify,
    is_idempotent,
    needs_body,
)
from sidestep._answers.retry_after import parse_retry_after
from sidestep._common.scopes import ScopeKind
from sidestep._core.flavour import Flavour

YEAR = 365 * 24 * 3600.0
# 2024-01-01T00:00:00Z
NOW = float(calendar.timegm((2024, 1, 1, 0, 0, 0)))

HeaderFactory = Callable[[Mapping[str, str]], Mapping[str, str]]
HEADER_TYPES: list[HeaderFactory] = [dict, httpx.Headers, httpx2.Headers]


def body(document: Any) -> bytes:
    return json.dumps(document).encode()


OPENAI_QUOTA = body(
    {
        "error": {
            "message": "You exceeded your current quota, please check your plan and billing "
            "details. For more information on this error, read the docs: "
            "https://platform.openai.com/docs/guides/error-codes/api-errors.",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
    }
)
OPENAI_RATE_LIMIT = body(
    {
        "error": {
            "message": "Rate limit reached for gpt-4o in organization org-abc on tokens per min "
            "(TPM): Limit 30000, Used 29000, Requested 2000. Please try again in 2s.",
            "type": "tokens",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
)
OPENAI_OVERFLOW = body(
    {
        "error": {
            "message": "This model's maximum context length is 128000 tokens. However, your "
            "messages resulted in 130412 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
)
OPENAI_BAD_PARAM = body(
    {
        "error": {
            "message": "Invalid value for 'temperature': expected a number.",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": "invalid_value",
        }
    }
)
ANTHROPIC_BILLING = body(
    {
        "type": "error",
        "error": {
            "type": "billing_error",
            "message": "There is an issue with your billing or payment information.",
        },
    }
)
ANTHROPIC_CREDIT = body(
    {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "Your credit balance is too low to access the Anthropic API. "
            "Please go to Plans & Billing to upgrade or purchase credits.",
        },
        "request_id": "req_011CabcdEFGH",
    }
)
ANTHROPIC_RATE_LIMIT = body(
    {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": "Number of request tokens has exceeded your per-minute rate limit; "
            "see the response headers for current usage.",
        },
    }
)
ANTHROPIC_PERMISSION = body(
    {
        "type": "error",
        "error": {
            "type": "permission_error",
            "message": "Your API key does not have permission to use the specified resource.",
        },
    }
)
ANTHROPIC_OVERFLOW = body(
    {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 215000 tokens > 200000 maximum",
        },
    }
)
ANTHROPIC_MAX_TOKENS = body(
    {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "input length and `max_tokens` exceed context limit: 195000 + 8192 > "
            "200000, decrease input length or `max_tokens` and try again",
        },
    }
)


def gemini_quota(*quota_ids: str) -> dict[str, Any]:
    return {
        "error": {
            "code": 429,
            "message": "You exceeded your current quota, please check your plan and billing "
            "details. For more information on this error, head to: "
            "https://ai.google.dev/gemini-api/docs/rate-limits.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [
                        {
                            "quotaMetric": "generativelanguage.googleapis.com/"
                            "generate_content_free_tier_requests",
                            "quotaId": quota_id,
                            "quotaDimensions": {"location": "global", "model": "gemini-2.0-flash"},
                        }
                        for quota_id in quota_ids
                    ],
                },
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "43s"},
            ],
        }
    }


GEMINI_DAILY = body(gemini_quota("GenerateRequestsPerDayPerProjectPerModel-FreeTier"))
GEMINI_MINUTE_AND_DAY = body(
    gemini_quota(
        "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
        "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
    )
)
GEMINI_PER_MINUTE = body(gemini_quota("GenerateRequestsPerMinutePerProjectPerModel-FreeTier"))
GEMINI_STREAM_DAILY = body([gemini_quota("GenerateRequestsPerDayPerProjectPerModel-FreeTier")])
GEMINI_BUSY = body(
    {
        "error": {
            "code": 429,
            "message": "Resource has been exhausted (e.g. check quota).",
            "status": "RESOURCE_EXHAUSTED",
        }
    }
)
GEMINI_OVERFLOW = body(
    {
        "error": {
            "code": 400,
            "message": "The input token count (1200000) exceeds the maximum number of tokens "
            "allowed (1048576).",
            "status": "INVALID_ARGUMENT",
        }
    }
)


def exchange(
    status: int | None = None,
    *,
    method: str = "POST",
    request_headers: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> Exchange:
    return Exchange(method, request_headers or {}, status, **kwargs)


def expect(
    kind: Kind, reason: str | None, scope: ScopeKind | None, failover: bool
) -> tuple[Kind, str | None, ScopeKind | None, bool]:
    return (kind, reason, scope, failover)


SUCCESS = expect(Kind.SUCCESS, None, None, False)
UNAVAILABLE_MODEL = expect(Kind.FAILURE, UNAVAILABLE, ScopeKind.MODEL, True)
RATE_LIMIT = expect(Kind.SUSPEND, RATE_LIMITED, ScopeKind.CREDENTIAL_MODEL, True)
QUOTA = expect(Kind.SUSPEND, QUOTA_EXHAUSTED, ScopeKind.CREDENTIAL, True)
OVERFLOW = expect(Kind.NEUTRAL, CONTEXT_OVERFLOW, None, True)
CLIENT = expect(Kind.NEUTRAL, CLIENT_ERROR, None, False)

TABLE = [
    pytest.param(exchange(200), SUCCESS, id="200"),
    pytest.param(exchange(204), SUCCESS, id="204"),
    pytest.param(exchange(101), SUCCESS, id="101"),
    pytest.param(exchange(301), SUCCESS, id="301"),
    pytest.param(exchange(304), SUCCESS, id="304"),
    pytest.param(
        exchange(error=ErrorKind.CONNECT),
        expect(Kind.FAILURE, UNAVAILABLE, ScopeKind.ORIGIN, True),
        id="connect",
    ),
    *(pytest.param(exchange(s), UNAVAILABLE_MODEL, id=str(s)) for s in (500, 502, 503, 504, 529)),
    pytest.param(exchange(408), UNAVAILABLE_MODEL, id="408"),
    *(pytest.param(exchange(s), UNAVAILABLE_MODEL, id=str(s)) for s in (507, 520, 524, 599)),
    pytest.param(exchange(501), CLIENT, id="501-request-fault"),
    pytest.param(exchange(505), CLIENT, id="505-request-fault"),
    pytest.param(
        exchange(error=ErrorKind.AMBIGUOUS, method="GET"), UNAVAILABLE_MODEL, id="ambiguous-get"
    ),
    pytest.param(
        exchange(error=ErrorKind.AMBIGUOUS),
        expect(Kind.FAILURE, UNAVAILABLE, ScopeKind.MODEL, False),
        id="ambiguous-post",
    ),
    pytest.param(exchange(error=ErrorKind.POOL), expect(Kind.NEUTRAL, None, None, True), id="pool"),
    pytest.param(
        exchange(error=ErrorKind.OTHER), expect(Kind.NEUTRAL, None, None, False), id="other"
    ),
    pytest.param(
        exchange(error=ErrorKind.CLOSED, method="GET"),
        expect(Kind.NEUTRAL, None, None, False),
        id="closed-locally",
    ),
    pytest.param(exchange(429), RATE_LIMIT, id="429-bare"),
    pytest.param(exchange(429, body=OPENAI_RATE_LIMIT), RATE_LIMIT, id="429-openai-rate"),
    pytest.param(exchange(429, body=ANTHROPIC_RATE_LIMIT), RATE_LIMIT, id="429-anthropic-rate"),
    pytest.param(exchange(429, body=GEMINI_BUSY), RATE_LIMIT, id="429-gemini-busy"),
    pytest.param(exchange(429, body=GEMINI_PER_MINUTE), RATE_LIMIT, id="429-gemini-per-minute"),
    pytest.param(exchange(429, body=OPENAI_QUOTA), QUOTA, id="429-openai-quota"),
    pytest.param(exchange(429, body=GEMINI_DAILY), QUOTA, id="429-gemini-daily"),
    pytest.param(exchange(429, body=GEMINI_MINUTE_AND_DAY), QUOTA, id="429-gemini-minute-day"),
    pytest.param(exchange(429, body=GEMINI_STREAM_DAILY), QUOTA, id="429-gemini-stream-array"),
    pytest.param(exchange(403, body=OPENAI_QUOTA), QUOTA, id="403-openai-quota"),
    pytest.param(exchange(402, body=ANTHROPIC_BILLING), QUOTA, id="402-anthropic-billing"),
    pytest.param(exchange(400, body=ANTHROPIC_CREDIT), QUOTA, id="400-anthropic-credit"),
    pytest.param(
        exchange(403, body=b"Monthly quota exceeded for this API key."),
        QUOTA,
        id="403-plain-text-quota",
    ),
    pytest.param(
        exchange(402, body=b'{"error": {"message": "Insufficient credits", "code": 402}}'),
        QUOTA,
        id="402-insufficient-credits",
    ),
    pytest.param(
        exchange(429, body=b'{"error": "Quota exceeded for this key"}'),
        QUOTA,
        id="429-error-as-string",
    ),
    pytest.param(exchange(402), CLIENT, id="402-bare"),
    pytest.param(exchange(403), CLIENT, id="403-bare"),
    pytest.param(exchange(403, body=ANTHROPIC_PERMISSION), CLIENT, id="403-permission"),
    pytest.param(
        exchange(401),
        expect(Kind.SUSPEND, INVALID_CREDENTIAL, ScopeKind.CREDENTIAL, True),
        id="401",
    ),
    pytest.param(exchange(400, body=OPENAI_OVERFLOW), OVERFLOW, id="400-openai-overflow"),
    pytest.param(exchange(400, body=ANTHROPIC_OVERFLOW), OVERFLOW, id="400-anthropic-overflow"),
    pytest.param(exchange(400, body=ANTHROPIC_MAX_TOKENS), OVERFLOW, id="400-anthropic-limit"),
    pytest.param(exchange(400, body=GEMINI_OVERFLOW), OVERFLOW, id="400-gemini-overflow"),
    pytest.param(
        exchange(400, body=b"Input exceeds the context window of this model"),
        OVERFLOW,
        id="400-plain-context-window",
    ),
    pytest.param(
        exchange(400, body=b'{"detail": "too many tokens for the model context"}'),
        OVERFLOW,
        id="400-too-many-tokens-context",
    ),
    pytest.param(
        exchange(400, body=b'{"detail": "too many tokens in field \'stop\'"}'),
        CLIENT,
        id="400-too-many-tokens-no-context",
    ),
    pytest.param(exchange(400), CLIENT, id="400-bare"),
    pytest.param(exchange(403, body=OPENAI_OVERFLOW), CLIENT, id="403-overflow-wording"),
    pytest.param(exchange(400, body=OPENAI_BAD_PARAM), CLIENT, id="400-bad-param"),
    pytest.param(
        exchange(413, body=OPENAI_OVERFLOW), CLIENT, id="413-overflow-wording-not-overflow"
    ),
    pytest.param(
        exchange(
            400,
            body=body(
                {
                    "error": {"type": "invalid_request_error", "message": "Bad stop value"},
                    "echo": "prompt is too long; you exceeded your current quota",
                }
            ),
        ),
        CLIENT,
        id="400-json-signal-outside-error-fields",
    ),
    *(pytest.param(exchange(s), CLIENT, id=str(s)) for s in (404, 405, 409, 413, 418, 422, 451)),
    pytest.param(exchange(600), expect(Kind.NEUTRAL, None, None, False), id="600-not-http"),
]


@pytest.mark.parametrize(("x", "expected"), TABLE)
def test_table(x: Exchange, expected: tuple[Kind, str | None, ScopeKind | None, bool]) -> None:
    """Each result maps to the kind, reason, scope and failover of DESIGN §3.2."""
    v = classify(x)
    assert (v.kind, v.reason, v.scope, v.failover) == expected
    assert v.status == x.status


def test_error_decides_over_status() -> None:
    """An exception after the headers arrived is classified as the exception."""
    v = classify(exchange(200, error=ErrorKind.AMBIGUOUS, method="GET"))
    assert (v.kind, v.scope, v.status) == (Kind.FAILURE, ScopeKind.MODEL, 200)


def test_exchange_repr_hides_headers_and_body() -> None:
    """An exchange's repr shows neither header values nor the body."""
    x = exchange(
        429,
        request_headers={"X-Api-Key": "sk-secret-value"},
        response_headers={"set-cookie": "session=abc123"},
        body=b"account acct-42 is over quota",
    )
    text = repr(x)
    assert "status=429" in text
    for secret in ("sk-secret-value", "abc123", "acct-42"):
        assert secret not in text


def test_exchange_needs_status_or_error() -> None:
    """An exchange with neither a status nor an error is refused at construction."""
    with pytest.raises(ValueError, match="status or an error"):
        Exchange("GET", {})


def test_needs_body_only_for_body_dependent_statuses() -> None:
    """Only 400, 402, 403 and 429 ever need their body read."""
    assert {s for s in range(100, 600) if needs_body(s)} == {400, 402, 403, 429}


def test_context_overflow_failover_can_be_turned_off() -> None:
    """With on_context_overflow false, an overflow stays neutral but does not fail over."""
    v = classify(exchange(400, body=OPENAI_OVERFLOW, on_context_overflow=False))
    assert (v.kind, v.reason, v.failover) == (Kind.NEUTRAL, CONTEXT_OVERFLOW, False)


# --- ambiguous outcomes and idempotency -------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE", "get"])
def test_idempotent_methods(method: str) -> None:
    """The idempotent methods may be re-sent after an ambiguous outcome."""
    assert is_idempotent(method, {})
    assert classify(exchange(error=ErrorKind.AMBIGUOUS, method=method)).failover


@pytest.mark.parametrize("method", ["POST", "PATCH", "CONNECT"])
def test_non_idempotent_methods(method: str) -> None:
    """Other methods are not re-sent after an ambiguous outcome."""
    assert not is_idempotent(method, {})
    assert not classify(exchange(error=ErrorKind.AMBIGUOUS, method=method)).failover


@pytest.mark.parametrize("make", HEADER_TYPES)
@pytest.mark.parametrize("name", ["Idempotency-Key", "idempotency-key", "IDEMPOTENCY-KEY"])
def test_idempotency_key_makes_post_repeatable(make: HeaderFactory, name: str) -> None:
    """A POST carrying an Idempotency-Key header, in any case, may be re-sent."""
    headers = make({name: "order-4711"})
    assert is_idempotent("POST", headers)
    assert classify(exchange(error=ErrorKind.AMBIGUOUS, request_headers=headers)).failover


def test_blank_idempotency_key_does_not_count() -> None:
    """A blank Idempotency-Key header promises nothing."""
    assert not is_idempotent("POST", {"Idempotency-Key": "  "})


def test_retry_ambiguous_allows_any_method() -> None:
    """retry_ambiguous lets a POST fail over after an ambiguous outcome."""
    v = classify(exchange(error=ErrorKind.AMBIGUOUS, retry_ambiguous=True))
    assert (v.kind, v.reason, v.failover) == (Kind.FAILURE, UNAVAILABLE, True)


# --- Retry-After -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param({"Retry-After": "120"}, 120.0, id="seconds"),
        pytest.param({"Retry-After": "0"}, 0.0, id="zero"),
        pytest.param({"Retry-After": " \t30  "}, 30.0, id="whitespace"),
        pytest.param({"Retry-After": "1.5"}, 1.5, id="fraction"),
        pytest.param({"Retry-After": "Mon, 01 Jan 2024 00:01:00 GMT"}, 60.0, id="imf-date"),
        pytest.param({"Retry-After": "Monday, 01-Jan-24 00:02:00 GMT"}, 120.0, id="rfc850-date"),
        pytest.param({"Retry-After": "Mon Jan  1 00:00:30 2024"}, 30.0, id="asctime-date"),
        pytest.param({"Retry-After": " Mon, 01 Jan 2024 00:01:00 GMT "}, 60.0, id="date-spaces"),
        pytest.param({"Retry-After": "Sun, 31 Dec 2023 23:00:00 GMT"}, 0.0, id="past-date"),
        pytest.param({"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, YEAR, id="far-date"),
        pytest.param({"Retry-After": "99999999999"}, YEAR, id="huge-seconds"),
        pytest.param({"Retry-After": "9" * 400}, YEAR, id="overflowing-seconds"),
        pytest.param({"retry-after-ms": "1500"}, 1.5, id="ms"),
        pytest.param({"retry-after-ms": "250.5"}, 0.2505, id="ms-fraction"),
        pytest.param({"retry-after-ms": "99999999999999"}, YEAR, id="huge-ms"),
        pytest.param({"retry-after-ms": " 1500\t"}, 1.5, id="ms-whitespace"),
        pytest.param({"retry-after-ms": "1500", "Retry-After": "60"}, 1.5, id="ms-wins"),
        pytest.param({"retry-after-ms": "soon", "Retry-After": "60"}, 60.0, id="bad-ms-ignored"),
        pytest.param({}, None, id="absent"),
        *(
            pytest.param({"Retry-After": garbage}, None, id=f"garbage-{garbage!r}")
            for garbage in (
                "soon",
                "-5",
                "+5",
                "nan",
                "inf",
                "-inf",
                "1e400",
                "1e3",
                "0x10",
                "1_000",
                "5, 10",
                "",
                "   ",
                "Sun, 06 Nov 1994 25:00:00 GMT",
                "Sun, 06 Nov 99999 08:49:37 GMT",
            )
        ),
        *(
            pytest.param({"retry-after-ms": garbage}, None, id=f"garbage-ms-{garbage!r}")
            for garbage in ("-5", "nan", "inf", "1e400", "soon")
        ),
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    """Retry-After and retry-after-ms give seconds from now, clamped, and garbage gives None."""
    got = parse_retry_after(headers, NOW)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


@pytest.mark.parametrize("make", HEADER_TYPES)
def test_retry_after_lookup_is_case_insensitive(make: HeaderFactory) -> None:
    """Retry-After headers are found whatever their case and mapping type."""
    assert parse_retry_after(make({"RETRY-AFTER": "5"}), NOW) == 5.0
    assert parse_retry_after(make({"Retry-After-Ms": "5", "retry-after": "9"}), NOW) == 0.005


@pytest.mark.parametrize(
    ("status", "body_bytes"),
    [(429, b""), (429, OPENAI_QUOTA), (503, b""), (529, b"")],
)
def test_verdict_carries_retry_after(status: int, body_bytes: bytes) -> None:
    """429, 503 and 529 verdicts carry the upstream's Retry-After."""
    v = classify(exchange(status, response_headers={"retry-after": "7"}, body=body_bytes))
    assert v.retry_after == 7.0


def test_retry_after_date_uses_wall_now() -> None:
    """An HTTP-date Retry-After is measured from the exchange's wall time."""
    headers = {"Retry-After": "Mon, 01 Jan 2024 00:01:00 GMT"}
    v = classify(exchange(503, response_headers=headers, wall_now=NOW + 15))
    assert v.retry_after == 45.0


@pytest.mark.parametrize("status", [200, 500, 401])
def test_other_statuses_ignore_retry_after(status: int) -> None:
    """Retry-After is read only where it sets a suspension or retry: 429, 503, 529."""
    assert classify(exchange(status, response_headers={"Retry-After": "7"})).retry_after is None


# --- bounded body reading ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "full", "cut_after", "expected"),
    [
        (429, OPENAI_QUOTA, b"exceeded your current quota", QUOTA),
        (403, OPENAI_QUOTA, b"exceeded your current quota", QUOTA),
        (400, OPENAI_OVERFLOW, b"maximum context length", OVERFLOW),
        (400, ANTHROPIC_OVERFLOW, b"prompt is too long", OVERFLOW),
        (429, GEMINI_DAILY, b"PerDay", QUOTA),
    ],
)
def test_truncated_json_prefix_is_still_read(
    status: int,
    full: bytes,
    cut_after: bytes,
    expected: tuple[Kind, str, ScopeKind | None, bool],
) -> None:
    """A JSON error body cut short still shows its signal to the substring fallback."""
    prefix = full[: full.index(cut_after) + len(cut_after)]
    with pytest.raises(json.JSONDecodeError):
        json.loads(prefix)
    v = classify(exchange(status, body=prefix))
    assert (v.kind, v.reason, v.scope, v.failover) == expected


@pytest.mark.parametrize(
    ("status", "signal"), [(403, b"insufficient_quota"), (400, b"prompt is too long")]
)
def test_signal_beyond_prefix_limit_is_not_read(status: int, signal: bytes) -> None:
    """Only the first BODY_PREFIX_LIMIT bytes are searched, however long the body is."""
    padding = b'{"error": {"message": "' + b"x" * BODY_PREFIX_LIMIT
    late = classify(exchange(status, body=padding + signal + b'"}}'))
    assert (late.kind, late.reason) == (Kind.NEUTRAL, CLIENT_ERROR)
    early = classify(exchange(status, body=signal + b" " + padding))
    assert early.reason in (QUOTA_EXHAUSTED, CONTEXT_OVERFLOW)


def test_deeply_nested_body_does_not_break_the_parser() -> None:
    """A body nested deeper than the JSON parser allows is searched as text instead."""
    v = classify(exchange(400, body=b"[" * BODY_PREFIX_LIMIT))
    assert (v.kind, v.reason) == (Kind.NEUTRAL, CLIENT_ERROR)


def test_non_utf8_body_is_searched() -> None:
    """Bytes that are not UTF-8 do not hide a signal next to them."""
    v = classify(exchange(429, body=b"\xff\xfe quota exceeded \xc3"))
    assert v.reason == QUOTA_EXHAUSTED


# --- properties --------------------------------------------------------------------------

REASONS = {None, *SUSPENSION_REASONS, UNAVAILABLE, CONTEXT_OVERFLOW, CLIENT_ERROR}
FRAGMENTS = [
    b'{"error": {"message": "',
    b'"}}',
    b"insufficient_quota",
    b"quota exceeded",
    b"PerMinute",
    b"PerDay",
    b"maximum context length",
    b"too many tokens",
    b"context",
    b"[",
    b"{",
]
bodies = st.one_of(
    st.binary(max_size=256),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.binary(max_size=16)), max_size=12).map(
        b"".join
    ),
)
header_names = st.one_of(
    st.sampled_from(["Retry-After", "retry-after-ms", "Idempotency-Key", "RETRY-AFTER"]),
    st.text(max_size=20),
)
header_values = st.one_of(
    st.text(max_size=40),
    st.from_regex(r"\A-?[0-9]{0,20}(\.[0-9]{0,5})?\Z"),
    st.sampled_from(["Mon, 01 Jan 2024 00:01:00 GMT", "Sun, 06 Nov 1994 08:49:37 GMT", "nan"]),
)
headers = st.dictionaries(header_names, header_values, max_size=4)


@given(
    status=st.one_of(st.none(), st.integers(100, 599)),
    error=st.one_of(st.none(), st.sampled_from(ErrorKind)),
    method=st.one_of(st.sampled_from(["GET", "POST", "PATCH"]), st.text(max_size=8)),
    request_headers=headers,
    response_headers=headers,
    body_bytes=bodies,
    retry_ambiguous=st.booleans(),
    on_context_overflow=st.booleans(),
    wall_now=st.floats(0, 4e9),
)
def test_classify_is_total(
    status: int | None,
    error: ErrorKind | None,
    method: str,
    request_headers: dict[str, str],
    response_headers: dict[str, str],
    body_bytes: bytes,
    retry_ambiguous: bool,
    on_context_overflow: bool,
    wall_now: float,
) -> None:
    """Any status, body and headers give a well-formed verdict and never an exception."""
    if status is None and error is None:
        status = 200
    v = classify(
        Exchange(
            method,
            request_headers,
            status,
            response_headers,
            body_bytes,
            error,
            retry_ambiguous,
            on_context_overflow,
            wall_now,
        )
    )
    assert isinstance(v, Verdict)
    assert isinstance(v.kind, Kind)
    assert type(v.failover) is bool
    assert v.reason in REASONS
    assert v.scope is None or isinstance(v.scope, ScopeKind)
    assert (v.kind is Kind.SUSPEND) == (v.reason in SUSPENSION_REASONS)
    assert (v.kind is Kind.FAILURE) == (v.reason == UNAVAILABLE)
    if v.retry_after is not None:
        assert 0.0 <= v.retry_after <= YEAR
        assert math.isfinite(v.retry_after)


@given(headers=headers, wall_now=st.floats(0, 4e9))
def test_parse_retry_after_is_total(headers: dict[str, str], wall_now: float) -> None:
    """Any header values give None or a finite delay between zero and one year."""
    got = parse_retry_after(headers, wall_now)
    assert got is None or (0.0 <= got <= YEAR and math.isfinite(got))


# --- an error closed by our own side, told from its chain (ErrorKind.CLOSED) ----------------


def raised_through_httpcore(h: Any, backend: BaseException, mapped: type[Any]) -> BaseException:
    """`backend` as it reaches the core: mapped by httpcore's network stream (``from``),
    re-raised by its pool ``from None``, then mapped by the flavour's transport."""
    try:
        try:
            try:
                raise backend
            except Exception as exc:
                raise httpcore.ReadError(str(exc)) from exc
        except httpcore.ReadError as exc:
            raise exc from None  # what httpcore's connection pool does
    except httpcore.ReadError as exc:
        try:
            raise mapped(str(exc)) from exc
        except mapped as error:
            return error
    raise AssertionError("unreachable")


def _broken() -> BaseException:
    try:
        raise ConnectionResetError(errno.ECONNRESET, "reset by peer")
    except ConnectionResetError as exc:
        try:
            raise anyio.BrokenResourceError from exc
        except anyio.BrokenResourceError as broken:
            return broken
    raise AssertionError("unreachable")


OURS = {
    "anyio closed": lambda: anyio.ClosedResourceError(),
    "trio closed": lambda: trio.ClosedResourceError("another task closed this fd"),
    "bad descriptor": lambda: OSError(errno.EBADF, "Bad file descriptor"),
    "not a socket": lambda: OSError(errno.ENOTSOCK, "Socket operation on non-socket"),
}
THEIRS = {
    "anyio broken": _broken,
    "trio broken": lambda: trio.BrokenResourceError("socket connection broken"),
    "reset": lambda: ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
    "pipe": lambda: BrokenPipeError(errno.EPIPE, "Broken pipe"),
    "end of stream": lambda: anyio.EndOfStream(),
    "tls error numbered as EBADF": lambda: ssl.SSLError(errno.EBADF, "a TLS failure"),
}


@pytest.mark.parametrize("mapped", ["ReadError", "WriteError"])
@pytest.mark.parametrize("cause", sorted(OURS))
@pytest.mark.parametrize("h", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_a_connection_closed_by_our_side_is_told_from_its_chain(
    h: Any, cause: str, mapped: str
) -> None:
    """A read or write error whose chain holds a closed resource or a closed descriptor is
    `ErrorKind.CLOSED`, found through the pool's ``from None``."""
    exc = raised_through_httpcore(h, OURS[cause](), getattr(h, mapped))
    assert Flavour(h).error_kind(exc) is ErrorKind.CLOSED


@pytest.mark.parametrize("cause", sorted(THEIRS))
@pytest.mark.parametrize("h", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_a_connection_the_upstream_broke_stays_ambiguous(h: Any, cause: str) -> None:
    """A reset, a broken pipe, a broken resource or an end of stream is the upstream's doing:
    still an ambiguous failure, never taken for a local close."""
    exc = raised_through_httpcore(h, THEIRS[cause](), h.ReadError)
    assert Flavour(h).error_kind(exc) is ErrorKind.AMBIGUOUS


@pytest.mark.parametrize("h", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_errors_with_no_closed_cause_keep_their_kind(h: Any) -> None:
    """Errors without a cause keep the kind their type gives; a closed resource past the
    bounded walk of a chain is not looked for."""
    kinds = Flavour(h)
    assert kinds.error_kind(h.RemoteProtocolError("Server disconnected")) is ErrorKind.AMBIGUOUS
    assert kinds.error_kind(h.ReadTimeout("timed out")) is ErrorKind.AMBIGUOUS
    assert kinds.error_kind(h.ConnectError("refused")) is ErrorKind.CONNECT
    assert kinds.error_kind(h.PoolTimeout("full")) is ErrorKind.POOL
    deep: BaseException = anyio.ClosedResourceError()
    for _ in range(8):
        outer = h.ReadError("wrapped")
        outer.__cause__ = deep
        deep = outer
    assert kinds.error_kind(deep) is ErrorKind.AMBIGUOUS
    assert kinds.error_kind(deep.__cause__ or deep) is ErrorKind.CLOSED
