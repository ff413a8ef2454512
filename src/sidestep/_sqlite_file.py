"""The SQLite file behind `SqliteStore`: its tables, opening it, reading a view, writing changes.

Tables: ``scopes`` (one row per unhealthy scope: the `Circuit` fields and
the `ScopeKey` parts; no credential, only its fingerprint), ``origins``
(when one of an origin's scopes was last forgotten), ``leases`` (one row
per probe slot taken, with its end in wall-clock time) and ``meta`` (the
generation sequence, the fingerprint key).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from ._circuit import Bucket, Circuit, State
from ._scopes import ScopeKey, ScopeKind
from ._store import _Origin, _Scopes

__all__ = ["Lease", "connect", "identity", "immediate", "load", "take_key", "write"]

Lease = tuple[ScopeKey, str, int, float]  # scope, token, generation, end (wall clock)
_Row = tuple[Any, ...]

SCHEMA = """
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
        conn.executescript(SCHEMA)
        with immediate(conn):
            conn.execute(
                "DELETE FROM scopes WHERE state = 'open' AND retry_at <= ?", (forget_before,)
            )
    except BaseException:
        conn.close()
        raise
    return conn


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


def load(conn: sqlite3.Connection) -> tuple[_Scopes, int]:
    """The whole file as a view and its sequence (only unhealthy scopes are kept: few).

    A half-open scope's probe count is its leases that have not ended.
    """
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
    return state, int(seq[0]) if seq else 0


def write(
    conn: sqlite3.Connection,
    before: tuple[dict[ScopeKey, Circuit], dict[str, int], int],
    after: tuple[_Scopes, int],
    added: list[Lease],
    removed: list[tuple[ScopeKey, str]],
) -> bool:
    """Write what changed between two views, with the leases taken and given back.

    True when a lease given back had ended already: its scope's count was
    lowered twice in the view, which must be read again.
    """
    entries, forgot, seq = before
    state, new_seq = after
    for key, c in state.entries.items():
        old = entries.get(key)
        if old is c:
            continue
        if old is None or _row(key, old) != _row(key, c):
            conn.execute(
                "INSERT OR REPLACE INTO scopes VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", _row(key, c)
            )
        if c.state is not State.HALF_OPEN:
            conn.execute("DELETE FROM leases WHERE key = ?", (key.key,))
        elif old is None or old.generation != c.generation:
            conn.execute(
                "DELETE FROM leases WHERE key = ? AND generation <> ?", (key.key, c.generation)
            )
    for key in entries.keys() - state.entries.keys():
        conn.execute("DELETE FROM scopes WHERE key = ?", (key.key,))
        conn.execute("DELETE FROM leases WHERE key = ?", (key.key,))
    for name, origin in state.origins.items():
        if forgot.get(name) != origin.forgot:
            conn.execute("INSERT OR REPLACE INTO origins VALUES (?, ?)", (name, origin.forgot))
    for name in forgot.keys() - state.origins.keys():
        conn.execute("DELETE FROM origins WHERE origin = ?", (name,))
    if new_seq != seq:
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('seq', ?)", (str(new_seq),))
    for key, token, generation, until in added:
        conn.execute(
            "INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?)", (key.key, token, generation, until)
        )
    ended = False
    for key, token in removed:
        gone = conn.execute(
            "DELETE FROM leases WHERE key = ? AND token = ?", (key.key, token)
        ).rowcount
        ended = ended or not gone
    return ended


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
