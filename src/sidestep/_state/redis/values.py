"""Sidestep's values in the Lua script's terms, and back: a verdict and its policy
as the script's arguments, seconds as its milliseconds; the transitions and the
forgotten scopes its replies tell as `Transition`s, a stored scope's parts as its key.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..._answers.classify import Kind, Verdict
from ..._common.scopes import ScopeKey, ScopeKind
from .. import circuit
from ..circuit import State
from ..protocol import Transition

if TYPE_CHECKING:
    from ..._settings.policies import BreakerPolicy, Suspensions

__all__ = ["forgotten", "ms", "scope_key", "transitions", "verdict_args"]


def transitions(keys: Sequence[ScopeKey], changes: list[Any]) -> tuple[Transition, ...]:
    return tuple(
        Transition(
            scope=keys[index - 1],
            state=State(state),
            previous=State(previous),
            reason=reason or None,
            failures=int(failures),
            retry_in=_retry_in(float(retry_in)),
        )
        for index, state, previous, reason, failures, retry_in in changes
    )


def forgotten(dropped: list[Any], sent: float) -> tuple[Transition, ...]:
    """The suspended scopes the script forgot to stay within ``max_scopes`` (sent at `sent`)."""
    return tuple(
        Transition(
            scope=scope_key(ScopeKind(kind), origin, credential, model),
            state=State.CLOSED,
            previous=State(state),
            reason=reason or None,
            failures=int(failures),
            retry_in=None,
            forgotten=True,
            at=sent,
        )
        for _, kind, origin, credential, model, state, reason, failures in dropped
    )


def verdict_args(
    verdict: Verdict, policy: BreakerPolicy, suspensions: Suspensions, routed: bool
) -> list[str]:
    window = suspensions.window(verdict.reason or "") if verdict.kind is Kind.SUSPEND else None
    rate = policy.failure_rate
    return [
        verdict.kind.value,
        verdict.reason or "",
        circuit.UNAVAILABLE,
        _opt(verdict.retry_after),
        "1" if verdict.slow else "0",
        str(policy.failure_threshold),
        repr(policy.cooldown),
        repr(policy.max_cooldown),
        repr(policy.backoff_multiplier),
        _opt(window.initial if window else None),
        _opt(window.max if window else None),
        _opt(rate.threshold if rate else None),
        _opt(rate.window if rate else None),
        _opt(rate.minimum_calls if rate else None),
        str(circuit.RATE_BUCKETS),
        "1" if routed else "0",  # a route's verdict: the cap spares what it records on
    ]


def scope_key(kind: ScopeKind, origin: str, credential: str, detail: str) -> ScopeKey:
    """A stored scope's key: its last part is the model, or an endpoint's fingerprint."""
    if kind is ScopeKind.ENDPOINT:
        return ScopeKey(kind, origin, credential, endpoint=detail)
    return ScopeKey(kind, origin, credential, detail)


def _retry_in(seconds: float) -> float | None:
    return None if math.isinf(seconds) else max(0.0, seconds)


def _opt(value: float | None) -> str:
    return "" if value is None else repr(value)


def ms(seconds: float) -> str:
    return str(max(1, math.ceil(seconds * 1000)))
