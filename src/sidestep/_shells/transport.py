"""The sync and async transports: thin I/O drivers over the core in `_attempts`.

A shell runs `Core.handle` and performs each effect it yields — send, read a
body's head, close, sleep, call the store — handing back the result or the
exception. It decides nothing. Each shell is bound to a flavour (httpx here,
httpx2 in `sidestep.httpx2`) by a two-line subclass.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, ClassVar

import anyio
import httpx
from anyio.lowlevel import EventLoopToken, current_token

from .._core.attempts import Core
from .._core.effects import Call, Clock, Close, Read, Scan, Send, Sleep
from .._core.flavour import Flavour, is_proxy
from .._core.listing import Listing, StoreUnavailable, Suspension
from .._core.run import Run
from .._settings.config import Config
from .._state.protocol import StateStore

__all__ = ["AsyncFailoverTransport", "FailoverTransport", "Suspension"]

_STORE_GRACE = 5.0  # seconds a store call may take, even while a cancellation unwinds
_TYPED_FIRST = 0.1  # seconds the deadline waits for the transport's own timeout to fire
_NO_ANSWER = "sidestep: no answer within the request's deadline"
_STALLED = "sidestep: the body stalled for longer than stall_timeout"
_OUT_OF_TIME = "sidestep: total_timeout ran out while the body was read"
# The request a shell is sending in this context (thread or task), with the shell's
# configuration: a shell further in with the same configuration (a transport that
# forwards to another client's) passes that very request straight on, so no request is
# counted, retried or failed over twice. Nothing is written on the request itself.
_SENDING: ContextVar[tuple[Any, Config] | None] = ContextVar("sidestep_sending", default=None)


class _Shell:
    """What both shells share: the core, the inner transport, the operator methods."""

    _flavour: ClassVar[Flavour]
    _exact: ClassVar[bool]

    def __init__(
        self,
        config: Config | Mapping[str, Any] | None = None,
        *,
        transport: Any = None,
        store: StateStore | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._core = Core(
            config, store=store, clock=clock, flavour=self._flavour, exact_deadlines=self._exact
        )
        self._inner = transport if transport is not None else self._default_transport()
        # A wrapped client's dispatch knows which of its transports an attempt
        # takes; a plain inner transport either proxies everything or nothing.
        via_proxy = getattr(self._inner, "via_proxy", None)
        if via_proxy is None and is_proxy(self._inner):
            via_proxy = _always
        if via_proxy is not None:
            self._core.via_proxy = via_proxy
        # Whether the inner transport may hand a request on to another client's (whose
        # shell must then know this one handles it): not when it is httpx's own network,
        # mock or in-process app transport, which send it nowhere else.
        self._forwards = not _terminal(self._inner)
        # False turns this transport into a plain pass-through to the inner one
        # (what `uninstall()` does to clients it had wrapped).
        self.active = True
        # Requests waiting to retry, which a close wakes (`_closing`): a sync one waits on
        # the condition; an async one waits on an event, kept with its event loop.
        self._waits = threading.Condition()
        self._sleeping: dict[anyio.Event, EventLoopToken] = {}
        # What `suspensions()` lists: a shared store that is away lists its local stand-in.
        self._view = Listing(self._core.store, self._core.router, self._core.clock, strict=False)

    @property
    def inner(self) -> Any:
        """The transport that does the I/O."""
        return self._inner

    def _sent_further_out(self, request: Any, sending: tuple[Any, Config]) -> bool:
        """Whether the shell further out sending `sending` (in this context), of the same
        configuration, is sending this very request: it handles it, this passes it on."""
        config = self._core.config
        return sending[0] is request and (sending[1] is config or sending[1] == config)

    def _default_transport(self) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(routes={list(self._core.router.routes)!r})"

    @property
    def config(self) -> Config:
        return self._core.config

    @property
    def store(self) -> StateStore:
        return self._core.store

    def suspensions(self) -> list[Suspension]:
        """A snapshot of the scopes that are not healthy (origins only, never credentials)."""
        return self._view.suspensions()

    def clear(self, scope_id: str) -> bool:
        """Close one scope by hand; whether it was unhealthy and is cleared now.

        Emits ``suspension.cleared`` (``who="application"``), as the admin app
        and the command line do, so the audit trail and the metrics see it.
        False as well when a shared store did not answer: nothing is known cleared.
        """
        try:
            return self._view.clear(scope_id, "application") is not None
        except StoreUnavailable:
            return False


class _SyncShell(_Shell):
    _exact = False

    def _default_transport(self) -> Any:
        return self._flavour.module.HTTPTransport()

    def handle_request(self, request: Any) -> Any:
        sending = _SENDING.get()
        if not self.active or (sending is not None and self._sent_further_out(request, sending)):
            return self._inner.handle_request(request)
        core = self._core
        ready = core.decide(request)
        if isinstance(ready, Run):  # not ready: the general path goes on from the decision
            return self._drive(core.handle(request, ready))
        try:  # the fast path: the core decided, this sends, the core settles
            if self._forwards:
                response = self._send(ready[0])
            else:
                response = self._inner.handle_request(ready[0])
        except BaseException as exc:  # the core decides what every failure means
            return self._drive(core.resume(ready, exc))
        answer = core.settle(ready, response)
        return self._drive(core.resume(ready, response)) if answer is None else answer

    def _send(self, request: Any) -> Any:
        token = _SENDING.set((request, self._core.config))
        try:
            return self._inner.handle_request(request)
        finally:
            _SENDING.reset(token)

    def close(self) -> None:
        self._closing()
        self._inner.close()

    # A client used as a context manager enters and exits its transports: the
    # inner one gets exactly those calls, as it would with no sidestep between.
    def __enter__(self) -> Any:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._closing()
        self._inner.__exit__(*exc_info)

    def _closing(self) -> None:
        """Tell the core, and wake the requests waiting to retry (they send nothing more)."""
        with self._waits:
            self._core.closing()
            self._waits.notify_all()

    def _drive(self, steps: Generator[Any, Any, Any]) -> Any:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = steps.send(value) if error is None else steps.throw(error)
            except StopIteration as stop:
                return stop.value
            value, error = None, None
            try:
                if type(effect) is Send:  # the common effect, inline
                    if self._forwards:
                        value = self._send(effect.request)
                    else:
                        value = self._inner.handle_request(effect.request)
                else:
                    value = self._perform(effect)
            except BaseException as exc:  # the core decides what every failure means
                error = exc

    def _perform(self, effect: Any) -> Any:
        kind = type(effect)  # Send is performed inline by _drive
        if kind is Read:
            return self._read(effect)
        if kind is Close:
            return effect.response.close()
        if kind is Sleep:
            core = self._core
            with self._waits:  # woken by a close (`_closing`), or one since `effect.closes`
                self._waits.wait_for(lambda: core.closes != effect.closes, effect.seconds)
            return None
        if kind is Call:
            return getattr(self._core.store, effect.name)(*effect.args)
        raise TypeError(f"unknown effect {kind.__name__}")

    def _read(self, effect: Read) -> tuple[list[bytes], bool]:
        response = effect.response
        stream = response.stream
        chunks = iter(stream)
        head: list[bytes] = []
        size = 0
        scan = effect.scan
        # deadlines: the core's, held against its clock as each chunk comes in (a read
        # itself is bounded by the read timeout the core set)
        clock, deadline, end_by = self._core.clock, effect.deadline, effect.end_by
        try:
            while size < effect.limit:
                chunk = next(chunks)
                if deadline is not None and clock() > deadline:
                    raise self._flavour.read_timeout(_NO_ANSWER, request=effect.request)
                head.append(chunk)
                size += len(chunk)
                if scan is not None and scan.feed(chunk):
                    break  # scan: the head ends where the core's reader says
        except StopIteration:
            stream.close()
            response.stream = self._flavour.ByteStream(b"".join(head))
            return head, True
        except BaseException:
            # The head failed between two chunks (the scan found a limit passed while
            # keep-alives came): the iterator started here waits at a yield. Finish it
            # now (a generator's finally runs), rather than leave it to the garbage
            # collector.
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
            raise
        on_error, drive = effect.on_error, self._drive
        # The body's verdict is due once: at its end, at its failure, or when the
        # caller closes it early (a stream left at "[DONE]" was a success).
        end = [effect.on_end] if effect.on_end is not None else []

        def finish() -> None:
            if end:
                drive(end.pop()())

        def rest() -> Iterator[bytes]:
            yield from head
            try:
                if scan is None and end_by is None:
                    yield from chunks
                else:
                    for chunk in chunks:
                        if end_by is not None and clock() > end_by:  # (deadlines, as above)
                            raise self._flavour.read_timeout(_OUT_OF_TIME, request=effect.request)
                        if scan is not None:  # scan: every later chunk fed to the reader too
                            scan.feed(chunk)
                        yield chunk
            except Exception as exc:
                end.clear()
                if on_error is not None:
                    drive(on_error(exc))
                raise
            finish()

        response.stream = _sync_replay(self._flavour)(rest(), stream, finish)
        return head, False


class _AsyncShell(_Shell):
    _exact = True

    def _default_transport(self) -> Any:
        return self._flavour.module.AsyncHTTPTransport()

    async def handle_async_request(self, request: Any) -> Any:
        sending = _SENDING.get()
        if not self.active or (sending is not None and self._sent_further_out(request, sending)):
            return await self._inner.handle_async_request(request)
        core = self._core
        ready = core.decide(request)
        if isinstance(ready, Run):  # not ready: the general path goes on from the decision
            return await self._drive(core.handle(request, ready))
        # the fast path: the core decided, this sends (inline: no coroutine), the core settles
        token = _SENDING.set((ready[0], core.config)) if self._forwards else None
        try:
            response = await self._inner.handle_async_request(ready[0])
        except BaseException as exc:  # the core decides; cancellation comes back out
            if token is not None:
                _SENDING.reset(token)
            return await self._drive(core.resume(ready, exc))
        if token is not None:
            _SENDING.reset(token)
        answer = core.settle(ready, response)
        return await self._drive(core.resume(ready, response)) if answer is None else answer

    async def _send(self, request: Any) -> Any:
        if not self._forwards:
            return await self._inner.handle_async_request(request)
        token = _SENDING.set((request, self._core.config))
        try:
            return await self._inner.handle_async_request(request)
        finally:
            _SENDING.reset(token)

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
            with anyio.CancelScope(shield=True):
                return await effect.response.aclose()
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
            # Verdicts and releases must land even while a cancellation unwinds:
            # shield them, briefly, so no probe slot is left taken.
            with anyio.CancelScope(shield=True), anyio.move_on_after(_STORE_GRACE):
                return await call(*effect.args)
            return ()  # the store did not answer in time: nothing was recorded
        raise TypeError(f"unknown effect {kind.__name__}")

    def _deadline(
        self, deadline: float | None, request: Any, grace: float = 0.0, message: str = _NO_ANSWER
    ) -> Any:
        if deadline is None:
            return _NO_DEADLINE
        seconds = max(0.0, deadline - self._core.clock()) + grace
        return _Deadline(seconds, self._flavour, request, message)

    def _stall(self, seconds: float | None, request: Any, scan: Scan | None) -> Callable[[], Any]:
        """A new bound for each wait for a chunk: `seconds` of silence raise a ReadTimeout
        (with a `scan`, what it says is left of them: a keep-alive does not count)."""
        if seconds is None:
            return _no_deadline
        flavour = self._flavour

        def bound() -> _Deadline:
            left = seconds if scan is None else scan.stall_left()
            return _Deadline(left, flavour, request, _STALLED)

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
            await _finish(chunks)
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
                            with stall(), self._deadline(end_by, request, 0.0, _OUT_OF_TIME):
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

        response.stream = _async_replay(self._flavour)(rest(), stream, finish, chunks)
        return head, False


class _Deadline:
    """anyio.fail_after that surfaces as the flavour's ReadTimeout, as any httpx timeout would."""

    __slots__ = ("_flavour", "_message", "_request", "_scope")

    def __init__(
        self, seconds: float, flavour: Flavour, request: Any, message: str = _NO_ANSWER
    ) -> None:
        self._scope = anyio.fail_after(seconds)
        self._flavour = flavour
        self._request = request
        self._message = message

    def __enter__(self) -> None:
        self._scope.__enter__()

    def __exit__(self, *exc_info: Any) -> bool:
        try:
            return bool(self._scope.__exit__(*exc_info))
        except TimeoutError as exc:
            raise self._flavour.read_timeout(self._message, request=self._request) from exc


class _NoDeadline:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: Any) -> None:
        return None


_NO_DEADLINE = _NoDeadline()


def _no_deadline() -> _NoDeadline:
    return _NO_DEADLINE


_TERMINAL = frozenset(
    {"HTTPTransport", "AsyncHTTPTransport", "MockTransport", "ASGITransport", "WSGITransport"}
)


def _terminal(transport: Any) -> bool:
    """Whether `transport` is exactly one of httpx's or httpx2's own transports (not a
    subclass, which could do anything), or a wrapped client's dispatch over only those."""
    cls = type(transport)
    if isinstance(getattr(cls, "transports", None), property):  # a wrapped client's dispatch
        return all(_terminal(t) for t in transport.transports)
    return cls.__name__ in _TERMINAL and cls.__module__.partition(".")[0] in ("httpx", "httpx2")


def _always(url: Any) -> bool:
    return True


async def _finish(*iterators: Any) -> None:
    """Close the async iterators a read started (a generator's finally runs now), even
    while a cancellation unwinds; one already finished, or with no aclose, is left."""
    with anyio.CancelScope(shield=True):
        for iterator in iterators:
            close = getattr(iterator, "aclose", None)
            if close is not None:
                await close()


_REPLAYS: dict[tuple[str, bool], type[Any]] = {}


def _sync_replay(flavour: Flavour) -> Callable[[Iterator[bytes], Any, Callable[[], None]], Any]:
    cls = _REPLAYS.get((flavour.name, False))
    if cls is None:

        class SyncReplay(flavour.module.SyncByteStream):  # type: ignore[name-defined,misc]
            """The peeked head, then the rest of the body; closing closes the original."""

            def __init__(
                self, body: Iterator[bytes], original: Any, on_close: Callable[[], None]
            ) -> None:
                self._body = body
                self._original = original
                self._on_close = on_close

            def __iter__(self) -> Iterator[bytes]:
                return self._body

            def close(self) -> None:
                try:
                    self._on_close()
                finally:
                    self._original.close()

        cls = _REPLAYS[(flavour.name, False)] = SyncReplay
    return cls


def _async_replay(
    flavour: Flavour,
) -> Callable[[AsyncIterator[bytes], Any, Callable[[], Awaitable[None]], Any], Any]:
    cls = _REPLAYS.get((flavour.name, True))
    if cls is None:

        class AsyncReplay(flavour.module.AsyncByteStream):  # type: ignore[name-defined,misc]
            """The peeked head, then the rest of the body; closing closes the original."""

            def __init__(
                self,
                body: AsyncIterator[bytes],
                original: Any,
                on_close: Callable[[], Awaitable[None]],
                chunks: Any,
            ) -> None:
                self._body = body
                self._original = original
                self._on_close = on_close
                self._chunks = chunks  # the original's iterator, started by the peek

            def __aiter__(self) -> AsyncIterator[bytes]:
                return self._body

            async def aclose(self) -> None:
                try:
                    # a verdict write must land even while a cancellation unwinds
                    with anyio.CancelScope(shield=True):
                        await self._on_close()
                finally:
                    # Finish the iterators the peek started here and now, rather
                    # than leave them to the garbage collector and a closing loop.
                    try:
                        await _finish(self._body, self._chunks)
                    finally:
                        await self._original.aclose()

        cls = _REPLAYS[(flavour.name, True)] = AsyncReplay
    return cls


_HTTPX = Flavour(httpx)


class AsyncFailoverTransport(_AsyncShell, httpx.AsyncBaseTransport):
    """An `httpx.AsyncBaseTransport` that skips suspended upstreams and fails over.

    Args:
        config: a `Config`, a mapping validated into one, or None (per-host
            breaking, no routes).
        transport: the inner transport doing the I/O (default
            `httpx.AsyncHTTPTransport()`); closing this one closes it.
        store: where circuit state lives (default: a new `MemoryStore`).
        clock: monotonic seconds, for tests.

    Example:
        >>> client = httpx.AsyncClient(transport=sidestep.AsyncFailoverTransport(config))
    """

    _flavour = _HTTPX


class FailoverTransport(_SyncShell, httpx.BaseTransport):
    """An `httpx.BaseTransport` that skips suspended upstreams and fails over (sync clients).

    Takes the same arguments as `AsyncFailoverTransport`; the inner transport
    defaults to `httpx.HTTPTransport()`.
    """

    _flavour = _HTTPX
