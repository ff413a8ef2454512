"""What keeps `SqliteStore`'s file off an event loop: a worker thread per store, and the
hand-off of an admission made in a worker thread to a caller that may stop waiting.

An async admission decides from the store's view of the file when it can;
keeping that view up to date is the worker's job, so the loop never reads
the file. While admissions use the view, and for `LINGER` after the last,
the worker brings it up to date every ``refresh`` on its own timer: an
admission only marks the view used — no clock read, no wake-up, no lock.
After a quiet spell the worker sleeps, and the view may be old: the next
admission wakes it and reads the file itself, in a worker thread, as one
does when no thread runs yet (the thread is started there, off the loop,
since starting a thread waits for it to run). An
admission that needs the file runs in anyio's worker threads; if its caller
is cancelled meanwhile (asyncio's own ``Task.cancel``, which no anyio
shield holds back, drops the thread's answer), the probe slots it took are
given back at once rather than when their lease ends: by the worker's thread,
or, when the store was closed meanwhile and that thread has ended, in a
worker thread the cancelled caller waits for (no thread is started on the
loop to do it).
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from typing import TYPE_CHECKING, Protocol

import anyio.to_thread

from ..._common.shield import shielded

if TYPE_CHECKING:
    from ..._common.scopes import ScopeFacts
    from ..._settings.policies import BreakerPolicy
    from ..protocol import Admission, Ticket

__all__ = ["LINGER", "Worker", "admit_in_thread"]

# Seconds the worker keeps the view up to date after the last admission that used it,
# before it sleeps until an admission wakes it: traffic at least this frequent never
# wakes it.
LINGER = 1.0


class _Store(Protocol):
    _next_poll: float  # when the view is next brought up to date (monotonic seconds)
    _refresh: float

    def admit_current(
        self, facts: ScopeFacts, policy: BreakerPolicy, now: float, lease: float | None = None
    ) -> Admission: ...

    def release(self, ticket: Ticket) -> None: ...

    def _poll(self, *, wait: bool) -> bool: ...


class Worker:
    """A daemon thread that keeps the view up to date for an event loop, and gives back
    abandoned probes.

    It holds its store only by a weak reference, so a store dropped unclosed is
    collected (and the thread ends with it).
    """

    def __init__(self, store: _Store) -> None:
        self._store = weakref.ref(store)
        self._wake = threading.Event()
        self._releases: collections.deque[Ticket] = collections.deque()
        self.used = False  # an admission read the view since the worker last brought it up
        # Polling on its own timer: an admission need not wake it. Both flags are plain
        # attributes, read and set without a lock: the interpreter orders them.
        self.awake = False
        self._idle = False  # asleep until woken: only then is it woken (waking costs the caller)
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._serving = False  # a thread runs that will look at `_releases` again
        weakref.finalize(store, self.stop)

    def use(self) -> bool:
        """An admission would read the view: keep it up to date. True when the view is
        (awake, the worker brings it up every ``refresh``); False when it may be older
        (asleep, at work on waking, or no thread at all): the admission reads the file
        itself, off the loop (where the thread is started if it does not run)."""
        self.used = True
        if self.awake:
            return True  # the common case: nothing else to do
        if self._idle:  # asleep since a quiet spell: wake it for the admissions to come
            self._wake.set()
        return False

    def start(self) -> None:
        """Run the thread, if it does not run yet (this waits for it to start)."""
        if not self._stopped:
            self._spawn()

    def release(self, ticket: Ticket) -> bool:
        """Have the thread give back the probe slots of a ticket nobody will use. False
        when no thread runs to do so (never started, or ended with the store's close):
        starting one here would hold the event loop until it runs."""
        with self._start_lock:
            if not self._serving:
                return False
            self._releases.append(ticket)
        self._wake.set()
        return True

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()  # whether it waits or not: it looks before it waits again

    def _spawn(self) -> None:
        thread = self._thread
        if thread is None or not thread.is_alive():
            with self._start_lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=_run, args=(self,), name="sidestep-sqlite", daemon=True
                    )
                    self._serving = True
                    self._thread.start()

    def _ending(self) -> bool:
        """The thread is about to end: true unless a release came in meanwhile."""
        with self._start_lock:
            if self._releases:
                return False
            self._serving = False  # from now on, releases go elsewhere
            return True


def _run(worker: Worker) -> None:
    try:
        _serve(worker)
    finally:
        worker._serving = False
        worker.awake = worker._idle = False  # gone: the next admission starts another


def _serve(worker: Worker) -> None:
    last_use = time.monotonic()
    while True:
        store = worker._store()
        if store is None:
            return
        # Probe slots given back even once stopped: a store closed while an abandoned
        # admission waited here is used again (and reopened) by its next caller.
        while worker._releases:
            store.release(worker._releases.popleft())
        if worker._stopped:
            if worker._ending():
                return
            continue  # a release came in after all: give it back first
        now, used = time.monotonic(), worker.used
        if used:
            last_use = now
        refresh = store._refresh
        awake = used or (refresh and now - last_use < LINGER)
        if awake and now >= store._next_poll:
            # Every `refresh` while awake, used since or not: an admission reading the
            # view of an awake worker reads one at most that far behind the file.
            worker.used = False
            store._poll(wait=True)  # which sets when the next one is due
            continue
        due = store._next_poll
        del store  # not held while the thread sleeps
        if awake:
            # Awake, on its own timer: until the next poll is due.
            worker.awake = True
            worker._wake.wait(max(due - now, 0.0))
        else:
            # Quiet (or asked on every admission, with no refresh): asleep until woken.
            worker.awake = False
            worker._idle = True
            if not (worker.used or worker._releases or worker._stopped):  # a job since?
                worker._wake.wait()
            worker._idle = False
        worker._wake.clear()


class _Handoff:
    """An admission made in a worker thread, and whether its caller still waits for it."""

    __slots__ = ("_answer", "_gone", "_lock", "_store", "_worker")

    def __init__(self, store: _Store, worker: Worker) -> None:
        self._store = store
        self._worker = worker
        self._lock = threading.Lock()
        self._answer: Admission | None = None
        self._gone = False

    def admit(
        self, facts: ScopeFacts, policy: BreakerPolicy, now: float, lease: float | None
    ) -> Admission:
        self._worker.start()  # here, in a worker thread: never on the event loop
        admission = self._store.admit_current(facts, policy, now, lease)
        with self._lock:
            if not self._gone:
                self._answer = admission
                return admission
        if admission.ticket is not None and admission.ticket.probes:
            self._store.release(admission.ticket)  # its caller is gone: in this thread, now
        return admission

    def abandon(self) -> Ticket | None:
        """The caller stopped waiting: an answer made already gives its slots back, by the
        worker's thread. Returned when that thread has ended (the store was closed
        meanwhile): then the caller gives them back."""
        with self._lock:
            self._gone = True
            answer, self._answer = self._answer, None
        if answer is None or answer.ticket is None or not answer.ticket.probes:
            return None
        if self._worker.release(answer.ticket):
            return None
        return answer.ticket


async def admit_in_thread(
    store: _Store,
    worker: Worker,
    facts: ScopeFacts,
    policy: BreakerPolicy,
    now: float,
    lease: float | None,
) -> Admission:
    """`store.admit_current` in a worker thread; cancelled meanwhile, it keeps no probe slot."""
    handoff = _Handoff(store, worker)
    try:
        return await anyio.to_thread.run_sync(handoff.admit, facts, policy, now, lease)
    except BaseException:
        ticket = handoff.abandon()
        if ticket is not None:
            # No worker to give the slots back (the store was closed while this admission
            # ran): the cancelled caller waits for that one write, in a worker thread,
            # however often it is cancelled meanwhile.
            await shielded(
                anyio.to_thread.run_sync, store.release, ticket, limit=None, otherwise=None
            )
        raise
