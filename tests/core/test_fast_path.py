"""The fast path (`Core.decide` and `Core.settle`) is the general path, only cheaper.

The same scripted traffic runs through a transport with the fast path and
one without it (the core's private switch): every answer or error, every
event and the store's state after every step must be the same. Pure logic:
the upstreams are `httpx.MockTransport` handlers, the clock a fake one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import anyio
import httpx
import pytest

import sidestep
from drivers import FakeClock
from sidestep import logging as events
from sidestep._answers.classify import Exchange, Kind, Verdict, classify
from sidestep._core.routes import Candidates
from sidestep._core.run import Run
from sidestep._state.memory import MemoryStore

PRIMARY = "http://primary.example"
BACKUP = "http://backup.example"
ORIGIN = "http://origin.example"
CONFIG = {
    "breaker": {"failure_threshold": 2, "cooldown": 10},
    "routes": [
        {
            "name": "chat",
            "match": ["http://llm.internal/v1"],
            "targets": [
                {"name": "primary", "url": PRIMARY + "/v1", "headers": {"x-api-key": "k1"}},
                {"name": "backup", "url": BACKUP + "/v1"},
            ],
        },
        {
            # Requests to the first target's own URL go as they are (`Candidates.lane`).
            "name": "direct",
            "targets": [
                {"name": "origin", "url": ORIGIN + "/v1"},
                {"name": "spare", "url": BACKUP + "/v2"},
            ],
        },
    ],
}


class Chunks(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body that arrives in pieces (not in memory): its verdict waits for its first byte."""

    def __init__(self, *chunks: bytes, fail: bool = False) -> None:
        self._chunks = chunks
        self._fail = fail

    def __iter__(self) -> Iterator[bytes]:
        yield from self._chunks
        if self._fail:
            raise httpx.ReadError("broke off")

    async def __aiter__(self) -> Any:
        for chunk in self._chunks:
            yield chunk
        if self._fail:
            raise httpx.ReadError("broke off")


def _answer(kind: str, request: httpx.Request) -> httpx.Response:
    if kind == "ok":
        return httpx.Response(200, content=b'{"ok":true}', headers={"x-from": request.url.host})
    if kind == "stream":
        return httpx.Response(200, stream=Chunks(b"a", b"b"))
    if kind == "broken":
        return httpx.Response(200, stream=Chunks(b"a", fail=True))
    if kind == "redirect":
        return httpx.Response(304, content=b"")
    if kind == "connect":
        raise httpx.ConnectError("refused", request=request)
    if kind == "timeout":
        raise httpx.ReadTimeout("slow", request=request)
    if kind == "429":
        return httpx.Response(429, headers={"retry-after": "3"}, content=b"slow down")
    return httpx.Response(int(kind), content=b'{"error":"x"}')


# Each step: (method, url, what primary answers, what backup answers, seconds to advance after).
SCRIPT: list[tuple[str, str, str, str, float]] = [
    ("GET", "http://llm.internal/v1/models", "ok", "ok", 0),
    ("POST", "http://llm.internal/v1/chat", "stream", "ok", 0),
    ("GET", "http://llm.internal/v1/models", "redirect", "ok", 0),
    ("GET", "http://llm.internal/v1/models", "404", "ok", 0),
    ("GET", "http://llm.internal/v1/models", "503", "ok", 0),
    ("GET", "http://llm.internal/v1/models", "ok", "ok", 0),  # resets the failure count
    ("GET", "http://llm.internal/v1/models", "connect", "ok", 0),
    ("GET", "http://llm.internal/v1/models", "503", "ok", 0),  # opens the primary
    ("GET", "http://llm.internal/v1/models", "ok", "ok", 0),  # skipped: served by the backup
    ("POST", "http://llm.internal/v1/chat", "ok", "stream", 11),  # skipped; streamed backup
    ("GET", "http://llm.internal/v1/models", "503", "ok", 11),  # the probe fails: reopened
    ("GET", "http://llm.internal/v1/models", "ok", "ok", 0),  # the probe succeeds: closed
    ("GET", "http://llm.internal/v1/models", "429", "ok", 0),
    ("GET", "http://llm.internal/v1/models", "ok", "503", 4),  # primary back after 3 s
    ("GET", "http://llm.internal/v1/models", "broken", "ok", 0),
    ("GET", "http://llm.internal/v1/models", "timeout", "connect", 0),
    ("GET", "http://llm.internal/v1/models", "500", "500", 0),
    ("GET", "http://llm.internal/v1/models", "500", "500", 0),  # both open
    ("GET", "http://llm.internal/v1/models", "ok", "ok", 11),  # every candidate suspended
    ("GET", "http://unrouted.example/a", "ok", "ok", 0),
    ("GET", "http://unrouted.example/a", "ok", "ok", 0),
    ("GET", "http://llm.internal/v1/models", "ok", "ok", 0),
    # The same story on a route whose requests go as they are to its first target.
    ("GET", ORIGIN + "/v1/models", "ok", "ok", 0),
    ("POST", ORIGIN + "/v1/chat", "stream", "ok", 0),
    ("GET", ORIGIN + "/v1/models", "404", "ok", 0),
    ("GET", ORIGIN + "/v1/models", "503", "ok", 0),
    ("GET", ORIGIN + "/v1/models", "ok", "ok", 0),  # resets the failure count
    ("GET", ORIGIN + "/v1/models", "503", "ok", 0),
    ("GET", ORIGIN + "/v1/models", "connect", "ok", 0),  # opens the origin
    ("GET", ORIGIN + "/v1/models", "ok", "ok", 11),  # skipped: served by the spare
    ("GET", ORIGIN + "/v1/models", "ok", "ok", 0),  # the probe succeeds: closed
    ("GET", ORIGIN + "/v1/models", "429", "ok", 4),
    ("GET", ORIGIN + "/v1/models", "ok", "ok", 0),
    ("GET", "http://unrouted.example/a", "503", "ok", 0),
    ("GET", "http://unrouted.example/a", "ok", "ok", 0),  # the failing endpoint reset
    # Requests naming state the primary's provider keeps never move to the backup.
    ("GET", "http://llm.internal/v1/files/f1", "503", "ok", 0),  # the primary's 503 comes back
    ("POST", "http://llm.internal/v1/responses", "503", "ok", 0),  # no state: opens, moves
    ("GET", "http://llm.internal/v1/responses/r1", "ok", "ok", 0),  # all suspended, backup not
    ("GET", "http://llm.internal/v1/models", "ok", "ok", 0),  # the backup's
]
# Sync only: while the request is in flight, the script sends another one through the transport.
RACES = [
    ("GET", "http://llm.internal/v1/models", "race", "ok", 0),
    ("GET", ORIGIN + "/v1/models", "race", "ok", 0),
]


class Script:
    """What each upstream answers now: set before each step."""

    def __init__(self) -> None:
        self.primary = self.backup = "ok"
        self.transport: Any = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        kind = self.backup if request.url.host == "backup.example" else self.primary
        if kind == "race":
            # While this request is in flight, another one fails on the same target: this
            # one's success must still reset the count the other one left.
            url = "http://llm.internal/v1/x"
            if request.url.host == "origin.example":
                url = ORIGIN + "/v1/x"
            self.primary = "503"
            self.transport.handle_request(httpx.Request("GET", url))
            self.primary, kind = "race", "ok"
        return _answer(kind, request)


def _transport(async_: bool, fast: bool, **extra: Any) -> tuple[Any, Script, FakeClock]:
    script, clock = Script(), FakeClock()
    store = MemoryStore(fingerprint_key=b"the same key for both")
    cls = sidestep.AsyncFailoverTransport if async_ else sidestep.FailoverTransport
    transport = cls(
        {**CONFIG, **extra}, transport=httpx.MockTransport(script), store=store, clock=clock
    )
    transport._core._fast_path = fast
    script.transport = transport
    return transport, script, clock


def _result(response: httpx.Response) -> tuple[Any, ...]:
    return (
        response.status_code,
        response.content,
        sorted(response.headers.multi_items()),
        response.extensions.get("sidestep"),
    )


def _state(transport: Any) -> list[dict[str, Any]]:
    return sorted((asdict(s) for s in transport.suspensions()), key=lambda s: s["scope_id"])


def _run_sync(fast: bool, body: bool = True, **extra: Any) -> list[Any]:
    transport, script, clock = _transport(False, fast, **extra)
    trail: list[Any] = []
    with httpx.Client(transport=transport) as client:
        for method, url, primary, backup, advance in [*RACES, *SCRIPT]:
            script.primary, script.backup = primary, backup
            try:
                trail.append(
                    _result(client.request(method, url, json={"model": "m"} if body else None))
                )
            except Exception as exc:
                trail.append((type(exc).__name__, str(exc)))
            trail.append(_state(transport))
            clock.advance(advance)
    return trail


def _run_async(fast: bool, body: bool = True, **extra: Any) -> list[Any]:
    async def main() -> list[Any]:
        transport, script, clock = _transport(True, fast, **extra)
        trail: list[Any] = []
        async with httpx.AsyncClient(transport=transport) as client:
            for method, url, primary, backup, advance in SCRIPT:
                script.primary, script.backup = primary, backup
                try:
                    response = await client.request(
                        method, url, json={"model": "m"} if body else None
                    )
                    trail.append(_result(response))
                except Exception as exc:
                    trail.append((type(exc).__name__, str(exc)))
                trail.append(_state(transport))
                clock.advance(advance)
        return trail

    return asyncio.run(main())


def _custom(exchange: Exchange) -> Verdict:
    if exchange.status == 418:
        return Verdict(Kind.FAILURE, "teapot", None, failover=True)
    return classify(exchange)


VARIANTS = {
    "default": {},
    "classifier": {"classifier": _custom},
    "avoid_rate_limits": {
        "routes": [{**CONFIG["routes"][0], "avoid_rate_limits": True}]  # type: ignore[dict-item]
    },
    "commit_complete": {"routes": [{**CONFIG["routes"][0], "commit": "complete"}]},  # type: ignore[dict-item]
    "observe": {"breaker": {"failure_threshold": 2, "cooldown": 10, "enforce": False}},
}


@pytest.mark.parametrize("body", [True, False], ids=["model", "no-body"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("run", [_run_sync, _run_async], ids=["sync", "async"])
def test_same_answers_and_store_state(run: Any, variant: str, body: bool) -> None:
    """With nobody listening, every answer, error and store state is the same on both paths.

    Without a body, failures count for the origin's own scope, which then refuses
    before any key is made.
    """
    extra = VARIANTS[variant]
    fast, general = run(True, body, **extra), run(False, body, **extra)
    assert len(fast) >= 2 * len(SCRIPT)
    assert fast == general


@pytest.mark.parametrize("run", [_run_sync, _run_async], ids=["sync", "async"])
def test_same_events(run: Any) -> None:
    """With an observer, both paths emit the same events, in the same order, skips included."""
    trails = []
    for fast in (True, False):
        seen: list[tuple[str, dict[str, Any]]] = []

        def observer(event: str, fields: Any, seen: list[Any] = seen) -> None:
            # when a listing was asked for is the real clock's, and each run has its own
            # store: compared, they would differ
            seen.append(
                (event, {k: v for k, v in fields.items() if k not in ("listed_at", "store")})
            )

        events.add_observer(observer)
        try:
            trails.append((run(fast), seen))
        finally:
            events.remove_observer(observer)
    (fast_trail, fast_events), (general_trail, general_events) = trails
    assert fast_trail == general_trail
    assert {name for name, _ in fast_events} >= {"candidate.skipped", "circuit.opened"}
    assert fast_events == general_events


def _counting(transport: Any) -> list[int]:
    core, calls = transport._core, [0]
    handle = core.handle

    def counted(*args: Any) -> Any:
        calls[0] += 1
        return handle(*args)

    core.handle = counted
    return calls


def test_healthy_request_runs_no_generator() -> None:
    """A healthy answer in memory is decided and settled without the general path."""
    transport, _, _ = _transport(False, True)
    calls = _counting(transport)
    with httpx.Client(transport=transport) as client:
        response = client.get("http://llm.internal/v1/models")
        assert response.status_code == 200
        assert response.extensions["sidestep"]["target"] == "primary"
        assert calls == [0]
        client.get("http://unrouted.example/a")
        assert calls == [0]
        assert client.get(ORIGIN + "/v1/models").extensions["sidestep"]["target"] == "origin"
        assert calls == [0]


@pytest.mark.parametrize("url", [ORIGIN + "/v1/models", "http://unrouted.example/a"])
def test_a_request_that_goes_as_it_is_makes_no_run(url: str) -> None:
    """To a healthy first candidate that is its own URL, a request is ready with no run made,
    and its answer's extension is a dict of its own (not shared with the next answer)."""
    transport, _, _ = _transport(False, True)
    request = httpx.Request("GET", url)
    ready = transport._core.decide(request)
    assert type(ready) is tuple and ready[0] is request
    assert isinstance(ready[1], Candidates)
    with httpx.Client(transport=transport) as client:
        first, second = client.get(url), client.get(url)
    first.extensions["sidestep"]["attempts"] = 99
    assert second.extensions["sidestep"]["attempts"] == 1


@pytest.mark.parametrize("kind", ["multipart", "byte stream"])
def test_a_replayable_body_sent_as_it_is_goes_whole_to_the_next_target(kind: str) -> None:
    """A body not yet in memory that can be sent again (multipart parts, bytes passed as a
    stream) is read ahead, before it goes to a healthy first target (a run is made: sending
    may use it up, or put it in memory); when that target fails, the next one gets the
    same bytes."""
    transport, _, _ = _transport(False, True)
    seen: list[tuple[str, bytes]] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, request.read()))
        return _answer("503" if request.url.host == "origin.example" else "ok", request)

    transport._inner = httpx.MockTransport(upstream)
    with httpx.Client(transport=transport) as client:
        request = client.build_request("POST", ORIGIN + "/v1/chat", files={"f": b"data"})
        if kind == "byte stream":
            request = httpx.Request("POST", request.url, stream=httpx.ByteStream(b"data"))
        assert not hasattr(request, "_content")
        ready = transport._core.decide(request)
        assert type(ready) is tuple and isinstance(ready[1], Run)
        response = client.send(request)
    assert response.extensions["sidestep"]["target"] == "spare"
    (first, sent), (second, again) = seen
    assert (first, second) == ("origin.example", "backup.example")
    assert sent == again and len(sent) >= 4


def test_what_the_fast_verdict_cannot_take_goes_on_in_the_general_path() -> None:
    """A streamed body, a failure or a listener: the general path, with admission made once."""
    transport, script, _ = _transport(False, True)
    calls = _counting(transport)
    with httpx.Client(transport=transport) as client:
        script.primary = "stream"
        assert client.get("http://llm.internal/v1/models").content == b"ab"
        assert calls == [1]
        script.primary = "503"
        assert client.get("http://llm.internal/v1/models").headers["x-from"] == "backup.example"
        assert calls == [2]

        def observer(event: str, fields: Any) -> None:
            return None

        events.add_observer(observer)
        try:
            script.primary = "ok"
            client.get("http://llm.internal/v1/models")
            assert calls == [3]
        finally:
            events.remove_observer(observer)


def test_a_probe_always_takes_the_general_path() -> None:
    """A half-open scope's probe is never sent by the shell itself."""
    transport, script, clock = _transport(False, True)
    with httpx.Client(transport=transport) as client:
        script.primary = "503"
        for _ in range(2):
            client.get("http://llm.internal/v1/models")
        clock.advance(11)
        request = client.build_request("GET", "http://llm.internal/v1/models")
        run = transport._core.decide(request)
        assert not run.ready
        assert run.admission is not None
        assert run.admission.ticket.probes
        transport._core.store.release(run.admission.ticket)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_cancelled_fast_send_leaves_nothing_behind(anyio_backend: str) -> None:
    """Cancelled while the shell sends: the cancellation comes out, nothing is recorded."""
    release = anyio.Event()

    async def hang(request: httpx.Request) -> httpx.Response:
        await release.wait()
        return httpx.Response(200)

    transport = sidestep.AsyncFailoverTransport(CONFIG, transport=httpx.MockTransport(hang))
    calls = _counting(transport)
    async with httpx.AsyncClient(transport=transport) as client:
        with anyio.move_on_after(0.05) as scope:
            await client.get("http://llm.internal/v1/models")
        assert scope.cancelled_caught
        assert calls == [1]  # handed over to the general path, which let the cancellation out
        assert transport.suspensions() == []
        release.set()
        response = await client.get("http://llm.internal/v1/models")
        assert response.extensions["sidestep"]["target"] == "primary"


def test_both_flavours_have_a_request_s_key_read_by_position() -> None:
    """The parsed URL of httpx and httpx2 gives (scheme, host, port, path) by position,
    as a sample shows; a parsed URL whose fields are in another order is read by name,
    never by a position that would take its userinfo for its host."""
    import types

    import httpx2

    from sidestep._core.fast_path import _BY_NAME, _BY_POSITION, key_parts

    assert key_parts(httpx) is _BY_POSITION
    assert key_parts(httpx2) is _BY_POSITION

    class Parsed(tuple[Any, ...]):
        scheme = property(lambda self: self[1])
        host = property(lambda self: self[0])
        port = property(lambda self: self[4])
        path = property(lambda self: self[3])

    class URL:
        def __init__(self, text: str) -> None:
            self._uri_reference = Parsed(("h.example", "http", "user", "/p", 1))

    other = types.ModuleType("other")
    other.URL = URL  # type: ignore[attr-defined]
    assert key_parts(other) is _BY_NAME
    assert key_parts(other)(URL("")._uri_reference) == ("http", "h.example", 1, "/p")


@pytest.mark.parametrize("fast", [True, False])
def test_a_url_with_no_path_is_matched_as_its_root(fast: bool) -> None:
    """A request to an origin with no path at all ("http://origin.example") is matched as
    one to "/" is: by a route whose target is the origin itself, failing over to its
    next target when the first is down, on either path."""
    config = {
        "breaker": {"failure_threshold": 2, "cooldown": 10},
        "routes": [
            {
                "name": "root",
                "targets": [{"name": "origin", "url": ORIGIN}, {"name": "spare", "url": BACKUP}],
            }
        ],
    }
    down = {"origin.example"}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host in down:
            return httpx.Response(503)
        return httpx.Response(200, json={"host": request.url.host, "path": request.url.path})

    transport = sidestep.FailoverTransport(config, transport=httpx.MockTransport(handler))
    transport._core._fast_path = fast
    with httpx.Client(transport=transport) as client:
        for url in (ORIGIN, ORIGIN + "/"):
            response = client.get(url)
            assert response.json() == {"host": "backup.example", "path": "/"}
            assert response.extensions["sidestep"]["target"] == "spare"
        down.clear()
        transport.clear(transport.suspensions()[0].scope_id)
        response = client.get(ORIGIN)
        assert response.json() == {"host": "origin.example", "path": "/"}
        assert response.extensions["sidestep"] == {
            "route": "root",
            "target": "origin",
            "attempts": 1,
            "failover": False,
        }
