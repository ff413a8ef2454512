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
from collections.abc import Iterator
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from ._circuit import Bucket, Circuit, State
from ._classify import Kind, Verdict
from ._failopen import FailOpen, LocalTicket
from ._scopes import ScopeFacts, ScopeKey, ScopeKind
from ._store import (
    DEFAULT_MAX_SCOPES,
    Admission,
    MemoryStore,
    ScopeStatus,
    Ticket,
    Transition,
    _Origin,
    _Scopes,
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

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS scopes (
    key TEXT PRIMARY KEY, kind TEXT NOT NULL, origin TEXT NOT NULL, credential TEXT NOT NULL,
    detail TEXT NOT NULL, state TEXT NOT NULL, failures INTEGER NOT NULL,
    generation INTEGER NOT NULL, born INTEGER NOT NULL, retry_at REAL NOT NULL,
    window REAL NOT NULL, reason TEXT, rate TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS origins (origin TEXT PRIMARY KEY, forgot INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
    key TEXT NOT NULL, token TEXT NOT NULL, generation INTEGER NOT NULL, until REAL NOT NULL,
    PRIMARY KEY (key, token)
);
"""

_Row = tuple[Any, ...]


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
        self.added: list[tuple[ScopeKey, str, int, float]] = []
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
                self._store._commit(self._entries, self._forgot, self._seq, self)
            else:
                self._store._rollback()
        finally:
            self.mutex.release()


_stores: weakref.WeakSet[SqliteStore] = weakref.WeakSet()


def _after_fork() -> None:
    for store in list(_stores):
        store._forked()


os.register_at_fork(after_in_child=_after_fork)


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
        self._path = os.fspath(path)
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
        self._orphans: list[sqlite3.Connection] = []  # inherited through fork: never touched
        self._version = -1  # the data_version the view reflects (-1: none yet)
        self._next_poll = 0.0
        # Private test hook: windows follow the caller's `now` instead of the
        # wall clock, so fake-clock tests drive every store alike.
        self._caller_clock = False
        super().__init__(max_scopes=max_scopes, fingerprint_key=fingerprint_key)
        self._adopt_key = fingerprint_key is None  # take the key kept in the file, once open
        self._tx = _Transaction(self)
        self._lock = self._tx  # type: ignore[assignment]  # MemoryStore's steps run in it
        _stores.add(self)
        try:
            self._connection()
        except _UNAVAILABLE as exc:
            self._lost(exc)
            self._failopen.unavailable("open", exc)

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
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            if version != self._version:
                with _immediate(conn, "BEGIN"):
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
        if not os.path.exists(self._path):
            # Created readable by its owner only: it may hold the fingerprint key.
            os.close(os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600))
        conn = sqlite3.connect(
            self._path, timeout=self._timeout, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            with _immediate(conn):
                # A window that ended more than `ttl` ago is forgotten as the file is opened
                # (one that ended since would let a probe through: that it stays is right).
                now = -math.inf if self._caller_clock else time.time()
                conn.execute(
                    "DELETE FROM scopes WHERE state = 'open' AND retry_at <= ?", (now - self._ttl,)
                )
            if self._adopt_key:
                self._take_key(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._version = -1
        return conn

    def _take_key(self, conn: sqlite3.Connection) -> None:
        """Adopt the fingerprint key kept in the file, made by the first process to open it,
        so that every process on the file shares credential scopes."""
        with _immediate(conn):
            conn.execute(
                "INSERT OR IGNORE INTO meta VALUES ('fingerprint_key', ?)", (secrets.token_hex(32),)
            )
            key = conn.execute("SELECT value FROM meta WHERE name = 'fingerprint_key'").fetchone()
        self.fingerprint._key = key[0].encode()
        self._adopt_key = False

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
        """Read the whole file into a fresh view (only unhealthy scopes are kept: few)."""
        leases: dict[tuple[str, int], int] = {}
        for key, generation, count in conn.execute(
            "SELECT key, generation, COUNT(*) FROM leases WHERE until > ? GROUP BY key, generation",
            (time.time(),),
        ):
            leases[key, generation] = count
        state = _Scopes()
        for row in conn.execute("SELECT * FROM scopes ORDER BY born, rowid"):
            key, c = _circuit(row)
            if c.state is State.HALF_OPEN:
                c = replace(c, probes=leases.get((row[0], c.generation), 0))
            state.entries[key] = c
            state.origins.setdefault(key.origin, _Origin()).unhealthy += 1
        for origin, forgot in conn.execute("SELECT origin, forgot FROM origins"):
            state.origins.setdefault(origin, _Origin()).forgot = forgot
        seq = conn.execute("SELECT value FROM meta WHERE name = 'seq'").fetchone()
        self._seq = int(seq[0]) if seq else 0
        self._state = state
        self._version = version

    def _commit(
        self,
        entries: dict[ScopeKey, Circuit],
        forgot: dict[str, int],
        seq: int,
        tx: _Transaction,
    ) -> None:
        """Write what the operation changed in the view, then commit."""
        conn = self._conn
        assert conn is not None
        try:
            state = self._state
            for key, c in state.entries.items():
                before = entries.get(key)
                if before is c:
                    continue
                if before is None or _row(key, before) != _row(key, c):
                    conn.execute(
                        "INSERT OR REPLACE INTO scopes VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        _row(key, c),
                    )
                if c.state is not State.HALF_OPEN:
                    conn.execute("DELETE FROM leases WHERE key = ?", (key.key,))
                elif before is None or before.generation != c.generation:
                    conn.execute(
                        "DELETE FROM leases WHERE key = ? AND generation <> ?",
                        (key.key, c.generation),
                    )
            for key in entries.keys() - state.entries.keys():
                conn.execute("DELETE FROM scopes WHERE key = ?", (key.key,))
                conn.execute("DELETE FROM leases WHERE key = ?", (key.key,))
            for name, origin in state.origins.items():
                if forgot.get(name) != origin.forgot:
                    conn.execute(
                        "INSERT OR REPLACE INTO origins VALUES (?, ?)", (name, origin.forgot)
                    )
            for name in forgot.keys() - state.origins.keys():
                conn.execute("DELETE FROM origins WHERE origin = ?", (name,))
            if self._seq != seq:
                conn.execute("INSERT OR REPLACE INTO meta VALUES ('seq', ?)", (str(self._seq),))
            for key, token, generation, until in tx.added:
                conn.execute(
                    "INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?)",
                    (key.key, token, generation, until),
                )
            freed = set()
            for key, token in tx.removed:
                gone = conn.execute(
                    "DELETE FROM leases WHERE key = ? AND token = ?", (key.key, token)
                ).rowcount
                if not gone:
                    freed.add(key)  # its lease had ended: the count was lowered already
            conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        if freed:
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

    def _forked(self) -> None:
        """In a child process: the parent's connection is never used (nor closed) here."""
        if self._conn is not None:
            self._orphans.append(self._conn)
        self._conn = None
        self._version = -1
        self._tx.mutex = threading.Lock()


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection, begin: str = "BEGIN IMMEDIATE") -> Iterator[None]:
    """One transaction: committed if the block ends well, else rolled back."""
    conn.execute(begin)
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _row(key: ScopeKey, c: Circuit) -> _Row:
    rate = ";".join(f"{b.index}:{b.successes}:{b.failures}" for b in c.rate)
    return (
        key.key,
        key.kind.value,
        key.origin,
        key.credential,
        key.model or key.endpoint,
        c.state.value,
        c.failures,
        c.generation,
        c.born,
        c.retry_at,
        c.window,
        c.reason,
        rate,
    )


def _circuit(row: _Row) -> tuple[ScopeKey, Circuit]:
    (
        _,
        kind,
        origin,
        credential,
        detail,
        state,
        failures,
        gen,
        born,
        retry_at,
        window,
        reason,
        rate,
    ) = row
    k = ScopeKind(kind)
    if k is ScopeKind.ENDPOINT:
        key = ScopeKey(k, origin, credential, endpoint=detail)
    else:
        key = ScopeKey(k, origin, credential, detail)
    buckets = tuple(Bucket(*(int(n) for n in part.split(":"))) for part in rate.split(";") if part)
    return key, Circuit(
        state=State(state),
        failures=failures,
        generation=gen,
        born=born,
        retry_at=retry_at,
        window=window,
        reason=reason,
        rate=buckets,
    )
