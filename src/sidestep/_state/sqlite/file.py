"""The SQLite file behind `SqliteStore`: its tables, opening it, and the statements on them.

Tables: ``scopes`` (one row per unhealthy scope: the `Circuit` fields, the
`ScopeKey` parts — no credential, only its fingerprint — its probe count and
the earliest end of their leases), ``gone`` (a tombstone per scope
forgotten), ``origins`` (when one of an origin's scopes was last
forgotten), ``leases`` (one row per probe slot taken, with its end in
wall-clock time), ``counters`` (the generation sequence, and the number of
the last change) and ``meta`` (the fingerprint key).

Every write stamps the rows it writes, and the tombstones of the rows it
deletes, with the next change number, so a reader learns what changed
since the change it last saw from those rows alone (`changes`), however
many scopes the file keeps. Tombstones older than `KEEP_TOMBSTONES` changes
are pruned; a reader further behind reads the whole file again. Many rows
are turned into values `paced` (`_common.turns`): the thread doing it lets other
threads of the process in every millisecond or so, an event loop's above all.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
from collections.abc import Iterator
from typing import Any, NamedTuple

from ..._common.scopes import ScopeKey, ScopeKind
from ..._common.turns import paced
from ..circuit import Bucket, Circuit, State

__all__ = [
    "Changes",
    "Counters",
    "Row",
    "Writer",
    "changes",
    "connect",
    "counters",
    "end_leases",
    "heartbeat",
    "identity",
    "immediate",
    "lease_end",
    "load",
    "release_lease",
    "take_key",
]

LAYOUT = 3  # PRAGMA user_version of the tables below
KEEP_TOMBSTONES = 65_536  # changes a tombstone outlives
PRUNE_EVERY = 1024  # changes between two prunings
_ALL_SCOPES = (
    "SELECT key, kind, origin, credential, detail, state, failures, generation, born,"
    " retry_at, window, reason, rate, probes, lease_end, routed FROM scopes ORDER BY born, key"
)
_SCOPES_SINCE = (
    "SELECT key, kind, origin, credential, detail, state, failures, generation, born,"
    " retry_at, window, reason, rate, probes, lease_end, routed FROM scopes WHERE change > ?"
    " ORDER BY born, key"
)
# A routed request recorded a result on the scope (`Circuit.routed`). Last, so that a
# table of layout 2 given it (`connect`) has its columns in the same order.
_ROUTED = "routed INTEGER NOT NULL DEFAULT 1"
_TABLES = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS counters (id INTEGER PRIMARY KEY CHECK (id = 0),"
    " seq INTEGER NOT NULL, change INTEGER NOT NULL, pruned INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO counters VALUES (0, 0, 0, 0)",
    "CREATE TABLE IF NOT EXISTS scopes (key TEXT PRIMARY KEY, kind TEXT NOT NULL,"
    " origin TEXT NOT NULL, credential TEXT NOT NULL, detail TEXT NOT NULL,"
    " state TEXT NOT NULL, failures INTEGER NOT NULL, generation INTEGER NOT NULL,"
    " born INTEGER NOT NULL, retry_at REAL NOT NULL, window REAL NOT NULL, reason TEXT,"
    " rate TEXT NOT NULL, probes INTEGER NOT NULL, lease_end REAL NOT NULL,"
    f" change INTEGER NOT NULL, {_ROUTED})",
    "CREATE INDEX IF NOT EXISTS scopes_by_change ON scopes (change)",
    "CREATE TABLE IF NOT EXISTS gone (key TEXT PRIMARY KEY, kind TEXT NOT NULL,"
    " origin TEXT NOT NULL, credential TEXT NOT NULL, detail TEXT NOT NULL,"
    " change INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS gone_by_change ON gone (change)",
    "CREATE TABLE IF NOT EXISTS origins (origin TEXT PRIMARY KEY, forgot INTEGER NOT NULL,"
    " change INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS origins_by_change ON origins (change)",
    "CREATE TABLE IF NOT EXISTS leases (key TEXT NOT NULL, token TEXT NOT NULL,"
    " generation INTEGER NOT NULL, until REAL NOT NULL, PRIMARY KEY (key, token))",
    "CREATE INDEX IF NOT EXISTS leases_by_end ON leases (until)",
)
# Tables of an earlier layout, made again empty (the fingerprint key in `meta` stays).
_OLD_TABLES = ("scopes", "origins", "leases", "gone", "counters")

Row = tuple[Any, ...]


class Counters(NamedTuple):
    seq: int  # the generation sequence
    change: int  # the last change committed
    pruned: int  # tombstones up to this change may be gone


class Changes(NamedTuple):
    """What changed in the file after some change: scopes written, scopes gone, origins."""

    counters: Counters
    scopes: list[tuple[ScopeKey, Circuit, float]]  # with the end of the earliest lease
    gone: list[ScopeKey]
    origins: list[tuple[str, int]]


def connect(path: str, timeout: float, forget_before: float) -> sqlite3.Connection:
    """Open the file (made readable by its owner only if missing), with its tables;
    open scopes whose window ended before `forget_before` are forgotten."""
    if not os.path.exists(path):
        # Created readable by its owner only: it may hold the fingerprint key.
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    conn = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        with immediate(conn):
            layout = conn.execute("PRAGMA user_version").fetchone()[0]
            if layout == 2:
                # Layout 2 had no routed mark: its scopes stay, each taken for a route's,
                # as nothing tells which traffic they were recorded for.
                conn.execute(f"ALTER TABLE scopes ADD COLUMN {_ROUTED}")
            elif layout != LAYOUT:
                for table in _OLD_TABLES:
                    conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(f"PRAGMA user_version = {LAYOUT}")
            for statement in _TABLES:
                conn.execute(statement)
            _forget_ended(conn, forget_before)
    except BaseException:
        conn.close()
        raise
    return conn


def _forget_ended(conn: sqlite3.Connection, before: float) -> None:
    if conn.execute(
        "SELECT 1 FROM scopes WHERE state = 'open' AND retry_at <= ? LIMIT 1", (before,)
    ).fetchone():
        change = counters(conn).change + 1
        conn.execute(
            "INSERT OR REPLACE INTO gone SELECT key, kind, origin, credential, detail, ?"
            " FROM scopes WHERE state = 'open' AND retry_at <= ?",
            (change, before),
        )
        conn.execute("DELETE FROM scopes WHERE state = 'open' AND retry_at <= ?", (before,))
        conn.execute("UPDATE counters SET change = ?", (change,))


def identity(path: str) -> tuple[int, int] | None:
    """Which file is at `path` now (device, inode); None if there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def take_key(conn: sqlite3.Connection) -> str:
    """The fingerprint key kept in the file, made by the first process to ask."""
    with immediate(conn):
        conn.execute(
            "INSERT OR IGNORE INTO meta VALUES ('fingerprint_key', ?)", (secrets.token_hex(32),)
        )
        key = conn.execute("SELECT value FROM meta WHERE name = 'fingerprint_key'").fetchone()
    return str(key[0])


# -- reading --------------------------------------------------------------------------------


def counters(conn: sqlite3.Connection) -> Counters:
    return Counters(*conn.execute("SELECT seq, change, pruned FROM counters").fetchone())


def load(
    conn: sqlite3.Connection,
) -> tuple[Counters, list[tuple[ScopeKey, Circuit, float]], list[tuple[str, int]]]:
    """Everything: the counters, every scope (oldest first) and every origin's mark."""
    found = counters(conn)
    rows = conn.execute(_ALL_SCOPES)
    scopes = [_circuit(row) for row in paced(rows)]
    origins = conn.execute("SELECT origin, forgot FROM origins").fetchall()
    return found, scopes, origins


def changes(conn: sqlite3.Connection, since: int, found: Counters) -> Changes:
    """What changed after change `since` (at most `found.change`): rows by their stamps."""
    rows = conn.execute(_SCOPES_SINCE, (since,))
    scopes = [_circuit(row) for row in paced(rows)]
    gone = [
        _key(kind, origin, credential, detail)
        for kind, origin, credential, detail in conn.execute(
            "SELECT kind, origin, credential, detail FROM gone WHERE change > ?", (since,)
        )
    ]
    origins = conn.execute("SELECT origin, forgot FROM origins WHERE change > ?", (since,))
    return Changes(found, scopes, gone, origins.fetchall())


def end_leases(conn: sqlite3.Connection, now: float) -> list[tuple[ScopeKey, int]]:
    """Drop the leases that ended by `now`: their scopes and generations, one per lease."""
    ended = conn.execute(
        "SELECT s.kind, s.origin, s.credential, s.detail, l.generation FROM leases AS l"
        " LEFT JOIN scopes AS s ON s.key = l.key WHERE l.until <= ?",
        (now,),
    ).fetchall()
    if not ended:
        return []
    conn.execute("DELETE FROM leases WHERE until <= ?", (now,))
    ended = [row for row in ended if row[0] is not None]  # a scope gone: nothing to free
    return [(_key(kind, origin, cred, detail), gen) for kind, origin, cred, detail, gen in ended]


def lease_end(conn: sqlite3.Connection, key: ScopeKey, generation: int) -> float:
    """When the earliest lease held on the scope's generation ends (0: none is held)."""
    until = conn.execute(
        "SELECT MIN(until) FROM leases WHERE key = ? AND generation = ?", (key.key, generation)
    ).fetchone()[0]
    return float(until) if until is not None else 0.0


# -- writing ----------------------------------------------------------------------------------


class Writer:
    """The statements of one write transaction, every row stamped with its change number."""

    __slots__ = ("change", "conn")

    def __init__(self, conn: sqlite3.Connection, change: int) -> None:
        self.conn = conn
        self.change = change

    def scope(self, key: ScopeKey, before: Circuit | None, c: Circuit | None) -> float:
        """Write a scope as the view holds it now (None: forgotten), its leases tidied;
        when its earliest lease ends (0: it holds none)."""
        conn, text = self.conn, key.key
        # Only a half-open scope holds leases; a new generation's slots are not an old one's.
        if before is not None and before.state is State.HALF_OPEN:
            if c is None or c.state is not State.HALF_OPEN:
                conn.execute("DELETE FROM leases WHERE key = ?", (text,))
            elif c.generation != before.generation:
                conn.execute(
                    "DELETE FROM leases WHERE key = ? AND generation <> ?", (text, c.generation)
                )
        if c is None:
            conn.execute("DELETE FROM scopes WHERE key = ?", (text,))
            conn.execute(
                "INSERT OR REPLACE INTO gone VALUES (?, ?, ?, ?, ?, ?)",
                (text, key.kind.value, key.origin, key.credential, _detail(key), self.change),
            )
            return 0.0
        ends = lease_end(conn, key, c.generation) if c.probes else 0.0
        conn.execute(
            "INSERT OR REPLACE INTO scopes VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (*_row(key, c), ends, self.change, int(c.routed)),
        )
        return ends

    def lease(self, key: ScopeKey, token: str, generation: int, until: float) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?)", (key.key, token, generation, until)
        )

    def origin(self, name: str, forgot: int | None) -> None:
        """An origin's mark as the view holds it (None: no longer kept)."""
        if forgot is None:
            self.conn.execute("DELETE FROM origins WHERE origin = ?", (name,))
        else:
            self.conn.execute(
                "INSERT OR REPLACE INTO origins VALUES (?, ?, ?)", (name, forgot, self.change)
            )

    def counters(self, seq: int) -> None:
        """The new sequence and change number; now and then, old tombstones pruned."""
        conn, change = self.conn, self.change
        if change % PRUNE_EVERY == 0 and change > KEEP_TOMBSTONES:
            horizon = change - KEEP_TOMBSTONES
            conn.execute("DELETE FROM gone WHERE change <= ?", (horizon,))
            conn.execute("UPDATE counters SET pruned = ?", (horizon,))
        conn.execute("UPDATE counters SET seq = ?, change = ?", (seq, change))


def heartbeat(conn: sqlite3.Connection, now: float) -> None:
    """A write that changes nothing the stores read: does the file take writes?"""
    conn.execute("INSERT OR REPLACE INTO meta VALUES ('written', ?)", (repr(now),))


def release_lease(conn: sqlite3.Connection, key: ScopeKey, token: str) -> bool:
    """Give a lease back; False when it was gone (ended, and counted out then)."""
    return bool(
        conn.execute("DELETE FROM leases WHERE key = ? AND token = ?", (key.key, token)).rowcount
    )


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection, begin: str = "BEGIN IMMEDIATE") -> Iterator[None]:
    """One transaction: committed if the block ends well, else rolled back."""
    conn.execute(begin)
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


# -- rows -------------------------------------------------------------------------------------


def _detail(key: ScopeKey) -> str:
    return key.model or key.endpoint


def _key(kind: str, origin: str, credential: str, detail: str) -> ScopeKey:
    k = ScopeKind(kind)
    if k is ScopeKind.ENDPOINT:
        return ScopeKey(k, origin, credential, endpoint=detail)
    return ScopeKey(k, origin, credential, detail)


def _row(key: ScopeKey, c: Circuit) -> Row:
    rate = ";".join(f"{b.index}:{b.successes}:{b.failures}" for b in c.rate)
    return (
        key.key,
        key.kind.value,
        key.origin,
        key.credential,
        _detail(key),
        c.state.value,
        c.failures,
        c.generation,
        c.born,
        c.retry_at,
        c.window,
        c.reason,
        rate,
        c.probes,
    )


def _circuit(row: Row) -> tuple[ScopeKey, Circuit, float]:
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
        probes,
        ends,
        routed,
    ) = row
    buckets = tuple(Bucket(*(int(n) for n in part.split(":"))) for part in rate.split(";") if part)
    c = Circuit(
        state=State(state),
        failures=failures,
        generation=gen,
        born=born,
        retry_at=retry_at,
        window=window,
        reason=reason,
        probes=probes,
        rate=buckets,
        routed=bool(routed),
    )
    return _key(kind, origin, credential, detail), c, ends
