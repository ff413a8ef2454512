"""The words `request.finished`, `attempt.finished` and `hedge.finished` end with: what
the core says and what metrics and traces count by."""

from __future__ import annotations

__all__ = ["ATTEMPT_RESULTS", "CANCELLED", "HEDGE_OUTCOMES", "REQUEST_OUTCOMES"]

#: What `attempt.finished` says of an attempt (`result`); "cancelled" when it never ended.
ATTEMPT_RESULTS = (
    "success",
    "unavailable",
    "timeout",
    "rate_limited",
    "quota_exhausted",
    "invalid_credential",
    "context_overflow",
    "neutral",
    "invalid_body",
)
#: How `request.finished` says a request ended (`outcome`); "cancelled" when it never did.
REQUEST_OUTCOMES = ("served", "served_after_failover", "upstream_error", "all_suspended", "error")
#: Both events' word for an attempt or a request its caller gave up on (a cancellation,
#: a timeout around the call, a generator closed): counted, never against a scope.
CANCELLED = "cancelled"
#: What `hedge.finished` says of a request whose hedge delay ran out (`outcome`): the
#: hedge answered first (`won`), the first attempt did (`lost`), both failed (`failed`),
#: or no hedge went (`refused_budget`: the route's budget had none left; `no_candidate`:
#: every other candidate was suspended).
HEDGE_OUTCOMES = ("won", "lost", "failed", "refused_budget", "no_candidate")
