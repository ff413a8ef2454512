"""Circuit state shared across processes and hosts: `RedisStore`.

Every store operation is one run of one Lua script (`_redis_scripts`) on the
server, so processes and hosts share circuits, generations and probe slots
atomically, and the server's clock decides windows. When Redis does not
answer within ``timeout``, the store serves from a local `MemoryStore` and
goes back to Redis once it answers again. Only this module imports redis.

It needs Redis 6.2 or later, as one server or a primary with replicas: not
Redis Cluster, because the script builds its key names from its arguments.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import itertools
import math
import re
import secrets
import threading
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript, Script
from redis.retry import Retry

from . import _circuit as circuit
from ._circuit import State
from ._classify import Kind, Verdict
from ._redis_scripts import SCRIPT
from ._scopes import Fingerprinter, ScopeFacts, ScopeKey, ScopeKind
from ._store import (
    DEFAULT_MAX_SCOPES,
    Admission,
    MemoryStore,
    Refusal,
    ScopeStatus,
    Ticket,
    Transition,
    verdict_keys,
)
from .logging import emit

if TYPE_CHECKING:
    from ._config import BreakerPolicy, Suspensions

__all__ = ["RedisStore"]

DEFAULT_TIMEOUT = 0.25
# The lease of a probe whose request has no bounded time to first byte (the
# core passes None): a minute outlasts a slow non-streamed completion, and
# bounds how long a process that died holding a probe keeps the scope shut.
DEFAULT_PROBE_LEASE = 60.0
DEFAULT_TTL = 3600.0
DEFAULT_RETRY_INTERVAL = 1.0

# How the script answers an admission or a verdict.
_HEALTHY, _NEED_KEYS, _ADMITTED, _REFUSED = 0, 1, 2, 3
# Redis errors and socket errors (timeouts included) alike mean "serve from memory for now".
_UNAVAILABLE = (redis.RedisError, OSError)
# Tried even while Redis is deemed down. A verdict on a ticket Redis issued can
# only go to Redis (a lost probe verdict would hold its slot until the lease
# ends), and only requests in flight when it went away have such tickets; an
# operator's clear must reach the shared state, not just this process's.
_ALWAYS_TRIED = frozenset({"record", "release", "clear"})
_SCOPE_ID = re.compile(r"[0-9a-f]{16}")
# Origins seen unhealthy are remembered so their admissions carry the scope keys
# in the first round trip; more than this and the memory starts afresh.
_MAX_HOT = 1024
# Lost admissions waiting to be dropped; past this the oldest are left to their leases.
_MAX_DROPS = 1024
# While one caller retries a Redis deemed down, the others stay on memory for
# up to this many timeouts: longer than any one attempt takes.
_CLAIM_TIMEOUTS = 8
# CLIENT SETINFO would cost two round trips per new connection (redis-py 7
# names the switch `driver_info`, earlier versions `lib_name`/`lib_version`).
_NO_SETINFO: dict[str, Any] = (
    {"driver_info": None}
    if "driver_info" in inspect.signature(redis.Redis.__init__).parameters
    else {"lib_name": None, "lib_version": None}
)

# The asyncio client gets no timeouts of its own: `_bounded` bounds each whole
# call, without cancelling the caller. redis-py implements its socket timeouts
# with `asyncio.wait_for` and `async_timeout`, which before Python 3.12 can
# swallow a cancellation; a cancelled exchange must stop at its next await.
_NO_SOCKET_TIMEOUTS: dict[str, Any] = {"socket_timeout": None, "socket_connect_timeout": None}

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Call:
    """One run of the script: its arguments, and for an admission that may take
    probe slots, the ``drop`` group that gives them back if its reply is lost."""

    args: list[str]
    drop: tuple[str, ...] = ()


_Steps = Generator[_Call, Any, T]


class _RedisTicket(Ticket):
    """A ticket Redis issued: its verdict goes to Redis."""

    __slots__ = ("token",)

    def __init__(
        self,
        facts: ScopeFacts,
        seq: int,
        generations: dict[ScopeKey, int] | None = None,
        probes: tuple[ScopeKey, ...] = (),
        *,
        shadow: bool = False,
        token: str = "",
    ) -> None:
        super().__init__(facts, seq, generations, probes, shadow)
        self.token = token  # names this admission's probe leases


class _LocalTicket(Ticket):
    """A ticket the local fallback issued: its verdict goes to that same fallback,
    even after Redis came back and a fresh fallback replaced it."""

    __slots__ = ("store",)

    def __init__(self, store: MemoryStore, ticket: Ticket) -> None:
        super().__init__(ticket.facts, ticket.seq, ticket.generations, ticket.probes, ticket.shadow)
        self.store = store


@dataclass(slots=True)
class _LoopClient:
    script: AsyncScript
    keeper: AsyncGenerator[None, None]  # closes the client when its event loop shuts down


class RedisStore:
    """Circuit state in Redis, shared by every process and host that uses the same `prefix`.

    Args:
        url: ``redis://[[user]:password@]host[:port][/db]`` (or ``rediss://``,
            ``unix://``); the password never appears in logs, errors or reprs.
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
        max_scopes: the most scopes kept; past it the one closest to
            expiring is forgotten.
        retry_interval: while Redis is down, try it again at most this often
            (one caller tries; the others stay on memory until it knows).

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
    ) -> None:
        self._where = _display(url)
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
        self.fallbacks = 0  # Redis calls that failed and were served locally (or dropped)
        self._url = url
        self._prefix = prefix
        self._lease_ms = _ms(probe_lease or DEFAULT_PROBE_LEASE)
        self._ttl_ms = _ms(ttl)
        self._max_scopes = max_scopes
        self._max = str(max_scopes)
        self._timeout = timeout
        self._retry_interval = retry_interval
        self._options: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "decode_responses": True,
            # RESP2: the script's replies need nothing newer, and redis-py 8's RESP3
            # handshake adds a round trip (maintenance notifications) to every connection.
            "protocol": 2,
            **_NO_SETINFO,
        }
        client: redis.Redis | None
        try:
            client = redis.Redis.from_url(
                url, retry=Retry(NoBackoff(), 0), redis_connect_func=_connect, **self._options
            )
        except Exception:  # no I/O happens here: whatever it is, the URL is unusable
            client = None
        if client is None:
            # Raised outside the handler, so the library's error (which may quote
            # the URL's password) is not kept as this one's context.
            raise ValueError(f"not a usable Redis URL: {self._where}")
        self._client = client
        self._script: Script = client.register_script(SCRIPT)
        self._async: dict[asyncio.AbstractEventLoop, _LoopClient] = {}
        self._fallback = MemoryStore(max_scopes=max_scopes)
        self._lock = threading.Lock()
        self._down = False
        self._retry_at = 0.0
        self._hot: dict[str, None] = {}
        self._drops: list[tuple[str, ...]] = []
        # Private test hook: windows follow the caller's `now` instead of the
        # server's clock, so fake-clock tests drive MemoryStore and RedisStore alike.
        self._caller_clock = False

    def __repr__(self) -> str:
        return f"RedisStore({self._where!r}, prefix={self._prefix!r})"

    def __len__(self) -> int:
        """The scopes kept under the prefix (the local fallback's while Redis is down)."""
        return int(self._run("count", self._one("count"), self._fallback.__len__))

    def close(self) -> None:
        """Close the sync client's connections (used again, it reconnects).

        The sync methods use that client, and so do the async ones under trio.
        Async clients under asyncio close with their event loop, or with `aclose`.
        """
        self._client.close()

    async def aclose(self) -> None:
        """Close the running asyncio event loop's client; the sync client stays open (`close`)."""
        if not _on_asyncio():
            return  # under trio the async methods use the sync client
        with self._lock:
            entry = self._async.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry.keeper.aclose()

    # -- the protocol ------------------------------------------------------------------

    def admit(
        self, facts: ScopeFacts, policy: BreakerPolicy, now: float, lease: float | None = None
    ) -> Admission:
        steps = self._admit(facts, policy, now, lease)
        return self._run("admit", steps, self._local_admit(facts, policy, now))

    def record(
        self,
        ticket: Ticket,
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        now: float,
    ) -> tuple[Transition, ...]:
        return self._run(
            "record", self._record(ticket, verdict, policy, suspensions, now), _nothing
        )

    def release(self, ticket: Ticket) -> None:
        self._run("release", self._release(ticket), _none)

    def snapshot(self, now: float) -> list[ScopeStatus]:
        return self._run(
            "snapshot", self._snapshot(now), functools.partial(self._fallback.snapshot, now)
        )

    def clear(self, scope_id: str) -> bool:
        local = self._fallback.clear(scope_id)  # both stores: the local one may hold it too
        if not _SCOPE_ID.fullmatch(scope_id):
            return local
        return bool(self._run("clear", self._one("clear", scope_id), _false)) or local

    async def admit_async(
        self, facts: ScopeFacts, policy: BreakerPolicy, now: float, lease: float | None = None
    ) -> Admission:
        if not _on_asyncio():
            return await anyio.to_thread.run_sync(self.admit, facts, policy, now, lease)
        steps = self._admit(facts, policy, now, lease)
        return await self._run_async("admit", steps, self._local_admit(facts, policy, now))

    async def record_async(
        self,
        ticket: Ticket,
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        now: float,
    ) -> tuple[Transition, ...]:
        if not _on_asyncio():
            return await anyio.to_thread.run_sync(
                self.record, ticket, verdict, policy, suspensions, now
            )
        steps = self._record(ticket, verdict, policy, suspensions, now)
        return await self._run_async("record", steps, _nothing)

    async def release_async(self, ticket: Ticket) -> None:
        if not _on_asyncio():
            return await anyio.to_thread.run_sync(self.release, ticket)
        return await self._run_async("release", self._release(ticket), _none)

    async def snapshot_async(self, now: float) -> list[ScopeStatus]:
        if not _on_asyncio():
            return await anyio.to_thread.run_sync(self.snapshot, now)
        otherwise = functools.partial(self._fallback.snapshot, now)
        return await self._run_async("snapshot", self._snapshot(now), otherwise)

    async def clear_async(self, scope_id: str) -> bool:
        if not _on_asyncio():
            return await anyio.to_thread.run_sync(self.clear, scope_id)
        local = self._fallback.clear(scope_id)
        if not _SCOPE_ID.fullmatch(scope_id):
            return local
        return bool(await self._run_async("clear", self._one("clear", scope_id), _false)) or local

    # -- the operations, as steps: each yields a script call, gets its reply -------------

    def _admit(
        self, facts: ScopeFacts, policy: BreakerPolicy, now: float, lease: float | None
    ) -> _Steps[Admission]:
        # An origin last seen healthy is asked about first without keys, so the
        # healthy path never parses a body or hashes a credential; one seen
        # unhealthy sends its keys at once. Either way: one round trip, unless
        # the origin changed since this process last looked.
        lease_ms = self._lease_ms if lease is None else _ms(lease)
        keys = facts.keys() if facts.origin in self._hot else ()
        token = _token(keys)
        reply = yield self._admit_call(facts, keys, token, lease_ms, policy, now)
        if reply[0] == _NEED_KEYS:
            keys = facts.keys()
            token = _token(keys)
            reply = yield self._admit_call(facts, keys, token, lease_ms, policy, now)
        status, seq, sick, gens, probes, refused, changes = reply
        self._note(facts.origin, sick)
        if status == _HEALTHY:
            return Admission(_RedisTicket(facts, int(seq)))
        refusal = None
        if refused:
            index, state, reason, retry_in = refused
            refusal = Refusal(keys[index - 1], State(state), reason or None, now + float(retry_in))
        if status == _REFUSED:
            return Admission(None, refusal)
        ticket = _RedisTicket(
            facts,
            int(seq),
            {key: int(g) for key, g in zip(keys, gens, strict=True)},
            tuple(keys[i - 1] for i in probes),
            shadow=refusal is not None,
            token=token,
        )
        return Admission(ticket, refusal, _transitions(keys, changes))

    def _admit_call(
        self,
        facts: ScopeFacts,
        keys: Sequence[ScopeKey],
        token: str,
        lease_ms: str,
        policy: BreakerPolicy,
        now: float,
    ) -> _Call:
        sids = [key.scope_id for key in keys]
        args = [
            *self._head("admit", now),
            _origin_hash(facts.origin),
            str(policy.half_open_probes),
            "1" if policy.enforce else "0",
            lease_ms,
            token,
            str(len(sids)),
            *sids,
        ]
        # With keys it may take probe slots: how to give them back if the reply is lost.
        return _Call(args, (token, lease_ms, str(len(sids)), *sids) if sids else ())

    def _record(
        self,
        ticket: Ticket,
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        now: float,
    ) -> _Steps[tuple[Transition, ...]]:
        if not isinstance(ticket, _RedisTicket):
            return self._issuer(ticket).record(ticket, verdict, policy, suspensions, now)
        if ticket.done:
            return ()
        ticket.done = True
        if ticket.shadow:
            return ()  # observe mode: enforcing would never have sent it
        origin = ticket.facts.origin
        keys: tuple[ScopeKey, ...]
        if verdict.kind is Kind.SUCCESS:
            if ticket.generations is None and not ticket.probes and origin not in self._hot:
                reply = yield _Call(self._record_args(ticket, None, now))
                self._note(origin, reply[1])
                if reply[0] != _NEED_KEYS:
                    return ()  # the healthy path: nothing kept, nothing to reset
            keys = ticket.facts.keys()
        else:
            keys = verdict_keys(ticket.facts, verdict)
            if not keys and not ticket.probes:
                return ()
        args = self._record_args(ticket, keys, now)
        if keys:
            args += _verdict_args(verdict, policy, suspensions)
        _, sick, changes = yield _Call(args)
        self._note(origin, sick)
        return _transitions(keys, changes)

    def _release(self, ticket: Ticket) -> _Steps[None]:
        if not isinstance(ticket, _RedisTicket):
            return self._issuer(ticket).release(ticket)
        if ticket.done:
            return None
        ticket.done = True
        if ticket.probes:
            yield _Call(self._record_args(ticket, (), 0.0))
        return None

    def _record_args(
        self, ticket: _RedisTicket, keys: Sequence[ScopeKey] | None, now: float
    ) -> list[str]:
        """The ticket's part of the record script's arguments; `keys` None asks whether
        the origin is unhealthy, no keys only releases probe slots."""
        gens = ticket.generations or {}
        args = [
            *self._head("record", now),
            _origin_hash(ticket.facts.origin),
            str(ticket.seq),
            ticket.token,
            str(len(ticket.probes)),
        ]
        for key in ticket.probes:
            args += (key.scope_id, str(gens.get(key, 0)))
        if keys is None:
            return [*args, "-1"]
        args.append(str(len(keys)))
        for key in keys:
            args += (
                key.scope_id,
                str(gens.get(key, 0)),
                key.kind.value,
                key.origin,
                key.credential,
                key.model or key.endpoint,  # one of them, by kind
            )
        return args

    def _snapshot(self, now: float) -> _Steps[list[ScopeStatus]]:
        rows = yield _Call(self._head("snapshot", now))
        statuses = []
        for sid, kind, origin, credential, model, state, reason, failures, retry_in, w in rows:
            s = State(state)
            rel = float(retry_in)
            closed = s is State.CLOSED
            # when the current window began; unknown while open until cleared
            opened = None if closed or math.isinf(rel) else now + rel - float(w)
            statuses.append(
                ScopeStatus(
                    scope_id=sid,
                    scope=_scope_key(ScopeKind(kind), origin, credential, model),
                    state=s,
                    reason=reason or None,
                    failures=int(failures),
                    retry_at=0.0 if closed else now + rel,
                    retry_in=_retry_in(rel) if s is State.OPEN else 0.0,
                    opened_at=opened,
                )
            )
        return statuses

    def _one(self, op: str, *args: str) -> _Steps[Any]:
        return (yield _Call([*self._head(op, 0.0), *args]))

    def _head(self, op: str, now: float) -> list[str]:
        return [
            op,
            self._prefix,
            repr(now),
            "1" if self._caller_clock else "0",
            self._ttl_ms,
            self._max,
        ]

    # -- driving the steps: against Redis, else locally ----------------------------------

    def _run(self, op: str, steps: _Steps[T], otherwise: Callable[[], T]) -> T:
        try:
            call = next(steps)  # decisions that need no server come first
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        if self._usable(op):
            try:
                while True:
                    try:
                        reply = self._script(keys=(), args=call.args)
                        self._answered()
                        call = steps.send(reply)
                    except StopIteration as stop:
                        value: T = stop.value
                        break
                    except BaseException:
                        if call.drop:  # its reply is lost: give its probe slots back
                            self._drop_now(call.drop)
                        raise
            except _UNAVAILABLE as exc:
                self._unavailable(op, exc)
            else:
                if self._drops:
                    self._send_drops()
                return value
        steps.close()
        return otherwise()

    async def _run_async(self, op: str, steps: _Steps[T], otherwise: Callable[[], T]) -> T:
        try:
            call = next(steps)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        if self._usable(op):
            calls = [call]  # the call in flight last, for its drop if the reply is lost
            try:
                value = await self._bounded(self._exchange(steps, calls))
            except BaseException as exc:
                if calls[-1].drop:  # its reply never made it into a ticket: give its slots back
                    self._queue_drops([calls[-1].drop])
                    if not isinstance(exc, GeneratorExit):  # a closed coroutine cannot wait
                        await self._send_drops_async()
                if not isinstance(exc, _UNAVAILABLE):
                    raise
                self._unavailable(op, exc)
            else:
                if self._drops:
                    await self._send_drops_async()
                return value
        steps.close()
        return otherwise()

    async def _exchange(self, steps: _Steps[T], calls: list[_Call]) -> T:
        """Drive `steps` against Redis: connecting, the handshake and every round trip."""
        script = await self._async_script()
        while True:
            reply = await script(keys=(), args=calls[-1].args)
            self._answered()
            try:
                calls.append(steps.send(reply))
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]

    async def _bounded(self, exchange: Coroutine[Any, Any, T]) -> T:
        """Await `exchange` for at most ``timeout`` seconds in all, cancel-safe.

        The exchange runs as a task of its own and the caller only waits for
        it, so the bound never cancels the caller: a cancellation of the caller
        that arrives as the time runs out is the caller's, never taken for a
        Redis timeout (a cancel scope's deadline can swallow it before Python
        3.12, as can redis-py's own socket timeouts). Either way the exchange
        is cancelled; redis-py closes the connection it was using.
        """
        task = asyncio.ensure_future(exchange)
        try:
            done, _ = await asyncio.wait((task,), timeout=self._timeout)
        except BaseException:
            task.cancel()
            task.add_done_callback(_retrieve)
            raise
        if not done:
            task.cancel()
            task.add_done_callback(_retrieve)
            raise TimeoutError(f"Redis did not answer within {self._timeout}s")
        return task.result()

    async def _async_script(self) -> AsyncScript:
        """This event loop's script (an asyncio client is bound to the loop it runs on)."""
        loop = asyncio.get_running_loop()
        entry = self._async.get(loop)
        if entry is not None:
            return entry.script
        with self._lock:  # loops in several threads may share the store
            for old in [old for old in self._async if old.is_closed()]:
                del self._async[old]  # its keeper closed its client as the loop shut down
            entry = self._async.get(loop)
            new = entry is None
            if entry is None:
                client = redis.asyncio.Redis.from_url(
                    self._url,
                    retry=AsyncRetry(NoBackoff(), 0),
                    redis_connect_func=_aconnect,
                    **{**self._options, **_NO_SOCKET_TIMEOUTS},
                )
                entry = self._async[loop] = _LoopClient(
                    client.register_script(SCRIPT), _keeper(client)
                )
        if new:
            # Started here, the keeper is one of this loop's async generators, which
            # the loop closes as it shuts down: that closes the client's connections.
            await entry.keeper.asend(None)
        return entry.script

    def _local_admit(
        self, facts: ScopeFacts, policy: BreakerPolicy, now: float
    ) -> Callable[[], Admission]:
        def admit() -> Admission:
            store = self._fallback
            admission = store.admit(facts, policy, now)
            if admission.ticket is None:
                return admission
            ticket = _LocalTicket(store, admission.ticket)
            return Admission(ticket, admission.refusal, admission.transitions)

        return admit

    def _issuer(self, ticket: Ticket) -> MemoryStore:
        return ticket.store if isinstance(ticket, _LocalTicket) else self._fallback

    # -- lost admissions: their probe slots are dropped -----------------------------------

    def _queue_drops(self, groups: list[tuple[str, ...]]) -> None:
        """Keep drops that could not be sent, to go with the next call that succeeds."""
        with self._lock:
            self._drops[:0] = groups
            del self._drops[:-_MAX_DROPS]  # the oldest are left to their leases

    def _take_drops(self) -> tuple[list[tuple[str, ...]], list[str]]:
        with self._lock:
            groups, self._drops = self._drops, []
        return groups, [*self._head("drop", 0.0), str(len(groups)), *itertools.chain(*groups)]

    def _drop_now(self, group: tuple[str, ...]) -> None:
        self._queue_drops([group])
        self._send_drops()

    def _send_drops(self) -> None:
        groups, args = self._take_drops()
        if not groups:
            return
        try:
            self._script(keys=(), args=args)
        except _UNAVAILABLE:
            self._queue_drops(groups)
        except BaseException:
            self._queue_drops(groups)
            raise

    async def _send_drops_async(self) -> None:
        groups, args = self._take_drops()
        if not groups:
            return
        sent = False
        try:
            # Even while a cancellation unwinds (it may be what lost the reply), briefly.
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._timeout):
                script = await self._async_script()
                await script(keys=(), args=args)
                sent = True
        except _UNAVAILABLE:
            pass
        finally:
            if not sent:
                self._queue_drops(groups)

    # -- availability ---------------------------------------------------------------------

    def _usable(self, op: str) -> bool:
        if not self._down or op in _ALWAYS_TRIED:
            return True
        now = time.monotonic()
        with self._lock:
            if now < self._retry_at:
                return False
            # This caller tries Redis; the others stay on memory until it knows.
            self._retry_at = now + self._retry_interval + _CLAIM_TIMEOUTS * self._timeout
            return True

    def _unavailable(self, op: str, exc: BaseException) -> None:
        with self._lock:
            self.fallbacks += 1
            self._down = True
            self._retry_at = time.monotonic() + self._retry_interval
            count = self.fallbacks
        # The exception's type only: its text is the client library's to word.
        emit(
            "store.unavailable",
            store="redis",
            server=self._where,
            operation=op,
            error=type(exc).__name__,
            retry_in_s=self._retry_interval,
            fallbacks=count,
        )

    def _answered(self) -> None:
        if not self._down:
            return
        with self._lock:
            was, self._down = self._down, False
            if was:
                # What the fallback learnt served the outage; kept, it would be invisible
                # and uncleared while Redis is up, and refuse requests in the next outage.
                # Its tickets still in flight keep it alive for their verdicts.
                self._fallback = MemoryStore(max_scopes=self._max_scopes)
        if was:
            emit("store.recovered", store="redis", server=self._where)

    # -- small helpers ----------------------------------------------------------------------

    def _note(self, origin: str, unhealthy: Any) -> None:
        """Remember whether `origin` has unhealthy scopes, for the next admission's shape."""
        if int(unhealthy):
            if origin not in self._hot:
                if len(self._hot) >= _MAX_HOT:
                    self._hot.clear()
                self._hot[origin] = None
        else:
            self._hot.pop(origin, None)


def _token(keys: Sequence[ScopeKey]) -> str:
    """A name for one admission's probe leases (none needed without keys).

    Random per admission, so processes forked from one parent never share one.
    """
    return secrets.token_hex(8) if keys else ""


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Collect the outcome of an exchange nobody waits for any more, so none is reported."""
    if not task.cancelled():
        task.exception()


def _connect(connection: Any) -> None:
    """A new sync connection: the usual handshake, then the script loaded, so no
    call meets NOSCRIPT (even after the server restarted empty)."""
    connection.on_connect()
    connection.send_command("SCRIPT", "LOAD", SCRIPT)
    connection.read_response()


async def _aconnect(connection: Any) -> None:
    """`_connect` for an asyncio connection."""
    await connection.on_connect()
    await connection.send_command("SCRIPT", "LOAD", SCRIPT)
    await connection.read_response()


async def _keeper(client: redis.asyncio.Redis) -> AsyncGenerator[None, None]:
    """Holds `client` until its event loop shuts down its async generators, then closes it."""
    try:
        yield
    finally:
        await client.aclose()


def _transitions(keys: Sequence[ScopeKey], changes: list[Any]) -> tuple[Transition, ...]:
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


def _verdict_args(verdict: Verdict, policy: BreakerPolicy, suspensions: Suspensions) -> list[str]:
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
    ]


def _scope_key(kind: ScopeKind, origin: str, credential: str, detail: str) -> ScopeKey:
    """A stored scope's key: its last part is the model, or an endpoint's fingerprint."""
    if kind is ScopeKind.ENDPOINT:
        return ScopeKey(kind, origin, credential, endpoint=detail)
    return ScopeKey(kind, origin, credential, detail)


def _retry_in(seconds: float) -> float | None:
    return None if math.isinf(seconds) else max(0.0, seconds)


def _opt(value: float | None) -> str:
    return "" if value is None else repr(value)


def _ms(seconds: float) -> str:
    return str(max(1, math.ceil(seconds * 1000)))


def _nothing() -> tuple[Transition, ...]:
    return ()


def _none() -> None:
    return None


def _false() -> bool:
    return False


def _on_asyncio() -> bool:
    """Running under asyncio (redis.asyncio works there; elsewhere a worker thread does)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@functools.lru_cache(maxsize=1024)
def _origin_hash(origin: str) -> str:
    return hashlib.blake2b(origin.encode(), digest_size=8).hexdigest()


def _display(url: str) -> str:
    """The server as logs may show it: scheme, host and port; never userinfo, path or query."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return "[invalid Redis URL]"
    if parts.scheme == "unix":
        return "unix://"
    shown = f"[{host}]" if host and ":" in host else host or "localhost"
    return f"{parts.scheme}://{shown}:{port or 6379}"
