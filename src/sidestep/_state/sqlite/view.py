"""`SqliteStore`'s view of its file: following the file, and the transactions that write it.

The view is `MemoryStore`'s own state. It follows the file by change
numbers (``file``): catching up reads only the rows changed since the
change it reflects, and a write transaction — the lock `MemoryStore`'s
steps run under (``transaction``) — begins by catching up, lets the step
change the view, and writes the rows of the scopes the step touched, stamped
with the next change. Probe slots are the file's leases beside the view: a
ticket holding probes carries the token naming them, and a lease past its
end frees its slot in the next transaction. Across a fork (``fork``), a
child never uses its parent's connection.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import sqlite3
import threading
import time
import weakref
from typing import TYPE_CHECKING

from ..._common.scopes import ScopeFacts, ScopeKey, ScopeKind
from ..._common.turns import paced
from .. import circuit
from ..circuit import Circuit, State
from ..kept import Origin, Scopes
from ..memory import MemoryStore
from ..protocol import Admission, Ticket
from . import file as sqlite_file
from .fork import register
from .transaction import Transaction, View

if TYPE_CHECKING:
    from ..._settings.policies import BreakerPolicy
    from ..failopen import FailOpen

__all__ = ["UNAVAILABLE", "FileView"]

# What the file is not, or cannot be now: serve from memory.
UNAVAILABLE = (sqlite3.Error, OSError)


class _SqliteTicket(Ticket):
    """A ticket holding probe slots in the file: its token names their leases."""

    __slots__ = ("token",)

    def __init__(self, ticket: Ticket, token: str) -> None:
        super().__init__(ticket.facts, ticket.seq, ticket.generations, ticket.probes, ticket.shadow)
        self.token = token


class FileView(MemoryStore):
    """A `MemoryStore` whose state is a view of a SQLite file, and whose lock is a write
    transaction on it (`SqliteStore` puts the protocol on top)."""

    def __init__(
        self,
        path: str,
        *,
        fingerprint_key: bytes | str | None,
        timeout: float,
        refresh: float,
        ttl: float,
        max_scopes: int,
        failopen: FailOpen,
    ) -> None:
        self._path = path
        self._shared_state = f"sqlite|{self._path}"  # `store_id`'s
        self._timeout = timeout
        self._refresh = refresh
        self._ttl = ttl
        self._failopen = failopen
        self._conn: sqlite3.Connection | None = None
        # The connection open now, closed when the store is collected unclosed (an
        # open connection left to the collector is a ResourceWarning, and a handle).
        self._held: list[sqlite3.Connection | None] = [None]
        weakref.finalize(self, _close_held, self._held)
        self._file: tuple[int, int] | None = None  # the file the connection opened (device, inode)
        self._orphans: list[sqlite3.Connection] = []  # inherited through fork: never touched
        self._version = -1  # the data_version last seen on this connection
        self._change = -1  # the file's change the view reflects (-1: no view)
        self._ends: dict[ScopeKey, float] = {}  # half-open scopes: when their first lease ends
        self._next_poll = 0.0
        # Private test hook: windows follow the caller's `now` instead of the
        # wall clock, so fake-clock tests drive every store alike.
        self._caller_clock = False
        super().__init__(max_scopes=max_scopes, fingerprint_key=fingerprint_key)
        self._view = View()
        self._state = Scopes(entries=self._view)
        self._kept = self._view
        self._adopt_key = fingerprint_key is None  # take the key kept in the file it opens
        self._tx = Transaction(self)
        self._lock = self._tx  # type: ignore[assignment]  # MemoryStore's steps run in it
        register(self)

    def close(self) -> None:
        """Close the file (used again, the store reopens it)."""
        with self._tx.mutex:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
                self._version = self._change = -1

    @property
    def changes(self) -> int | None:
        return None  # the file may have changed since the view last read it

    # -- MemoryStore's steps, with the file's leases and marks beside the view ----------

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
            tx.leases.append((key, token, ticket.generations[key], until))
        return Admission(_SqliteTicket(ticket, token), admission.refusal, admission.transitions)

    def _release(self, ticket: Ticket, exclude: tuple[ScopeKey, ...]) -> None:
        if isinstance(ticket, _SqliteTicket) and self._conn is not None:
            # A lease that ended already was counted out then: its slot is not freed twice.
            conn, token = self._conn, ticket.token
            ended = tuple(
                key
                for key in ticket.probes
                if key not in exclude and not sqlite_file.release_lease(conn, key, token)
            )
            exclude = (*exclude, *ended)
        super()._release(ticket, exclude)

    def _forget(self, key: ScopeKey) -> None:
        super()._forget(key)
        self._tx.origins.add(key.origin)

    def _clear(self, scope_id: str, key: ScopeKey | None) -> bool:
        if key is None or key not in self._state.entries:
            # another process's scope, read in as the write began
            key = next((k for k in self._state.entries if k.scope_id == scope_id), None)
        return super()._clear(scope_id, key)

    def _prune_origins(self) -> None:
        before = set(self._state.origins)
        super()._prune_origins()
        self._tx.origins |= before - self._state.origins.keys()

    # -- the view and the file ------------------------------------------------------------

    def _wall(self, now: float) -> float:
        return now if self._caller_clock else time.time()

    def _poll(self, *, wait: bool) -> bool:
        """Bring the view up to date if another process changed the file; False if it is away.

        Reading works while writing may not: only a write (`_commit`) tells the file is back.
        """
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
            if version != self._version or self._change < 0:
                with sqlite_file.immediate(conn, "BEGIN"):
                    self._follow(conn)
                self._version = version
        except UNAVAILABLE as exc:
            self._lost(exc)
            self._failopen.unavailable("admit", exc)
            return False
        finally:
            mutex.release()
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
        self._version = self._change = -1
        return conn

    def _follow(self, conn: sqlite3.Connection) -> None:
        """Bring the view up to date, inside a transaction: what changed since it, or all."""
        found = sqlite_file.counters(conn)
        if self._change < 0 or found.pruned > self._change or found.change < self._change:
            self._reload(conn)
            return
        if found.change != self._change:
            news = sqlite_file.changes(conn, self._change, found)
            for key in news.gone:
                self._take(key, None, 0.0)
            for key, c, ends in paced(news.scopes):
                self._take(key, c, ends)
            origins = self._state.origins
            for name, forgot in news.origins:
                origins.setdefault(name, Origin()).forgot = forgot
        self._seq, self._change = found.seq, found.change

    def _reload(self, conn: sqlite3.Connection) -> None:
        """The whole file as a new view (its first reading, or after the view went wrong)."""
        found, scopes, marks = sqlite_file.load(conn)
        entries = View()
        state = Scopes(entries=entries)
        ends: dict[ScopeKey, float] = {}
        for key, c, end in paced(scopes):
            dict.__setitem__(entries, key, c)
            kept = state.origins.setdefault(key.origin, Origin())
            kept.unhealthy += 1
            if key.kind is ScopeKind.ORIGIN:
                kept.key = key
            if end:
                ends[key] = end
        for name, forgot in marks:
            state.origins.setdefault(name, Origin()).forgot = forgot
        self._state, self._kept, self._view, self._ends = state, entries, entries, ends
        self._seq, self._change = found.seq, found.change

    def _take(self, key: ScopeKey, c: Circuit | None, ends: float) -> None:
        """One scope as the file has it now (None: forgotten) into the view."""
        entries, origins = self._state.entries, self._state.origins
        had = key in entries
        if c is None:
            if had:
                dict.__delitem__(entries, key)
                origins[key.origin].unhealthy -= 1
        else:
            if not had:
                kept = origins.setdefault(key.origin, Origin())
                kept.unhealthy += 1
                if key.kind is ScopeKind.ORIGIN:
                    kept.key = key
            dict.__setitem__(entries, key, c)
        if ends:
            self._ends[key] = ends
        else:
            self._ends.pop(key, None)

    def _begin(self, tx: Transaction) -> None:
        conn = self._connection()
        if self._change < 0:
            # No view: the whole file is read before taking the write lock, not holding it.
            with sqlite_file.immediate(conn, "BEGIN"):
                self._follow(conn)
        conn.execute("BEGIN IMMEDIATE")
        tx.leases, tx.origins, tx.heartbeat, tx.seq = [], set(), False, -1
        try:
            self._follow(conn)
            tx.seq = self._seq
            entries = self._view
            entries.touched = {}
            for key, generation in sqlite_file.end_leases(conn, time.time()):
                c = entries.get(key)
                if c is not None:  # written again, with the end of its next lease
                    # a probe whose lease ended: its slot is free
                    entries[key] = circuit.release(c) if c.generation == generation else c
        except BaseException:
            self._rollback(tx)
            raise

    def _commit(self, tx: Transaction) -> None:
        """Write the rows the step touched, each stamped with the next change, and commit."""
        conn = self._conn
        assert conn is not None
        state = self._state
        touched = self._view.touched or {}
        change = self._change
        try:
            if touched or tx.leases or tx.origins or self._seq != tx.seq:
                writer = sqlite_file.Writer(conn, change + 1)
                for lease in tx.leases:
                    writer.lease(*lease)
                for key, before in touched.items():
                    c = state.entries.get(key)
                    ends = writer.scope(key, before, c)
                    if ends and c is not None and c.state is State.HALF_OPEN:
                        self._ends[key] = ends
                    else:
                        self._ends.pop(key, None)
                for name in tx.origins:
                    kept = state.origins.get(name)
                    writer.origin(name, kept.forgot if kept is not None else None)
                writer.counters(self._seq)
                change = writer.change
            if tx.heartbeat:
                sqlite_file.heartbeat(conn, time.time())
            conn.execute("COMMIT")
        except BaseException:
            self._rollback(tx)
            raise
        if change != self._change or tx.heartbeat:
            self._change = change
            self._failopen.answered()  # a write went through: the file is back, if it was away

    def _rollback(self, tx: Transaction) -> None:
        if self._view.touched or tx.origins or (tx.seq >= 0 and self._seq != tx.seq):
            self._change = -1  # the view holds what the file does not: read it all again
        conn = self._conn
        if conn is None:
            return
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except UNAVAILABLE as exc:
            self._lost(exc)

    def _lost(self, exc: BaseException | None) -> None:
        """The file failed: open it afresh next time (it may have been replaced or repaired)."""
        self._version = -1
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            return  # only busy: the connection, and the view, are fine
        self._change = -1
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
        self._version = self._change = -1
        self._tx.mutex = threading.Lock()


def _close_held(held: list[sqlite3.Connection | None]) -> None:
    """Close a collected store's connection (it may be closed already: that is harmless)."""
    conn, held[0] = held[0], None
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()
