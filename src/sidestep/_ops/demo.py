"""`sidestep demo`: failover shown live against local upstreams, with nothing to set up.

Four HTTP upstreams start inside this process on 127.0.0.1 — one healthy,
one answering 503, one that accepts and never answers, one that is down for
a few seconds and then comes back — and the same paced load goes through two
clients in turn: plain httpx with naive per-request failover, then sidestep.
Progress and each target's circuit are shown while it runs, and a summary
side by side at the end. `LocalUpstream` is reused by the benchmarks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import enum
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from .. import logging as events
from .._shells.transport import AsyncFailoverTransport

__all__ = ["LocalUpstream", "Mode", "Tally", "add_arguments", "drive", "quiet_logs", "run"]

_REASONS = {200: "OK", 503: "Service Unavailable"}
_PATH = "/v1/items"
_COOLDOWN = 1.0  # seconds: short, so the flapping target's recovery is seen within the run
_MAX_COOLDOWN = 4.0
_HEALTHY_DELAY = 0.002  # seconds a healthy upstream takes to answer, as a real one would
_FRAME = 0.1  # seconds between redraws of the live table
_LINE_EVERY = 1.0  # seconds between progress lines when the output is not a terminal


class Mode(enum.Enum):
    """How a `LocalUpstream` answers."""

    HEALTHY = "answers 200"
    UNAVAILABLE = "answers 503"
    STALLED = "accepts, never answers"
    FLAPPING = "503 for a while, then 200"


class LocalUpstream:
    """A minimal HTTP/1.1 server on 127.0.0.1, answering as its `mode` says.

    It counts the requests it receives (`calls`); a flapping one is down
    (answers 503) until `down_until` on the event loop's clock, and counts the
    requests that arrived meanwhile (`calls_while_down`) and the time of its
    first 200 after coming back (`first_up_answer`). Call `start()` and
    `stop()` inside one running event loop.
    """

    def __init__(self, name: str, mode: Mode, *, delay: float = 0.0) -> None:
        self.name = name
        self.mode = mode
        self.delay = delay
        self.down_until = 0.0
        self.calls = 0
        self.calls_while_down = 0
        self.down_call_times: list[float] = []
        self.first_up_answer: float | None = None
        self.port = 0
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Transport] = set()

    def __repr__(self) -> str:
        return f"LocalUpstream({self.name!r}, {self.mode.name}, port={self.port})"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def down(self) -> bool:
        if self.mode is Mode.FLAPPING:
            return asyncio.get_running_loop().time() < self.down_until
        return self.mode is not Mode.HEALTHY

    def reset(self, down_for: float = 0.0) -> None:
        """Forget the counts; a flapping upstream goes down for `down_for` seconds from now."""
        self.calls = self.calls_while_down = 0
        self.down_call_times = []
        self.first_up_answer = None
        self.down_until = asyncio.get_running_loop().time() + down_for

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and drop every connection, stalled ones included."""
        if self._server is None:
            return
        self._server.close()
        for transport in list(self._connections):
            transport.abort()
        await self._server.wait_closed()
        self._server = None

    def answer(self, transport: asyncio.Transport) -> None:
        """One complete request arrived on `transport`: count it and answer (or not)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.calls += 1
        status = 200
        if self.down:
            self.calls_while_down += 1
            self.down_call_times.append(now)
            if self.mode is Mode.STALLED:
                return  # the connection stays open, unanswered, until the client gives up
            status = 503
        elif self.mode is Mode.FLAPPING and self.first_up_answer is None:
            self.first_up_answer = now
        body = b'{"ok":true}' if status == 200 else b'{"error":"unavailable"}'
        reply = (
            f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode() + body
        if self.delay and status == 200:
            loop.call_later(self.delay, _write, transport, reply)
        else:
            transport.write(reply)


def _write(transport: asyncio.Transport, data: bytes) -> None:
    if not transport.is_closing():
        transport.write(data)


class _Connection(asyncio.Protocol):
    """One client connection: split the byte stream into requests (keep-alive, no pipelining)."""

    def __init__(self, upstream: LocalUpstream) -> None:
        self._upstream = upstream
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._upstream._connections.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._upstream._connections.discard(self._transport)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while self._transport is not None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            size = _content_length(self._buffer[:end])
            if len(self._buffer) < end + 4 + size:
                return
            self._buffer = self._buffer[end + 4 + size :]
            self._upstream.answer(self._transport)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip() or 0)
    return 0


# -- the load ----------------------------------------------------------------------


@dataclass(slots=True)
class Tally:
    """What one client's run has seen so far: each request's start, latency and outcome."""

    total: int
    done: int = 0
    errors: int = 0
    starts: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    started: float = 0.0
    finished: float | None = None


Call = Callable[[], Awaitable[bool]]


async def drive(call: Call, tally: Tally, *, concurrency: int, rate: float) -> None:
    """Make `tally.total` calls, starting `rate` per second at most, `concurrency` at once at most.

    A call returns whether it succeeded; its latency is measured from the
    moment it got a slot (queueing for one is not counted).
    """
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(concurrency)
    tasks: set[asyncio.Task[None]] = set()

    async def one() -> None:
        started = loop.time()
        try:
            ok = await call()
        except Exception:  # whatever a call raises reached its caller: an error
            ok = False
        finally:
            slots.release()
        tally.starts.append(started)
        tally.latencies.append(loop.time() - started)
        tally.done += 1
        tally.errors += not ok

    tally.started = loop.time()
    try:
        for n in range(tally.total):
            wait = tally.started + n / rate - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            await slots.acquire()
            task = asyncio.ensure_future(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    tally.finished = loop.time()


def _naive(client: httpx.AsyncClient, urls: list[str]) -> Call:
    """Plain httpx: a request tries `urls` in order, one call each, until one answers below 500."""

    async def call() -> bool:
        for url in urls:
            try:
                response = await client.get(url)
            except httpx.TransportError:
                continue
            if response.status_code < 500:
                return True
        return False

    return call


def _through(client: httpx.AsyncClient, url: str) -> Call:
    """One request to the first target; the client's transport does any failover."""

    async def call() -> bool:
        try:
            response = await client.get(url)
        except httpx.TransportError:
            return False
        return response.status_code < 500

    return call


# -- the run ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Settings:
    requests: int
    concurrency: int
    rate: float
    timeout: float
    flap_down: float
    attempts: int


@dataclass(slots=True)
class _Phase:
    """One client's run, as shown and summarised."""

    label: str
    tally: Tally
    transport: AsyncFailoverTransport | None = None
    probes: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    wasted: int = 0


def _upstreams() -> list[LocalUpstream]:
    return [
        LocalUpstream("broken", Mode.UNAVAILABLE),
        LocalUpstream("stalled", Mode.STALLED),
        LocalUpstream("flapping", Mode.FLAPPING, delay=_HEALTHY_DELAY),
        LocalUpstream("healthy", Mode.HEALTHY, delay=_HEALTHY_DELAY),
    ]


def _config(upstreams: list[LocalUpstream], attempts: int) -> dict[str, Any]:
    return {
        "breaker": {
            "failure_threshold": 3,
            "cooldown": _COOLDOWN,
            "max_cooldown": _MAX_COOLDOWN,
            "half_open_probes": 1,
        },
        "failover": {"max_total_attempts": attempts},
        "routes": [
            {
                "name": "demo",
                "targets": [{"name": u.name, "url": u.url + "/v1"} for u in upstreams],
            }
        ],
    }


def _wasted(upstreams: list[LocalUpstream]) -> int:
    """Upstream calls that could not have helped: every call that reached a target while down."""
    return sum(u.calls_while_down for u in upstreams)


async def _phase(
    phase: _Phase,
    call: Call,
    upstreams: list[LocalUpstream],
    settings: _Settings,
    view: _View,
) -> None:
    for upstream in upstreams:
        upstream.reset(down_for=settings.flap_down)
    load = asyncio.ensure_future(
        drive(call, phase.tally, concurrency=settings.concurrency, rate=settings.rate)
    )
    try:
        while not load.done():
            _observe(phase, upstreams)
            view.show(phase, upstreams)
            await asyncio.wait({load}, timeout=_FRAME)
        await load
    finally:
        if not load.done():
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load
    _observe(phase, upstreams)
    view.show(phase, upstreams, final=True)


def _observe(phase: _Phase, upstreams: list[LocalUpstream]) -> None:
    phase.calls = {u.name: u.calls for u in upstreams}
    phase.wasted = _wasted(upstreams)


async def _main(settings: _Settings, view: _View) -> dict[str, Any]:
    upstreams = _upstreams()
    timeout = httpx.Timeout(settings.timeout)
    limits = httpx.Limits(max_connections=settings.concurrency * len(upstreams))
    naive = _Phase("plain httpx, naive failover", Tally(settings.requests))
    guarded = _Phase("sidestep", Tally(settings.requests))

    def count(event: str, fields: Mapping[str, Any], /) -> None:
        target = fields.get("target")
        if not isinstance(target, str):
            return
        if event == "circuit.half_open":
            guarded.probes[target] = guarded.probes.get(target, 0) + 1
        elif event == "candidate.skipped":
            guarded.skipped[target] = guarded.skipped.get(target, 0) + 1

    try:
        for upstream in upstreams:
            await upstream.start()
        view.started(upstreams, settings.attempts)
        urls = [u.url + _PATH for u in upstreams]  # the ports are known once started
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            call = _naive(client, urls[: settings.attempts])
            await _phase(naive, call, upstreams, settings, view)
        transport = AsyncFailoverTransport(
            _config(upstreams, settings.attempts), transport=httpx.AsyncHTTPTransport(limits=limits)
        )
        guarded.transport = transport
        events.add_observer(count)
        try:
            async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:
                await _phase(guarded, _through(client, urls[0]), upstreams, settings, view)
        finally:
            events.remove_observer(count)
    finally:
        for upstream in upstreams:
            await upstream.stop()
    return _summary(settings, naive, guarded)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _figures(phase: _Phase) -> dict[str, Any]:
    tally = phase.tally
    end = tally.finished if tally.finished is not None else tally.started
    return {
        "requests": tally.done,
        "errors": tally.errors,
        "wasted_calls": phase.wasted,
        "p50_ms": round(_percentile(tally.latencies, 0.50) * 1000, 1),
        "p99_ms": round(_percentile(tally.latencies, 0.99) * 1000, 1),
        "wall_s": round(end - tally.started, 2),
        "upstream_calls": dict(phase.calls),
    }


def _summary(settings: _Settings, naive: _Phase, guarded: _Phase) -> dict[str, Any]:
    return {
        "requests": settings.requests,
        "concurrency": settings.concurrency,
        "timeout_s": settings.timeout,
        "attempts": settings.attempts,
        "naive": _figures(naive),
        "sidestep": {**_figures(guarded), "probes": dict(guarded.probes)},
    }


# -- what the person sees --------------------------------------------------------------

_HIDE_CURSOR, _SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"
_BOLD, _DIM, _RESET = "\x1b[1m", "\x1b[2m", "\x1b[0m"
_COLOURS = {"closed": "\x1b[32m", "open": "\x1b[31m", "half_open": "\x1b[33m"}


class _View:
    """Live progress: a table redrawn in place on a terminal, plain lines otherwise, or nothing."""

    def __init__(self, out: TextIO, *, quiet: bool) -> None:
        self._out = out
        self._quiet = quiet
        self._live = not quiet and out.isatty()
        self._drawn = 0
        self._last_line = 0.0
        # Box-drawing characters only where the output can encode them.
        utf8 = (getattr(out, "encoding", None) or "").lower().replace("-", "") == "utf8"
        self._glyphs = ("█", "·", " → ") if utf8 else ("#", ".", " -> ")

    def started(self, upstreams: list[LocalUpstream], attempts: int) -> None:
        if self._quiet:
            return
        if self._live:
            self._out.write(_HIDE_CURSOR)
        listing = ", ".join(f"{u.name} :{u.port}" for u in upstreams)
        order = self._glyphs[2].join(u.name for u in upstreams)
        self._out.write(
            f"upstreams on 127.0.0.1: {listing}\n"
            f"each request tries {order}, making {attempts} upstream calls at most\n"
        )
        self._out.flush()

    def show(self, phase: _Phase, upstreams: list[LocalUpstream], *, final: bool = False) -> None:
        if self._quiet:
            return
        if self._live:
            self._redraw(self._table(phase, upstreams), final=final)
            return
        now = time.monotonic()
        if final or now - self._last_line >= _LINE_EVERY:
            self._last_line = now
            self._out.write(self._line(phase, upstreams) + "\n")
            self._out.flush()

    def restore(self) -> None:
        if self._live:
            self._out.write(_SHOW_CURSOR)
            self._out.flush()

    def summary(self, result: dict[str, Any]) -> None:
        rows = [
            ("requests", "requests", "{}"),
            ("errors seen by the caller", "errors", "{}"),
            ("upstream calls wasted on dead targets", "wasted_calls", "{}"),
            ("p50 latency", "p50_ms", "{} ms"),
            ("p99 latency", "p99_ms", "{} ms"),
            ("wall time", "wall_s", "{} s"),
        ]
        bold, reset = (_BOLD, _RESET) if self._live else ("", "")
        lines = [f"\n{bold}{'':<38}{'naive httpx':>14}{'sidestep':>12}{reset}"]
        for label, key, unit in rows:
            naive = unit.format(result["naive"][key])
            guarded = unit.format(result["sidestep"][key])
            lines.append(f"{label:<38}{naive:>14}{guarded:>12}")
        self._out.write("\n".join(lines) + "\n")
        self._out.flush()

    def _line(self, phase: _Phase, upstreams: list[LocalUpstream]) -> str:
        tally = phase.tally
        states = " ".join(f"{u.name}={_state(phase, u.name)[0]}" for u in upstreams)
        return (
            f"[{phase.label}] {tally.done}/{tally.total} done, {tally.errors} errors, "
            f"{phase.wasted} wasted calls | {states}"
        )

    def _table(self, phase: _Phase, upstreams: list[LocalUpstream]) -> list[str]:
        tally = phase.tally
        width = 30
        filled = width * tally.done // max(1, tally.total)
        bar = self._glyphs[0] * filled + self._glyphs[1] * (width - filled)
        lines = [
            f"{_BOLD}{phase.label}{_RESET}",
            f"  {bar} {tally.done}/{tally.total}   errors {tally.errors}   "
            f"wasted calls {phase.wasted}",
            f"  {_DIM}{'target':<10}{'behaviour':<28}{'calls':>7}{'skipped':>9}{'probes':>8}"
            f"  circuit{_RESET}",
        ]
        for u in upstreams:
            state, detail = _state(phase, u.name)
            colour = _COLOURS.get(state, "")
            shown = f"{colour}{state}{_RESET}{detail}" if colour else state
            lines.append(
                f"  {u.name:<10}{u.mode.value:<28}{u.calls:>7}"
                f"{phase.skipped.get(u.name, 0):>9}{phase.probes.get(u.name, 0):>8}  {shown}"
            )
        return lines

    def _redraw(self, lines: list[str], *, final: bool) -> None:
        up = f"\x1b[{self._drawn}F" if self._drawn else ""
        self._out.write(up + "".join(f"\x1b[2K{line}\n" for line in lines))
        self._out.flush()
        self._drawn = 0 if final else len(lines)


def _state(phase: _Phase, target: str) -> tuple[str, str]:
    """The circuit state of `target` in this phase, and a short detail."""
    if phase.transport is None:
        return "-", ""
    for s in phase.transport.suspensions():
        if s.target == target:
            if s.state == "open" and s.retry_in is not None:
                return s.state, f" (retry in {s.retry_in:.1f}s)"
            return s.state, ""
    return "closed", ""


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """Keep sidestep's log events to themselves while the demo runs (its table says it all)."""
    logger = logging.getLogger("sidestep")
    saved = logger.propagate
    logger.propagate = False  # only the library's NullHandler hears them
    try:
        yield
    finally:
        logger.propagate = saved


# -- the command ----------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to `parser` (the `sidestep demo` subcommand)."""
    parser.add_argument("--requests", type=int, default=300, help="requests per client")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight at once")
    parser.add_argument("--rate", type=float, default=60.0, help="requests started per second")
    parser.add_argument(
        "--timeout", type=float, default=0.5, help="client timeout in seconds (the stalled target)"
    )
    parser.add_argument(
        "--flap-down", type=float, default=3.0, help="seconds the flapping target stays down"
    )
    parser.add_argument(
        "--attempts",
        type=int,
        default=3,
        help="upstream calls one request may make, over all targets (both clients)",
    )
    parser.add_argument("--json", action="store_true", help="print only a JSON summary")


def run(args: argparse.Namespace) -> int:
    """Run the demo; the exit status (0, 2 for bad arguments, 130 when interrupted)."""
    settings = _Settings(
        requests=args.requests,
        concurrency=args.concurrency,
        rate=args.rate,
        timeout=args.timeout,
        flap_down=args.flap_down,
        attempts=args.attempts,
    )
    if (
        min(settings.requests, settings.concurrency, settings.attempts) < 1
        or min(settings.rate, settings.timeout) <= 0
    ):
        print("sidestep demo: counts, rate and timeout must be positive", file=sys.stderr)
        return 2
    view = _View(sys.stdout, quiet=args.json)
    try:
        with quiet_logs():
            result = asyncio.run(_main(settings, view))
    except KeyboardInterrupt:
        view.restore()
        print("\ninterrupted", file=sys.stderr)
        return 130
    view.restore()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        view.summary(result)
    return 0
