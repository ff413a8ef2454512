"""Listings of a store through the routes: what is built again, what is read again, and where.

A memory store hands out the same status for a scope whose circuit has not
changed, counts its changes, and finds the scope a clear names without its
lock; a `Listing` of a store that says nothing changed lists the same rows at
the later moment without reading the store; an encoded row is the JSON of its
row; `asuspensions()` builds its rows off the event loop. Fake clocks, no sleeps.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

import sidestep
from sidestep._answers.classify import INVALID_CREDENTIAL, RATE_LIMITED, Kind, Verdict
from sidestep._common.scopes import ScopeFacts, ScopeKey, ScopeKind
from sidestep._core.listed import Listed
from sidestep._core.listing import Listing
from sidestep._core.listing_row import as_json
from sidestep._core.routes import Router
from sidestep._settings.config import Config
from sidestep._settings.policies import BreakerPolicy, Suspensions
from sidestep._state.memory import MemoryStore
from sidestep._state.sqlite.store import SqliteStore

ORIGIN = "https://api.primary.example:443"
POLICY = BreakerPolicy(failure_threshold=2, cooldown=3600, max_cooldown=3600)
LIMITED = Verdict(Kind.SUSPEND, RATE_LIMITED, ScopeKind.ORIGIN, True, retry_after=600, status=429)
REVOKED = Verdict(Kind.SUSPEND, INVALID_CREDENTIAL, ScopeKind.CREDENTIAL, failover=True)
FAIL = Verdict(Kind.FAILURE, "unavailable", ScopeKind.ORIGIN, failover=True)
OK = Verdict(Kind.SUCCESS, None, None, failover=False)
WINDOWS = Suspensions.model_validate(
    {
        "rate_limited": {"initial": 1, "max": 3600},
        "invalid_credential": {"initial": 60, "max": None},  # until cleared
    }
)
CONFIG = Config.model_validate(
    {
        "routes": [
            {
                "name": "chat",
                "targets": [
                    {"name": "primary", "url": "https://api.primary.example/v1"},
                    {
                        "name": "backup",
                        "url": "https://api.primary.example/v2",
                        "headers": {"authorization": "Bearer sk-backup"},
                    },
                ],
            }
        ]
    }
)


def facts(store: MemoryStore, origin: str = ORIGIN, key: str = "") -> ScopeFacts:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return ScopeFacts(origin, headers=headers, body=None, fingerprint=store.fingerprint)


def record(
    store: MemoryStore,
    verdict: Verdict,
    now: float,
    *,
    origin: str = ORIGIN,
    key: str = "",
    suspensions: Suspensions = WINDOWS,
) -> None:
    ticket = store.admit(facts(store, origin, key), POLICY, now).ticket
    assert ticket is not None
    store.record(ticket, verdict, POLICY, suspensions, now)


def suspend_origins(store: MemoryStore, count: int, now: float = 0.0) -> list[str]:
    origins = [f"https://o{i:05d}.example:443" for i in range(count)]
    for origin in origins:
        record(store, LIMITED, now, origin=origin)
    return origins


class CountingStore(MemoryStore):
    """A memory store that counts its snapshots; with `counts` false it cannot tell its changes."""

    def __init__(self, *, counts: bool = True) -> None:
        super().__init__()
        self.snapshots = 0
        self.counts = counts

    @property
    def changes(self) -> int | None:
        return self._changes if self.counts else None

    def snapshot(self, now: float) -> list[Any]:
        self.snapshots += 1
        return super().snapshot(now)


def test_a_snapshot_hands_out_again_the_status_of_every_unchanged_scope() -> None:
    """Snapshots of an unchanged store hold the very same status objects; a scope whose circuit changed gets a new status, the others keep theirs, and a cleared scope's is let go of."""
    store = MemoryStore()
    suspend_origins(store, 3)
    record(store, FAIL, 0.0)  # one failure: the origin's scope is kept, closed
    first = store.snapshot(0.0)
    second = store.snapshot(99.0)
    assert len(first) == 4
    assert all(a is b for a, b in zip(first, second, strict=True))

    record(store, FAIL, 1.0)  # the second failure opens it
    third = {s.scope_id: s for s in store.snapshot(1.0)}
    changed = next(s for s in first if s.scope.origin == ORIGIN)
    assert third[changed.scope_id] is not changed
    assert third[changed.scope_id].failures == 2
    assert {s.scope_id for s in first if s is not changed} == {
        sid for sid, s in third.items() if any(s is old for old in first)
    }

    gone = first[0]
    assert store.clear(gone.scope_id)
    assert all(s.scope_id != gone.scope_id for s in store.snapshot(2.0))


def test_a_status_says_how_long_its_window_has_left_when_asked() -> None:
    """A status holds no clock reading: its retry_in is worked out for the moment given (0 when not open, None when open until cleared)."""
    store = MemoryStore()
    record(store, LIMITED, 100.0)
    record(store, REVOKED, 100.0, origin="https://other.example:443", key="sk-revoked")
    record(store, FAIL, 100.0, origin="https://third.example:443")
    statuses = {s.scope.origin: s for s in store.snapshot(100.0)}
    limited = statuses[ORIGIN]
    assert (limited.retry_in(100.0), limited.retry_in(400.0), limited.retry_in(1e9)) == (
        600.0,
        300.0,
        0.0,
    )
    assert statuses["https://other.example:443"].retry_in(1e9) is None
    assert statuses["https://third.example:443"].retry_in(100.0) == 0.0  # closed, one failure


def test_the_store_counts_every_change_to_what_it_keeps_and_nothing_else() -> None:
    """`changes` moves with each write to the scopes kept (a new scope, a failure counted, a transition, a probe's slot taken and given back, a clear, a healed scope forgotten) and stays put across snapshots, refusals and healthy traffic; a SQLite store, whose file may change under it, cannot tell."""
    store = MemoryStore()
    seen = [store.changes]

    def moved() -> bool:
        seen.append(store.changes)
        return seen[-1] != seen[-2]

    record(store, FAIL, 0.0)
    assert moved()
    store.snapshot(0.0)
    ticket = store.admit(facts(store, "https://healthy.example:443"), POLICY, 0.0).ticket
    assert ticket is not None
    store.record(ticket, OK, POLICY, Suspensions(), 0.0)
    assert not moved()
    record(store, FAIL, 1.0)  # opens
    assert moved()
    assert store.admit(facts(store), POLICY, 2.0).ticket is None  # refused: nothing written
    assert not moved()
    probe = store.admit(facts(store), POLICY, 4000.0).ticket  # half-open: a probe's slot
    assert probe is not None and moved()
    store.release(probe)
    assert moved()
    probe = store.admit(facts(store), POLICY, 4000.0).ticket
    assert probe is not None and moved()
    store.record(probe, OK, POLICY, Suspensions(), 4000.0)  # healed: forgotten
    assert moved() and len(store) == 0
    suspend_origins(store, 1)
    assert moved()
    assert store.clear(store.snapshot(0.0)[0].scope_id)
    assert moved()
    assert not store.clear("0123456789abcdef")
    assert not moved()


def test_a_sqlite_store_never_says_it_is_unchanged(tmp_path: Path) -> None:
    """A SQLite store's view may be behind its file: it counts no changes, so every listing reads it."""
    store = SqliteStore(tmp_path / "s.db")
    try:
        assert store.changes is None
    finally:
        store.close()


@pytest.fixture
def gated_ids(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Until the gate opens, a key's id asked for in any thread but the test's says so (the
    first event) and waits for the gate (the second)."""
    entered, gate = threading.Event(), threading.Event()
    original = ScopeKey.scope_id
    main = threading.get_ident()

    def scope_id(self: ScopeKey) -> str:
        if threading.get_ident() != main and not gate.is_set():
            entered.set()
            if not gate.wait(60):
                raise RuntimeError("the test never opened the gate")
        return original.fget(self)  # type: ignore[attr-defined, no-any-return]

    monkeypatch.setattr(ScopeKey, "scope_id", property(scope_id))
    yield entered, gate
    gate.set()


def test_a_clear_looks_for_its_scope_without_holding_the_stores_lock(
    gated_ids: tuple[threading.Event, threading.Event],
) -> None:
    """While a clear is in the middle of looking through the kept keys for the id it was given, admissions and verdicts that need the store's lock go through; the clear then finds and forgets its scope."""
    entered, gate = gated_ids
    store = MemoryStore()
    origins = suspend_origins(store, 50)
    wanted = ScopeKey(ScopeKind.ORIGIN, origins[-1])
    scope_id = ScopeKey.scope_id.fget(wanted)  # type: ignore[attr-defined]
    cleared: list[bool] = []
    clearing = threading.Thread(target=lambda: cleared.append(store.clear(scope_id)))
    clearing.start()
    try:
        assert entered.wait(30), "the clear never looked at a key"
        # a failure's verdict is recorded under the lock
        working = threading.Thread(target=record, args=(store, FAIL, 0.0))
        working.start()
        working.join(30)
        assert not working.is_alive(), "the store's lock was held while the clear looked"
        assert not cleared
    finally:
        gate.set()
        clearing.join(30)
    assert cleared == [True]
    assert len(store) == 50  # 49 origins left, and the new one's failure
    assert all(s.scope.origin != origins[-1] for s in store.snapshot(0.0))


def listing_of(store: MemoryStore, clock: Callable[[], float]) -> Listing:
    return Listing(store, Router(CONFIG), clock)


def test_a_listing_of_an_unchanged_store_does_not_read_it_again() -> None:
    """Listed again while the store's count of changes stays put, the store is not read: the same statuses, with the time left in each window worked out at the later moment; once the store changes it is read again, and shows the change; a store that cannot tell is read every time."""
    now = [1000.0]
    store = CountingStore()
    suspend_origins(store, 5, now=1000.0)
    listing = listing_of(store, lambda: now[0])
    first = listing.listed()
    assert store.snapshots == 1
    assert {row.retry_in for row in first.rows()} == {600.0}

    now[0] = 1100.0
    again = listing.listed()
    assert store.snapshots == 1
    assert again.statuses is first.statuses
    assert {row.retry_in for row in again.rows()} == {500.0}
    assert [row.scope_id for row in listing.suspensions()] == [s.scope_id for s in first.statuses]

    record(store, LIMITED, 1100.0, origin="https://new.example:443")
    changed = listing.listed()
    assert store.snapshots == 2 and len(changed.statuses) == 6

    blind = CountingStore(counts=False)
    suspend_origins(blind, 2)
    reading = listing_of(blind, lambda: now[0])
    reading.listed()
    reading.listed()
    assert blind.snapshots == 2


def test_an_encoded_row_is_the_json_of_its_row_every_time() -> None:
    """`Listed.encoded` gives what json.dumps gives of `as_json` of the row, for every kind of scope (open for a while, open until cleared, half-open, closed with failures, a credential scope of one target, unrouted), the first time and again once it keeps what does not move, at later moments."""
    store = MemoryStore()
    record(store, REVOKED, 0.0, key="sk-someone")  # one target's: backup has a key of its own
    record(store, LIMITED, 0.0)  # the origin's: both targets'
    record(store, FAIL, 0.0, origin="https://closed.example:443")
    record(store, FAIL, 0.0, origin="https://probing.example:443")
    record(store, FAIL, 0.0, origin="https://probing.example:443")
    probe = store.admit(facts(store, "https://probing.example:443"), POLICY, 4000.0).ticket
    assert probe is not None  # half-open, its probe out
    suspend_origins(store, 3)
    now = [4000.0]
    listing = listing_of(store, lambda: now[0])
    states = set()
    for moment in (4000.0, 4000.0, 4321.123456, 5000.5):
        now[0] = moment
        listed = listing.listed()
        wall = 1_800_000_000.25 + moment
        for status in listed.statuses:
            states.add((status.state.value, status.retry_in(moment) is None))
            expected = json.dumps(as_json(listed.row(status), moment, wall))
            assert listed.encoded(status, moment, wall) == expected
    assert {("open", False), ("open", True), ("half_open", False), ("closed", False)} <= states


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_asuspensions_builds_its_rows_off_the_event_loop(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`await transport.asuspensions()` over a memory store builds its rows in a worker thread: held in the middle of building one, the event loop runs on (this test awaits, and checks, meanwhile), and once let go every row comes back."""
    transport = sidestep.AsyncFailoverTransport(CONFIG)
    suspend_origins(transport.store, 20, now=time.monotonic())  # type: ignore[arg-type]
    loop_thread = threading.get_ident()
    entered, gate = threading.Event(), threading.Event()
    built_in: set[int] = set()
    row = Listed.row

    def held_row(self: Listed, status: Any) -> Any:
        built_in.add(threading.get_ident())
        entered.set()
        if not gate.wait(60):
            raise RuntimeError("the test never opened the gate")
        return row(self, status)

    monkeypatch.setattr(Listed, "row", held_row)
    rows: list[Any] = []

    async def listing() -> None:
        rows.extend(await transport.asuspensions())

    async with anyio.create_task_group() as group:
        group.start_soon(listing)
        assert await anyio.to_thread.run_sync(entered.wait, 30), "no row was ever built"
        assert not rows  # held, and the loop is here, running this
        gate.set()
    assert len(rows) == 20
    assert loop_thread not in built_in
