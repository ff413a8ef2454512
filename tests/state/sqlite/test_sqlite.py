"""`SqliteStore` on real files: sharing between stores, surviving a restart, failing open.

The contract every store keeps runs in test_store.py, test_store_machine.py
and test_store_processes.py; here is what only a file does.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import socket
import sqlite3
import stat
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog

from children import TESTS, environment
from drivers import FakeClock, MakeDriver, route
from sidestep._answers.classify import QUOTA_EXHAUSTED, RATE_LIMITED, Kind, Verdict
from sidestep._common.scopes import ScopeFacts, ScopeKind
from sidestep._core.attempts import LEASE_MARGIN
from sidestep._settings.policies import BreakerPolicy, Suspensions
from sidestep._state.circuit import State
from sidestep._state.failopen import LocalTicket
from sidestep._state.sqlite.store import SqliteStore
from upstream import IN_TIME, STORE_WAIT, Hang, Respond, Upstream, wait_for

ORIGIN = "https://api.example:443"
OTHER = "https://other.example:443"
OK = Verdict(Kind.SUCCESS, None, None, failover=False)
FAIL = Verdict(Kind.FAILURE, "unavailable", ScopeKind.MODEL, failover=True)
P = BreakerPolicy(failure_threshold=2, cooldown=600, max_cooldown=600)
SUSPENSIONS = Suspensions()
SIX_HOURS = Suspensions(quota_exhausted={"initial": 21600, "max": 21600})


def facts(store: SqliteStore, model: str = "m", origin: str = ORIGIN) -> ScopeFacts:
    return ScopeFacts(
        origin,
        headers={"authorization": "Bearer k1"},
        userinfo="",
        body=f'{{"model": "{model}"}}'.encode(),
        fingerprint=store.fingerprint,
    )


def open_scope(store: SqliteStore, now: float = 0.0) -> None:
    for _ in range(2):
        ticket = store.admit(facts(store), P, now).ticket
        assert ticket is not None
        store.record(ticket, FAIL, P, SUSPENSIONS, now)


def test_what_one_store_opens_another_on_the_file_refuses(tmp_path: Path) -> None:
    """Two stores on one file (as two processes would be) share circuits, generations and the credential fingerprint key kept in the file."""
    one, two = SqliteStore(tmp_path / "s.db", refresh=0), SqliteStore(tmp_path / "s.db", refresh=0)
    assert two.admit(facts(two), P, 0).ticket is not None  # healthy
    open_scope(one)
    admission = two.admit(facts(two), P, 1)
    assert admission.ticket is None and admission.refusal is not None
    assert admission.refusal.retry_at == pytest.approx(1 + 600, abs=1)  # on the caller's clock
    assert [s.scope_id for s in two.snapshot(1)] == [s.scope_id for s in one.snapshot(1)]
    assert two.clear(two.snapshot(1)[0].scope_id)
    assert one.admit(facts(one), P, 2).ticket is not None  # cleared for both
    assert one.fallbacks == two.fallbacks == 0


def test_the_healthy_path_runs_no_statement_until_refresh_is_due(tmp_path: Path) -> None:
    """On a healthy origin, 1000 admissions and successes within one refresh interval run no SQL at all; a change made elsewhere is seen at the next refresh."""
    store = SqliteStore(tmp_path / "s.db", refresh=3600)
    other = SqliteStore(tmp_path / "s.db")
    assert store.admit(facts(store), P, 0).ticket is not None  # opens the file, reads it once
    statements: list[str] = []
    assert store._conn is not None
    store._conn.set_trace_callback(statements.append)
    for _ in range(1000):
        ticket = store.admit(facts(store), P, 0).ticket
        assert ticket is not None and ticket.generations is None
        assert store.record(ticket, OK, P, SUSPENSIONS, 0) == ()
    assert statements == []
    open_scope(other)
    assert store.admit(facts(store), P, 0).ticket is not None  # not looked yet: by design
    store._next_poll = 0.0  # the refresh is due
    assert store.admit(facts(store), P, 0).ticket is None
    assert statements[0] == "PRAGMA data_version"


def test_a_suspension_survives_a_restart_and_a_past_window_does_not(tmp_path: Path) -> None:
    """A six-hour quota suspension is there for a store that opens the file later; a window that ended more than `ttl` before the file is opened is dropped on load."""
    path = tmp_path / "s.db"
    first = SqliteStore(path)
    quota = Verdict(Kind.SUSPEND, QUOTA_EXHAUSTED, ScopeKind.CREDENTIAL, failover=True)
    brief = Verdict(
        Kind.SUSPEND, RATE_LIMITED, ScopeKind.CREDENTIAL_MODEL, failover=True, retry_after=0.05
    )
    for origin, verdict in ((ORIGIN, quota), (OTHER, brief)):
        ticket = first.admit(facts(first, origin=origin), P, 0).ticket
        assert ticket is not None
        first.record(ticket, verdict, P, SIX_HOURS, 0)
    assert len(first) == 2
    ended = time.time() + 0.05
    first.close()
    wait_for(lambda: time.time() > ended + 0.01)
    kept = SqliteStore(path)  # the default ttl: the ended window stays, for a probe
    assert [s.state for s in kept.snapshot(0)] == [State.OPEN, State.OPEN]
    kept.close()
    restarted = SqliteStore(path, ttl=0.01)
    (status,) = restarted.snapshot(0)
    assert status.reason == QUOTA_EXHAUSTED
    left = status.retry_in(0)
    assert left is not None and 21500 < left <= 21600
    refusal = restarted.admit(facts(restarted), P, 0).refusal
    assert refusal is not None and refusal.reason == QUOTA_EXHAUSTED
    assert restarted.admit(facts(restarted, origin=OTHER), P, 0).refusal is None


def test_a_file_of_the_layout_before_the_routed_mark_keeps_its_scopes_spared_as_routes(
    tmp_path: Path,
) -> None:
    """A file of layout 2 (no routed mark) is taken as it is: its scopes stay, each spared as a
    route's, so unrouted traffic at max_scopes is not kept; a newer file is not touched again."""
    path = tmp_path / "s.db"
    store = SqliteStore(path)
    unrouted = ScopeFacts(ORIGIN, {}, b"", store.fingerprint, path="/x")
    ticket = store.admit(unrouted, P, 0).ticket
    assert ticket is not None
    store.record(ticket, FAIL, P, SUSPENSIONS, 0)
    store.close()
    with sqlite3.connect(path) as conn:  # as layout 2 had it
        conn.execute("ALTER TABLE scopes DROP COLUMN routed")
        conn.execute("PRAGMA user_version = 2")
    conn.close()
    reopened = SqliteStore(path, max_scopes=1)
    (kept,) = reopened.snapshot(0)
    other = ScopeFacts(OTHER, {}, b"", reopened.fingerprint, path="/x")
    ticket = reopened.admit(other, P, 0).ticket
    assert ticket is not None
    assert reopened.record(ticket, FAIL, P, SUSPENSIONS, 0) == ()
    assert [s.scope_id for s in reopened.snapshot(0)] == [kept.scope_id]
    reopened.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (3,)
        assert conn.execute("SELECT routed FROM scopes").fetchall() == [(1,)]
    conn.close()


def test_an_unchanged_scope_lists_at_the_same_instants_whatever_the_delay_before_listing(
    tmp_path: Path,
) -> None:
    """Listings of an unchanged open scope, each with the caller's clock read up to 0.3 s before the store reads the wall clock (a loaded machine's delay), put its window at the same instants every time (an admin listing's tag follows them); a caller's clock stepped by 5 s is followed."""
    store = SqliteStore(tmp_path / "s.db")
    open_scope(store, time.monotonic())
    seen = set()
    for late in (0.0, 0.3, 0.1, 0.0, 0.2, 0.3, 0.1):
        (status,) = store.snapshot(time.monotonic() - late)
        assert status.state is State.OPEN and status.opened_at is not None
        seen.add((status.retry_at, status.opened_at))
    assert len(seen) == 1
    ((retry_at, opened_at),) = seen
    assert retry_at - opened_at == pytest.approx(600.0)
    (status,) = store.snapshot(time.monotonic() + 5.0)
    assert status.retry_at == pytest.approx(retry_at + 5.0, abs=0.5)
    store.close()


def test_the_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """The file keeps the fingerprint key: the store creates it with mode 0600."""
    SqliteStore(tmp_path / "s.db")
    assert stat.S_IMODE(os.stat(tmp_path / "s.db").st_mode) == 0o600


def _events(logs: list[Any]) -> list[str]:
    return [e["event"] for e in logs if e["event"].startswith("store.")]


def test_an_unwritable_place_fails_open_with_one_warning_and_recovers(tmp_path: Path) -> None:
    """With the file's directory missing, every request is served from memory (one warning, no directory in it); once the file can be made, the store goes back to it."""
    where = tmp_path / "later"
    with structlog.testing.capture_logs() as logs:
        store = SqliteStore(where / "s.db", retry_interval=0.05)
        tickets = [store.admit(facts(store), P, 0).ticket for _ in range(5)]
        assert all(isinstance(t, LocalTicket) for t in tickets)
        for ticket in tickets[:2]:
            assert ticket is not None
            store.record(ticket, FAIL, P, SUSPENSIONS, 0)  # in memory
        assert store.admit(facts(store), P, 1).ticket is None  # memory opened it
        where.mkdir()

        def back() -> bool:
            return not isinstance(store.admit(facts(store, "other"), P, 1).ticket, LocalTicket)

        wait_for(back)
        assert store.admit(facts(store), P, 1).ticket is not None  # the file knows nothing
    assert _events(logs) == ["store.unavailable", "store.recovered"]
    warning = logs[0]
    assert warning["log_level"] == "warning" and warning["server"] == "s.db"
    assert str(tmp_path) not in repr(logs)


def test_a_file_locked_past_the_timeout_fails_open_and_recovers(tmp_path: Path) -> None:
    """Another writer holding the file longer than `timeout`: a refusal is still answered from the view, with no wait; a write is served from memory with one warning, and the store returns once a write goes through."""
    path = tmp_path / "s.db"
    store = SqliteStore(path, timeout=0.05, retry_interval=0.05)
    open_scope(store)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    with structlog.testing.capture_logs() as logs:
        assert store.admit(facts(store), P, 1).ticket is None  # the view: no write, no wait
        assert store.fallbacks == 0
        ticket = store.admit(facts(store, "other"), P, 1).ticket
        assert ticket is not None and not isinstance(ticket, LocalTicket)
        started = time.monotonic()
        store.record(ticket, FAIL, P, SUSPENSIONS, 1)  # a write: waits, then memory
        assert time.monotonic() - started < IN_TIME  # its timeout, not until the holder commits
        assert not store.available
        assert isinstance(store.admit(facts(store), P, 1).ticket, LocalTicket)  # memory, no wait
        holder.execute("COMMIT")
        wait_for(lambda: store.admit(facts(store), P, 1).ticket is None)  # the file again
        assert store.available
    assert _events(logs) == ["store.unavailable", "store.recovered"]
    holder.close()


def test_writes_failing_while_reads_work_keep_the_fallback_until_a_write_succeeds(
    tmp_path: Path,
) -> None:
    """The write lock held by another connection for many retry intervals (reads still work): one warning, the store stays on its local fallback (never declared back after a mere read), and a dead upstream gets failure_threshold calls in all; once the lock goes, one write brings the store back."""
    path = tmp_path / "s.db"
    store = SqliteStore(path, timeout=0.02, retry_interval=0.02)
    assert store.admit(facts(store), P, 0).ticket is not None  # the file read: a view
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    calls = 0
    with structlog.testing.capture_logs() as logs:
        while store.fallbacks < 6:  # the failed write, and retries that failed after it
            ticket = store.admit(facts(store, origin=OTHER), P, 0).ticket
            if ticket is not None:
                calls += 1  # sent to the dead upstream
                store.record(ticket, FAIL, P, SUSPENSIONS, 0)
            time.sleep(0.005)
        assert calls == P.failure_threshold
        assert _events(logs) == ["store.unavailable"]
        holder.execute("COMMIT")
        wait_for(lambda: store.admit(facts(store), P, 0) is not None and store.available)
    assert _events(logs) == ["store.unavailable", "store.recovered"]
    holder.close()


def test_a_corrupt_file_fails_open_and_a_replaced_one_is_used(tmp_path: Path) -> None:
    """A file that is not a database never fails a request; once it is replaced by a good one the store uses it, with the fingerprint key kept there."""
    path = tmp_path / "s.db"
    path.write_bytes(b"not a database, " * 512)
    with structlog.testing.capture_logs() as logs:
        store = SqliteStore(path, retry_interval=0.05)
        assert isinstance(store.admit(facts(store), P, 0).ticket, LocalTicket)
        path.unlink()
        good = SqliteStore(path)  # makes the fingerprint key the first store adopts on return
        open_scope(good)
        wait_for(lambda: store.admit(facts(store), P, 1).refusal is not None)  # the good file's
        assert not store._failopen.down
    assert _events(logs) == ["store.unavailable", "store.recovered"]


def test_every_transport_shares_circuits_through_the_file(
    make: MakeDriver, a: Upstream, b: Upstream, tmp_path: Path
) -> None:
    """Sync and async transports over two stores on one file: failures one sees make the other skip the target."""
    a.behaviour = lambda seen: Respond(503)
    config = route(("a", a.url + "/v1"), ("b", b.url + "/v1"))
    first = make(config, store=SqliteStore(tmp_path / "s.db"))
    second = make(config, store=SqliteStore(tmp_path / "s.db", refresh=0))
    assert [first.get(a.url + "/v1/x").status for _ in range(2)] == [200, 200]
    assert a.calls == 2
    assert second.get(a.url + "/v1/x").text == "b"
    assert a.calls == 2


@pytest.mark.slow
def test_gunicorn_workers_under_sidestep_run_find_a_dead_upstream_once(
    a: Upstream, b: Upstream, tmp_path: Path
) -> None:
    """`sidestep run -c cfg -- gunicorn -w 4` with a SQLite store: the dead primary gets failure_threshold calls in all, not that many per worker, and every worker then goes to the backup."""
    a.behaviour = lambda seen: Respond(503)
    config = tmp_path / "sidestep.yaml"
    config.write_text(
        json.dumps(
            {
                **route(
                    ("primary", a.url + "/v1"),
                    ("backup", b.url + "/v1"),
                    breaker={"failure_threshold": 2, "cooldown": 600},
                ),
                "store": {
                    "sqlite": {
                        "path": str(tmp_path / "state.db"),
                        "refresh": 0,
                        "timeout": STORE_WAIT,
                    }
                },
            }
        )
    )
    sock = tmp_path / "gunicorn.sock"
    env = environment(OUTAGE_UPSTREAM=a.url + "/v1/chat")
    command = [sys.executable, "-m", "sidestep._ops.cli", "run", "-c", str(config), "--"]
    command += [sys.executable, "-m", "gunicorn", "--workers", "4", "--bind", f"unix:{sock}"]
    command += ["--error-logfile", str(tmp_path / "error.log"), "outage_app:application"]
    server = subprocess.Popen(command, env=env, cwd=TESTS, stdin=subprocess.DEVNULL)  # noqa: S603
    client = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=10)
    try:

        def listening() -> bool:
            assert server.poll() is None, (tmp_path / "error.log").read_text()
            # the file exists a moment before gunicorn listens on it: connect to know
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(str(sock))
                except OSError:
                    return False
            return True

        wait_for(listening, timeout=60)
        assert client.get("http://app/").text.endswith(" 200 b")  # the first failure
        assert client.get("http://app/").text.endswith(" 200 b")  # the second: it opens
        assert a.calls == 2
        workers: set[str] = set()
        with ThreadPoolExecutor(8) as pool:
            for _ in range(50):  # until every worker has answered since
                answers = list(pool.map(lambda _: client.get("http://app/").text, range(8)))
                assert all(answer.endswith(" 200 b") for answer in answers), answers
                workers |= {answer.split()[0] for answer in answers}
                if len(workers) == 4:
                    break
        assert len(workers) == 4
        assert a.calls == 2  # found once, for all four workers
    finally:
        client.close()
        server.terminate()
        server.wait(30)


def test_a_file_deleted_under_running_stores_is_followed_to_the_new_one(tmp_path: Path) -> None:
    """The file and its WAL deleted while stores use it (a cleaner of temporary files), and a
    new one made at the path by a store opened since: within `refresh` the running stores use
    the new file, its fingerprint key included, so no two groups of processes keep circuits
    apart."""
    path = tmp_path / "s.db"
    running = SqliteStore(path, refresh=0)
    assert running.admit(facts(running), P, 0).ticket is not None  # the file is open
    for name in ("s.db", "s.db-wal", "s.db-shm"):
        (tmp_path / name).unlink()
    restarted = SqliteStore(path, refresh=0)  # a process started since: a new file, a new key
    open_scope(restarted)
    refusal = running.admit(facts(running), P, 1).refusal
    assert refusal is not None and refusal.scope == restarted.snapshot(1)[0].scope
    credential = {"authorization": "Bearer k1"}
    assert running.fingerprint(credential, "") == restarted.fingerprint(credential, "")
    assert running.clear(restarted.snapshot(1)[0].scope_id)
    assert restarted.admit(facts(restarted), P, 2).ticket is not None
    assert running.fallbacks == restarted.fallbacks == 0


_FORKED = """
import os, sys, time
from sidestep._state.sqlite.store import SqliteStore
from test_sqlite import P, facts, open_scope

path = sys.argv[1]
master = SqliteStore(path, refresh=0)  # opened before the fork, as gunicorn --preload does
master.admit(facts(master), P, 0)
ready, go = os.pipe(), os.pipe()
pid = os.fork()
if pid == 0:
    worker = master
    worker.admit(facts(worker), P, 0)  # the worker's own connection
    os.write(ready[1], b"1")
    os.read(go[0], 1)
    open_scope(worker)  # after the master closed its connection
    os._exit(0)
os.read(ready[0], 1)
master.close()
os.write(go[1], b"1")
_, status = os.waitpid(pid, 0)
print(status, sorted(name for name in os.listdir(os.path.dirname(path))))
"""


def test_a_worker_forked_from_a_master_that_opened_the_file_keeps_sharing_it(
    tmp_path: Path,
) -> None:
    """A store opened before fork (gunicorn --preload) and used in the forked worker: when the
    master closes its connection the WAL stays (the worker holds its own locks), and what the
    worker writes afterwards reaches a process started later."""
    path = tmp_path / "s.db"
    done = subprocess.run(  # noqa: S603
        [sys.executable, "-c", _FORKED, str(path)],
        env=environment(Path(__file__).parent),  # the child imports this module
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.split("\n")[0] == "0 ['s.db', 's.db-shm', 's.db-wal']"
    later = SqliteStore(path)
    assert later.admit(facts(later), P, 0).ticket is None


def test_a_relative_path_names_the_same_file_after_the_process_changes_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store given a relative path keeps to the file it named when it was made, though the
    process changes its working directory afterwards (a daemon's chdir)."""
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    store = SqliteStore("s.db", refresh=0)
    assert store.admit(facts(store), P, 0).ticket is not None
    monkeypatch.chdir(tmp_path / "elsewhere")
    open_scope(SqliteStore(tmp_path / "s.db"))
    assert store.admit(facts(store), P, 1).ticket is None
    assert not (tmp_path / "elsewhere" / "s.db").exists()


def test_a_store_dropped_unclosed_closes_its_file(tmp_path: Path) -> None:
    """A SqliteStore the program drops without close() closes its connection when collected, rather than leave it (and a ResourceWarning) to the collector."""
    store = SqliteStore(tmp_path / "state.db")
    conn = store._conn
    assert conn is not None
    conn.execute("SELECT 1")  # open
    del store
    with warnings.catch_warnings():  # what earlier tests left to the collector is theirs
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        conn.execute("SELECT 1")


def test_a_probes_lease_outlasts_the_time_its_request_may_run(
    make: MakeDriver, a: Upstream, b: Upstream, tmp_path: Path
) -> None:
    """A half-open probe under `total_timeout` holds its slot in the file a margin past that
    deadline (the shell lets the transport's own timeout fire up to 0.1 s after it, and
    the verdict must still reach the file): the slot never frees, and lets a second probe
    out, while the first may still be running."""
    a.behaviour = lambda _: Respond(503)
    path = tmp_path / "s.db"
    store = SqliteStore(path)
    store._caller_clock = True  # windows on the transport's clock
    config = route(
        ("a", a.url + "/v1"),
        ("b", b.url + "/v1"),
        breaker={"half_open_probes": 1},
        failover={"total_timeout": 0.3},
    )
    clock = FakeClock()
    d = make(config, store=store, clock=clock)
    for _ in range(2):
        assert d.get(a.url + "/v1/x").text == "b"
    a.behaviour = lambda _: Hang()
    clock.advance(11)
    sent = time.time()
    with ThreadPoolExecutor(1) as pool:
        probing = pool.submit(d.get, a.url + "/v1/x")
        wait_for(lambda: a.calls == 3)  # the probe reached a, and hangs there
        with contextlib.closing(sqlite3.connect(path)) as conn:
            (until,) = conn.execute("SELECT until FROM leases").fetchone()
        assert until >= sent + 0.3 + LEASE_MARGIN
        assert probing.result(60).text == "b"  # timed out at a, failed over
