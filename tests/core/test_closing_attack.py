"""A client closed between two attempts of one request sends nothing more.

`tests/core/test_closing.py` closes a client while an attempt is in flight, and while a
retry waits. These close it in the gaps left: while the next candidate is admitted
(a store that waits on I/O, such as SQLite's, lets another task run there), and as
the next candidate or the retry starts (another thread may close a sync client at any
moment; an observer of the request's events stands in for it, deterministically).
Plain httpx sends nothing through a closed client, and neither may the request: no
attempt reaches the next upstream, and no connection is opened in the closed pool. A
probe slot the next candidate's admission took comes back at once.
Each case runs over real sockets on 127.0.0.1.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import sidestep
import sidestep.httpx2
from differential import FLAVOURS, KINDS, Face
from drivers import route
from sidestep._common.scopes import ScopeFacts
from sidestep._settings.values import SidestepConfigWarning
from sidestep._state.protocol import Admission
from sidestep.logging import add_observer, remove_observer
from test_closing import (
    FAILURE_EVENTS,
    Recorder,
    assert_only_a_open,
    execute,
    failover_transport,
    flavour_of,
    settled,
)
from upstream import Respond, Upstream


class AdmittingStore(sidestep.SqliteStore):
    """A real SQLite store that calls `hook` (once) as it admits a request to `origin`."""

    def __init__(self, path: Path, origin: str) -> None:
        super().__init__(path)
        self.origin = origin
        self.hook: Callable[[], Any] | None = None

    def _take(self, facts: ScopeFacts) -> Callable[[], Any] | None:
        hook = self.hook if facts.origin == self.origin else None
        if hook is not None:
            self.hook = None
        return hook

    def admit(self, facts: ScopeFacts, *args: Any) -> Admission:
        hook = self._take(facts)
        if hook is not None:
            hook()
        return super().admit(facts, *args)

    async def admit_async(self, facts: ScopeFacts, *args: Any) -> Admission:
        hook = self._take(facts)
        if hook is not None:
            await hook()
        return await super().admit_async(facts, *args)


@pytest.fixture
def closing_store(tmp_path: Path, b: Upstream) -> Iterator[AdmittingStore]:
    store = AdmittingStore(tmp_path / "state.db", b.url)
    yield store
    store.close()


def failing_over(a: Upstream, b: Upstream, **failover: Any) -> dict[str, Any]:
    """Route "chat" over A then B, A answering 503: one strike opens a scope."""
    a.behaviour = lambda _: Respond(503, body="busy")
    return route(
        ("a", a.url + "/v1"),
        ("b", b.url + "/v1"),
        breaker={"failure_threshold": 1},
        failover=failover,
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_client_closed_while_the_next_candidate_is_admitted_sends_it_nothing(
    flavour: str, kind: str, a: Upstream, b: Upstream, closing_store: AdmittingStore
) -> None:
    """A's 503 sends the GET on to B; the client is closed (another thread, another task)
    while the store admits B. B is sent nothing and no connection to it is opened: the
    request ends with A's 503 as it came, which counts against A."""
    h, sync = flavour_of(flavour), kind == "sync"
    module: Any = sidestep.httpx2 if flavour == "httpx2" else sidestep
    cls = module.FailoverTransport if sync else module.AsyncFailoverTransport
    inner = h.HTTPTransport() if sync else h.AsyncHTTPTransport()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)  # failure_threshold: 1
        transport = cls(failing_over(a, b), transport=inner, store=closing_store)
    client = (h.Client if sync else h.AsyncClient)(transport=transport, timeout=5.0)
    if sync:

        def close_from_another_thread() -> None:
            thread = threading.Thread(target=client.close)
            thread.start()
            thread.join(10.0)

        closing_store.hook = close_from_another_thread
    else:
        closing_store.hook = client.aclose
    seen: list[Any] = []

    async def go() -> None:
        with Recorder() as events:
            seen.append(await settled(Face(client, sync).get(a.url + "/v1/x")))
        seen.append(events.names())

    execute(kind, go)
    answer, names = seen
    assert answer[0] == "returned"
    assert (answer[1]["status"], answer[1]["content"]) == (503, b"busy")
    assert (a.calls, b.calls, b.connections) == (1, 0, 0)
    assert "failover" not in names
    assert_only_a_open(transport)


def closed_on(
    h: Any, config: Mapping[str, Any], url: str, when: Callable[[str, Mapping[str, Any]], bool]
) -> tuple[Any, Recorder]:
    """A sync GET of `url` through a failover transport over `config`, its client closed by
    an observer as soon as `when(event, fields)` holds (in the request's own thread, as
    another thread may close it at that moment): the transport, and the events seen. The
    GET must raise the flavour's ReadError."""
    transport = failover_transport(h, True, config, h.HTTPTransport())
    client = h.Client(transport=transport, timeout=5.0)

    def on_event(event: str, fields: Mapping[str, Any], /) -> None:
        if when(event, fields):
            client.close()

    with Recorder() as events:
        add_observer(on_event)
        try:
            with pytest.raises(h.ReadError):
                client.get(url)
        finally:
            remove_observer(on_event)
    return transport, events


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_sync_client_closed_as_the_next_candidate_starts_sends_it_nothing(
    flavour: str, a: Upstream, b: Upstream
) -> None:
    """Closed as the GET moves on to B (its 503 from A let go already), the request ends
    with the flavour's ReadError, as one in flight on a closed client does: B is sent
    nothing, no connection to it is opened, and no failure is made up for B."""
    transport, events = closed_on(
        flavour_of(flavour),
        failing_over(a, b),
        a.url + "/v1/x",
        lambda event, _: event == "failover",
    )
    assert (a.calls, b.calls, b.connections) == (1, 0, 0)
    failed = [f["target"] for e, f in events.seen if e == "upstream.failed"]
    assert failed == ["a"]
    assert_only_a_open(transport)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_sync_client_closed_as_a_retry_starts_sends_it_nothing(
    flavour: str, a: Upstream, b: Upstream
) -> None:
    """With two attempts per target, A's 503 is retried in place; closed as the retry
    starts, the request ends with the flavour's ReadError, and neither A nor B is sent
    anything more (no connection is opened in the closed pool). A's 503 counts, as when
    the close comes during the wait: it is told as a failure and opens A, and nothing
    fails over."""
    transport, events = closed_on(
        flavour_of(flavour),
        failing_over(a, b, max_attempts_per_target=2, max_retry_wait=0.05),
        a.url + "/v1/x",
        lambda event, fields: event == "attempt.started" and fields["attempt"] == 2,
    )
    assert (a.calls, a.connections, b.calls, b.connections) == (1, 1, 0, 0)
    assert_only_a_open(transport)
    assert events.names() & FAILURE_EVENTS == {"upstream.failed", "circuit.opened"}


class HookedMemoryStore(sidestep.MemoryStore):
    """A memory store that calls `hook` (once) as it admits a request to `origin`."""

    def __init__(self, origin: str) -> None:
        super().__init__()
        self.origin = origin
        self.hook: Callable[[], Any] | None = None

    def admit(self, facts: ScopeFacts, *args: Any) -> Admission:
        hook = self.hook if facts.origin == self.origin else None
        if hook is not None:
            self.hook = None
            hook()
        return super().admit(facts, *args)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_probe_admitted_as_the_client_closes_gives_its_slot_back(
    flavour: str, a: Upstream, b: Upstream
) -> None:
    """A and B are half-open. A's probe fails (503) and the GET moves on to B, whose probe
    is admitted as another thread closes the client: B is sent nothing, and its probe slot
    comes back at once, so the next request probes B (no request refused until a lease
    ends) and B's answer closes its circuit."""
    h = flavour_of(flavour)
    now = [1000.0]
    store = HookedMemoryStore(b.url)
    config = failing_over(a, b)
    b.behaviour = lambda _: Respond(503, body="busy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)  # failure_threshold: 1
        module: Any = sidestep.httpx2 if flavour == "httpx2" else sidestep
        transport = module.FailoverTransport(
            config, transport=h.HTTPTransport(), store=store, clock=lambda: now[0]
        )
    with h.Client(transport=transport, timeout=5.0) as first:
        assert first.get(a.url + "/v1/x").status_code == 503  # A, then B: both open
    now[0] += 3600  # both half-open
    b.behaviour = lambda _: Respond(body="b")
    client = h.Client(transport=transport, timeout=5.0)

    def close_from_another_thread() -> None:
        thread = threading.Thread(target=client.close)
        thread.start()
        thread.join(10.0)

    store.hook = close_from_another_thread
    response = client.get(a.url + "/v1/x")
    assert (response.status_code, response.text) == (503, "busy")  # A's probe, as it came
    assert (a.calls, b.calls) == (2, 1)
    with h.Client(transport=transport, timeout=5.0) as after:
        response = after.get(a.url + "/v1/x")  # A open again: B's probe
    assert (response.status_code, response.text) == (200, "b")
    assert [s.target for s in transport.suspensions()] == ["a"]
