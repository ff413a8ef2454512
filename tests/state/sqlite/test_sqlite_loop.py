"""`SqliteStore` under an event loop: what the loop's thread does, and what it leaves to the worker.

These tests watch which thread starts the worker and which wakes it, and what
the view learns; they never time anything.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from sidestep._answers.classify import Kind, Verdict
from sidestep._common import turns as _turns
from sidestep._common.scopes import ScopeFacts, ScopeKind
from sidestep._settings.policies import BreakerPolicy, Suspensions
from sidestep._state.sqlite import loop as _sqlite_loop
from sidestep._state.sqlite.store import SqliteStore

CONNECT_FAIL = Verdict(Kind.FAILURE, "unavailable", ScopeKind.ORIGIN, failover=True)
P = BreakerPolicy(failure_threshold=2, cooldown=600, max_cooldown=600)
SUSPENSIONS = Suspensions()

BACKENDS = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])


def origin(i: int) -> str:
    return f"https://h{i}.example:443"


def facts(store: SqliteStore, at: str) -> ScopeFacts:
    return ScopeFacts(
        at,
        headers={"authorization": "Bearer k1"},
        userinfo="",
        body=b'{"model": "m"}',
        fingerprint=store.fingerprint,
    )


def fail(store: SqliteStore, at: str) -> None:
    """Fail `at` until the file holds it open."""
    for _ in range(P.failure_threshold):
        ticket = store.admit(facts(store, at), P, 0).ticket
        assert ticket is not None
        store.record(ticket, CONNECT_FAIL, P, SUSPENSIONS, 0)


class Wake(threading.Event):
    """A worker's wake-up event that notes the threads that set it."""

    def __init__(self) -> None:
        super().__init__()
        self.setters: list[int] = []

    def set(self) -> None:
        self.setters.append(threading.get_ident())
        super().set()


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The threads that start a store's worker thread, in order."""
    seen: list[int] = []
    start = threading.Thread.start

    def noted(thread: threading.Thread) -> None:
        if thread.name == "sidestep-sqlite":
            seen.append(threading.get_ident())
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", noted)
    return seen


async def until(condition: Callable[[], bool]) -> None:
    """Poll `condition` from the loop, letting it run meanwhile; a hang fails the test."""
    with anyio.fail_after(60):
        while not condition():  # noqa: ASYNC110  # a fact of another thread
            await anyio.sleep(0.005)


async def refused_in_time(store: SqliteStore, at: str, healthy: str) -> None:
    """Admit to `at` (and to the healthy origin between) until `at` is refused."""
    with anyio.fail_after(60):
        while (await store.admit_async(facts(store, at), P, 0)).ticket is not None:
            assert (await store.admit_async(facts(store, healthy), P, 0)).ticket is not None
            await anyio.sleep(0.001)


@BACKENDS
@pytest.mark.anyio
async def test_admissions_on_the_loop_neither_start_nor_wake_the_worker(
    tmp_path: Path, starts: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While admissions keep coming, the worker keeps the view up to date on its own timer: the loop's thread never starts its thread (a view made by a sync call first included) nor wakes it, and sees what another store opened."""
    monkeypatch.setattr(_sqlite_loop, "LINGER", 3600.0)  # never quiet, however slow the machine
    path = tmp_path / "s.db"
    store = SqliteStore(path, refresh=0.01)
    wake = store._worker._wake = Wake()
    assert store.admit(facts(store, origin(0)), P, 0).ticket is not None  # a view; no worker
    other = SqliteStore(path, refresh=0)
    loop = threading.get_ident()
    assert (await store.admit_async(facts(store, origin(1)), P, 0)).ticket is not None
    assert len(starts) == 1
    fail(other, origin(1))
    await refused_in_time(store, origin(1), origin(2))
    fail(other, origin(3))
    await refused_in_time(store, origin(3), origin(2))
    assert len(starts) == 1 and loop not in starts
    assert loop not in wake.setters
    assert store.fallbacks == 0
    store.close()
    other.close()


@BACKENDS
@pytest.mark.anyio
async def test_after_a_quiet_spell_an_admission_wakes_the_worker(
    tmp_path: Path, starts: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that has seen no admission for `LINGER` sleeps until one wakes it (from the loop: setting an event, never starting a thread), then brings the view up to date again."""
    monkeypatch.setattr(_sqlite_loop, "LINGER", 0.0)  # quiet as soon as no admission is seen
    path = tmp_path / "s.db"
    store = SqliteStore(path, refresh=0.01)
    wake = store._worker._wake = Wake()
    assert (await store.admit_async(facts(store, origin(0)), P, 0)).ticket is not None
    worker = store._worker
    await until(lambda: worker._idle)  # asleep: no admission read the view yet
    other = SqliteStore(path, refresh=0)
    fail(other, origin(1))
    loop = threading.get_ident()
    await refused_in_time(store, origin(1), origin(2))
    assert loop in wake.setters  # woken by an admission
    assert len(starts) == 1 and loop not in starts
    store.close()
    other.close()


@BACKENDS
@pytest.mark.anyio
async def test_after_a_quiet_spell_the_first_admission_reads_the_file_not_the_old_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the worker slept after a quiet spell, its view may be old: the first admission
    after it, the view older than `refresh`, decides from the file (in a worker thread), so
    an origin another store opened meanwhile is refused at once, not let through by the
    view of before."""
    monkeypatch.setattr(_sqlite_loop, "LINGER", 0.0)  # quiet as soon as no admission is seen
    path = tmp_path / "s.db"
    store = SqliteStore(path, refresh=0.01)
    other = SqliteStore(path, refresh=0)
    assert (await store.admit_async(facts(store, origin(1)), P, 0)).ticket is not None
    worker = store._worker
    await until(lambda: worker._idle)  # asleep, with a view where origin 1 is healthy
    await until(lambda: time.monotonic() >= store._next_poll)  # and older than `refresh`
    fail(other, origin(1))
    assert (await store.admit_async(facts(store, origin(1)), P, 0)).ticket is None
    store.close()
    other.close()


@BACKENDS
@pytest.mark.anyio
async def test_an_awake_worker_keeps_the_view_up_to_date_between_admissions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until it sleeps, the worker brings the view up to date every `refresh` whether or
    not admissions come meanwhile: what another store opened shows in the view with no
    admission to ask for it, so the next one decides from a view at most `refresh` old."""
    monkeypatch.setattr(_sqlite_loop, "LINGER", 3600.0)  # never quiet, however slow the machine
    path = tmp_path / "s.db"
    store = SqliteStore(path, refresh=0.01)
    other = SqliteStore(path, refresh=0)
    assert (await store.admit_async(facts(store, origin(0)), P, 0)).ticket is not None
    await until(lambda: store._worker.awake)
    fail(other, origin(1))

    def opened() -> bool:
        kept = store._state.origins.get(origin(1))
        return kept is not None and kept.unhealthy > 0

    await until(opened)  # no admission since the first
    assert (await store.admit_async(facts(store, origin(1)), P, 0)).ticket is None
    store.close()
    other.close()


@BACKENDS
@pytest.mark.anyio
async def test_a_worker_thread_that_ended_is_started_again_off_the_loop(
    tmp_path: Path, starts: list[int]
) -> None:
    """Closed and used again, the store's next worker thread is started by an admission in a worker thread, never by the loop's."""
    path = tmp_path / "s.db"
    store = SqliteStore(path, refresh=0.01)
    assert (await store.admit_async(facts(store, origin(0)), P, 0)).ticket is not None
    store.close()
    other = SqliteStore(path, refresh=0)
    fail(other, origin(1))
    await refused_in_time(store, origin(1), origin(2))
    assert len(starts) == 2 and threading.get_ident() not in starts
    store.close()
    other.close()


@BACKENDS
@pytest.mark.anyio
async def test_reading_the_whole_file_lets_other_threads_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread turning many rows into the view pauses now and then (each `TURN` of work,
    for `PAUSE`), so that an event loop waiting for the interpreter's lock gets it; the
    view it makes is whole."""
    path = tmp_path / "s.db"
    writer = SqliteStore(path, refresh=0)
    for i in range(1, 101):
        fail(writer, origin(i))
    pauses: list[float] = []

    class Clock:
        perf_counter = staticmethod(time.perf_counter)

        @staticmethod
        def sleep(seconds: float) -> None:
            pauses.append(seconds)

    monkeypatch.setattr(_turns, "time", Clock)
    monkeypatch.setattr(_turns, "TURN", 0.0)  # every look at the clock is late
    store = SqliteStore(path, refresh=0.01)
    assert (await store.admit_async(facts(store, origin(0)), P, 0)).ticket is not None
    assert len(pauses) >= 2 * 100  # the rows read, then the view made of them
    assert all(p == _turns.PAUSE > 0 for p in pauses)
    assert len(store) == 100
    for i in range(1, 101):
        assert (await store.admit_async(facts(store, origin(i)), P, 0)).ticket is None
    store.close()
    writer.close()


@pytest.mark.parametrize("cancels", [1, 2])
def test_a_probe_given_back_after_the_store_closed_starts_no_thread_on_the_loop(
    tmp_path: Path, starts: list[int], monkeypatch: pytest.MonkeyPatch, cancels: int
) -> None:
    """An admission that took a probe slot in a worker thread, whose caller is cancelled
    (asyncio's own cancel, which drops the thread's answer) once the store was closed and
    its worker thread ended, gives the slot back to the file, and the loop's thread starts
    no worker thread to do it; cancelled again while it waits for that write, it still
    waits for it. (Under trio a cancelled caller still gets its thread's answer, so
    nothing is abandoned there.)"""
    import asyncio

    answered, proceed = threading.Event(), threading.Event()
    admit = _sqlite_loop._Handoff.admit

    def held(self: _sqlite_loop._Handoff, *args: object) -> object:
        admission = admit(self, *args)  # type: ignore[arg-type]
        answered.set()
        proceed.wait(60)  # the caller is cancelled while its answer waits here
        return admission

    monkeypatch.setattr(_sqlite_loop._Handoff, "admit", held)
    path = tmp_path / "s.db"
    store = SqliteStore(path, refresh=0.01)
    other = SqliteStore(path, refresh=0)  # another process's (made first: it would forget
    for s in (store, other):  # rows of 1970 as older than its ttl)
        s._caller_clock = True  # windows on the callers' `now`: 601 is past the cooldown
    fail(store, origin(1))
    worker = store._worker

    def probe() -> bool:
        ticket = other.admit(facts(other, origin(1)), P, 601).ticket
        if ticket is None:
            return False
        other.release(ticket)
        return bool(ticket.probes)

    releasing, released = threading.Event(), threading.Event()
    release = store.release

    def held_release(ticket: Any) -> None:
        releasing.set()
        released.wait(60)  # cancelled again while the give-back waits here
        release(ticket)

    store.release = held_release  # type: ignore[method-assign]

    async def main() -> int:
        task = asyncio.ensure_future(store.admit_async(facts(store, origin(1)), P, 601))
        try:
            await until(answered.is_set)  # the probe slot is taken, in the file
            assert not probe()  # ... and held: another process gets no probe
            store.close()  # its worker thread ends
            await until(lambda: worker._thread is not None and not worker._thread.is_alive())
            task.cancel()
            proceed.set()
            await until(releasing.is_set)  # the cancelled caller gives the slot back
            for _ in range(cancels - 1):
                task.cancel()
                await asyncio.sleep(0.01)
            released.set()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            proceed.set()
            released.set()
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert probe()  # the slot went back to the file, before the cancelled caller went on
    assert loop_thread not in starts
    store.close()
    other.close()


def test_an_admission_off_the_loop_waits_for_a_catch_up_under_way(tmp_path: Path) -> None:
    """An async admission sent to a worker thread (its view may be old: the worker slept)
    waits for a catch-up another thread of the store has under way, and decides from the
    view it brings, not from the one before: an origin another store opened is refused."""
    import concurrent.futures

    path = tmp_path / "s.db"
    store = SqliteStore(path, refresh=0.01)
    other = SqliteStore(path, refresh=0)
    assert store.admit(facts(store, origin(1)), P, 0).ticket is not None  # a view: healthy
    fail(other, origin(1))
    store._tx.mutex.acquire()  # another thread of the store is at the file, catching up
    releasing = threading.Timer(0.2, store._tx.mutex.release)
    releasing.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            admitted = pool.submit(store.admit_current, facts(store, origin(1)), P, 0)
            assert admitted.result(60).ticket is None
    finally:
        releasing.join()
    store.close()
    other.close()
