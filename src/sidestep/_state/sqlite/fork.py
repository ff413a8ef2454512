"""SQLite stores across a fork: no statement under way as it happens, no parent's connection after.

Every `FileView` is registered here. Before a fork, each one's transaction
is held (for a while at most), so that no statement is under way as the
process forks; after it, the parent lets them go, and in the child each
store gives up the parent's connection (`_forked`), closing those held idle.
"""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .transaction import Transaction

__all__ = ["Forking", "register"]


class Forking(Protocol):
    """A store with a file: the transaction held across a fork, for at most four times
    its `_timeout`, and what it does in the child."""

    _tx: Transaction
    _timeout: float

    def _forked(self, *, idle: bool) -> None: ...


_stores: weakref.WeakSet[Forking] = weakref.WeakSet()


_held: list[Forking] = []  # the stores whose file no thread uses across a fork


def register(store: Forking) -> None:
    """Hold `store`'s transaction across every fork of this process, and tell it in the child."""
    _stores.add(store)


def _before_fork() -> None:
    # Holding each store's mutex, no statement is under way as the process forks,
    # so the child can close its copy of the connection cleanly.
    for store in list(_stores):
        if store._tx.mutex.acquire(timeout=store._timeout * 4):
            _held.append(store)


def _after_fork_in_parent() -> None:
    while _held:
        _held.pop()._tx.mutex.release()


def _after_fork() -> None:
    held = {id(store) for store in _held}
    _held.clear()
    for store in list(_stores):
        store._forked(idle=id(store) in held)


if hasattr(os, "register_at_fork"):  # POSIX only: elsewhere nothing forks
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork
    )
