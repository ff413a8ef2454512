"""The async shell: drives the core's steps in the caller's event loop, performing
each effect they yield — send, read a body's head, close, wait to retry, call the
store — within the core's deadlines, and handing back the result or the exception.
It decides nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Generator
from typing import Any

import anyio
from anyio.lowlevel import EventLoopToken, current_token

from .._common.shield import shielded
from .._core.effects import Call, Close, Race, Read, Scan, Send, Sleep
from .._core.listing import StoreUnavailable
from .._core.listing_row import Suspension
from .._core.run import Run
from .deadlines import NO_ANSWER, NO_DEADLINE, OUT_OF_TIME, STALLED, Deadline, no_deadline
from .races import race_async
from .replay import async_replay, finish_iterators
from .shell import SENDING, Shell

__all__ = ["AsyncShell"]

_STORE_GRACE = 5.0  # seconds a store call may take, even while a cancellation unwinds
_TYPED_FIRST = 0.1  # seconds the deadline waits for the transport's own timeout to fire


class AsyncShell(Shell):
    _exact = True

    def _default_transport(self) -> Any:
        return self._flavour.module.AsyncHTTPTransport()

    async def handle_async_request(self, request: Any) -> Any:
        sending = SENDING.get()
        if not self.active or (sending is not None and self._sent_further_out(request, sending)):
            return await self.inner.handle_async_request(request)  # (under no fault plan)
        core = self._core
        ready = core.decide(request)
        if isinstance(ready, Run):  # not ready: the general path goes on from the decision
            return await self._drive(core.handle(request, ready))
        # the fast path: the core decided, this sends (inline: no coroutine), the core settles
        token = SENDING.set((ready[0], core.config)) if self._forwards else None
        try:
            response = await self._inner.handle_async_request(ready[0])
        except BaseException as exc:  # the core decides; cancellation comes back out
            if token is not None:
                SENDING.reset(token)
            return await self._drive(core.resume(ready, exc))
        if token is not None:
            SENDING.reset(token)
        answer = core.settle(ready, response)
        return await self._drive(core.resume(ready, response)) if answer is None else answer

    async def _send(self, request: Any) -> Any:
        if not self._forwards:
            return await self._inner.handle_async_request(request)
        token = SENDING.set((request, self._core.config))
        try:
            return await self._inner.handle_async_request(request)
        finally:
            SENDING.reset(token)

    async def aclose(self) -> None:
        self._closing(current_token())
        await self._inner.aclose()

    async def __aenter__(self) -> Any:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        self._closing(current_token())
        await self._inner.__aexit__(*exc_info)

    def _closing(self, loop: EventLoopToken) -> None:
        """Tell the core, and wake the requests waiting to retry in the closing event loop
        (one in another — another thread's, or one of this thread's that is not running —
        cannot be woken from here: it waits on)."""
        self._core.closing()
        for woken, waiting_in in tuple(self._sleeping.items()):
            if waiting_in == loop:
                woken.set()

    async def asuspensions(self) -> list[Suspension]:
        """`suspensions()` without blocking the event loop: a memory store is read, and the
        rows of any store are built, in a worker thread; a shared store is read with its
        async methods."""
        return await self._view.asuspensions()

    async def aclear(self, scope_id: str) -> bool:
        """`clear()` without blocking the event loop on a shared store."""
        try:
            return await self._view.aclear(scope_id, "application") is not None
        except StoreUnavailable:
            return False

    async def _drive(self, steps: Generator[Any, Any, Any]) -> Any:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = steps.send(value) if error is None else steps.throw(error)
            except StopIteration as stop:
                return stop.value
            value, error = None, None
            try:
                if type(effect) is Send and effect.deadline is None:
                    # the common effect, inline: no coroutine, no deadline scope
                    if self._forwards:
                        value = await self._send(effect.request)
                    else:
                        value = await self._inner.handle_async_request(effect.request)
                else:
                    value = await self._perform(effect)
            except BaseException as exc:  # the core decides; cancellation comes back out
                error = exc

    async def _perform(self, effect: Any) -> Any:
        kind = type(effect)
        if kind is Send:
            # A little grace, so the transport's own typed errors (a connect or pool
            # timeout, shrunk to the same limit) come first and keep their meaning.
            with self._deadline(effect.deadline, effect.request, _TYPED_FIRST):
                return await self._send(effect.request)
        if kind is Read:
            return await self._read(effect)
        if kind is Close:
            # Closing may run while a cancellation unwinds; it must still happen.
            return await shielded(effect.response.aclose, limit=None, otherwise=None)
        if kind is Sleep:
            if self._core.closes == effect.closes:  # else closed since: no wait
                # An event a close sets (`_closing`), not a cancellation: a caller's own
                # cancellation landing as well stays the caller's (on Python 3.10 anyio
                # cannot tell a native one from its scope's, and would swallow it).
                woken = anyio.Event()
                self._sleeping[woken] = current_token()
                try:
                    with anyio.move_on_after(effect.seconds):
                        await woken.wait()
                finally:
                    del self._sleeping[woken]
            return None
        if kind is Call:
            call = getattr(self._core.store, effect.name + "_async")
            if effect.name == "admit":
                return await call(*effect.args)
            # Verdicts and releases must land even while a cancellation unwinds (asyncio's
            # own included), briefly, so no probe slot is left taken; () when the store
            # did not answer in time: nothing was recorded.
            return await shielded(call, *effect.args, limit=_STORE_GRACE, otherwise=())
        if kind is Race:
            return await race_async(effect, self._drive)
        raise TypeError(f"unknown effect {kind.__name__}")

    def _deadline(
        self, deadline: float | None, request: Any, grace: float = 0.0, message: str = NO_ANSWER
    ) -> Any:
        if deadline is None:
            return NO_DEADLINE
        seconds = max(0.0, deadline - self._core.clock()) + grace
        return Deadline(seconds, self._flavour, request, message)

    def _stall(self, seconds: float | None, request: Any, scan: Scan | None) -> Callable[[], Any]:
        """A new bound for each wait for a chunk: `seconds` of silence raise a ReadTimeout
        (with a `scan`, what it says is left of them: a keep-alive does not count)."""
        if seconds is None:
            return no_deadline
        flavour = self._flavour

        def bound() -> Deadline:
            left = seconds if scan is None else scan.stall_left()
            return Deadline(left, flavour, request, STALLED)

        return bound

    async def _read(self, effect: Read) -> tuple[list[bytes], bool]:
        response = effect.response
        stream = response.stream
        chunks = stream.__aiter__()
        head: list[bytes] = []
        size = 0
        scan = effect.scan
        stall = self._stall(effect.stall, effect.request, scan)
        try:
            with self._deadline(effect.deadline, effect.request):
                while size < effect.limit:
                    with stall():
                        chunk = await chunks.__anext__()
                    head.append(chunk)
                    size += len(chunk)
                    if scan is not None and scan.feed(chunk):
                        break  # scan: the head ends where the core's reader says
        except StopAsyncIteration:
            await stream.aclose()
            response.stream = self._flavour.ByteStream(b"".join(head))
            return head, True
        except BaseException:
            # The head failed between two chunks (the scan found a limit passed while
            # keep-alives came, before the deadline's own timer): the iterator the peek
            # started waits at a yield. Finish it now, as the replay's close does, rather
            # than leave it to the garbage collector (trio warns of each it finalizes).
            await finish_iterators(chunks)
            raise
        on_error, drive = effect.on_error, self._drive
        end_by, request = effect.end_by, effect.request  # (the rest's deadline)
        # The body's verdict is due once: at its end, at its failure, or when the
        # caller closes it early (a stream left at "[DONE]" was a success).
        end = [effect.on_end] if effect.on_end is not None else []

        async def finish() -> None:
            if end:
                await drive(end.pop()())

        async def rest() -> AsyncIterator[bytes]:
            for chunk in head:
                yield chunk
            try:
                if effect.stall is None and scan is None and effect.end_by is None:
                    async for chunk in chunks:
                        yield chunk
                else:
                    while True:
                        try:
                            with stall(), self._deadline(end_by, request, 0.0, OUT_OF_TIME):
                                chunk = await chunks.__anext__()
                        except StopAsyncIteration:
                            break
                        if scan is not None:  # scan: every later chunk fed to the reader too
                            scan.feed(chunk)
                        yield chunk
            except Exception as exc:
                end.clear()
                if on_error is not None:
                    await drive(on_error(exc))
                raise
            await finish()

        response.stream = async_replay(self._flavour)(rest(), stream, finish, chunks)
        return head, False
