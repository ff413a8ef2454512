"""Circuit state shared across processes and hosts: `RedisStore`.

Every store operation is one run of one Lua script (`scripts`) on the
server, so processes and hosts share circuits, generations and probe slots
atomically, and the server's clock decides windows. When Redis does not
answer within ``timeout``, the store serves from a local `MemoryStore` and
goes back to Redis once it answers again. This module holds the protocol:
each operation's steps (`calls`) go to the store's `Driver` (`drive`), which
calls Redis through its `Clients` (`client`). Only the modules of this
package import redis.

It needs Redis 6.2 or later: one server, a primary with replicas, or Redis
Cluster (``cluster=True`` or a ``redis+cluster://`` URL), where every key of
one origin shares a hash slot and redis-py's `RedisCluster` follows the
cluster's moves and failovers.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

import anyio.to_thread

from ..._answers.classify import Verdict
from ..._common.scopes import Fingerprinter, ScopeFacts
from ..._settings.stores import plain_redis_url
from ..failopen import FailOpen
from ..memory import DEFAULT_MAX_SCOPES, MemoryStore
from ..protocol import Admission, ScopeStatus, Ticket, Transition
from .calls import Calls, RedisTicket
from .client import Clients, display, on_asyncio
from .drive import Driver
from .mirror import Mirror

if TYPE_CHECKING:
    from ..._settings.policies import BreakerPolicy, Suspensions

__all__ = ["RedisStore"]

DEFAULT_TIMEOUT = 0.25
# The lease of a probe whose request has no bounded time to first byte (the
# core passes None): a minute outlasts a slow non-streamed completion, and
# bounds how long a process that died holding a probe keeps the scope shut.
DEFAULT_PROBE_LEASE = 60.0
DEFAULT_TTL = 3600.0
DEFAULT_RETRY_INTERVAL = 1.0

# Tried even while Redis is deemed down. A verdict on a ticket Redis issued can
# only go to Redis (a lost probe verdict would hold its slot until the lease
# ends), and only requests in flight when it went away have such tickets; an
# operator's clear must reach the shared state, not just this process's.
_ALWAYS_TRIED = frozenset({"record", "release", "clear"})
_SCOPE_ID = re.compile(r"[0-9a-f]{16}")
# While one caller retries a Redis deemed down, the others stay on memory for
# up to this many timeouts: longer than any one attempt takes.
_CLAIM_TIMEOUTS = 8


class RedisStore:
    """Circuit state in Redis, shared by every process and host that uses the same `prefix`.

    While its mirror is live (see ``mirror``), a request to an origin with no
    unhealthy scope is admitted, and its success recorded, without talking to
    Redis; failures, probes and transitions go to Redis. Until the mirror's
    first snapshot, and from a lost subscription until the next one, every
    admission asks Redis: never a stale "healthy".

    Args:
        url: ``redis://[[user]:password@]host[:port][/db]`` (or ``rediss://``,
            ``unix://``); the password never appears in logs, errors or reprs.
            ``redis+cluster://`` (or ``rediss+cluster://``) names one node of
            a Redis Cluster, as ``cluster=True`` does.
        prefix: every key lives under ``prefix:``.
        fingerprint_key: the shared secret for credential fingerprints; give
            every process the same one, or credential scopes are not shared.
        probe_lease: seconds a half-open probe holds its slot when its request
            has no bounded time to first byte (default 60). Otherwise the lease
            is that time, passed in by the transport from the attempt's
            timeouts (``total_timeout`` left, else ``first_byte_timeout`` or
            the read timeout, with connect, write and pool, times the attempts,
            plus their waits). A process that dies holding a probe frees it
            when the lease ends.
        timeout: seconds Redis may take to answer. The async methods give each
            store call this long in all (under asyncio); the sync methods, and
            the async ones under trio, give it to each round trip (connecting
            is one, and the first call on a new connection makes three:
            authentication, loading the script, the call).
        ttl: seconds a key outlives the last change to its scope (a closed
            scope's failure count, an open scope past its window, an origin's
            bookkeeping): after healing, nothing stays behind longer.
        max_scopes: the most scopes kept; past it, unrouted traffic's scope
            closest to expiring is forgotten, and one a routed request recorded
            a result on only for another route's (as in `MemoryStore`). On Redis
            Cluster, the most kept per origin (a store-wide count would be a key
            every call touches).
        retry_interval: while Redis is down, try it again at most this often
            (one caller tries; the others stay on memory until it knows).
        mirror: keep a mirror of the origins with unhealthy scopes, followed
            by pub/sub from a daemon listener thread (started by the first
            admission, stopped by `close`), so that a healthy origin costs no
            round trip. False: no thread, a round trip per admission and verdict.
        cluster: `url` names a node of a Redis Cluster (redis-py's
            `RedisCluster` finds the others, follows ``MOVED``/``ASK`` and
            failovers). Every key of one origin shares a hash slot.

    While Redis is unreachable or slow, the store serves from a local
    `MemoryStore`, emits ``store.unavailable`` and counts ``fallbacks``; each
    ticket's verdict goes back to the store that issued it (one Redis issued
    is dropped if Redis does not take it). When Redis answers again the local
    state is forgotten: it served the outage and would only mislead the next.

    Under asyncio the ``*_async`` methods use ``redis.asyncio``, one client
    per event loop, closed when that loop shuts down (the end of
    ``asyncio.run``) or by `aclose`; under other event loops (trio) they run
    the sync client in a worker thread.

    Example:
        >>> store = sidestep.RedisStore("redis://:pw@redis:6379/0", fingerprint_key=secret)
        >>> client = httpx.Client(transport=sidestep.FailoverTransport(config, store=store))
    """

    blocking = True

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "sidestep",
        fingerprint_key: bytes | str | None = None,
        probe_lease: float | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        ttl: float = DEFAULT_TTL,
        max_scopes: int = DEFAULT_MAX_SCOPES,
        retry_interval: float = DEFAULT_RETRY_INTERVAL,
        mirror: bool = True,
        cluster: bool = False,
    ) -> None:
        url, named = plain_redis_url(url)
        cluster = cluster or named
        self._where = display(url)
        for name, value in (("timeout", timeout), ("ttl", ttl), ("probe_lease", probe_lease)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive")
        if max_scopes < 1:
            raise ValueError("max_scopes must be at least 1")
        if retry_interval < 0:
            raise ValueError("retry_interval must not be negative")
        if not prefix:
            raise ValueError("prefix must not be empty")
        self.fingerprint = Fingerprinter(fingerprint_key)
        self._prefix = prefix
        self._shared_state = f"redis|{url}|{prefix}"  # `store_id`'s
        self._cluster = cluster
        lease = probe_lease or DEFAULT_PROBE_LEASE
        self._calls = Calls(prefix, ttl, max_scopes, lease, index=not cluster)
        self._timeout = timeout
        self._failopen = FailOpen(
            "redis",
            self._where,
            max_scopes=max_scopes,
            retry_interval=retry_interval,
            # While one caller retries a Redis deemed down, the others stay on memory
            # for up to this long: longer than any one attempt takes.
            claim=8 * timeout,
            always=_ALWAYS_TRIED,
        )
        self._clients = Clients(url, self._where, prefix, timeout, cluster=cluster)
        self._driver = Driver(self._clients, self._calls, self._failopen, timeout)
        self._mirror: Mirror | None = None
        if mirror:
            self._mirror = self._calls.mirror = Mirror(
                self._clients.new_subscription,
                f"{prefix}:m",
                self._driver.origins,
                retry_interval=retry_interval,
            )

    # Private test hooks and views: windows following the caller's `now` instead of the
    # server's clock (so fake-clock tests drive every store alike), the local fallback,
    # the origins this process has seen unhealthy.

    @property
    def _caller_clock(self) -> bool:
        return self._calls.caller_clock

    @_caller_clock.setter
    def _caller_clock(self, value: bool) -> None:
        self._calls.caller_clock = value

    @property
    def _fallback(self) -> MemoryStore:
        return self._failopen.fallback

    @property
    def _hot(self) -> dict[str, None]:
        return self._calls.hot

    @property
    def fallbacks(self) -> int:
        """Redis calls that failed and were served locally (or dropped)."""
        return self._failopen.fallbacks

    @property
    def available(self) -> bool:
        """False while the shared state is deemed away and a local stand-in serves."""
        return not self._failopen.down

    def __repr__(self) -> str:
        return f"RedisStore({self._where!r}, prefix={self._prefix!r})"

    def __len__(self) -> int:
        """The scopes kept under the prefix (the local fallback's while Redis is down)."""
        return int(self._driver.run("count", self._calls.count(), self._fallback.__len__))

    def close(self) -> None:
        """Stop the mirror's listener and close the sync client's connections (used
        again, the store reconnects and starts the listener again).

        The sync methods use that client, and so do the async ones under trio.
        Async clients under asyncio close with their event loop, or with `aclose`.
        """
        if self._mirror is not None:
            self._mirror.stop()
        self._clients.close()

    async def aclose(self) -> None:
        """Close the running asyncio event loop's client; the sync client stays open (`close`)."""
        await self._clients.aclose()

    # -- the protocol ------------------------------------------------------------------

    def admit(
        self, facts: ScopeFacts, policy: BreakerPolicy, now: float, lease: float | None = None
    ) -> Admission:
        steps = self._calls.admit(facts, policy, now, lease, vouch=not self._failopen.down)
        return self._driver.run(
            "admit", steps, functools.partial(self._failopen.admit, facts, policy, now)
        )

    def record(
        self,
        ticket: Ticket,
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        now: float,
    ) -> tuple[Transition, ...]:
        if not isinstance(ticket, RedisTicket):
            return self._failopen.issuer(ticket).record(ticket, verdict, policy, suspensions, now)
        return self._driver.run(
            "record", self._calls.record(ticket, verdict, policy, suspensions, now), _nothing
        )

    def release(self, ticket: Ticket) -> None:
        if not isinstance(ticket, RedisTicket):
            return self._failopen.issuer(ticket).release(ticket)
        self._driver.run("release", self._calls.release(ticket), _none)

    def snapshot(self, now: float) -> list[ScopeStatus]:
        return self._driver.run(
            "snapshot", self._calls.snapshot(now), functools.partial(self._fallback.snapshot, now)
        )

    def clear(self, scope_id: str) -> bool:
        local = self._fallback.clear(scope_id)  # both stores: the local one may hold it too
        if not _SCOPE_ID.fullmatch(scope_id):
            return local
        return bool(self._driver.run("clear", self._calls.clear(scope_id), _false)) or local

    async def admit_async(
        self, facts: ScopeFacts, policy: BreakerPolicy, now: float, lease: float | None = None
    ) -> Admission:
        if not on_asyncio():
            return await anyio.to_thread.run_sync(self.admit, facts, policy, now, lease)
        steps = self._calls.admit(facts, policy, now, lease, vouch=not self._failopen.down)
        return await self._driver.run_async(
            "admit", steps, functools.partial(self._failopen.admit, facts, policy, now)
        )

    async def record_async(
        self,
        ticket: Ticket,
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        now: float,
    ) -> tuple[Transition, ...]:
        if not on_asyncio():
            return await anyio.to_thread.run_sync(
                self.record, ticket, verdict, policy, suspensions, now
            )
        if not isinstance(ticket, RedisTicket):
            return self._failopen.issuer(ticket).record(ticket, verdict, policy, suspensions, now)
        steps = self._calls.record(ticket, verdict, policy, suspensions, now)
        return await self._driver.run_async("record", steps, _nothing)

    async def release_async(self, ticket: Ticket) -> None:
        if not on_asyncio():
            return await anyio.to_thread.run_sync(self.release, ticket)
        if not isinstance(ticket, RedisTicket):
            return self._failopen.issuer(ticket).release(ticket)
        return await self._driver.run_async("release", self._calls.release(ticket), _none)

    async def snapshot_async(self, now: float) -> list[ScopeStatus]:
        if not on_asyncio():
            return await anyio.to_thread.run_sync(self.snapshot, now)
        otherwise = functools.partial(self._fallback.snapshot, now)
        return await self._driver.run_async("snapshot", self._calls.snapshot(now), otherwise)

    async def clear_async(self, scope_id: str) -> bool:
        if not on_asyncio():
            return await anyio.to_thread.run_sync(self.clear, scope_id)
        local = self._fallback.clear(scope_id)
        if not _SCOPE_ID.fullmatch(scope_id):
            return local
        cleared = await self._driver.run_async("clear", self._calls.clear(scope_id), _false)
        return bool(cleared) or local


def _nothing() -> tuple[Transition, ...]:
    return ()


def _none() -> None:
    return None


def _false() -> bool:
    return False
