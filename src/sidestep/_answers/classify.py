"""Classification: what one upstream result means for the breaker and for failover.

One pure function turns an `Exchange` (the request, and the response or the
flavour-neutral kind of exception that ended it) into a `Verdict`: success,
an availability failure, a suspension with its reason, or neutral; the scope
kind it is recorded against; and whether the request may move on to the next
candidate (DESIGN §3.2). ``Retry-After`` is read by `retry_after`; a rate
limit without it is timed by the provider's own signals (`ratelimits`). No
I/O, no clock reads: the caller passes the wall time for HTTP-date
``Retry-After`` values and RFC 3339 reset times, and at most
`BODY_PREFIX_LIMIT` bytes of an error body.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

from .._common.scopes import ScopeKind
from . import ratelimits as _ratelimits
from .ratelimits import header as _header
from .retry_after import parse_retry_after

__all__ = [
    "AMBIGUOUS_SAFE_METHODS",
    "BODY_PREFIX_LIMIT",
    "CLIENT_ERROR",
    "CLOSED_LOCALLY",
    "CONTEXT_OVERFLOW",
    "INVALID_CREDENTIAL",
    "NOT_COUNTED",
    "QUOTA_EXHAUSTED",
    "RATE_LIMITED",
    "SUSPENSION_REASONS",
    "UNAVAILABLE",
    "Classifier",
    "ErrorKind",
    "Exchange",
    "Kind",
    "Verdict",
    "classify",
    "is_idempotent",
    "needs_body",
    "rate_limit_ahead",
]


class Kind(enum.Enum):
    """What a result means for the scope it is recorded against."""

    SUCCESS = "success"
    FAILURE = "failure"  # an availability failure: counts toward opening the circuit
    SUSPEND = "suspend"  # a reason suspension: opens the scope at once
    NEUTRAL = "neutral"  # neither counts nor resets


class ErrorKind(enum.Enum):
    """The exception that ended an attempt, mapped away from the httpx flavour."""

    CONNECT = "connect"  # nothing was sent: connect error/timeout, DNS or TLS handshake failure
    AMBIGUOUS = "ambiguous"  # read/write timeout, reset or protocol error: it may have been sent
    POOL = "pool"  # the local pool is exhausted: not the upstream's fault, nothing was sent
    PROXY = "proxy"  # the proxy could not be reached or refused the tunnel: the proxy's fault
    # our own side closed the connection under the attempt (the application closed its
    # client, transport or pool while the request was in flight): nothing about the upstream
    CLOSED = "closed"
    OTHER = "other"  # unsupported protocol, programming error: not an upstream failure


# Reasons are plain strings: they name log fields, metric labels and config keys.
UNAVAILABLE = "unavailable"
RATE_LIMITED = "rate_limited"
QUOTA_EXHAUSTED = "quota_exhausted"
INVALID_CREDENTIAL = "invalid_credential"
CONTEXT_OVERFLOW = "context_overflow"
CLIENT_ERROR = "client_error"
SUSPENSION_REASONS = (RATE_LIMITED, QUOTA_EXHAUSTED, INVALID_CREDENTIAL)

BODY_PREFIX_LIMIT: int = 16 * 1024
"""The most of an error body the classifier ever looks at."""

AMBIGUOUS_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
"""Methods that may be re-sent after an ambiguous outcome (RFC 9110 idempotent methods)."""

_BODY_STATUSES = frozenset({400, 402, 403, 429})
_RETRY_AFTER_STATUSES = frozenset({429, 503, 529})
_CHALLENGE_STATUSES = frozenset({401, 403})
# 501 and 505 say the server cannot do what this request asks (method, HTTP
# version): the request is at fault and another attempt would fare the same.
# Every other 5xx, including the CDNs' 520-527 and a proxy's 599, means the
# upstream is not answering properly: an availability failure.
_REQUEST_FAULT_5XX = frozenset({501, 505})

# Explicit quota/billing exhaustion, matched lower-case. A bare 402/403/429 is
# never read as exhausted quota: only one of these in the body counts.
_QUOTA_SIGNALS = (
    "insufficient_quota",  # OpenAI error code and type
    "billing_hard_limit_reached",  # OpenAI error code
    "billing_error",  # Anthropic error type
    "credit balance is too low",  # Anthropic, sent as a 400 invalid_request_error
    "exceeded your current quota",  # OpenAI and Gemini message
    "quota exceeded",  # Google per-metric lines, Mistral and others
    "insufficient balance",  # DeepSeek 402
    "insufficient credits",  # OpenRouter 402
)
# Google reports per-minute limits with the same "exceeded your current quota"
# message as daily ones; the quota ids tell them apart. A per-minute quota is a
# rate limit and must not suspend the whole credential for a quota's window.
_PER_MINUTE = re.compile(r"per_?minute")
_PER_DAY = re.compile(r"per_?day")

# The context window is exceeded: a larger model may take the request.
_OVERFLOW_SIGNALS = (
    "context_length_exceeded",  # OpenAI error code, also vLLM, Groq and others
    "maximum context length",  # OpenAI, Mistral, vLLM message
    "prompt is too long",  # Anthropic
    "exceed context limit",  # Anthropic: input length and `max_tokens` exceed context limit
    "exceeds the maximum number of tokens",  # Gemini
)
_OVERFLOW = re.compile(
    r"context[ _]window|too many tokens.{0,100}context|context.{0,100}too many tokens", re.DOTALL
)
# The fields of a JSON error object that carry its meaning, at the top level
# and under "error" (OpenAI, Anthropic, Google and Mistral shapes).
_ERROR_FIELDS = ("code", "type", "status", "message", "detail")


@dataclass(frozen=True, slots=True)
class Exchange:
    """Everything the classifier may look at for one attempt.

    Header lookups are case-insensitive whatever mapping is passed. `body` is
    at most `BODY_PREFIX_LIMIT` bytes of the response body, read only when
    `needs_body(status)` is true. When `error` is set it decides, whatever
    `status` says.

    `routed` is False for a request that matched no route (its only candidate
    is its own origin); `credentialed` says whether the request carried any
    credential to the upstream (a credential header, query parameter or URL
    userinfo). Both default to the routed, credentialed case.
    """

    method: str
    # Headers carry credentials and bodies are never logged: both stay out of the repr.
    request_headers: Mapping[str, str] = field(repr=False)
    status: int | None = None
    response_headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    body: bytes = field(default=b"", repr=False)
    error: ErrorKind | None = None
    retry_ambiguous: bool = False
    on_context_overflow: bool = True
    wall_now: float = 0.0
    routed: bool = True
    credentialed: bool = True

    def __post_init__(self) -> None:
        if self.status is None and self.error is None:
            raise ValueError("an exchange needs a status or an error")


@dataclass(frozen=True, slots=True)
class Verdict:
    """The meaning of one result.

    Attributes:
        kind: success, availability failure, suspension or neutral.
        reason: `UNAVAILABLE` for a failure, a suspension reason, or
            `CONTEXT_OVERFLOW` / `CLIENT_ERROR` for a neutral response; None for
            a success and for neutral local errors.
        scope: the scope kind the result is recorded against; None for a
            success (every covering scope) and for neutral results.
        failover: whether the request may move on to the next candidate.
        retry_after: seconds from ``Retry-After`` / ``retry-after-ms``; for a
            rate limit without them, from the provider's own reset hints.
        status: the response status, None when an exception ended the attempt.
        also: a second scope kind the result is recorded against, or None.
        timeout: the attempt ended by a timeout (connect, first byte, read,
            write, stall or a deadline); set by the failover loop, never by a
            classifier. Such a target is not retried in place: the request
            moves on to the next candidate at once.
        slow: the failure took the caller at least `BreakerPolicy.slow_failure`
            (a timeout, a slow 5xx): set by the core, never by the classifier.
            A failed probe that was slow grows the open window; a quick one
            does not (DESIGN §3.3).
    """

    kind: Kind
    reason: str | None
    scope: ScopeKind | None
    failover: bool
    retry_after: float | None = None
    status: int | None = None
    also: ScopeKind | None = None
    timeout: bool = False
    slow: bool = False


Classifier: TypeAlias = Callable[[Exchange], Verdict]

CLOSED_LOCALLY = Verdict(Kind.NEUTRAL, None, None, failover=False)
"""The verdict on an attempt our own side closed under it (`ErrorKind.CLOSED`).

Neither counts nor resets, and moves on to no other attempt or candidate:
whoever closed the client wants nothing more sent through it. The core gives
it without asking a replacement classifier: it is a fact, not a judgement of
the upstream.
"""

NOT_COUNTED = Verdict(Kind.NEUTRAL, None, None, failover=False)
"""The verdict on an attempt whose failure says nothing of the upstream.

An unrouted request's write timeout (the caller chose that budget; a host that
stops answering shows as a read timeout or a connect failure, which do count),
or, under install(), an error a test's mock raised in the network's place.
Neither counts nor resets, and moves on to nothing: raised as it came. The
core gives it without asking a replacement classifier.
"""


def needs_body(status: int) -> bool:
    """Whether the body of a response with `status` may change its verdict."""
    return status in _BODY_STATUSES


def is_idempotent(method: str, request_headers: Mapping[str, str]) -> bool:
    """Whether a request may be re-sent after an ambiguous outcome.

    True for the idempotent methods and for any request carrying a non-blank
    ``Idempotency-Key`` header (the upstream de-duplicates it).
    """
    if method.upper() in AMBIGUOUS_SAFE_METHODS:
        return True
    key = _header(request_headers, "idempotency-key")
    return key is not None and key.strip() != ""


def classify(x: Exchange) -> Verdict:
    """The default classifier: DESIGN §3.2 as one function.

    Example:
        >>> classify(Exchange("GET", {}, status=503)).kind
        <Kind.FAILURE: 'failure'>
    """
    status = x.status
    if x.error is not None or status is None:
        return _classify_error(x)
    if 100 <= status < 400:
        return Verdict(Kind.SUCCESS, None, None, failover=False, status=status)
    retry_after = (
        parse_retry_after(x.response_headers, x.wall_now)
        if status in _RETRY_AFTER_STATUSES
        else None
    )
    if not x.routed:
        # Unrouted traffic is the caller's own: every 4xx and 5xx goes back as it
        # came (its auth flow, token refresh, retries or Retry-After handling stay
        # in charge; a fast answer failed fast would save the caller nothing).
        return Verdict(Kind.NEUTRAL, CLIENT_ERROR, None, failover=False, status=status)
    if status == 408 or (500 <= status < 600 and status not in _REQUEST_FAULT_5XX):
        return Verdict(Kind.FAILURE, UNAVAILABLE, ScopeKind.MODEL, True, retry_after, status)
    if status in _CHALLENGE_STATUSES and not x.credentialed:
        # A 401/403 to a request without a credential is a challenge, not a
        # verdict on one.
        return Verdict(Kind.NEUTRAL, CLIENT_ERROR, None, failover=False, status=status)
    if status == 401:
        return Verdict(Kind.SUSPEND, INVALID_CREDENTIAL, ScopeKind.CREDENTIAL, True, None, status)
    if needs_body(status):
        whole, document = _read_body(x.body[:BODY_PREFIX_LIMIT])
        signal = _body_signal(whole, document)
        if signal == QUOTA_EXHAUSTED:
            return Verdict(
                Kind.SUSPEND, QUOTA_EXHAUSTED, ScopeKind.CREDENTIAL, True, retry_after, status
            )
        if status == 429:
            if retry_after is None:
                retry_after = _rate_limit_hint(x, document)
            return Verdict(
                Kind.SUSPEND, RATE_LIMITED, ScopeKind.CREDENTIAL_MODEL, True, retry_after, status
            )
        # Only a 400 can mean overflow: a 413 is a request over the upstream's
        # byte limit, which a larger model does not lift.
        if status == 400 and signal == CONTEXT_OVERFLOW:
            return Verdict(
                Kind.NEUTRAL, CONTEXT_OVERFLOW, None, x.on_context_overflow, None, status
            )
    if 400 <= status < 600:
        return Verdict(Kind.NEUTRAL, CLIENT_ERROR, None, failover=False, status=status)
    # Not an HTTP status at all: hand it back untouched, count nothing.
    return Verdict(Kind.NEUTRAL, None, None, failover=False, status=status)


def _classify_error(x: Exchange) -> Verdict:
    if x.error is ErrorKind.CLOSED:
        return Verdict(Kind.NEUTRAL, None, None, failover=False, status=x.status)
    if x.error is ErrorKind.CONNECT:
        return Verdict(Kind.FAILURE, UNAVAILABLE, ScopeKind.ORIGIN, True, status=x.status)
    if x.error is ErrorKind.AMBIGUOUS:
        # The upstream may have acted on it: re-send only what is safe to repeat.
        failover = x.retry_ambiguous or is_idempotent(x.method, x.request_headers)
        return Verdict(Kind.FAILURE, UNAVAILABLE, ScopeKind.MODEL, failover, status=x.status)
    # Nothing reached the upstream: a full local pool or an unreachable proxy
    # says nothing about it, and another target may go another way.
    failover = x.error in (ErrorKind.POOL, ErrorKind.PROXY)
    return Verdict(Kind.NEUTRAL, None, None, failover, status=x.status)


def rate_limit_ahead(status: int, headers: Mapping[str, str], wall_now: float) -> Verdict | None:
    """The suspension a successful response asks for when it spent its window's last request.

    With a route's ``avoid_rate_limits``, a success whose remaining-requests
    header (``x-ratelimit-remaining-requests``,
    ``anthropic-ratelimit-requests-remaining``) reads 0 suspends the scope a
    429 would, as `RATE_LIMITED`, until the advertised requests reset (None:
    the reason's ``initial``). The response itself still goes to the caller,
    so the verdict does not fail over. None when requests are left, or unsaid.

    >>> rate_limit_ahead(200, {"x-ratelimit-remaining-requests": "0",
    ...                        "x-ratelimit-reset-requests": "1.5s"}, 0.0).retry_after
    1.5
    """
    spent, reset = _ratelimits.spent_requests(headers, wall_now)
    if not spent:
        return None
    return Verdict(Kind.SUSPEND, RATE_LIMITED, ScopeKind.CREDENTIAL_MODEL, False, reset, status)


def _rate_limit_hint(x: Exchange, document: object) -> float | None:
    """A 429's wait from the provider's own signals: reset headers, else Google's RetryInfo."""
    reset = _ratelimits.reset_after(x.response_headers, x.wall_now)
    return reset if reset is not None else _ratelimits.retry_delay(document)


def _read_body(prefix: bytes) -> tuple[str, object]:
    """An error body's text, and its JSON document (None when it is not whole JSON).

    Gemini streams answer errors as a one-element array: its element is the document.
    """
    whole = prefix.decode("utf-8", "replace")
    document: object = None
    if whole.lstrip()[:1] in ("{", "["):
        try:
            document = json.loads(whole)
        except (ValueError, RecursionError):  # truncated, or nested beyond the parser
            document = None
    if isinstance(document, list) and document:
        document = document[0]
    return whole, document


def _body_signal(whole: str, document: object) -> str | None:
    """`QUOTA_EXHAUSTED` or `CONTEXT_OVERFLOW` when an error body says so explicitly.

    A JSON error object is read by its meaningful fields only, so text echoed
    elsewhere in it cannot pose as a signal. Anything else, including a JSON
    prefix cut short, is searched whole.
    """
    whole = whole.lower()
    text = " ".join(_error_strings(document)).lower() if isinstance(document, dict) else whole
    if any(signal in text for signal in _QUOTA_SIGNALS) and not (
        _PER_MINUTE.search(whole) and not _PER_DAY.search(whole)
    ):
        return QUOTA_EXHAUSTED
    if any(signal in text for signal in _OVERFLOW_SIGNALS) or _OVERFLOW.search(text):
        return CONTEXT_OVERFLOW
    return None


def _error_strings(document: dict[str, object]) -> Iterator[str]:
    for part in (document, document.get("error")):
        if isinstance(part, str):
            yield part
        elif isinstance(part, dict):
            for name in _ERROR_FIELDS:
                value = part.get(name)
                if isinstance(value, str):
                    yield value
