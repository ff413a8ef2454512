"""Circuit state shared by every process on one host through one file: `SqliteStore`.

The store is a `MemoryStore` whose lock is a SQLite transaction: the same
code (and `_circuit`'s state machine) runs every operation on a view of the
file, and the transaction writes back what the operation changed. A view
is refreshed when another process committed since (``PRAGMA data_version``),
so each process reads the file only after a change, and the healthy path
reads nothing at all: at most every ``refresh`` seconds it asks whether the
file changed.

Only unhealthy scopes are kept, as in memory. Probe slots are leases with
an end in wall-clock time, so a process that dies holding a probe frees it
when its lease ends; windows follow the wall clock too, so a suspension
survives a restart of every process (windows long past are dropped when a
store opens the file).
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import sqlite3
import threading
import time
import weakref
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING

import anyio.to_thread

from . import _sqlite_file as sqlite_file
from ._circuit import Circuit
from ._classify import Kind, Verdict
from ._failopen import FailOpen, LocalTicket
from ._scopes import ScopeFacts, ScopeKey
from ._store import (
    DEFAULT_MAX_SCOPES,
    Admission,
    MemoryStore,
    ScopeStatus,
    Ticket,
    Transition,
)

if TYPE_CHECKING:
    from ._config import BreakerPolicy, Suspensions

__all__ = ["SqliteStore"]

DEFAULT_TIMEOUT = 0.1
DEFAULT_REFRESH = 0.01
DEFAULT_TTL = 3600.0
DEFAULT_PROBE_LEASE = 60.0
DEFAULT_RETRY_INTERVAL = 1.0
# What the file is not, or cannot be now: serve from memory.
_UNAVAILABLE = (sqlite3.Error, OSError)
# A verdict on a ticket the file issued can only go to the file; an operator's
# clear must reach it too. Both are tried even while the file is deemed away.
_ALWAYS_TRIED = frozenset({"record", "release", "clear"})


class _SqliteTicket(Ticket):
    """A ticket holding probe slots in the file: its token names their leases."""

    __slots__ = ("token",)

    def __init__(self, ticket: Ticket, token: str) -> None:
        super().__init__(ticket.facts, ticket.seq, ticket.generations, ticket.probes, ticket.shadow)
        self.token = token


class _Transaction:
    """What `MemoryStore` takes for its lock: one write transaction on the file.

    Entering takes the thread lock, begins an immediate transaction, drops
    ended leases and brings the view up to date; leaving writes what changed
    in the view and commits, or rolls back and forgets the view.
    """

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self.mutex = threading.Lock()
        self.lease = DEFAULT_PROBE_LEASE
        self.added: list[sqlite_file.Lease] = []
        self.removed: list[tuple[ScopeKey, str]] = []
        self._entries: dict[ScopeKey, Circuit] = {}
        self._forgot: dict[str, int] = {}
        self._seq = 0

    def __enter__(self) -> None:
        self.mutex.acquire()
        try:
            self._store._begin()
        except BaseException:
            self.mutex.release()
            raise
        state = self._store._state
        self.added, self.removed = [], []
        self._entries = dict(state.entries)
        self._forgot = {name: o.forgot for name, o in state.origins.items()}
        self._seq = self._store._seq

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if kind is None:
                self._store._commit((self._entries, self._forgot, self._seq))
            else:
                self._store._rollback()
        finally:
            self.mutex.release()


_stores: weakref.WeakSet[SqliteStore] = weakref.WeakSet()


_held: list[SqliteStore] = []  # the stores whose file no thread uses across a fork


def _before_fork() -> None:
    # Holding each store's mutex, no statement is under way as the process forks,
    # so the child can close its copy of the connection cleanly.
    for store in list(_stores):
        if store._tx.mutex.acquire(timeout=store._timeout * 4):
            _held.append(store)


def _after_fork_in_parent() -> None:
    while _held:
        _held.pop()._tx.mutex.release()


def _after_fork() -> None:
    held = {id(store) for store in _held}
    _held.clear()
    for store in list(_stores):
        store._forked(idle=id(store) in held)


if hasattr(os, "register_at_fork"):  # POSIX only: elsewhere nothing forks
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork
    )


class SqliteStore(MemoryStore):
    """Circuit state in a SQLite file, shared by every process on the host that opens it.

    Args:
        path: the file (created with its tables if missing, readable by its owner only).
        fingerprint_key: the key for credential fingerprints; None takes the
            one kept in the file (made by the first store to open it), so every
            process using the file shares credential scopes.
        probe_lease: seconds a half-open probe holds its slot when its request
            has no bounded time to first byte (default 60); otherwise the
            transport passes that time. A process that dies holding a probe
            frees it when the lease ends.
        timeout: seconds an operation may wait for another process's write
            before the file is deemed away.
        refresh: on the healthy path, ask at most this often whether another
            process changed the file (0: on every request). A transition
            reaches every process within this time.
        ttl: seconds an open scope is kept past the end of its window by a
            store opening the file: a restart forgets windows long past.
        max_scopes: the most scopes kept; past it the oldest closed (else the
            oldest) scope is forgotten.
        retry_interval: while the file is away, try it again at most this often.

    A file that cannot be opened or written, stays locked past ``timeout``,
    or is not a database, never fails a request: the store serves from a
    local `MemoryStore`, emits one ``store.unavailable`` warning, and goes
    back to the file (``store.recovered``) once it works again. It needs a
    local file system (SQLite's WAL mode shares memory between processes).

    Example:
        >>> store = sidestep.SqliteStore("/var/tmp/sidestep.db")
        >>> client = httpx.Client(transport=sidestep.FailoverTransport(config, store=store))
    """

    blocking = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fingerprint_key: bytes | str | None = None,
        probe_lease: float | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        refresh: float = DEFAULT_REFRESH,
        ttl: float = DEFAULT_TTL,
        max_scopes: int = DEFAULT_MAX_SCOPES,
        retry_interval: float = DEFAULT_RETRY_INTERVAL,
    ) -> None:
        for name, value in (("timeout", timeout), ("probe_lease", probe_lease)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive")
        if refresh < 0 or retry_interval < 0 or ttl < 0:
            raise ValueError("refresh, ttl and retry_interval must not be negative")
        # Absolute: a process that changes its directory later still finds the same file.
        self._path = os.path.abspath(os.fspath(path))
        self._shared_state = f"sqlite|{self._path}"  # `store_id`'s
        self._timeout = timeout
        self._refresh = refresh
        self._ttl = ttl
        self._default_lease = probe_lease or DEFAULT_PROBE_LEASE
        self._failopen = FailOpen(
            "sqlite",
            os.path.basename(self._path),  # the file's name only: no directory in events
            max_scopes=max_scopes,
            retry_interval=retry_interval,
            claim=timeout * 4,
            always=_ALWAYS_TRIED,
            repeat=False,
        )
        self._conn: sqlite3.Connection | None = None
        # The connection open now, closed when the store is collected unclosed (an
        # open connection left to the collector is a ResourceWarning, and a handle).
        self._held: list[sqlite3.Connection | None] = [None]
        weakref.finalize(self, _close_held, self._held)
        self._file: tuple[int, int] | None = None  # the file the connection opened (device, inode)
        self._orphans: list[sqlite3.Connection] = []  # inherited through fork: never touched
        self._version = -1  # the data_version the view reflects (-1: none yet)
        self._next_poll = 0.0
        # Private test hook: windows follow the caller's `now` instead of the
        # wall clock, so fake-clock tests drive every store alike.
        self._caller_clock = False
        super().__init__(max_scopes=max_scopes, fingerprint_key=fingerprint_key)
        self._adopt_key = fingerprint_key is None  # take the key kept in the file it opens
        self._tx = _Transaction(self)
        self._lock = self._tx  # type: ignore[assignment]  # MemoryStore's steps run in it
        _stores.add(self)
        try:
            self._connection()
        except _UNAVAILABLE as exc:
            self._lost(exc)
            self._failopen.unavailable("open", exc)

    @property
    def available(self) -> bool:
        """False while the shared state is deemed away and a local stand-in serves."""
        return not self._failopen.down

    def __repr__(self) -> str:
        return f"SqliteStore({self._failopen.where!r}, scopes={len(self._state.entries)})"

    @property
    def fallbacks(self) -> int:
        """Operations that failed on the file and were served locally (or dropped)."""
        return self._failopen.fallbacks

    def __len__(self) -> int:
        """The scopes kept in the file (the local fallback's while the file is away)."""
        try:
            with self._tx:
                return len(self._state.entries)
        except _UNAVAILABLE as exc:
            self._failopen.unavailable("count", exc)
            return len(self._failopen.fallback)

    def close(self) -> None:
        """Close the file (used again, the store reopens it)."""
        with self._tx.mutex:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
                self._version = -1

    # -- the protocol ------------------------------------------------------------------

    def admit(
        self, facts: ScopeFacts, policy: BreakerPolicy, now: float, lease: float | None = None
    ) -> Admission:
        fo = self._failopen
        if fo.down and not self._retry("admit"):
            return fo.admit(facts, policy, now)
        quick = self._quick(facts)
        if fo.down:  # the file failed as the view was brought up to date
            return fo.admit(facts, policy, now)
        if quick is not None:
            return quick
        wall = self._wall(now)
        keys = facts.keys()
        try:
            with self._tx:
                self._tx.lease = lease or self._default_lease
                admission = self._admit(facts, keys, policy, wall)
        except _UNAVAILABLE as exc:
            self._lost(exc)
            fo.unavailable("admit", exc)
            return fo.admit(facts, policy, now)
        refusal = admission.refusal
        if refusal is None or wall == now:
            return admission
        moved = replace(refusal, retry_at=refusal.retry_at - wall + now)  # on the caller's clock
        return Admission(admission.ticket, moved, admission.transitions)

    def _quick(self, facts: ScopeFacts) -> Admission | None:
        """The healthy path, from the view: None when the file must be asked."""
        if self._version < 0 or time.monotonic() >= self._next_poll:
            self._poll(wait=self._version < 0)  # with no view yet, every thread waits for one
        origin = self._state.origins.get(facts.origin)
        if origin is None or not origin.unhealthy:
            return Admission(Ticket(facts, self._seq))  # nothing read, nothing written
        return None

    def record(
        self,
        ticket: Ticket,
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        now: float,
    ) -> tuple[Transition, ...]:
        if isinstance(ticket, LocalTicket):
            return ticket.store.record(ticket, verdict, policy, suspensions, now)
        try:
            return super().record(ticket, verdict, policy, suspensions, self._wall(now))
        except _UNAVAILABLE as exc:
            self._failopen.unavailable("record", exc)
            return ()  # a verdict the file issued the ticket for goes to the file or nowhere

    def release(self, ticket: Ticket) -> None:
        if isinstance(ticket, LocalTicket):
            return ticket.store.release(ticket)
        try:
            super().release(ticket)
        except _UNAVAILABLE as exc:
            self._failopen.unavailable("release", exc)  # its lease frees the slot in time

    def snapshot(self, now: float) -> list[ScopeStatus]:
        if self._failopen.down and not self._retry("snapshot"):
            return self._failopen.fallback.snapshot(now)
        wall = self._wall(now)
        try:
            statuses = super().snapshot(wall)
        except _UNAVAILABLE as exc:
            self._failopen.unavailable("snapshot", exc)
            return self._failopen.fallback.snapshot(now)
        return [replace(s, retry_at=s.retry_at - wall + now) for s in statuses]

    def clear(self, scope_id: str) -> bool:
        local = self._failopen.fallback.clear(scope_id)  # the local store may hold it too
        try:
            return super().clear(scope_id) or local
        except _UNAVAILABLE as exc:
            self._failopen.unavailable("clear", exc)
            return local

    # -- async twins: the healthy path inline, the file in a worker thread ---------------

    async def admit_async(
        self, facts: ScopeFacts, policy: BreakerPolicy, now: float, lease: float | None = None
    ) -> Admission:
        if not self._failopen.down and self._version >= 0:
            quick = self._quick(facts)  # never waits: the view exists, the poll does not queue
            if quick is not None:
                return quick
        return await anyio.to_thread.run_sync(self.admit, facts, policy, now, lease)

    async def record_async(
        self,
        ticket: Ticket,
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        now: float,
    ) -> tuple[Transition, ...]:
        if verdict.kind is Kind.SUCCESS and not ticket.probes and ticket.generations is None:
            origin = self._state.origins.get(ticket.facts.origin)
            if origin is None or not origin.unhealthy:
                return self.record(ticket, verdict, policy, suspensions, now)  # writes nothing
        return await anyio.to_thread.run_sync(
            self.record, ticket, verdict, policy, suspensions, now
        )

    async def release_async(self, ticket: Ticket) -> None:
        if not ticket.probes:
            return self.release(ticket)  # writes nothing
        await anyio.to_thread.run_sync(self.release, ticket)

    async def snapshot_async(self, now: float) -> list[ScopeStatus]:
        return await anyio.to_thread.run_sync(self.snapshot, now)

    async def clear_async(self, scope_id: str) -> bool:
        return await anyio.to_thread.run_sync(self.clear, scope_id)

    # -- probe leases: MemoryStore's steps, with the file's leases beside them ----------

    def _admit(
        self, facts: ScopeFacts, keys: tuple[ScopeKey, ...], policy: BreakerPolicy, now: float
    ) -> Admission:
        admission = super()._admit(facts, keys, policy, now)
        ticket = admission.ticket
        if ticket is None or not ticket.probes or ticket.generations is None:
            return admission
        tx = self._tx
        token = secrets.token_hex(8)  # random: processes forked from one parent never share one
        until = time.time() + tx.lease
        for key in ticket.probes:
            tx.added.append((key, token, ticket.generations[key], until))
        return Admission(_SqliteTicket(ticket, token), admission.refusal, admission.transitions)

    def _release(self, ticket: Ticket, exclude: tuple[ScopeKey, ...]) -> None:
        super()._release(ticket, exclude)
        if isinstance(ticket, _SqliteTicket):
            self._tx.removed.extend(
                (key, ticket.token) for key in ticket.probes if key not in exclude
            )

    # -- the file --------------------------------------------------------------------------

    def _wall(self, now: float) -> float:
        return now if self._caller_clock else time.time()

    def _retry(self, op: str) -> bool:
        """While the file is away: may this caller try it now? Then prove it works."""
        return self._failopen.usable(op) and self._poll(wait=True)

    def _poll(self, *, wait: bool) -> bool:
        """Bring the view up to date if another process changed the file; False if it is away."""
        self._next_poll = time.monotonic() + self._refresh
        mutex = self._tx.mutex
        if not mutex.acquire(blocking=wait):
            return True  # another thread is at the file: it brings the view up to date
        try:
            conn = self._connection()
            if sqlite_file.identity(self._path) != self._file:
                # Deleted or replaced under the store: other processes open the file
                # now at the path, so this one does too.
                self._lost(None)
                conn = self._connection()
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            if version != self._version:
                with sqlite_file.immediate(conn, "BEGIN"):
                    self._load(conn, version)
        except _UNAVAILABLE as exc:
            self._lost(exc)
            self._failopen.unavailable("admit", exc)
            return False
        finally:
            mutex.release()
        self._failopen.answered()
        return True

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        # A window that ended more than `ttl` ago is forgotten as the file is opened
        # (one that ended since lets a probe through: that it stays is right).
        forget_before = -math.inf if self._caller_clock else time.time() - self._ttl
        conn = sqlite_file.connect(self._path, self._timeout, forget_before)
        self._file = sqlite_file.identity(self._path)
        try:
            if self._adopt_key:
                # Every process on the file shares credential scopes (a file that
                # replaced the one first opened may keep another key).
                self.fingerprint._key = sqlite_file.take_key(conn).encode()
        except BaseException:
            conn.close()
            raise
        self._conn = self._held[0] = conn
        self._version = -1
        return conn

    def _begin(self) -> None:
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            ended = conn.execute("DELETE FROM leases WHERE until <= ?", (time.time(),)).rowcount
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            if ended or version != self._version:
                self._load(conn, version)
        except BaseException:
            self._rollback()
            raise

    def _load(self, conn: sqlite3.Connection, version: int) -> None:
        self._state, self._seq = sqlite_file.load(conn)
        self._version = version

    def _commit(self, before: tuple[dict[ScopeKey, Circuit], dict[str, int], int]) -> None:
        """Write what the operation changed in the view, then commit."""
        conn = self._conn
        assert conn is not None
        tx = self._tx
        try:
            ended = sqlite_file.write(conn, before, (self._state, self._seq), tx.added, tx.removed)
            conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        if ended:
            self._version = -1  # count the leases again at the next operation

    def _rollback(self) -> None:
        self._version = -1  # the view may hold what the file does not: read it again
        conn = self._conn
        if conn is None:
            return
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except _UNAVAILABLE as exc:
            self._lost(exc)

    def _lost(self, exc: BaseException | None) -> None:
        """The file failed: open it afresh next time (it may have been replaced or repaired)."""
        self._version = -1
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            return  # only busy: the connection is fine
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _forked(self, *, idle: bool) -> None:
        """In a child process: the parent's connection is never used here.

        An idle one is closed: SQLite keeps what a process knows of a file's locks
        per file, so while the copy stays open a new connection would believe it
        holds the parent's locks and take none, and the last other process to close
        would delete the WAL this child still writes to. One forked mid-statement
        (its mutex not had in time) is left alone, never closed.
        """
        conn, self._conn = self._conn, None
        self._held[0] = None  # the parent's: never closed here but when idle, below
        if conn is not None and idle:
            with contextlib.suppress(Exception):
                conn.close()
        elif conn is not None:
            self._orphans.append(conn)
        self._version = -1
        self._tx.mutex = threading.Lock()


def _close_held(held: list[sqlite3.Connection | None]) -> None:
    """Close a collected store's connection (it may be closed already: that is harmless)."""
    conn, held[0] = held[0], None
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()
