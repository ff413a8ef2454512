"""Putting sidestep under clients that already exist or that other code creates: wrap, install.

`wrap` replaces a client's transport and each of its mounts in place by a
sidestep transport over the original, so the client keeps every setting it
was built with. `install` patches the four client classes of httpx and httpx2
so that every client created afterwards — an SDK's default client included —
is wrapped the same way, all sharing one store; `uninstall` undoes both.
httpx2 is optional: where it is not installed, only httpx's classes are
known, and httpx2 is never imported.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from .._core.flavour import is_proxy, reaches_network
from .._settings.config import Config, as_config
from .._state.build import build_store
from .._state.protocol import StateStore
from .shell import Shell
from .transport import AsyncFailoverTransport, FailoverTransport

if TYPE_CHECKING:
    import httpx2

__all__ = ["install", "uninstall", "wrap"]

Client = TypeVar(
    "Client", bound="httpx.Client | httpx.AsyncClient | httpx2.Client | httpx2.AsyncClient"
)

# The shell for each client class; subclasses (the SDKs' default clients) find theirs by MRO.
_SHELLS: dict[type[Any], type[Shell]] = {
    httpx.Client: FailoverTransport,
    httpx.AsyncClient: AsyncFailoverTransport,
}
try:
    from . import httpx2 as _sidestep_httpx2  # the optional httpx2: its classes when it is there
except ImportError as exc:  # httpx2 is not installed: httpx's classes are all there is
    if exc.name != "httpx2":
        raise
else:
    import httpx2

    _SHELLS[httpx2.Client] = _sidestep_httpx2.FailoverTransport
    _SHELLS[httpx2.AsyncClient] = _sidestep_httpx2.AsyncFailoverTransport


@dataclass(frozen=True, slots=True)
class _Installed:
    config: Config
    store: StateStore


_lock = threading.RLock()  # re-entrant: a client created while wrapping must not deadlock
_installed: _Installed | None = None
_originals: dict[type[Any], tuple[Callable[..., None], Callable[..., None]]] = {}
_installed_shells: weakref.WeakSet[Shell] = weakref.WeakSet()


class _Dispatch:
    """The inner transport of a wrapped slot: each attempt goes where the client would send it.

    A failover target may need another mount than the request it replaces (a
    backup host listed in ``NO_PROXY``, say), so every attempt is routed
    through the client's original transports by its own URL. Closing closes
    only the slot's own transport, as the client closes each slot once.
    """

    __slots__ = ("main", "mounts", "own")

    def __init__(self, own: Any, main: Any, mounts: list[tuple[Any, Any]]) -> None:
        self.own = own
        self.main = main
        self.mounts = mounts

    def __repr__(self) -> str:
        return f"_Dispatch({type(self.own).__name__})"

    @property
    def transports(self) -> list[Any]:
        """Every transport an attempt may take: the client's main one and its mounts'."""
        return [self.main, *(t for _, t in self.mounts if t is not None)]

    def _for(self, url: Any) -> Any:
        # the same walk as the clients' own `_transport_for_url`
        for pattern, transport in self.mounts:
            if pattern.matches(url):
                return self.main if transport is None else transport
        return self.main

    def via_proxy(self, url: Any) -> bool:
        """Whether an attempt to `url` goes through a proxy (the core asks on a connect error)."""
        return is_proxy(self._for(url))

    def handle_request(self, request: Any) -> Any:
        return self._for(request.url).handle_request(request)

    async def handle_async_request(self, request: Any) -> Any:
        return await self._for(request.url).handle_async_request(request)

    def close(self) -> None:
        self.own.close()

    async def aclose(self) -> None:
        await self.own.aclose()

    def __enter__(self) -> Any:
        self.own.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.own.__exit__(*exc_info)

    async def __aenter__(self) -> Any:
        await self.own.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.own.__aexit__(*exc_info)


def wrap(
    client: Client,
    config: Config | Mapping[str, Any] | None = None,
    *,
    store: StateStore | None = None,
) -> Client:
    """Put sidestep under an existing httpx or httpx2 client, sync or async, in place.

    The client's transport and every mount (environment proxies live in
    mounts) become sidestep transports over the originals, sharing one store,
    so the client keeps its own limits, proxies, TLS and keep-alive settings.

    Args:
        client: an `httpx.Client`, `httpx.AsyncClient`, `httpx2.Client` or
            `httpx2.AsyncClient`, or a subclass such as an SDK's default client.
        config: a `Config`, a mapping validated into one, or None.
        store: where circuit state lives (default: a new store for this client, of the kind
            the configuration's `store:` names).

    Returns:
        The same client. A client that already has a sidestep transport is
        returned unchanged, unless it got it from `install()`: an explicit
        `wrap` replaces those with its own configuration.

    Raises:
        TypeError: `client` is not a client of httpx or httpx2.
        ConfigError: `config` is a mapping that is not a valid configuration.

    Example:
        >>> openai.OpenAI(http_client=sidestep.wrap(openai.DefaultHttpx2Client(), config))
    """
    shell = _shell_class(client)
    settings = as_config(config)
    with _lock:
        _wrap(client, shell, settings, store, explicit=True)
    return client


def install(
    config: Config | Mapping[str, Any] | None = None, *, store: StateStore | None = None
) -> None:
    """Wrap every httpx and httpx2 client created from now on, SDK clients included.

    All clients wrapped this way share one store, so what one learns about an
    upstream every other knows. Clients that exist already are left alone.
    Calling it again changes the configuration for clients created afterwards
    (and the store, when one is given); no client is ever wrapped twice.

    Args:
        config: a `Config`, a mapping validated into one, or None.
        store: the shared store (default: the one the configuration's `store:` names,
            kept across calls while that setting stays the same).

    Raises:
        ConfigError: `config` is a mapping that is not a valid configuration.
    """
    global _installed
    settings = as_config(config)
    with _lock:
        if store is None:
            # the configured store, kept across calls while its settings stay the same
            same = _installed is not None and _installed.config.store == settings.store
            store = _installed.store if same and _installed else build_store(settings.store)
        _installed = _Installed(settings, store)
        for cls in _SHELLS:
            if cls not in _originals:
                original = cls.__init__
                patched = _after_init(original)
                _originals[cls] = (original, patched)
                setattr(cls, "__init__", patched)  # noqa: B010  # mypy refuses assigning a method


def uninstall() -> None:
    """Undo `install()`: new clients are plain again; the clients it wrapped pass straight through.

    A no-op when nothing is installed.
    """
    global _installed
    with _lock:
        _installed = None
        for cls, (original, patched) in _originals.items():
            # someone may have patched over us since; then our hook stays, inert
            if cls.__dict__.get("__init__") is patched:
                setattr(cls, "__init__", original)  # noqa: B010  # as in install()
        _originals.clear()
        for shell in list(_installed_shells):
            shell.active = False
        _installed_shells.clear()


def _after_init(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        with _lock:
            # read under the lock: an uninstall() racing this constructor wins cleanly
            if _installed is not None:
                state = _installed
                _wrap(self, _shell_class(self), state.config, state.store, explicit=False)

    return __init__


def _shell_class(client: object) -> type[Shell]:
    for cls in type(client).__mro__:
        shell = _SHELLS.get(cls)
        if shell is not None:
            return shell
    raise TypeError(
        "sidestep.wrap() takes an httpx or httpx2 client (Client or AsyncClient), "
        f"not {type(client).__name__}"
    )


def _replaceable(transport: Any) -> bool:
    """A shell that install() put there, still active or turned off by uninstall()."""
    return (
        isinstance(transport, Shell)
        and isinstance(transport.inner, _Dispatch)
        and (transport in _installed_shells or not transport.active)
    )


def _original(transport: Any) -> Any:
    """The transport install() put a shell over, or `transport` if it put none."""
    return transport.inner.own if isinstance(transport, Shell) else transport


def _wrap(
    client: Any, shell: type[Shell], config: Config, store: StateStore | None, *, explicit: bool
) -> None:
    """Put shells of `shell` over the client's transport and mounts; the caller holds the lock."""
    main: Any = client._transport
    mounts: dict[Any, Any] = client._mounts
    slots = [main, *(t for t in mounts.values() if t is not None)]
    shells = [t for t in slots if isinstance(t, Shell)]
    if shells:
        if not explicit or not all(_replaceable(t) for t in shells):
            return  # wrapped already
        # an explicit wrap() takes over from install(), or from an uninstalled
        # pass-through: back to the originals first (install() left the slots that
        # reach no network as they were)
        for t in shells:
            _installed_shells.discard(t)
        main = _original(main)
        mounts = {k: None if t is None else _original(t) for k, t in mounts.items()}
    store = store if store is not None else build_store(config.store)
    table = list(mounts.items())

    def over(transport: Any) -> Any:
        if not explicit and not reaches_network(transport):
            # install() breaks circuits for the network only: a test double, an in-process
            # app, or a transport that cannot be told to reach the network is left as it
            # is, never refused for what a circuit learned of the same URL elsewhere
            return transport
        wrapped = shell(config, transport=_Dispatch(transport, main, table), store=store)
        if not explicit:
            _installed_shells.add(wrapped)
            wrapped._core.only_the_network = True
        return wrapped

    client._mounts = {k: None if t is None else over(t) for k, t in mounts.items()}
    client._transport = over(main)
