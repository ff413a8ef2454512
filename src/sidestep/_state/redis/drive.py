"""Driving `RedisStore`'s steps: each script call to Redis, its reply sent back into
the steps, and when Redis fails the local stand-in (`FailOpen`) instead; and the
drops that give a lost admission's probe slots back. The sync and the async drive
the same steps (`calls`), through the store's `Clients`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import anyio
import redis

from ..failopen import FailOpen
from .calls import Call, Calls, Steps
from .client import Clients, bounded

__all__ = ["Driver"]

# Redis errors and socket errors (timeouts included) alike mean "serve from memory for now";
# so does a cluster none of whose nodes could be reached to learn its layout.
_UNAVAILABLE = (redis.RedisError, OSError, redis.exceptions.RedisClusterException)
# Lost admissions waiting to be dropped; past this the oldest are left to their leases.
_MAX_DROPS = 1024
T = TypeVar("T")


class Driver:
    """One store's steps driven against Redis, else served by its `FailOpen`."""

    def __init__(self, clients: Clients, calls: Calls, failopen: FailOpen, timeout: float) -> None:
        self._clients = clients
        self._calls = calls
        self._failopen = failopen
        self._timeout = timeout
        self._lock = threading.Lock()
        self._drops: list[tuple[str, ...]] = []

    def run(self, op: str, steps: Steps[T], otherwise: Callable[[], T]) -> T:
        try:
            call = next(steps)  # decisions that need no server come first
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        if self._failopen.usable(op):
            try:
                while True:
                    try:
                        reply = self._clients.call(call)
                        self._failopen.answered()
                        call = steps.send(reply)
                    except StopIteration as stop:
                        value: T = stop.value
                        break
                    except BaseException:
                        if call.drop:  # its reply is lost: give its probe slots back
                            self._drop_now(call.drop)
                        raise
            except _UNAVAILABLE as exc:
                self._failopen.unavailable(op, exc)
            else:
                if self._drops:
                    self._send_drops()
                return value
        steps.close()
        return otherwise()

    async def run_async(self, op: str, steps: Steps[T], otherwise: Callable[[], T]) -> T:
        try:
            call = next(steps)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        if self._failopen.usable(op):
            calls = [call]  # the call in flight last, for its drop if the reply is lost
            try:
                value = await bounded(self._exchange(steps, calls), self._timeout)
            except BaseException as exc:
                if calls[-1].drop:  # its reply never made it into a ticket: give its slots back
                    self._queue_drops([calls[-1].drop])
                    if not isinstance(exc, GeneratorExit):  # a closed coroutine cannot wait
                        await self._send_drops_async()
                if not isinstance(exc, _UNAVAILABLE):
                    raise
                self._failopen.unavailable(op, exc)
            else:
                if self._drops:
                    await self._send_drops_async()
                return value
        steps.close()
        return otherwise()

    async def _exchange(self, steps: Steps[T], calls: list[Call]) -> T:
        """Drive `steps` against Redis: connecting, the handshake and every round trip."""
        script = await self._clients.async_script()
        while True:
            reply = await self._clients.acall(script, calls[-1])
            self._failopen.answered()
            try:
                calls.append(steps.send(reply))
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]

    def origins(self) -> tuple[int, dict[str, int]]:
        """The mirror's snapshot: a server's clock, and the origins with unhealthy scopes."""
        steps = self._calls.origins()
        call = next(steps)
        while True:
            try:
                call = steps.send(self._clients.call(call))
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]

    # -- lost admissions: their probe slots are dropped -----------------------------------

    def _queue_drops(self, groups: list[tuple[str, ...]]) -> None:
        """Keep drops that could not be sent, to go with the next call that succeeds."""
        with self._lock:
            self._drops[:0] = groups
            del self._drops[:-_MAX_DROPS]  # the oldest are left to their leases

    def _take_drops(self) -> list[tuple[str, ...]]:
        with self._lock:
            groups, self._drops = self._drops, []
        return groups

    def _drop_now(self, group: tuple[str, ...]) -> None:
        self._queue_drops([group])
        self._send_drops()

    def _send_drops(self) -> None:
        """Each lost admission's drop, one call each (each goes to its origin's slot)."""
        groups = self._take_drops()
        sent = 0
        try:
            for group in groups:
                self._clients.call(self._calls.drop(group))
                sent += 1
        except _UNAVAILABLE:
            self._queue_drops(groups[sent:])
        except BaseException:
            self._queue_drops(groups[sent:])
            raise

    async def _send_drops_async(self) -> None:
        groups = self._take_drops()
        sent = 0
        try:
            # Even while a cancellation unwinds (it may be what lost the reply), briefly.
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._timeout):
                script = await self._clients.async_script()
                for group in groups:
                    await self._clients.acall(script, self._calls.drop(group))
                    sent += 1
        except _UNAVAILABLE:
            pass
        finally:
            if sent < len(groups):
                self._queue_drops(groups[sent:])
