"""The `Race` effect performed: two branches of the core's effects run at once, the first
result the core says ends the race wins, the other branch is cancelled.

The async shell runs the branches as two tasks of one task group, and cancels the
loser's scope: its generator gets the cancellation at the effect it waits on and
closes what it holds, as any cancelled request does. The sync shell runs both branches
in threads of their own, so the caller's thread is free to return the winner at once;
the loser is told at its next effect (a response it was sent is closed there, and its
generator gets `BranchCancelled`), and a loser waiting in a read of its answer's body
is woken by shutting its connection's socket down (`Lost.aborting`). One waiting for
its answer's headers cannot be reached, and is bounded by its own deadlines. Nothing
here decides: which result ends the race, and what the second branch is, are the core's.
"""

from __future__ import annotations

import contextlib
import contextvars
import socket
import threading
from collections.abc import Awaitable, Callable, Generator, Iterator
from typing import Any

import anyio

from .._core.effects import NOT_RUN, Race, Raced, Read, Send, Sleep

__all__ = ["BranchCancelled", "Lost", "race_async", "race_sync"]

Steps = Generator[Any, Any, Any]


class BranchCancelled(BaseException):
    """Thrown into a sync branch that lost its race (a cancellation: not an upstream's
    failure, so the core closes and lets go rather than judging it)."""


class Lost:
    """A sync branch's word that it lost its race, and the read it then cuts short.

    `set` (from the race's thread) shuts down the socket of the answer the branch is
    reading at that moment, if any: its thread, blocked in the read, wakes with the
    connection ended, and its answer is closed (the connection is not kept). Only
    while `aborting` holds the answer: once the read is over the connection may be
    another request's.
    """

    __slots__ = ("_event", "_lock", "_reading")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._reading: Any = None

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        with self._lock:
            self._event.set()
            if self._reading is not None:
                _shut_down(self._reading)

    @contextlib.contextmanager
    def aborting(self, response: Any) -> Iterator[None]:
        """While the branch reads `response`'s body: a loss shuts its socket down (at once,
        if the branch has lost already)."""
        with self._lock:
            self._reading = response
            if self._event.is_set():
                _shut_down(response)
        try:
            yield
        finally:
            with self._lock:
                self._reading = None


def _shut_down(response: Any) -> None:
    """End the connection `response` is read from, both ways: a thread blocked reading it
    wakes to its end. (A response with no socket, such as a test's, is left alone, and so
    is one over HTTP/2, whose loser stops at its next chunk.)"""
    extensions = getattr(response, "extensions", {})
    if extensions.get("http_version", b"HTTP/1.1") != b"HTTP/1.1":
        return  # an HTTP/2 connection carries other requests' streams too: left alone
    stream = extensions.get("network_stream")
    sock = None if stream is None else stream.get_extra_info("socket")
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):  # (closed already)
            # the socket's own shutdown, not TLS's: the TLS object stays with its reader
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


async def race_async(effect: Race, drive: Callable[[Steps], Awaitable[Any]]) -> Raced:
    """`effect` with two tasks, each branch driven by `drive` (the async shell's)."""
    results: list[Any] = [NOT_RUN, NOT_RUN]
    errors: list[BaseException] = []
    winner: int | None = None
    scopes = (anyio.CancelScope(), anyio.CancelScope())
    first_done = anyio.Event()
    started = False

    async def branch(index: int, steps: Steps) -> None:
        nonlocal winner
        try:
            with scopes[index]:
                try:
                    value = await drive(steps)
                except Exception as exc:  # the core's own failure: the race ends with it
                    errors.append(exc)
                    scopes[1 - index].cancel()
                    return
                results[index] = value
                if winner is None and effect.ends(value):
                    winner = index
                    scopes[1 - index].cancel()
        finally:
            if index == 0:
                first_done.set()

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(branch, 0, effect.first)
            with anyio.move_on_after(effect.delay):
                await first_done.wait()
            if not first_done.is_set():
                # (a caller's cancellation that came as the delay ran out: no hedge)
                await anyio.lowlevel.checkpoint_if_cancelled()
                second = effect.second()
                if second is not None:
                    started = True
                    group.start_soon(branch, 1, second)
    except BaseException:
        # The caller's cancellation (or an error) as a branch got its result, the winner's
        # perhaps: nobody takes what it holds, so it is closed here.
        await _discard_async(effect, drive, results)
        raise
    if errors:  # one branch's own failure ends the race: what the other got is closed
        await _discard_async(effect, drive, results)
        raise errors[0]
    return Raced((results[0], results[1]), winner, started)


async def _discard_async(
    effect: Race, drive: Callable[[Steps], Awaitable[Any]], results: list[Any]
) -> None:
    """Close what the branches' results hold, shielded: the race ends without them."""
    with anyio.CancelScope(shield=True):
        for value in results:
            if value is not NOT_RUN:
                with contextlib.suppress(Exception):
                    await drive(effect.discard(value))


def race_sync(effect: Race, drive: Callable[[Steps, Lost], Any]) -> Raced:
    """`effect` with a thread per branch, each driven by `drive` (the sync shell's
    `_drive`, which stops at its next effect once its `Lost` is set)."""
    state = threading.Condition()
    results: list[Any] = [NOT_RUN, NOT_RUN]
    done = [False, False]
    errors: list[BaseException] = []
    winner: list[int] = []
    lost = (Lost(), Lost())

    def branch(index: int, steps: Steps) -> None:
        value: Any = NOT_RUN
        error: BaseException | None = None
        try:
            value = drive(steps, lost[index])
        except BranchCancelled:
            pass
        except BaseException as exc:  # handed to the caller's thread, raised there
            error = exc
        with state:
            done[index] = True
            if error is not None:
                errors.append(error)
                lost[1 - index].set()
            elif value is not NOT_RUN and not lost[index].is_set():
                results[index], value = value, NOT_RUN  # handed back
                if not winner and effect.ends(results[index]):
                    winner.append(index)
                    lost[1 - index].set()
            state.notify_all()
        if value is not NOT_RUN:  # it came after this branch lost: nobody takes it
            with contextlib.suppress(Exception):  # (nobody to tell, in this thread)
                drive(effect.discard(value), Lost())

    def start(index: int, steps: Steps) -> None:
        context = contextvars.copy_context()  # the caller's context vars, per branch
        name = f"sidestep-race-{index}"
        thread = threading.Thread(target=context.run, args=(branch, index, steps), name=name)
        thread.daemon = True
        thread.start()

    def over() -> bool:
        return bool(errors or winner) or all(done)

    started = False
    try:
        start(0, effect.first)
        with state:  # (a delay past what a wait can take waits as long as it can)
            state.wait_for(lambda: done[0], min(effect.delay, threading.TIMEOUT_MAX))
            first_over = done[0]
        if not first_over:
            second = effect.second()
            if second is not None:
                started = True
                start(1, second)
        with state:
            if started:
                state.wait_for(over)
            else:
                state.wait_for(lambda: done[0])
            if errors:
                raise errors[0]
            return Raced((results[0], results[1]), winner[0] if winner else None, started)
    except BaseException:
        for event in lost:  # the caller's own interruption (or an error): both stop
            event.set()
        with state:  # and what a branch handed back is closed (a later one closes its own)
            held = [value for value in results if value is not NOT_RUN]
            results[:] = [NOT_RUN, NOT_RUN]
        for value in held:
            with contextlib.suppress(Exception):
                drive(effect.discard(value), Lost())
        raise


def stops_at(effect: Any) -> bool:
    """Whether a lost sync branch is stopped before performing `effect`: it would send,
    read or wait. (Closing and the store's calls are performed: what it holds goes back.)"""
    return type(effect) in (Send, Read, Sleep, Race)
