"""What the sync and async shells share: the core and the inner transport they drive,
the operator methods (`suspensions`, `clear`), and the request a shell is sending in
this context, which a shell further in passes straight on.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, ClassVar

import anyio
from anyio.lowlevel import EventLoopToken

from .._core.effects import Clock
from .._core.flavour import Flavour, is_proxy
from .._core.listing import Listing, StoreUnavailable
from .._core.listing_row import Suspension
from .._core.loop import Core
from .._settings.config import Config
from .._state.protocol import StateStore
from . import faults

__all__ = ["SENDING", "Shell"]

# The request a shell is sending in this context (thread or task), with the shell's
# configuration: a shell further in with the same configuration (a transport that
# forwards to another client's) passes that very request straight on, so no request is
# counted, retried or failed over twice. Nothing is written on the request itself.
SENDING: ContextVar[tuple[Any, Config] | None] = ContextVar("sidestep_sending", default=None)


class Shell:
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
        if self._core.config.chaos is not None:
            faults.chaos(self)  # the configuration's faults, between this and its transport
        if faults.BUILT:
            faults.built(self)

    @property
    def inner(self) -> Any:
        """The transport that does the I/O (under any fault plan's layer)."""
        inner = self._inner
        while isinstance(inner, faults.FaultyTransport):
            inner = inner.inner
        return inner

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
