"""`sidestep doctor`: deterministic findings about a configuration, without calling an upstream.

Each check returns `Finding`s — ``ok``, ``warn``, or ``unknown`` when the
evidence would only come from running it — with a one-line reason and the
key paths involved. Reasons name routes, targets, keys and variable names,
never a value: values may be credentials. Only `--online` talks to anything,
and only to the configured Redis; the `store` check reads how many processes
the command after ``--`` runs (`_processes`), which may look for a
``gunicorn.conf.py`` in the working directory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from .._common.scopes import is_credential
from .._settings.config import Config
from .._settings.policies import FailoverPolicy
from .._settings.routes import Route, Target
from .._settings.stores import StoreSettings, redis_server
from .processes import processes

__all__ = ["Finding", "diagnose"]

OK, WARN, UNKNOWN = "ok", "warn", "unknown"

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
# The window a reason typically needs when the upstream names none: a 503's
# Retry-After, a rate limit's minute, a monthly quota's top-up, a key's rotation.
_TYPICAL_WAIT = {
    "unavailable": 10.0,
    "rate_limited": 1.0,
    "quota_exhausted": 900.0,
    "invalid_credential": 300.0,
}
_SMALL_BUFFER = 1 << 20  # an LLM answer of long output, tools and logprobs reaches this
_MEANINGFUL_CALLS = 10


@dataclass(frozen=True, slots=True)
class Finding:
    """One check's verdict: ``ok``, ``warn`` or ``unknown``, why, and the keys involved."""

    status: str
    check: str
    reason: str
    keys: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "keys": list(self.keys)}


def diagnose(
    config: Config,
    *,
    unset: Sequence[str] = (),
    command: Sequence[str] = (),
    ping: Callable[[], bool | None] | None = None,
) -> list[Finding]:
    """Every finding about `config`, in a stable order.

    Args:
        unset: the ``${VAR}`` names the file uses that the environment lacks.
        command: the command `sidestep run` will start, when given (`--`).
        ping: with `--online`, asks the configured Redis for PING; None: offline.
    """
    findings: list[Finding] = []
    for index, route in enumerate(config.routes):
        at = f"routes[{index}]"
        policy = route.policy(config.failover)
        llm = _is_llm(route)
        findings += _timeouts(route, at, policy)
        findings += _budget(route, at, policy)
        findings += _redundancy(route, at)
        if llm:
            findings += _llm(route, at, policy)
        findings += _buffer(route, at, llm)
    findings += _overlaps(config)
    findings += _windows(config)
    findings += _failure_rate(config)
    findings += _variables(unset)
    findings += _store(config.store, command, ping)
    return findings


# --- per route ------------------------------------------------------------------------------


def _where(route: Route, at: str, key: str) -> str:
    """A route's key: its own override when it sets one, else the global one."""
    return f"{at}.failover.{key}" if key in route.failover.model_fields_set else f"failover.{key}"


def _timeouts(route: Route, at: str, policy: FailoverPolicy) -> Iterator[Finding]:
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
            f"{name}: {_n(attempts, 'attempt')} x {_s(policy.first_byte_timeout)} first byte"
            f" + {_s(waits)} waits fit in total_timeout {_s(policy.total_timeout)}",
            keys,
        )
        return
    fit = max(1, int(policy.total_timeout // policy.first_byte_timeout))
    yield Finding(
        WARN,
        "timeouts",
        f"{name}: {_n(attempts, 'attempt')} x {_s(policy.first_byte_timeout)} first byte"
        f" + {_s(waits)} waits = {_s(worst)} exceed total_timeout {_s(policy.total_timeout)}:"
        f" slow upstreams leave time for only {min(fit, attempts)}",
        keys,
    )


def _budget(route: Route, at: str, policy: FailoverPolicy) -> Iterator[Finding]:
    keys = (_where(route, at, "max_total_attempts"), f"{at}.targets")
    if policy.max_total_attempts >= len(route.targets):
        yield Finding(
            OK,
            "budget",
            f"route {route.name!r}: {_n(policy.max_total_attempts, 'attempt')} can reach"
            f" every target ({len(route.targets)})",
            keys,
        )
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


def _credential(target: Target) -> tuple[tuple[str, str], ...]:
    userinfo = urlsplit(target.url).netloc.rpartition("@")[0]
    own = tuple(sorted((n, v) for n, v in target.headers.items() if is_credential(n)))
    return (*own, ("userinfo", userinfo)) if userinfo else own


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def _redundancy(route: Route, at: str) -> Iterator[Finding]:
    seen: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
    clashes = []
    for index, target in enumerate(route.targets):
        key = (_origin(target.url), _credential(target))
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


def _is_llm(route: Route) -> bool:
    for target in route.targets:
        host = (urlsplit(target.url).hostname or "").lower()
        if any(host == h or host.endswith("." + h) for h in _LLM_HOSTS):
            return True
    return False


def _llm(route: Route, at: str, policy: FailoverPolicy) -> Iterator[Finding]:
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


def _buffer(route: Route, at: str, llm: bool) -> Iterator[Finding]:
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


# --- across routes --------------------------------------------------------------------------


def _prefixes(route: Route) -> Iterator[tuple[str, str]]:
    for url in [t.url for t in route.targets] + list(route.match):
        parts = urlsplit(url)
        yield _origin(url), parts.path.rstrip("/")


def _overlaps(config: Config) -> Iterator[Finding]:
    found = False
    for i, first in enumerate(config.routes):
        for j in range(i + 1, len(config.routes)):
            second = config.routes[j]
            shared = [
                (o1, p1, p2)
                for o1, p1 in _prefixes(first)
                for o2, p2 in _prefixes(second)
                if o1 == o2 and _nested(p1, p2)
            ]
            if shared:
                found = True
                yield Finding(
                    WARN,
                    "overlap",
                    f"routes {first.name!r} and {second.name!r} both match some requests"
                    " (the same origin, one path inside the other): the longer prefix wins",
                    (f"routes[{i}]", f"routes[{j}]"),
                )
    if not found and len(config.routes) > 1:
        yield Finding(OK, "overlap", "no request is matched by two routes", ("routes",))


def _nested(a: str, b: str) -> bool:
    return a == b or not a or not b or a.startswith(b + "/") or b.startswith(a + "/")


def _windows(config: Config) -> Iterator[Finding]:
    windows = {
        "unavailable": (config.breaker.cooldown, "breaker.cooldown"),
        "rate_limited": (config.suspensions.rate_limited.initial, "suspensions.rate_limited"),
        "quota_exhausted": (
            config.suspensions.quota_exhausted.initial,
            "suspensions.quota_exhausted",
        ),
        "invalid_credential": (
            config.suspensions.invalid_credential.initial,
            "suspensions.invalid_credential",
        ),
    }
    short = []
    for reason, (window, key) in windows.items():
        typical = _TYPICAL_WAIT[reason]
        if window < typical:
            short.append(key)
            yield Finding(
                WARN,
                "windows",
                f"{reason}: without a Retry-After the scope reopens after {_s(window)},"
                f" before the typical {_s(typical)}: the probes it lets through mostly fail",
                (key,),
            )
    if not short:
        yield Finding(
            OK,
            "windows",
            "every reason's first window is at least its typical wait",
            tuple(key for _, key in windows.values()),
        )


def _failure_rate(config: Config) -> Iterator[Finding]:
    rate = config.breaker.failure_rate
    if rate is None:
        return
    key = ("breaker.failure_rate.minimum_calls",)
    if rate.minimum_calls < _MEANINGFUL_CALLS:
        yield Finding(
            WARN,
            "failure_rate",
            f"minimum_calls {rate.minimum_calls} is under {_MEANINGFUL_CALLS}: a ratio over"
            " so few calls opens a scope on chance",
            key,
        )
    else:
        yield Finding(OK, "failure_rate", "minimum_calls is large enough to mean something", key)


def _variables(unset: Sequence[str]) -> Iterator[Finding]:
    if unset:
        yield Finding(
            WARN,
            "variables",
            f"environment variables used but not set here: {', '.join(sorted(set(unset)))}",
        )
    else:
        yield Finding(OK, "variables", "every ${VAR} the file uses is set")


def _store(
    store: StoreSettings, command: Sequence[str], ping: Callable[[], bool | None] | None
) -> Iterator[Finding]:
    if store.kind == "memory":
        yield _memory(command)
        return
    options = store.options
    if store.kind == "redis":
        if getattr(options, "fingerprint_key", None) is None:
            yield Finding(
                WARN,
                "store",
                "redis store without fingerprint_key: each process fingerprints credentials"
                " with its own random key, so credential scopes are not shared",
                ("store.redis.fingerprint_key",),
            )
        server = redis_server(options.url)  # type: ignore[attr-defined]
        if ping is None:
            yield Finding(
                UNKNOWN,
                "store",
                f"redis store at {server}: not contacted (--online pings it)",
                ("store.redis.url",),
            )
            return
        answered = ping()
        if answered is None:
            yield Finding(
                UNKNOWN,
                "store",
                "redis store: not contacted, its address is not set here",
                ("store.redis.url",),
            )
        elif answered:
            yield Finding(OK, "store", f"redis store at {server} answers", ("store.redis.url",))
        else:
            yield Finding(
                WARN,
                "store",
                f"redis store at {server} does not answer: processes fall back to memory",
                ("store.redis.url",),
            )


def _memory(command: Sequence[str]) -> Finding:
    """A memory store under the command: per-process circuits split between workers."""
    if not command:
        return Finding(
            UNKNOWN,
            "store",
            "memory store: circuits are per process; whether the app runs in several is"
            " not known here (give the command after --)",
            ("store",),
        )
    run = processes(command)
    if run.several is None:
        return Finding(
            UNKNOWN,
            "store",
            f"memory store under {run.what}; if it runs several processes, each learns"
            " every outage on its own",
            ("store",),
        )
    if run.several:
        return Finding(
            WARN,
            "store",
            f"memory store under {run.what}: each worker process learns every outage"
            " on its own; a redis store shares circuits across them",
            ("store",),
        )
    return Finding(OK, "store", f"memory store under {run.what}", ("store",))


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _s(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def unset_variables(data: object, environ: Mapping[str, str] = os.environ) -> list[str]:
    """The ``${NAME}`` references in a parsed YAML tree's strings whose variable is unset."""
    found: list[str] = []
    stack = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str):
            for name in re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)\}", node):
                if name not in environ:
                    found.append(name)
    return sorted(set(found))
