"""The doctor's checks of each route.

Its timeouts against its total_timeout, targets its attempt budget can never
reach (on a pooled route, tiers: a pool's members are reached by spreading,
`doctor_pools.reach`), targets that share an origin and a credential, the
settings a route to an LLM API needs, and a buffer too small for a typical
answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

from .._common.scopes import is_credential
from .._settings.policies import FailoverPolicy
from .._settings.routes import Route, Target
from .doctor_findings import OK, UNKNOWN, WARN, Finding, n, s
from .doctor_pools import reach

__all__ = ["budget", "buffer", "is_llm", "llm", "origin", "redundancy", "timeouts"]

# Hosts whose APIs answer LLM requests: routes to them are treated as LLM routes.
_LLM_HOSTS = (
    "api.openai.com",
    "api.anthropic.com",
    "generativelanguage.googleapis.com",
    "openai.azure.com",
    "api.mistral.ai",
    "api.groq.com",
    "openrouter.ai",
    "api.together.xyz",
    "api.deepseek.com",
    "api.x.ai",
    "api.fireworks.ai",
    "api.cohere.com",
)
_SMALL_BUFFER = 1 << 20  # an LLM answer of long output, tools and logprobs reaches this


def _where(route: Route, at: str, key: str) -> str:
    """A route's key: its own override when it sets one, else the global one."""
    return f"{at}.failover.{key}" if key in route.failover.model_fields_set else f"failover.{key}"


def timeouts(route: Route, at: str, policy: FailoverPolicy) -> Iterator[Finding]:
    keys = tuple(
        _where(route, at, k) for k in ("first_byte_timeout", "max_total_attempts", "total_timeout")
    )
    name = f"route {route.name!r}"
    if policy.total_timeout is None:
        yield Finding(OK, "timeouts", f"{name}: no total_timeout, every attempt may run", keys)
        return
    if policy.first_byte_timeout is None:
        yield Finding(
            UNKNOWN,
            "timeouts",
            f"{name}: without first_byte_timeout an attempt's length is only known at run time",
            keys,
        )
        return
    attempts = min(policy.max_total_attempts, len(route.targets) * policy.max_attempts_per_target)
    waits = policy.max_retry_wait * (attempts - 1) if policy.max_attempts_per_target > 1 else 0.0
    worst = policy.first_byte_timeout * attempts + waits
    if worst <= policy.total_timeout:
        yield Finding(
            OK,
            "timeouts",
            f"{name}: {n(attempts, 'attempt')} x {s(policy.first_byte_timeout)} first byte"
            f" + {s(waits)} waits fit in total_timeout {s(policy.total_timeout)}",
            keys,
        )
        return
    fit = max(1, int(policy.total_timeout // policy.first_byte_timeout))
    yield Finding(
        WARN,
        "timeouts",
        f"{name}: {n(attempts, 'attempt')} x {s(policy.first_byte_timeout)} first byte"
        f" + {s(waits)} waits = {s(worst)} exceed total_timeout {s(policy.total_timeout)}:"
        f" slow upstreams leave time for only {min(fit, attempts)}",
        keys,
    )


def budget(route: Route, at: str, policy: FailoverPolicy) -> Iterator[Finding]:
    keys = (_where(route, at, "max_total_attempts"), f"{at}.targets")
    if policy.max_total_attempts >= len(route.targets):
        yield Finding(
            OK,
            "budget",
            f"route {route.name!r}: {n(policy.max_total_attempts, 'attempt')} can reach"
            f" every target ({len(route.targets)})",
            keys,
        )
        return
    if route.pooled:
        yield _pooled_budget(route, keys, policy.max_total_attempts)
        return
    never = [t.name for t in route.targets[policy.max_total_attempts :]]
    yield Finding(
        WARN,
        "budget",
        f"route {route.name!r}: max_total_attempts {policy.max_total_attempts} is below its"
        f" {len(route.targets)} targets: {', '.join(never)} can never be reached"
        " (skipped suspended targets cost no attempt)",
        keys,
    )


def _pooled_budget(route: Route, keys: tuple[str, ...], attempts: int) -> Finding:
    """A pooled route's budget: every member of a tier it reaches is reached (by spreading);
    a tier is reached when the tiers before it hold fewer targets than the attempts."""
    never = [route.targets[i].name for i in reach(route, attempts)]
    if not never:
        return Finding(
            OK,
            "budget",
            f"route {route.name!r}: {n(attempts, 'attempt')} reach every tier; within"
            " a pool, requests are spread over every member",
            keys,
        )
    names = ", ".join(never)
    return Finding(
        WARN,
        "budget",
        f"route {route.name!r}: the tiers before {names} hold at least max_total_attempts"
        f" ({attempts}) targets: {names} can never be reached (skipped suspended targets"
        " cost no attempt)",
        keys,
    )


def _credential(target: Target) -> tuple[tuple[str, str], ...]:
    userinfo = urlsplit(target.url).netloc.rpartition("@")[0]
    own = tuple(sorted((n, v) for n, v in target.headers.items() if is_credential(n)))
    return (*own, ("userinfo", userinfo)) if userinfo else own


def origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def redundancy(route: Route, at: str) -> Iterator[Finding]:
    seen: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
    clashes = []
    for index, target in enumerate(route.targets):
        key = (origin(target.url), _credential(target))
        if key in seen:
            clashes.append((seen[key], index))
        else:
            seen[key] = index
    for first, second in clashes:
        a, b = route.targets[first].name, route.targets[second].name
        yield Finding(
            WARN,
            "redundancy",
            f"route {route.name!r}: targets {a!r} and {b!r} share an origin and a credential:"
            " one outage, rate limit or revoked key stops both",
            (f"{at}.targets[{first}]", f"{at}.targets[{second}]"),
        )
    if not clashes and len(route.targets) > 1:
        yield Finding(
            OK,
            "redundancy",
            f"route {route.name!r}: each target has its own origin or credential",
            (f"{at}.targets",),
        )


def is_llm(route: Route) -> bool:
    for target in route.targets:
        host = (urlsplit(target.url).hostname or "").lower()
        if any(host == h or host.endswith("." + h) for h in _LLM_HOSTS):
            return True
    return False


def llm(route: Route, at: str, policy: FailoverPolicy) -> Iterator[Finding]:
    name = f"route {route.name!r}"
    fbt = (_where(route, at, "first_byte_timeout"),)
    if policy.first_byte_timeout is None:
        yield Finding(
            WARN,
            "first_byte",
            f"{name} calls an LLM API without first_byte_timeout: a stuck upstream holds"
            " the request until the client's own timeout, and never fails over",
            fbt,
        )
    else:
        yield Finding(OK, "first_byte", f"{name}: first_byte_timeout bounds a stuck upstream", fbt)
    if not policy.retry_ambiguous:
        yield Finding(
            OK,
            "retry_ambiguous",
            f"note: {name} sends POSTs; with retry_ambiguous false a connection reset after"
            " the request was sent does not fail over (it might have been processed)",
            (_where(route, at, "retry_ambiguous"),),
        )
    if policy.on_all_suspended == "raise":
        yield Finding(
            WARN,
            "on_all_suspended",
            f"{name}: with on_all_suspended raise, the OpenAI and Anthropic SDKs take the"
            " error for a connection failure and retry it after their short backoff, while"
            " every target is still suspended; respond answers a 503 with Retry-After,"
            " which they honour",
            (_where(route, at, "on_all_suspended"),),
        )


def buffer(route: Route, at: str, llm: bool) -> Iterator[Finding]:
    if route.commit != "complete":
        return
    keys = (f"{at}.commit", f"{at}.max_buffered_bytes")
    if route.max_buffered_bytes < _SMALL_BUFFER:
        yield Finding(
            WARN,
            "buffer",
            f"route {route.name!r}: commit complete with max_buffered_bytes"
            f" {route.max_buffered_bytes} (under 1MiB): a long answer"
            f"{' (long output, tool calls, logprobs)' if llm else ''} outgrows the buffer"
            " and is handed over unchecked, with no failover",
            keys,
        )
    else:
        yield Finding(
            OK, "buffer", f"route {route.name!r}: the buffer holds a typical answer", keys
        )
