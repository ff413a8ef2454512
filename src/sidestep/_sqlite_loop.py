"""What keeps `SqliteStore`'s file off an event loop: a worker thread per store.

An async admission decides from the store's view of the file when it can;
bringing that view up to date is the worker's job, asked for when
``refresh`` has passed, so the loop never reads the file. An admission that
needs the file runs in anyio's worker threads.
"""

from __future__ import annotations

import threading
import weakref
from typing import Protocol

__all__ = ["Worker"]


class _Store(Protocol):
    def _poll(self, *, wait: bool) -> bool: ...


class Worker:
    """A daemon thread that reads the file for an event loop.

    Started by the first job, it then sleeps until the next; it holds its store
    only by a weak reference, so a store dropped unclosed is collected (and the
    thread ends with it).
    """

    def __init__(self, store: _Store) -> None:
        self._store = weakref.ref(store)
        self._wake = threading.Event()
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
        if not (worker._poll or worker._stopped):
            worker._idle = True
            if not (worker._poll or worker._stopped):  # a job since?
                worker._wake.wait()
            worker._idle = False
            worker._wake.clear()
        store = worker._store()
        if worker._stopped or store is None:
            return
        if worker._poll:
            worker._poll = False
            store._poll(wait=True)
        del store  # not held while the thread sleeps
