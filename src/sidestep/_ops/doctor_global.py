"""The doctor's checks across routes and of the global settings.

Routes that match the same requests, suspension windows shorter than their
reason's typical wait, a failure_rate over too few calls to mean anything,
and the environment variables the file uses but this environment lacks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from urllib.parse import urlsplit

from .._settings.config import Config
from .._settings.routes import Route
from .doctor_findings import OK, WARN, Finding, s
from .doctor_routes import origin

__all__ = ["failure_rate", "overlaps", "variables", "windows"]

# The window a reason typically needs when the upstream names none: a 503's
# Retry-After, a rate limit's minute, a monthly quota's top-up, a key's rotation.
_TYPICAL_WAIT = {
    "unavailable": 10.0,
    "rate_limited": 1.0,
    "quota_exhausted": 900.0,
    "invalid_credential": 300.0,
}
_MEANINGFUL_CALLS = 10


def _prefixes(route: Route) -> Iterator[tuple[str, str]]:
    for url in [t.url for t in route.targets] + list(route.match):
        parts = urlsplit(url)
        yield origin(url), parts.path.rstrip("/")


def overlaps(config: Config) -> Iterator[Finding]:
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


def windows(config: Config) -> Iterator[Finding]:
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
                f"{reason}: without a Retry-After the scope reopens after {s(window)},"
                f" before the typical {s(typical)}: the probes it lets through mostly fail",
                (key,),
            )
    if not short:
        yield Finding(
            OK,
            "windows",
            "every reason's first window is at least its typical wait",
            tuple(key for _, key in windows.values()),
        )


def failure_rate(config: Config) -> Iterator[Finding]:
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


def variables(unset: Sequence[str]) -> Iterator[Finding]:
    if unset:
        yield Finding(
            WARN,
            "variables",
            f"environment variables used but not set here: {', '.join(sorted(set(unset)))}",
        )
    else:
        yield Finding(OK, "variables", "every ${VAR} the file uses is set")
