"""What keeps `SqliteStore`'s file off an event loop: a worker thread per store, and the
hand-off of an admission made in a worker thread to a caller that may stop waiting.

An async admission decides from the store's view of the file when it can;
bringing that view up to date is the worker's job, asked for when
``refresh`` has passed, so the loop never reads the file. An admission that
needs the file runs in anyio's worker threads; if its caller is cancelled
meanwhile (asyncio's own ``Task.cancel``, which no anyio shield holds back,
drops the thread's answer), the probe slots it took are given back at once
rather than when their lease ends.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import TYPE_CHECKING, Protocol

import anyio.to_thread

if TYPE_CHECKING:
    from ._config import BreakerPolicy
    from ._scopes import ScopeFacts
    from ._store import Admission, Ticket

__all__ = ["Worker", "admit_in_thread"]


class _Store(Protocol):
    def admit(
        self, facts: ScopeFacts, policy: BreakerPolicy, now: float, lease: float | None = None
    ) -> Admission: ...

    def release(self, ticket: Ticket) -> None: ...

    def _poll(self, *, wait: bool) -> bool: ...


class Worker:
    """A daemon thread that reads the file for an event loop and gives back abandoned probes.

    Started by the first job, it then sleeps until the next; it holds its store
    only by a weak reference, so a store dropped unclosed is collected (and the
    thread ends with it).
    """

    def __init__(self, store: _Store) -> None:
        self._store = weakref.ref(store)
        self._wake = threading.Event()
        self._releases: collections.deque[Ticket] = collections.deque()
        self._poll = False
        self._idle = False  # waiting for a job: only then is it woken (waking costs the caller)
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        weakref.finalize(store, self.stop)

    def poll(self) -> None:
        """Bring the store's view up to date, in the worker's thread."""
        self._poll = True
        self._go()

    def release(self, ticket: Ticket) -> None:
        """Give back the probe slots of a ticket nobody will use."""
        self._releases.append(ticket)
        self._go()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()  # whether it waits or not: it looks before it waits again

    def _go(self) -> None:
        thread = self._thread
        if thread is None or not thread.is_alive():
            with self._start_lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=_run, args=(self,), name="sidestep-sqlite", daemon=True
                    )
                    self._thread.start()
        if self._idle:  # else it is at work, and looks for jobs before it waits again
            self._wake.set()


def _run(worker: Worker) -> None:
    while True:
        if not (worker._poll or worker._releases or worker._stopped):
            worker._idle = True
            if not (worker._poll or worker._releases or worker._stopped):  # a job since?
                worker._wake.wait()
            worker._idle = False
            worker._wake.clear()
        store = worker._store()
        if store is None:
            return
        # Probe slots given back even once stopped: a store closed while an abandoned
        # admission waited here is used again (and reopened) by its next caller.
        while worker._releases:
            store.release(worker._releases.popleft())
        if worker._stopped:
            return
        if worker._poll:
            worker._poll = False
            store._poll(wait=True)
        del store  # not held while the thread sleeps


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
        admission = self._store.admit(facts, policy, now, lease)
        with self._lock:
            if not self._gone:
                self._answer = admission
                return admission
        if admission.ticket is not None and admission.ticket.probes:
            self._store.release(admission.ticket)  # its caller is gone: in this thread, now
        return admission

    def abandon(self) -> None:
        """The caller stopped waiting: an answer made already gives its slots back."""
        with self._lock:
            self._gone = True
            answer, self._answer = self._answer, None
        if answer is not None and answer.ticket is not None and answer.ticket.probes:
            self._worker.release(answer.ticket)  # not on the event loop: the worker's thread


async def admit_in_thread(
    store: _Store,
    worker: Worker,
    facts: ScopeFacts,
    policy: BreakerPolicy,
    now: float,
    lease: float | None,
) -> Admission:
    """`store.admit` in a worker thread; cancelled meanwhile, it keeps no probe slot."""
    handoff = _Handoff(store, worker)
    try:
        return await anyio.to_thread.run_sync(handoff.admit, facts, policy, now, lease)
    except BaseException:
        handoff.abandon()
        raise
