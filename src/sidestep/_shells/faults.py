"""Performing a fault plan: the layer put between a shell and its inner transport.

`FaultyTransport` asks the plan's `Injector` (`_core.faults`) for each attempt
it is handed, and performs what was picked: an answer made up (an error status,
a malformed body, an event stream opening with an error), an exception (a
connection failure, a timeout), or the upstream's own answer spoiled (its body
cut, or stalled, after some bytes). Everything else goes to the inner
transport untouched, so routes, circuits, stores, events and metrics run for
real. What it makes is marked (`_core.faults.mark`), so the core can tell it
from the upstream's. It decides nothing: the sync and async methods only
perform.

`put_under` and `take_out` add and remove the layer; the `chaos:` section of
a configuration puts one under every transport built from it (`chaos`), and
`BUILT` holds what else wants to see each transport built (`sidestep.testing`).
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import anyio

from .._core.effects import Clock
from .._core.faults import ATTEMPT, Injection, Injector, made_answer, mark
from .._core.flavour import Flavour

if TYPE_CHECKING:
    from .shell import Shell

__all__ = ["BUILT", "FaultyTransport", "built", "chaos", "put_under", "take_out"]

# Called with every shell built, after it is whole (`sidestep.testing` tracks them).
BUILT: list[Callable[[Shell], None]] = []

_REFUSED = "sidestep injected a fault: the connection was refused"
_NO_ANSWER = "sidestep injected a fault: no answer in time"
_CUT = "sidestep injected a fault: the upstream's stream was cut"
_STALLED = "sidestep injected a fault: the upstream's stream stalled"


class FaultyTransport:
    """The inner transport of a shell under a fault plan: each attempt as the plan says."""

    __slots__ = ("_clock", "_draw", "_flavour", "injector", "inner")

    def __init__(
        self,
        inner: Any,
        injector: Injector,
        flavour: Flavour,
        clock: Clock,
        draw: Callable[[], float],
    ) -> None:
        self.inner = inner
        self.injector = injector
        self._flavour = flavour
        self._clock = clock
        self._draw = draw

    def __repr__(self) -> str:
        return f"FaultyTransport({self.inner!r})"

    def _pick(self, request: Any) -> Injection | None:
        """The fault for `request` (its `ATTEMPT` taken off: the inner transport sees the
        request's extensions as they would be with no plan)."""
        where = request.extensions.pop(ATTEMPT, None)  # (the attempt's own copy: `_exchange`)
        return self.injector.pick(where, self._clock(), self._draw)

    def handle_request(self, request: Any) -> Any:
        injection = self._pick(request)
        if injection is None:
            return self.inner.handle_request(request)
        if injection.sends:
            return self._spoiled(self.inner.handle_request(request), request, injection)
        if injection.rule.delay:
            time.sleep(_delay(injection, request))
        return self._made(request, injection)

    async def handle_async_request(self, request: Any) -> Any:
        injection = self._pick(request)
        if injection is None:
            return await self.inner.handle_async_request(request)
        if injection.sends:
            response = await self.inner.handle_async_request(request)
            return self._spoiled(response, request, injection)
        if injection.rule.delay:
            await anyio.sleep(_delay(injection, request))
        return self._made(request, injection)

    def _made(self, request: Any, injection: Injection) -> Any:
        """The made-up answer of `injection`; raised, when it is an exception."""
        module = self._flavour.module
        fault = injection.fault
        if fault == "connect_error":
            raise mark(module.ConnectError(_REFUSED, request=request), injection)
        if fault == "timeout":
            raise mark(module.ReadTimeout(_NO_ANSWER, request=request), injection)
        status, headers, body = made_answer(injection)
        stream = _stream_class(self._flavour)(None, body, injection, request, self._flavour)
        response = module.Response(status, headers=headers, stream=stream, request=request)
        return mark(response, injection)

    def _spoiled(self, response: Any, request: Any, injection: Injection) -> Any:
        """The upstream's `response`, its body cut or stalled as `injection` says (one read
        already, as an inner transport may hand it, comes again as a stream to cut)."""
        stream = _stream_class(self._flavour)
        try:
            content = response._content
        except AttributeError:
            response.stream = stream(response.stream, b"", injection, request, self._flavour)
            return mark(response, injection)
        spoiled = stream(self._flavour.ByteStream(content), b"", injection, request, self._flavour)
        made = self._flavour.module.Response(
            response.status_code,
            headers=response.headers,
            stream=spoiled,
            request=request,
            extensions=response.extensions,
        )
        return mark(made, injection)

    # Lifecycle calls go to the inner transport, once each, as with no plan between.
    def close(self) -> None:
        self.inner.close()

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __enter__(self) -> Any:
        self.inner.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.inner.__exit__(*exc_info)

    async def __aenter__(self) -> Any:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.inner.__aexit__(*exc_info)


class _FaultStream:
    """A body a fault made up (`source` None: `body`, in one chunk), or the upstream's
    body (`source`) up to the fault's `after_bytes`, where it is cut or stalls."""

    def __init__(
        self, source: Any, body: bytes, injection: Injection, request: Any, flavour: Flavour
    ) -> None:
        self._source = source
        self._body = body
        self._injection = injection
        self._request = request
        self._flavour = flavour
        self._left = injection.rule.after_bytes  # bytes still handed on before the fault
        self._closed = threading.Event()

    def _take(self, chunk: bytes) -> bytes:
        """The part of `chunk` handed on before the fault strikes."""
        part = chunk[: self._left]
        self._left -= len(part)
        return part

    def _error(self) -> BaseException:
        module, request = self._flavour.module, self._request
        if self._injection.fault == "cut_stream":
            error = module.RemoteProtocolError(_CUT, request=request)
        else:
            error = module.ReadTimeout(_STALLED, request=request)
        return mark(error, self._injection)  # type: ignore[no-any-return]

    def _stall(self) -> float | None:
        """How long a stalled body waits before its read times out: the attempt's read
        timeout, as a socket's read would (None: until the body is closed); a cut, not at all."""
        if self._injection.fault != "stalled_stream":
            return 0.0
        timeouts = self._request.extensions.get("timeout")
        read = timeouts.get("read") if isinstance(timeouts, dict) else None
        return float(read) if isinstance(read, (int, float)) else None

    def __iter__(self) -> Iterator[bytes]:
        if self._source is None:
            yield self._body
            return
        if not self._left:
            self._strike()
        for chunk in self._source:
            part = self._take(chunk)
            if part:
                yield part
            if not self._left:
                self._strike()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._source is None:
            yield self._body
            return
        if not self._left:
            await self._astrike()
        async for chunk in self._source:
            part = self._take(chunk)
            if part:
                yield part
            if not self._left:
                await self._astrike()

    def _strike(self) -> None:
        wait = self._stall()
        if wait != 0.0:
            self._closed.wait(wait)
        raise self._error()

    async def _astrike(self) -> None:
        wait = self._stall()
        if wait is None:
            await anyio.sleep_forever()
        elif wait:
            await anyio.sleep(wait)
        raise self._error()

    def close(self) -> None:
        self._closed.set()
        if self._source is not None:
            self._source.close()

    async def aclose(self) -> None:
        self._closed.set()
        if self._source is not None:
            await self._source.aclose()


@functools.cache
def _delay(injection: Injection, request: Any) -> float:
    """How long an injected fault waits before it is raised or answered: its rule's delay,
    no longer than the attempt's read timeout (which a silent upstream would meet first)."""
    delay = float(injection.rule.delay or 0.0)
    read = (request.extensions.get("timeout") or {}).get("read")
    return delay if read is None else max(0.0, min(delay, read))


def _stream_class(flavour: Flavour) -> Callable[..., _FaultStream]:
    """`_FaultStream` as a byte stream of `flavour`, sync and async (and no `ByteStream`:
    the core reads it as a body still to come)."""
    module = flavour.module
    bases = (_FaultStream, module.SyncByteStream, module.AsyncByteStream)
    made: Callable[..., _FaultStream] = type("FaultStream", bases, {})
    return made


def put_under(
    shell: Shell, injector: Injector, clock: Clock, draw: Callable[[], float]
) -> FaultyTransport:
    """Put `injector`'s layer between `shell` and its inner transport."""
    core = shell._core
    faulty = FaultyTransport(shell._inner, injector, shell._flavour, clock, draw)
    shell._inner = faulty
    core.injecting = True
    return faulty


def take_out(shell: Shell, injector: Injector) -> None:
    """Take `injector`'s layer (if any) from between `shell` and its inner transport."""
    outer: FaultyTransport | None = None
    layer = shell._inner
    while isinstance(layer, FaultyTransport):
        if layer.injector is injector:
            if outer is None:
                shell._inner = layer.inner
            else:
                outer.inner = layer.inner
            break
        outer, layer = layer, layer.inner
    shell._core.injecting = isinstance(shell._inner, FaultyTransport)


def chaos(shell: Shell) -> None:
    """Put the configuration's `chaos:` faults under `shell`: its own rules' counts, its
    own random numbers (seeded as the section says), the core's clock."""
    settings = shell._core.config.chaos
    if settings is None:
        return
    core = shell._core
    injector = Injector()
    injector.add_all(settings.faults, core.clock())
    draw = random.Random(settings.seed).random  # noqa: S311  # chaos, not cryptography
    put_under(shell, injector, core.clock, draw)


def built(shell: Shell) -> None:
    """Tell whoever asked (`BUILT`) of a shell just built."""
    for hook in tuple(BUILT):
        hook(shell)
