"""The leanest fast path (a request that goes as it is, with no run made) against the world.

A request to its first candidate's own URL, healthy, is sent by the shell with
no run made (`Core.decide` returns its `Candidates`); a run is made afterwards
only if it is needed. These tests try to tell that apart from the general path
(`Core._fast_path = False`) where it could show: bodies that cannot be read
twice or that an inner transport reads as it sends them, seeded random traffic,
failures recorded by others while the request is in flight, threads and
tasks hammering it while another origin opens and closes, cancellation mid-send
(asyncio and trio), the response's extension, and the question of whether anyone
listens (`sidestep.logging.listening`), which the fast path now answers from
logging's and structlog's own state. Upstreams are real servers on 127.0.0.1
wherever I/O is involved; time is a fake clock.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import os
import random
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import httpx
import httpx2
import pytest
import structlog

import sidestep
import sidestep.httpx2
import test_fast_path as fast_path
from drivers import FakeClock, MakeDriver, Result, route
from sidestep import logging as events
from sidestep._core.routes import Candidates
from sidestep._state.memory import MemoryStore
from test_fast_path import BACKUP, ORIGIN
from upstream import CLIENT_TIMEOUT, Hang, Reset, Respond, Seen, Upstream, wait_for


class OneShotFile:
    """A file read once, as a pipe's or a socket's is: no seek, no length, no second read."""

    def __init__(self, data: bytes) -> None:
        self._buffer = io.BytesIO(data)

    def read(self, size: int = -1) -> bytes:
        return self._buffer.read(size)


def _pair(a: Upstream, b: Upstream, **extra: Any) -> dict[str, Any]:
    return route(("a", a.url + "/v1"), ("b", b.url + "/v1"), **extra)


_BOUNDARY = re.compile(rb"[0-9a-f]{32}")


def _received(upstream: Upstream) -> list[bytes]:
    """The bodies an upstream received, each multipart boundary (random per body) blanked."""
    return [_BOUNDARY.sub(b"BOUNDARY", seen.body) for seen in upstream.seen]


# --- bodies ------------------------------------------------------------------------------------


def test_a_one_shot_file_in_a_multipart_body_reaches_the_backup_whole(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A multipart upload whose file can be read only once, to a healthy first target that
    answers 503: the backup gets exactly the bytes the first one got (the body was read
    ahead), not the same form with an empty file."""
    a.behaviour = lambda _: Respond(503, b"down")
    driver = make(_pair(a, b))
    data = b"Z" * 5000
    result = driver.post(a.url + "/v1/upload", files={"f": ("f.bin", OneShotFile(data))})
    assert result.status == 200
    assert result.extensions["sidestep"]["target"] == "b"
    (first,), (second,) = _received(a), _received(b)
    assert data in first
    assert second == first


def _chunks() -> Iterator[bytes]:
    """A one-shot JSON body, in two pieces."""
    yield b'{"model":'
    yield b'"m"}'


async def _async_chunks() -> Any:
    """The same, for an async client."""
    yield b'{"model":'
    yield b'"m"}'


def _bodies(is_async: bool) -> dict[str, dict[str, Any]]:
    """Every kind of request body, made afresh (some are used up by sending)."""
    seekable = io.BytesIO(b"S" * 300)
    seekable.seek(100)  # multipart sends a file from its start, wherever it was left
    return {
        "json": {"json": {"model": "m"}},
        "bytes": {"content": b"raw bytes"},
        "generator": {"content": _async_chunks() if is_async else _chunks()},
        "form": {"data": {"k": "v"}},
        "files in memory": {"files": {"f": b"in memory"}},
        "seekable file": {"files": {"f": ("s.bin", seekable)}, "data": {"k": "v"}},
        "one-shot file": {"files": {"f": ("o.bin", OneShotFile(b"O" * 300))}},
    }


@pytest.mark.parametrize("first", [503, 200])
def test_every_body_reaches_each_target_as_the_general_path_sends_it(
    make: MakeDriver, a: Upstream, b: Upstream, first: int
) -> None:
    """For each kind of body (JSON, bytes, a generator, a form, multipart parts in memory, a
    seekable file, a one-shot file), with the first target failing or answering, the answer
    and the bytes each target receives are the same with the fast path as without it; after
    a 503 every body but the generator's reaches the backup as the first target got it."""
    a.behaviour = lambda _: Respond(first, b"from a")
    trails = []
    for fast in (True, False):
        driver = make(_pair(a, b))
        driver.transport._core._fast_path = fast
        trail: dict[str, Any] = {}
        for name, body in _bodies(driver.is_async).items():
            del a.seen[:], b.seen[:]
            result = driver.post(a.url + "/v1/chat", **body)
            answer = (result.status, result.body, result.extensions["sidestep"])
            trail[name] = (answer, _received(a), _received(b))
            for scope in driver.transport.suspensions():  # a healthy again for the next body
                assert driver.transport.clear(scope.scope_id)
        trails.append(trail)
    assert trails[0] == trails[1]
    for name, (answer, to_a, to_b) in trails[0].items():
        assert len(to_a) == 1
        if first == 200 or name == "generator":  # a one-shot stream is sent once only
            assert answer == (first, b"from a", _served_by("a")) and to_b == []
        else:
            assert answer == (200, b"b", {**_served_by("b"), "attempts": 2}) and to_b == to_a


def _served_by(name: str) -> dict[str, Any]:
    return {"route": "chat", "target": name, "attempts": 1, "failover": name != "a"}


def _signing(h: Any, is_async: bool) -> Any:
    """An inner transport that reads each request's body before sending it (to sign it)."""

    def sign(request: Any) -> None:
        digest = hashlib.sha256(request.content).hexdigest()
        request.headers["x-signature"] = digest

    if is_async:

        class AsyncSigning(h.AsyncHTTPTransport):  # type: ignore[misc,name-defined]
            async def handle_async_request(self, request: Any) -> Any:
                await request.aread()
                sign(request)
                return await super().handle_async_request(request)

        return AsyncSigning()

    class Signing(h.HTTPTransport):  # type: ignore[misc,name-defined]
        def handle_request(self, request: Any) -> Any:
            request.read()
            sign(request)
            return super().handle_request(request)

    return Signing()


@pytest.mark.parametrize("flavour", ["httpx", "httpx2"])
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_one_shot_body_read_by_the_inner_transport_is_still_one_shot(
    flavour: str, is_async: bool, a: Upstream, b: Upstream
) -> None:
    """A generator body goes to a's own URL through an inner transport that reads it (to
    sign it), so it is in memory once sent. It is still the one-shot body it was: a's 503
    is the answer and b never gets it (routed), and an unrouted 503 goes back as it came
    and counts for nothing — as on the general path."""
    h: Any = httpx2 if flavour == "httpx2" else httpx
    module: Any = sidestep.httpx2 if flavour == "httpx2" else sidestep
    a.behaviour = lambda _: Respond(503, b"down")

    def scenario(fast: bool) -> list[Any]:
        trail: list[Any] = []
        for config, url in ((_pair(a, b), a.url + "/v1/chat"), (None, a.url + "/chat")):
            inner = _signing(h, is_async)
            if is_async:
                transport = module.AsyncFailoverTransport(config, transport=inner)
                transport._core._fast_path = fast

                async def send(transport: Any = transport, url: str = url) -> Any:
                    async with h.AsyncClient(transport=transport) as client:
                        return await client.post(url, content=_async_chunks())

                response = asyncio.run(send())
            else:
                transport = module.FailoverTransport(config, transport=inner)
                transport._core._fast_path = fast
                with h.Client(transport=transport) as client:
                    response = client.post(url, content=_chunks())
            trail.append((response.status_code, response.extensions["sidestep"]))
            trail.append(sorted((s.scope, s.failures) for s in transport.suspensions()))
        return trail

    fast = scenario(True)
    assert fast == scenario(False)
    assert fast[0] == (503, _served_by("a"))
    assert fast[2][0] == 503
    assert fast[3] == []
    assert b.calls == 0
    assert a.seen[0].headers["x-signature"] == hashlib.sha256(b'{"model":"m"}').hexdigest()


_FUZZ_URLS = (
    "http://llm.internal/v1/models",
    ORIGIN + "/v1/models",
    ORIGIN + "/v1/chat",
    BACKUP + "/v2/x",  # the direct route's second target's own URL
    "http://unrouted.example/a",
    "http://unrouted.example/b",
)
_FUZZ_ANSWERS = ("ok", "stream", "broken", "redirect", "connect", "timeout", "429", "401")
_FUZZ_ANSWERS += ("404", "500", "503")


def _fuzz_body(rng: random.Random, is_async: bool) -> dict[str, Any]:
    kind = rng.choice(["none", "json", "files", "bytes as a stream", "generator"])
    if kind == "json":
        return {"json": {"model": rng.choice(["m", "n"])}}
    if kind == "files":
        return {"files": {"f": b"data"}}
    if kind == "bytes as a stream":
        return {"stream": httpx.ByteStream(b'{"model":"m"}')}
    if kind == "generator":
        return {"content": _async_chunks() if is_async else _chunks()}
    return {}


def _fuzz_steps(seed: int, is_async: bool) -> Iterator[tuple[str, str, str, str, float, Any]]:
    rng = random.Random(seed)
    primaries = _FUZZ_ANSWERS if is_async else (*_FUZZ_ANSWERS, "race")
    for _ in range(60):
        method, url = rng.choice(["GET", "POST"]), rng.choice(_FUZZ_URLS)
        primary, backup = rng.choice(primaries), rng.choice(_FUZZ_ANSWERS)
        yield method, url, primary, backup, rng.choice([0, 0, 0, 4, 11]), _fuzz_body(rng, is_async)


def _fuzz(seed: int, is_async: bool, fast: bool) -> list[Any]:
    """What seeded random traffic gets, step by step: answers or errors, and the store."""

    def request(method: str, url: str, body: dict[str, Any]) -> httpx.Request:
        stream = body.pop("stream", None)
        if stream is not None:
            return httpx.Request(method, url, stream=stream)
        return httpx.Request(method, url, **body)

    async def main() -> list[Any]:
        transport, script, clock = fast_path._transport(is_async, fast)
        trail: list[Any] = []
        client: Any = (httpx.AsyncClient if is_async else httpx.Client)(transport=transport)
        for method, url, primary, backup, advance, body in _fuzz_steps(seed, is_async):
            script.primary, script.backup = primary, backup
            try:
                sent = client.send(request(method, url, body))
                response = await sent if is_async else sent
                trail.append(fast_path._result(response))
            except Exception as exc:
                trail.append((type(exc).__name__, str(exc)))
            trail.append(fast_path._state(transport))
            clock.advance(advance)
        await client.aclose() if is_async else client.close()
        return trail

    return [_BOUNDARY.sub(b"BOUNDARY", repr(step).encode()) for step in asyncio.run(main())]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("seed", range(8))
def test_random_traffic_with_every_kind_of_body_gets_the_same_on_both_paths(
    seed: int, is_async: bool
) -> None:
    """Seeded random traffic — the routes of the fast-path differential test and unrouted
    origins, each upstream answer and failure, no body, JSON, multipart, bytes as a stream
    and one-shot generators, in-flight failures (sync), time moving on — gets the same
    answers, errors and store after every step with the fast path as without it. (The mock
    upstream reads each body as it is sent, as a signing transport would.)"""
    assert _fuzz(seed, is_async, True) == _fuzz(seed, is_async, False)


# --- failures recorded by others while a lean request is in flight -----------------------------


def _slow_and_failing(gate: threading.Event, fail: Any = None) -> Any:
    """/…/slow answers 200 once `gate` is set; any path with "fail" in it answers 503
    (or `fail`: an unrouted answer counts for nothing, a reset does)."""

    def behaviour(seen: Seen) -> Any:
        if "fail" in seen.path:
            return fail if fail is not None else Respond(503, b"down")
        return Respond(200, b"slow", gate=gate)

    return behaviour


_RESETS = ("ReadError", "RemoteProtocolError")


def _reset(call: Any) -> str:
    """`call()`, which must end in the error of a connection reset: that error's name."""
    with pytest.raises((httpx.TransportError, httpx2.TransportError)) as raised:
        call()
    return type(raised.value).__name__


def test_a_lean_success_resets_a_failure_recorded_while_it_was_in_flight(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A request to a's own URL is in flight (no run made) while another one's 503 counts a
    failure against a; its success resets that count, so one more 503 leaves a closed
    (failure_threshold 2) and the next request is still a's."""
    gate = threading.Event()
    a.behaviour = _slow_and_failing(gate)
    driver = make(_pair(a, b))
    with ThreadPoolExecutor(max_workers=1) as pool:
        slow = pool.submit(driver.get, a.url + "/v1/slow")
        wait_for(lambda: a.calls == 1)
        assert driver.get(a.url + "/v1/fail").extensions["sidestep"]["target"] == "b"
        (scope,) = driver.transport.suspensions()
        assert scope.failures == 1
        gate.set()
        assert slow.result(10).extensions["sidestep"] == _served_by("a")
    assert driver.transport.suspensions() == []
    assert driver.get(a.url + "/v1/fail-again").extensions["sidestep"]["target"] == "b"
    assert driver.get(a.url + "/v1/slow").extensions["sidestep"] == _served_by("a")


def test_an_unrouted_success_resets_what_a_failing_endpoint_left_while_it_was_in_flight(
    make: MakeDriver, a: Upstream
) -> None:
    """Unrouted: while a request to /slow is in flight, /fail-1 resets its connection
    (counted for the endpoint and the origin). /slow's success forgets the failing endpoints
    and resets the origin, so a reset from another endpoint, /fail-2, leaves the origin
    closed, and /slow is still sent (failure_threshold 2)."""
    gate = threading.Event()
    a.behaviour = _slow_and_failing(gate, Reset())
    driver = make({"breaker": {"failure_threshold": 2, "cooldown": 10}})
    with ThreadPoolExecutor(max_workers=1) as pool:
        slow = pool.submit(driver.get, a.url + "/slow")
        wait_for(lambda: a.calls == 1)
        assert _reset(lambda: driver.get(a.url + "/fail-1")) in _RESETS
        gate.set()
        assert slow.result(10).status == 200
    assert _reset(lambda: driver.get(a.url + "/fail-2")) in _RESETS
    (origin,) = [s for s in driver.transport.suspensions() if s.scope == "origin"]
    assert (origin.state, origin.failures) == ("closed", 1)
    assert driver.get(a.url + "/slow").status == 200
    assert a.calls == 4


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("url", ["http://origin.example/v1/x", "http://unrouted.example/x"])
def test_a_failure_landing_while_an_async_lean_request_is_in_flight_is_reset_alike(
    backend: str, url: str
) -> None:
    """Async, with the answer in memory (settled without the general path): task one is in
    flight with no run made while task two's 503 (unrouted: a reset) counts a failure on
    the same origin; task one's success resets it. Answers and the store after each step
    are the same with the fast path on and off."""

    async def scenario(fast: bool) -> list[Any]:
        arrived, release = anyio.Event(), anyio.Event()

        async def upstream(request: httpx.Request) -> httpx.Response:
            if request.url.host == "spare.example":
                return httpx.Response(200, content=b"spare")
            if request.url.path.endswith("/fail"):
                if request.url.host == "unrouted.example":  # its answers count for nothing
                    raise httpx.ReadError("connection reset", request=request)
                return httpx.Response(503, content=b"down")
            arrived.set()
            await release.wait()
            return httpx.Response(200, content=b"ok")

        store = MemoryStore(fingerprint_key=b"k")
        transport = sidestep.AsyncFailoverTransport(
            route(("origin", "http://origin.example/v1"), ("spare", "http://spare.example/v1")),
            transport=httpx.MockTransport(upstream),
            store=store,
            clock=FakeClock(),
        )
        transport._core._fast_path = fast
        trail: list[Any] = []
        failing = url.rsplit("/", 1)[0] + "/fail"

        async def first(client: httpx.AsyncClient) -> None:
            response = await client.get(url)
            trail.append(("first", response.status_code, response.extensions["sidestep"]))

        async with (
            httpx.AsyncClient(transport=transport) as client,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(first, client)
            with anyio.fail_after(5):
                await arrived.wait()
            try:
                response = await client.get(failing)  # while the first is in flight
                trail.append(("second", response.status_code, response.extensions["sidestep"]))
            except httpx.ReadError:
                trail.append(("second", "ReadError"))
            trail.append(sorted((s.scope, s.failures) for s in transport.suspensions()))
            release.set()
        trail.append(sorted((s.scope, s.failures) for s in transport.suspensions()))
        return trail

    fast = anyio.run(scenario, True, backend=backend)
    general = anyio.run(scenario, False, backend=backend)
    assert fast == general
    during, after = fast[1], fast[-1]
    assert ("origin", 1) in during  # counted while the first was in flight
    assert not [scope for scope in after if scope[0] == "origin"]  # reset by its success


# --- threads and tasks -------------------------------------------------------------------------


def test_a_hammered_direct_route_stays_lean_while_another_origin_opens_and_closes(
    make: MakeDriver, a: Upstream, b: Upstream, c: Upstream
) -> None:
    """32 threads (or as many tasks) send 300 requests to a's own URL while, on the same
    transport, another route's only target, c, fails twice (opens), turns a request away,
    and is probed closed again, three times over: every request to a is a's first-attempt
    answer, with an extension of its own, and nothing is ever kept for a."""
    clock = FakeClock()
    config = _pair(a, b)
    config["routes"].append({"name": "other", "targets": [{"name": "c", "url": c.url + "/v1"}]})
    driver = make(config, clock=clock, timeout=CLIENT_TIMEOUT)
    status = [503]
    c.behaviour = lambda _: Respond(status[0], b"c")
    rounds = 0

    def churn() -> None:
        nonlocal rounds
        for _ in range(3):
            status[0] = 503
            for _ in range(2):
                assert driver.get(c.url + "/v1/p").status == 503
            assert [(s.target, s.state) for s in driver.transport.suspensions()] == [("c", "open")]
            with pytest.raises(Exception, match="every candidate of route 'other'"):
                driver.get(c.url + "/v1/p")  # turned away
            status[0] = 200
            clock.advance(11)
            assert driver.get(c.url + "/v1/p").status == 200  # the probe closes it
            assert driver.transport.suspensions() == []
            rounds += 1

    with ThreadPoolExecutor(max_workers=1) as pool:
        churning = pool.submit(churn)
        results = driver.many(300, "GET", a.url + "/v1/x", concurrency=32)
        churning.result(30)
    assert rounds == 3
    answers = [r for r in results if isinstance(r, Result)]
    assert len(answers) == 300, [r for r in results if not isinstance(r, Result)][:3]
    assert {(r.status, r.text) for r in answers} == {(200, "a")}
    assert all(r.extensions["sidestep"] == _served_by("a") for r in answers)
    assert len({id(r.extensions["sidestep"]) for r in answers}) == 300
    assert (a.calls, b.calls, c.calls) == (300, 0, 9)


@pytest.fixture
def c() -> Iterator[Upstream]:
    """A third upstream on 127.0.0.1, named "c"."""
    server = Upstream(name="c")
    yield server
    server.close()


# --- cancellation ------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize("flavour", ["httpx", "httpx2"])
@pytest.mark.parametrize("routed", [True, False], ids=["direct route", "unrouted"])
async def test_a_lean_send_cancelled_records_nothing_and_keeps_no_connection(
    anyio_backend: str, flavour: str, routed: bool, a: Upstream, b: Upstream
) -> None:
    """Cancelled while the shell sends a request with no run made (a hangs): the cancellation
    comes out, nothing is recorded, b is never tried, the connection to a is closed, and
    the next request is a's."""
    h: Any = httpx2 if flavour == "httpx2" else httpx
    module: Any = sidestep.httpx2 if flavour == "httpx2" else sidestep
    a.behaviour = lambda _: Hang()
    config = _pair(a, b) if routed else None
    transport = module.AsyncFailoverTransport(config, clock=FakeClock())
    url = a.url + ("/v1/x" if routed else "/x")
    request = h.Request("POST", url, content=b"a body in memory")
    assert isinstance(transport._core.decide(request)[1], Candidates)  # no run made
    async with h.AsyncClient(transport=transport, timeout=30) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.send, request)
            for _ in range(500):  # until a has the request (5 s at most)
                if a.calls:
                    break
                await anyio.sleep(0.01)
            assert a.calls == 1
            tg.cancel_scope.cancel()
        assert transport.suspensions() == []
        await anyio.to_thread.run_sync(wait_for, lambda: a.open_connections == 0)
        a.behaviour = lambda _: Respond(body="a")
        response = await client.post(url, content=b"again")
        assert response.text == "a"
        assert response.extensions["sidestep"]["attempts"] == 1
    assert (a.calls, b.calls) == (2, 0)
    assert transport.suspensions() == []


# --- the response's extension ------------------------------------------------------------------


@pytest.mark.parametrize("flavour", ["httpx", "httpx2"])
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_each_first_attempt_answer_has_an_extension_of_its_own(
    flavour: str, is_async: bool
) -> None:
    """Two answers from a first candidate, with no run made: changing one's
    `extensions["sidestep"]` changes nothing in the other's, nor in the next one's."""
    h: Any = httpx2 if flavour == "httpx2" else httpx
    module: Any = sidestep.httpx2 if flavour == "httpx2" else sidestep

    def upstream(request: Any) -> Any:
        return h.Response(200, content=b"ok")

    url = "http://unrouted.example/x"
    if is_async:
        transport = module.AsyncFailoverTransport(transport=h.MockTransport(upstream))

        async def three() -> list[Any]:
            async with h.AsyncClient(transport=transport) as client:
                first = await client.get(url)
                first.extensions["sidestep"]["attempts"] = 99
                first.extensions["sidestep"]["target"] = "changed"
                return [first, await client.get(url), await client.get(url)]

        first, second, third = asyncio.run(three())
    else:
        transport = module.FailoverTransport(transport=h.MockTransport(upstream))
        with h.Client(transport=transport) as client:
            first = client.get(url)
            first.extensions["sidestep"]["attempts"] = 99
            first.extensions["sidestep"]["target"] = "changed"
            second, third = client.get(url), client.get(url)
    assert isinstance(transport._core.decide(h.Request("GET", url))[1], Candidates)
    expected = {
        "route": None,
        "target": "http://unrouted.example",
        "attempts": 1,
        "failover": False,
    }
    assert second.extensions["sidestep"] == third.extensions["sidestep"] == expected
    assert second.extensions["sidestep"] is not third.extensions["sidestep"]


# --- who listens -------------------------------------------------------------------------------


def _reference(level: int) -> bool:
    """What `listening(level)` must answer, asked the long way."""
    return (
        bool(events._observers)
        or logging.getLogger("sidestep").isEnabledFor(level)
        or structlog.is_configured()
    )


def test_listening_answers_as_the_loggers_would_through_any_sequence_of_changes(
    default_structlog: None,
) -> None:
    """Through 400 seeded random changes — levels of the sidestep logger and the root,
    `logging.disable`, a disabled sidestep logger, an observer added and removed,
    structlog configured and reset — `listening(level)` answers, at DEBUG, INFO and
    WARNING, exactly what the observers, `isEnabledFor` and `structlog.is_configured()`
    would, whether logging had cached an answer or not."""
    logger, root = logging.getLogger("sidestep"), logging.getLogger()
    saved = (logger.level, root.level, logger.disabled, logging.root.manager.disable)
    levels = [logging.NOTSET, logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR]

    def observer(event: str, fields: Mapping[str, Any]) -> None:
        return None

    changes = [
        lambda r: logger.setLevel(r.choice(levels)),
        lambda r: root.setLevel(r.choice(levels[1:])),
        lambda r: logging.disable(r.choice(levels)),
        lambda r: setattr(logger, "disabled", r.random() < 0.3),
        lambda r: events.add_observer(observer) if r.random() < 0.2 else None,
        lambda r: events.remove_observer(observer),
        lambda r: structlog.configure(processors=[]) if r.random() < 0.1 else None,
        lambda r: structlog.reset_defaults(),
    ]
    rng = random.Random(20261201)
    disagreements = []
    try:
        for step in range(400):
            rng.choice(changes)(rng)
            for level in (logging.DEBUG, logging.INFO, logging.WARNING):
                for _ in range(2):  # the second answer may come from logging's cache
                    if events.listening(level) != _reference(level):
                        disagreements.append((step, level))
    finally:
        events.remove_observer(observer)
        logger.setLevel(saved[0])
        root.setLevel(saved[1])
        logger.disabled = saved[2]
        logging.disable(saved[3])
    assert disagreements == []


def test_listening_asks_a_logger_class_with_its_own_is_enabled_for() -> None:
    """An application whose logger class (`logging.setLoggerClass`, before sidestep is
    imported) answers `isEnabledFor` itself — here DEBUG for the requests it traces — is
    asked: `listening()` follows it, though logging cached the base class's answer."""
    code = textwrap.dedent(
        """
        import contextvars, logging
        tracing = contextvars.ContextVar("tracing", default=False)

        class TracingLogger(logging.Logger):
            def isEnabledFor(self, level):
                return tracing.get() or super().isEnabledFor(level)

        logging.setLoggerClass(TracingLogger)
        from sidestep.logging import listening
        answers = [listening(), listening()]
        tracing.set(True)
        answers += [listening(), logging.getLogger("sidestep").isEnabledFor(logging.DEBUG)]
        print(answers)
        """
    )
    done = subprocess.run(  # noqa: S603  # this interpreter, our own code
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ,
        check=False,
    )
    assert done.stdout.strip() == "[False, False, True, True]", done.stderr
