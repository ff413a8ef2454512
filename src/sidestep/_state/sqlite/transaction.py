"""The write transaction `FileView`'s steps run in, and the view that notes what they touch.

`Transaction` is what `MemoryStore`'s steps take for their lock: entering it
takes the thread lock and begins an immediate transaction on the file, and
leaving it writes the rows the step touched and commits, or rolls back (the
store's `_begin`, `_commit` and `_rollback`). `View` holds the scopes of the
view, and notes for those rows which scopes the step changed, and how.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Protocol

from ..._common.scopes import ScopeKey
from ..circuit import Circuit

__all__ = ["DEFAULT_PROBE_LEASE", "Transacting", "Transaction", "View"]

DEFAULT_PROBE_LEASE = 60.0


class View(dict[ScopeKey, Circuit]):
    """The scopes of the view: notes which scopes a transaction's step set or deleted,
    and what each was before the step (None: not kept).

    The step changes it only inside a transaction (`touched` is then a dict);
    the file's rows are taken in through `dict`'s own methods, unnoted.
    """

    __slots__ = ("touched",)

    def __init__(self) -> None:
        super().__init__()
        self.touched: dict[ScopeKey, Circuit | None] | None = None

    def __setitem__(self, key: ScopeKey, value: Circuit) -> None:
        self._note(key)
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: ScopeKey) -> None:
        self._note(key)
        dict.__delitem__(self, key)

    def _note(self, key: ScopeKey) -> None:
        touched = self.touched
        if touched is None:
            raise RuntimeError("the view of the file changes inside a transaction only")
        if key not in touched:
            touched[key] = self.get(key)


class Transacting(Protocol):
    """The store a transaction runs on: its view, and how it begins, commits and rolls back."""

    @property
    def _view(self) -> View: ...

    def _begin(self, tx: Transaction) -> None: ...

    def _commit(self, tx: Transaction) -> None: ...

    def _rollback(self, tx: Transaction) -> None: ...


class Transaction:
    """What `MemoryStore` takes for its lock: one write transaction on the file.

    Entering takes the thread lock, begins an immediate transaction, brings
    the view up to date and ends the leases past their end; leaving writes
    the rows the step touched and commits, or rolls back.
    """

    def __init__(self, store: Transacting) -> None:
        self._store = store
        self.mutex = threading.Lock()
        self.lease = DEFAULT_PROBE_LEASE
        self.leases: list[tuple[ScopeKey, str, int, float]] = []  # taken by this step
        self.origins: set[str] = set()  # whose mark changed, or that the view let go
        self.seq = 0  # the sequence as the step began
        self.heartbeat = False  # write, though nothing changed: does the file take writes?

    def __enter__(self) -> None:
        self.mutex.acquire()
        try:
            self._store._begin(self)
        except BaseException:
            self.mutex.release()
            raise

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if kind is None:
                self._store._commit(self)
            else:
                self._store._rollback(self)
        finally:
            self._store._view.touched = None
            self.mutex.release()
