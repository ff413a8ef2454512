"""What a store is: the `StateStore` protocol, and the values its operations take and give.

A store offers whole operations — admit a request's scopes, record a verdict
for a ticket, release a ticket, snapshot, clear — never get/set, so that each
can be one atomic step: one lock in memory, one transaction on a file, one
script on a shared server. `MemoryStore` (``memory``) is the reference; the
shared stores run its steps or repeat them atomically.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

from .circuit import State

if TYPE_CHECKING:
    from .._answers.classify import Verdict
    from .._common.scopes import Fingerprinter, ScopeFacts, ScopeKey
    from .._settings.policies import BreakerPolicy, Suspensions

__all__ = [
    "Admission",
    "Refusal",
    "ScopeStatus",
    "StateStore",
    "Ticket",
    "Transition",
    "store_id",
]


class Ticket:
    """One admitted request on one target: what it saw, so its verdict can be checked for staleness.

    `generations` holds, for each covering scope, the generation seen at
    admission (0: not kept, i.e. healthy); None when the origin had nothing
    unhealthy and no key was computed at all. Created per request: kept lean.
    """

    __slots__ = ("done", "facts", "generations", "probes", "seq", "shadow")

    def __init__(
        self,
        facts: ScopeFacts,
        seq: int,
        generations: dict[ScopeKey, int] | None = None,
        probes: tuple[ScopeKey, ...] = (),
        shadow: bool = False,
    ) -> None:
        self.facts = facts
        self.seq = seq
        self.generations = generations
        self.probes = probes
        self.shadow = shadow  # observe mode: enforcing would have refused this request
        self.done = False

    def __repr__(self) -> str:
        return f"Ticket(origin={self.facts.origin!r}, seq={self.seq}, probes={len(self.probes)})"


@dataclass(frozen=True, slots=True)
class Refusal:
    """The scope that keeps a target out, and until when."""

    scope: ScopeKey
    state: State
    reason: str | None
    retry_at: float  # math.inf while open until cleared


_STATE_KEY = secrets.token_bytes(16)  # store ids mean something in this process alone


def store_id(store: object) -> str:
    """An opaque id of the state a store holds: events about its scopes carry it, so
    that a listing of one store speaks for that state alone. Two instances of a shared
    store on one state (a Redis server and prefix, a SQLite file: `_shared_state`) have
    one id, keyed by a secret of this process (the name may hold a password); any other
    store is its instance."""
    shared = getattr(store, "_shared_state", None)
    if not isinstance(shared, str):
        return format(id(store), "x")
    return hashlib.blake2b(shared.encode(), key=_STATE_KEY, digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class Transition:
    """A scope changed state: the material of one event.

    `forgotten`: the store let go of a scope that was not closed (open or
    half-open, `previous`) to stay within its bound; it is healthy again as
    far as admission goes (`state` closed), but never passed a probe. Such a
    scope may be any target's, not the request's that made room; `at` is when
    the store let go of it (`time.monotonic()`, taken before anything else could
    suspend that scope anew), so that telling it late takes off no newer suspension.
    """

    scope: ScopeKey
    state: State
    previous: State
    reason: str | None
    failures: int
    retry_in: float | None  # seconds until half-open, when opened; None when open until cleared
    forgotten: bool = False
    at: float | None = None  # a forgotten scope's: when the store let go of it (if known)


class Admission(NamedTuple):
    """How admission went: made per request, so a tuple (the cheapest value to build)."""

    ticket: Ticket | None  # None: refused
    refusal: Refusal | None = None  # why refused (in observe mode: why it would have been)
    transitions: tuple[Transition, ...] = ()


@dataclass(frozen=True, slots=True)
class ScopeStatus:
    """A snapshot of one unhealthy scope (no credential, no URL path).

    Nothing in it depends on when it was taken: a store may hand out the same
    status again for as long as its scope is unchanged, and the time left in
    its window is worked out when it is asked for (`retry_in`).
    """

    scope_id: str
    scope: ScopeKey
    state: State
    reason: str | None
    failures: int
    retry_at: float  # on the caller's clock; math.inf while open until cleared
    opened_at: float | None = None  # when its current window began; None when it has no end

    def retry_in(self, now: float) -> float | None:
        """Seconds from `now` until re-admission while open; None when open until cleared,
        0 when not open."""
        if self.state is not State.OPEN:
            return 0.0
        return None if math.isinf(self.retry_at) else max(0.0, self.retry_at - now)


class StateStore(Protocol):
    """Atomic circuit operations; `MemoryStore` here, `RedisStore` across processes.

    `blocking` says whether the plain methods may wait on I/O: the async
    transport then uses the `*_async` twins so the event loop never blocks.
    """

    fingerprint: Fingerprinter
    blocking: bool

    def admit(
        self, facts: ScopeFacts, policy: BreakerPolicy, now: float, lease: float | None = None
    ) -> Admission:
        """Admit a request's scopes; `lease` bounds how long a probe slot may be held."""
        ...

    def record(
        self,
        ticket: Ticket,
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        now: float,
    ) -> tuple[Transition, ...]: ...

    def release(self, ticket: Ticket) -> None: ...

    def snapshot(self, now: float) -> list[ScopeStatus]: ...

    def clear(self, scope_id: str) -> bool: ...

    async def snapshot_async(self, now: float) -> list[ScopeStatus]: ...

    async def clear_async(self, scope_id: str) -> bool: ...

    async def admit_async(
        self, facts: ScopeFacts, policy: BreakerPolicy, now: float, lease: float | None = None
    ) -> Admission: ...

    async def record_async(
        self,
        ticket: Ticket,
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        now: float,
    ) -> tuple[Transition, ...]: ...

    async def release_async(self, ticket: Ticket) -> None: ...
