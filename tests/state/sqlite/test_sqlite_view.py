"""`SqliteStore`'s view of the file: what each operation reads and writes, whatever the file keeps.

The statements a connection runs are watched through SQLite's trace callback,
so these tests count work, never time it.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from sidestep._answers.classify import Kind, Verdict
from sidestep._common.scopes import ScopeFacts, ScopeKind
from sidestep._settings.policies import BreakerPolicy, Suspensions
from sidestep._state.circuit import State
from sidestep._state.sqlite import file as sqlite_file
from sidestep._state.sqlite import store as sqlite_store
from sidestep._state.sqlite import view as sqlite_view
from sidestep._state.sqlite.loop import _Handoff
from sidestep._state.sqlite.store import SqliteStore
from upstream import wait_for

OK = Verdict(Kind.SUCCESS, None, None, failover=False)
FAIL = Verdict(Kind.FAILURE, "unavailable", ScopeKind.MODEL, failover=True)
CONNECT_FAIL = Verdict(Kind.FAILURE, "unavailable", ScopeKind.ORIGIN, failover=True)
P = BreakerPolicy(failure_threshold=2, cooldown=600, max_cooldown=600)
SUSPENSIONS = Suspensions()
KEPT = 300  # scopes the file keeps in these tests: every operation below must not read them all


def origin(i: int) -> str:
    return f"https://h{i}.example:443"


def facts(store: SqliteStore, at: str = origin(0), model: str = "m") -> ScopeFacts:
    return ScopeFacts(
        at,
        headers={"authorization": "Bearer k1"},
        userinfo="",
        body=f'{{"model": "{model}"}}'.encode(),
        fingerprint=store.fingerprint,
    )


def fail(store: SqliteStore, at: str, verdict: Verdict = CONNECT_FAIL, model: str = "m") -> None:
    """Fail `at` until the file holds it open."""
    for _ in range(P.failure_threshold):
        ticket = store.admit(facts(store, at, model), P, 0).ticket
        assert ticket is not None
        store.record(ticket, verdict, P, SUSPENSIONS, 0)


class Statements:
    """The statements a store's connection runs while watched, and the threads that ran them."""

    def __init__(self, store: SqliteStore) -> None:
        conn = store._conn
        assert conn is not None
        self.conn = conn
        self.seen: list[tuple[str, int]] = []
        conn.set_trace_callback(self._saw)

    def _saw(self, statement: str) -> None:
        self.seen.append((statement, threading.get_ident()))

    @property
    def text(self) -> list[str]:
        return [s for s, _ in self.seen]

    def writes(self) -> list[str]:
        return [s for s in self.text if s.split()[0] in {"INSERT", "UPDATE", "DELETE"}]

    def clear(self) -> None:
        self.seen.clear()


@pytest.fixture
def kept(tmp_path: Path) -> Path:
    """A file keeping KEPT open scopes, one per origin h1 … h300 (h0 is left healthy)."""
    path = tmp_path / "s.db"
    store = SqliteStore(path, refresh=0)
    for i in range(1, KEPT + 1):
        fail(store, origin(i))
    assert len(store) == KEPT
    store.close()
    return path


def test_a_refusal_runs_no_statement_and_waits_for_no_writer(kept: Path) -> None:
    """A request to an origin the file holds open is refused from the view: no statement at all, even while another connection holds the write lock past `timeout`."""
    store = SqliteStore(kept, refresh=3600, timeout=0.05)
    assert store.admit(facts(store, origin(0)), P, 0).ticket is not None  # the file read
    holder = sqlite3.connect(kept, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    watched = Statements(store)
    for i in range(1, 51):
        assert store.admit(facts(store, origin(i)), P, 0).ticket is None
    assert watched.text == []
    assert store.fallbacks == 0
    holder.execute("ROLLBACK")
    holder.close()


def test_an_open_origins_refusal_is_made_on_the_callers_clock_once(
    kept: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal of an origin the file holds open comes on the caller's clock, made once and shared while the offset between that clock and the wall clock stands (to a millisecond); on a clock further behind, its end moves with it."""
    wall, steady = time.time(), time.monotonic

    class Wall:
        time = staticmethod(lambda: wall)  # the wall clock stands still
        monotonic = staticmethod(steady)

    monkeypatch.setattr(sqlite_view, "time", Wall)
    monkeypatch.setattr(sqlite_store, "time", Wall)
    store = SqliteStore(kept, refresh=3600)
    (status,) = [s for s in store.snapshot(wall) if s.scope.origin == origin(1)]
    first = store.admit(facts(store, origin(1)), P, 100.0)
    assert first.ticket is None and first.refusal is not None
    assert first.refusal.retry_at == pytest.approx(status.retry_at - wall + 100.0)
    assert store.admit(facts(store, origin(1)), P, 100.0) is first
    assert store.admit(facts(store, origin(1)), P, 100.0005) is first
    later = store.admit(facts(store, origin(1)), P, 200.0)
    assert later.refusal is not None and later is not first
    assert later.refusal.retry_at == pytest.approx(first.refusal.retry_at + 100.0)


def test_a_verdict_that_changes_nothing_is_not_written(kept: Path) -> None:
    """A success on an origin that has another model's scope open, and a failure on a scope open already, write nothing."""
    store = SqliteStore(kept, refresh=3600)
    fail(store, origin(0), FAIL, model="other")  # h0's model scope "other" open
    watched = Statements(store)
    ticket = store.admit(facts(store, origin(0), "m"), P, 0).ticket
    assert ticket is not None and ticket.generations is not None  # the keys were looked at
    assert store.record(ticket, OK, P, SUSPENSIONS, 0) == ()
    assert watched.text == []


def test_a_write_reads_and_writes_only_the_rows_it_touches(kept: Path) -> None:
    """With 300 scopes kept, a failure that opens a new scope writes that scope's row (and the counters) alone, and reads no scope but what changed since."""
    store = SqliteStore(kept, refresh=3600)
    assert store.admit(facts(store, origin(0)), P, 0).ticket is not None
    watched = Statements(store)
    fail(store, origin(0))
    scope_writes = [s for s in watched.writes() if "INTO scopes" in s]
    assert len(scope_writes) == P.failure_threshold  # one row per verdict
    assert not [s for s in watched.text if "FROM scopes ORDER BY" in s]  # no whole-file read
    assert len(store) == KEPT + 1


def test_another_processs_changes_are_read_by_their_change_numbers(kept: Path) -> None:
    """A store learns what another wrote — a scope opened, a scope healed and forgotten — from the rows changed since it last looked (tombstones tell the deletions), never by reading the file again."""
    one = SqliteStore(kept, refresh=0)
    two = SqliteStore(kept, refresh=0)
    assert one.admit(facts(one, origin(0)), P, 0).ticket is not None  # a view of the file
    watched = Statements(one)
    fail(two, origin(0))  # opened by the other store
    assert one.admit(facts(one, origin(0)), P, 0).ticket is None
    assert two.clear(next(s.scope_id for s in two.snapshot(0) if s.scope.origin == origin(5)))
    assert one.admit(facts(one, origin(5)), P, 0).ticket is not None  # forgotten there too
    assert len(one._state.entries) == KEPT
    reads = [s for s in watched.text if s.startswith("SELECT")]
    assert reads and all("change > " in s or "FROM counters" in s for s in reads), reads
    assert one.fallbacks == two.fallbacks == 0


def test_a_store_behind_the_pruned_tombstones_reads_the_whole_file(
    kept: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tombstones are kept for a bounded number of changes; a store that has not looked since before the oldest reads the file whole, and so still forgets what was deleted."""
    monkeypatch.setattr(sqlite_file, "KEEP_TOMBSTONES", 4)
    monkeypatch.setattr(sqlite_file, "PRUNE_EVERY", 2)
    behind = SqliteStore(kept, refresh=3600)
    assert behind.admit(facts(behind, origin(3)), P, 0).ticket is None  # a view: h3 open
    other = SqliteStore(kept, refresh=0)
    for status in other.snapshot(0)[:10]:
        assert other.clear(status.scope_id)  # ten changes, each a tombstone
    conn = other._conn
    assert conn is not None
    assert conn.execute("SELECT pruned FROM counters").fetchone()[0] > behind._change
    watched = Statements(behind)
    behind._next_poll = 0.0
    for i in range(1, 11):
        assert behind.admit(facts(behind, origin(i)), P, 0).ticket is not None
    assert any("FROM scopes ORDER BY" in s for s in watched.text)  # read whole
    assert len(behind._state.entries) == KEPT - 10


def test_an_ended_lease_frees_its_slot_though_refusals_come_from_the_view(tmp_path: Path) -> None:
    """A half-open scope whose only probe slot is held refuses from the view; once that probe's lease ends (its holder gone), the next request takes the slot."""
    policy = BreakerPolicy(failure_threshold=2, cooldown=1, max_cooldown=60, half_open_probes=1)
    store = SqliteStore(tmp_path / "s.db", refresh=0)
    store._caller_clock = True
    for _ in range(2):
        ticket = store.admit(facts(store), policy, 0).ticket
        assert ticket is not None
        store.record(ticket, FAIL, policy, SUSPENSIONS, 0)
    held = store.admit(facts(store), policy, 2, lease=0.05).ticket  # its holder will vanish
    assert held is not None and held.probes
    watched = Statements(store)
    assert store.admit(facts(store), policy, 2).ticket is None  # full: from the view
    assert watched.writes() == []

    def probes() -> bool:
        ticket = store.admit(facts(store), policy, 2).ticket
        return ticket is not None and bool(ticket.probes)

    wait_for(probes)
    (status,) = store.snapshot(2)
    assert status.state is State.HALF_OPEN


def test_an_earlier_layout_is_made_again_keeping_the_fingerprint_key(tmp_path: Path) -> None:
    """A file written by an earlier layout of the tables (no change numbers) is made again, empty, when opened; the fingerprint key kept in it stays."""
    path = tmp_path / "s.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO meta VALUES ('fingerprint_key', 'kept')")
    conn.execute("CREATE TABLE scopes (key TEXT PRIMARY KEY, kind TEXT NOT NULL)")
    conn.execute("INSERT INTO scopes VALUES ('x', 'origin')")
    conn.close()
    store = SqliteStore(path)
    assert len(store) == 0 and store.fallbacks == 0
    assert store.fingerprint._key == b"kept"
    fail(store, origin(1))
    assert len(SqliteStore(path)) == 1


@pytest.mark.anyio
async def test_the_event_loop_never_reads_the_file(kept: Path) -> None:
    """Async admissions on healthy and open origins, while another store keeps changing the file: no statement ever runs on the event loop's thread, and what the other store opened is refused within a few refreshes."""
    store = SqliteStore(kept, refresh=0)
    await store.admit_async(facts(store, origin(0)), P, 0)  # the first view, read in a thread
    other = SqliteStore(kept, refresh=0)
    watched = Statements(store)
    loop_thread = threading.get_ident()
    for i in range(1, 40):
        assert (await store.admit_async(facts(store, origin(i)), P, 0)).ticket is None
        healthy = await store.admit_async(facts(store, origin(KEPT + i)), P, 0)
        assert healthy.ticket is not None
        fail(other, origin(KEPT + 100 + i))  # a change: the store's worker catches up
        await anyio.lowlevel.checkpoint()
    fail(other, origin(0))

    async def refused() -> bool:
        return (await store.admit_async(facts(store, origin(0)), P, 0)).ticket is None

    with anyio.fail_after(10):
        while not await refused():  # noqa: ASYNC110  # the worker thread's catching up
            await anyio.sleep(0.01)
    assert watched.seen, "the worker read nothing"
    assert all(thread != loop_thread for _, thread in watched.seen)
    assert store.fallbacks == 0


def test_a_probe_abandoned_across_close_is_still_given_back(tmp_path: Path) -> None:
    """An async admission whose caller gives up after its thread took the only probe slot,
    the store closed meanwhile: while the closed store's worker still runs, the worker
    gives the slot back at once (rather than when its lease ends); once it has ended, the
    hand-off gives the ticket to its caller to give back (it starts no thread)."""
    policy = BreakerPolicy(failure_threshold=2, cooldown=1, max_cooldown=60, half_open_probes=1)
    store = SqliteStore(tmp_path / "s.db", refresh=0)
    store._caller_clock = True
    for _ in range(2):
        ticket = store.admit(facts(store), policy, 0).ticket
        assert ticket is not None
        store.record(ticket, FAIL, policy, SUSPENSIONS, 0)
    handoff = _Handoff(store, store._worker)  # as `admit_in_thread` makes it
    taken = handoff.admit(facts(store), policy, 2, 3600.0).ticket  # the thread's answer
    assert taken is not None and taken.probes
    worker = store._worker
    store.close()  # the application shuts down while the caller still waits
    left = handoff.abandon()  # then the caller is cancelled
    if left is not None:  # the worker had ended already
        assert left is taken and worker._thread is not None
        assert not worker._thread.is_alive()
        store.release(left)  # as `admit_in_thread` does, in a worker thread

    def probes() -> bool:
        ticket = store.admit(facts(store), policy, 2).ticket
        if ticket is None:
            return False
        store.release(ticket)
        return bool(ticket.probes)

    wait_for(probes)  # long before the hour's lease could end
    handoff = _Handoff(store, store._worker)
    taken = handoff.admit(facts(store), policy, 2, 3600.0).ticket
    assert taken is not None and taken.probes
    worker = store._worker
    store.close()
    wait_for(lambda: worker._thread is not None and not worker._thread.is_alive())
    assert handoff.abandon() is taken  # no thread to give it back: the caller does
    assert not worker._thread.is_alive()  # and none was started for it
    store.release(taken)
    assert probes()
    store.close()
