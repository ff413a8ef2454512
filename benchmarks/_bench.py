"""What every benchmark scenario shares: rows, statistics, peers, upstreams and contenders.

A scenario module exposes ``run(quick: bool) -> list[dict]``; each row is
``{"scenario", "metric", "value", "unit", "note"}``, and a verdict row adds
``"verdict": "pass" | "fail"``. Measurements are interleaved (A B A B …)
and medians reported, because the machine is small and noisy.

Contenders for the failure scenarios all guard the same two targets — a dead
primary, then a healthy backup — with the same breaker settings: sidestep
fails over by itself; plain httpx and the peer breakers get the fallback loop
a user would write by hand.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import math
import multiprocessing
import statistics
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import httpx

import sidestep
from sidestep import logging as events
from sidestep._ops.demo_load import Tally, drive, through
from sidestep._ops.demo_upstream import LocalUpstream, Mode

Row = dict[str, Any]
THRESHOLD = 3  # consecutive failures that open a circuit, for every breaker alike
PROBES = 1  # requests let through at once when a circuit half-opens
PEER_HINT = "not installed: pip install -r benchmarks/requirements.txt"

# -- rows and statistics ---------------------------------------------------------------


def row(scenario: str, metric: str, value: Any, unit: str = "", note: str = "") -> Row:
    if isinstance(value, float):
        value = round(value, 4 if abs(value) < 10 else 1)
    return {"scenario": scenario, "metric": metric, "value": value, "unit": unit, "note": note}


def verdict(scenario: str, target: str, value: Any, unit: str, ok: bool, note: str = "") -> Row:
    """A target and whether it was met."""
    out = row(scenario, f"target: {target}", value, unit, note)
    out["verdict"] = "pass" if ok else "fail"
    return out


def at_most(scenario: str, target: str, measured: float, limit: float, note: str) -> Row:
    """The verdict that the ratio `measured` is at most `limit`."""
    return verdict(scenario, target, measured, "x", measured <= limit, note)


def paired_ratio(ours: list[float], base: list[float]) -> float:
    """The median of each round's ratio `ours / base`, the samples in round order.

    Samples taken in the same round share the machine's state then: on a
    shared machine a slow spell slows both, and their ratio cancels it,
    where the ratio of two medians could pair a slow sample with a fast one.
    """
    return median(a / b for a, b in zip(ours, base, strict=True) if b)


def paired_difference(ours: list[float], base: list[float]) -> float:
    """The median of each round's difference `ours - base` (see `paired_ratio`)."""
    return median(a - b for a, b in zip(ours, base, strict=True))


def median(values: Iterable[float]) -> float:
    items = [v for v in values if not math.isnan(v)]
    return statistics.median(items) if items else math.nan


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def cpu_per_call(call: Callable[[], Any], calls: int) -> float:
    """CPU seconds per call of `call` (`calls` of them), after 20 calls of warm-up."""
    for _ in range(20):  # lazily built state, caches
        call()
    gc.collect()
    started = time.process_time()
    for _ in range(calls):
        call()
    return (time.process_time() - started) / calls


async def cpu_per_call_async(call: Callable[[], Awaitable[Any]], calls: int) -> float:
    """`cpu_per_call` for a coroutine function."""
    for _ in range(20):
        await call()
    gc.collect()
    started = time.process_time()
    for _ in range(calls):
        await call()
    return (time.process_time() - started) / calls


# -- peers -----------------------------------------------------------------------------


def missing(modules: Iterable[str]) -> str | None:
    """The first of `modules` that cannot be imported, or None when all can."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            return name
    return None


# -- upstreams in a child process --------------------------------------------------------


class Child:
    """A process of servers that the parent drives with (command, argument) messages over a pipe.

    `target(conn, *args)` runs in the child: it starts its servers, sends one
    message saying where they listen, then answers commands (`obey`) until
    told to stop. `what` names the process in errors.
    """

    def __init__(self, target: Callable[..., None], args: tuple[Any, ...], what: str) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=target, args=(child, *args), daemon=True)
        self._what = what

    def start(self) -> Any:
        """Start the process; what it sent once its servers listen."""
        self._process.start()
        if not self._conn.poll(60):
            self._process.kill()
            raise RuntimeError(f"{self._what} did not start")
        return self._conn.recv()

    def stop(self) -> None:
        if self._process.is_alive():
            self._conn.send(("stop", None))
            self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()

    def ask(self, command: str, argument: Any) -> Any:
        self._conn.send((command, argument))
        if not self._conn.poll(10):
            raise RuntimeError(f"{self._what} stopped answering")
        return self._conn.recv()


async def obey(conn: Connection, handle: Callable[[str, Any], Any]) -> None:
    """In the child: answer each command with `handle(command, argument)` until "stop" (or EOF)."""
    loop = asyncio.get_running_loop()
    stopped = loop.create_future()

    def command() -> None:
        try:
            name, argument = conn.recv()
        except EOFError:
            name, argument = "stop", None
        if name != "stop":
            conn.send(handle(name, argument))
        elif not stopped.done():
            stopped.set_result(None)

    loop.add_reader(conn.fileno(), command)
    try:
        await stopped
    finally:
        loop.remove_reader(conn.fileno())


class Upstreams:
    """`LocalUpstream` servers run by a child process, so the client measured keeps a core.

    `specs` maps a name to (mode, delay). Use as a context manager; `urls`
    maps each name to its base URL. Times in `stats()` are on the monotonic
    clock, which parent and child share on Linux.
    """

    def __init__(self, specs: Mapping[str, tuple[Mode, float]]) -> None:
        self.urls: dict[str, str] = {}
        self._child = Child(_serve, (dict(specs),), "the upstream process")

    def __enter__(self) -> Upstreams:
        ports: dict[str, int] = self._child.start()
        self.urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._child.stop()

    def reset(self, down_for: Mapping[str, float] | None = None) -> None:
        """Zero the counts; each named flapping upstream goes down for that many seconds."""
        self._child.ask("reset", dict(down_for or {}))

    def stats(self) -> dict[str, dict[str, Any]]:
        result: dict[str, dict[str, Any]] = self._child.ask("stats", None)
        return result


def _serve(conn: Connection, specs: dict[str, tuple[Mode, float]]) -> None:
    asyncio.run(_serve_async(conn, specs))


async def _serve_async(conn: Connection, specs: dict[str, tuple[Mode, float]]) -> None:
    servers = {
        name: LocalUpstream(name, mode, delay=delay) for name, (mode, delay) in specs.items()
    }
    for server in servers.values():
        await server.start()

    def handle(command: str, argument: Any) -> Any:
        if command == "reset":
            for key, server in servers.items():
                server.reset(down_for=argument.get(key, 0.0))
            return None
        return {key: _stats(server) for key, server in servers.items()}

    conn.send({name: server.port for name, server in servers.items()})
    try:
        await obey(conn, handle)
    finally:
        for server in servers.values():
            await server.stop()


def _stats(server: LocalUpstream) -> dict[str, Any]:
    return {
        "calls": server.calls,
        "calls_while_down": server.calls_while_down,
        "down_call_times": list(server.down_call_times),
        "down_until": server.down_until,
        "first_up_answer": server.first_up_answer,
    }


# -- contenders for the failure scenarios ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """The two targets (dead primary first) and the settings every contender shares."""

    urls: tuple[str, str]
    timeout: float
    cooldown: float
    max_cooldown: float


@dataclass(slots=True)
class Caller:
    """One contender, ready: `call()` makes one request; True when the caller got an answer."""

    call: Callable[[], Awaitable[bool]]
    close: Callable[[], Awaitable[None]]
    opened: list[float] = field(default_factory=list)  # sidestep only: when the primary opened
    half_opened: list[float] = field(default_factory=list)


class Unhealthy(Exception):
    """Raised inside a peer's guard so that the breaker counts a 5xx answer as a failure."""


Guard = Callable[[str, Callable[[], Awaitable[httpx.Response]]], Awaitable[httpx.Response]]


class GuardTransport(httpx.AsyncBaseTransport):
    """A peer breaker per host around an inner transport: the glue a user of that peer writes."""

    def __init__(self, inner: httpx.AsyncBaseTransport, guard: Guard) -> None:
        self._inner = inner
        self._guard = guard

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        async def send() -> httpx.Response:
            response = await self._inner.handle_async_request(request)
            if response.status_code >= 500:
                await response.aclose()
                raise Unhealthy(response.status_code)
            return response

        return await self._guard(_netloc(request), send)

    async def aclose(self) -> None:
        await self._inner.aclose()


def aiobreaker_guard(threshold: int, cooldown: float) -> Guard:
    import aiobreaker

    breakers: defaultdict[str, Any] = defaultdict(
        lambda: aiobreaker.CircuitBreaker(
            fail_max=threshold, timeout_duration=timedelta(seconds=cooldown)
        )
    )

    async def guard(host: str, send: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
        response: httpx.Response = await breakers[host].call_async(send)
        return response

    return guard


def purgatory_guard(threshold: int, cooldown: float) -> Guard:
    import purgatory

    factory = purgatory.AsyncCircuitBreakerFactory(
        default_threshold=threshold, default_ttl=cooldown
    )

    async def guard(host: str, send: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
        async with await factory.get_breaker(host):
            return await send()

    return guard


def pybreaker_guard(threshold: int, cooldown: float) -> Guard:
    import pybreaker

    # pybreaker guards coroutines only through tornado; its `calling()` context
    # manager wraps any block, an awaited one included, with the same accounting.
    breakers: defaultdict[str, Any] = defaultdict(
        lambda: pybreaker.CircuitBreaker(fail_max=threshold, reset_timeout=cooldown)
    )

    async def guard(host: str, send: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
        with breakers[host].calling():
            return await send()

    return guard


def circuitbreaker_guard(threshold: int, cooldown: float) -> Guard:
    import circuitbreaker

    # Only the decorated form checks the state before calling: decorate per host.
    guarded: dict[str, Callable[..., Awaitable[httpx.Response]]] = {}

    async def through(send: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
        return await send()

    async def guard(host: str, send: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
        wrapped = guarded.get(host)
        if wrapped is None:
            breaker = circuitbreaker.CircuitBreaker(
                failure_threshold=threshold, recovery_timeout=cooldown, name=f"bench-{host}"
            )
            wrapped = guarded[host] = breaker(through)
        return await wrapped(send)

    return guard


def interlock_transport(
    inner: httpx.AsyncBaseTransport, threshold: int, cooldown: float
) -> httpx.AsyncBaseTransport:
    from interlock import Config
    from interlock.integrations.httpx import AsyncCircuitBreakerTransport

    # A count window of `threshold` calls tripping at 100% failures: the same
    # rule as `threshold` consecutive failures.
    config = Config(
        failure_rate_threshold=1.0,
        minimum_number_of_calls=threshold,
        window_size=threshold,
        wait_duration_in_open=cooldown,
        permitted_calls_in_half_open=PROBES,
        max_concurrent_probes=PROBES,
    )
    # Its default breaker key is the host alone; the benchmark's targets share
    # 127.0.0.1 on two ports where real ones would be two hosts, so key by host:port.
    transport: httpx.AsyncBaseTransport = AsyncCircuitBreakerTransport(
        inner, config=config, name_resolver=_netloc
    )
    return transport


def _netloc(request: httpx.Request) -> str:
    return request.url.netloc.decode()


def retries_transport(inner: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport:
    from httpx_retries import Retry, RetryTransport

    transport: httpx.AsyncBaseTransport = RetryTransport(transport=inner, retry=Retry(total=1))
    return transport


# name -> (modules it needs, how to wrap the inner transport); None: plain httpx
PEERS: dict[str, tuple[tuple[str, ...], Callable[[httpx.AsyncBaseTransport, Plan], Any]]] = {
    "interlock-cb": (
        ("interlock.integrations.httpx",),
        lambda inner, plan: interlock_transport(inner, THRESHOLD, plan.cooldown),
    ),
    "aiobreaker": (
        ("aiobreaker",),
        lambda inner, plan: GuardTransport(inner, aiobreaker_guard(THRESHOLD, plan.cooldown)),
    ),
    "purgatory": (
        ("purgatory",),
        lambda inner, plan: GuardTransport(inner, purgatory_guard(THRESHOLD, plan.cooldown)),
    ),
    "pybreaker": (
        ("pybreaker",),
        lambda inner, plan: GuardTransport(inner, pybreaker_guard(THRESHOLD, plan.cooldown)),
    ),
    "circuitbreaker": (
        ("circuitbreaker",),
        lambda inner, plan: GuardTransport(inner, circuitbreaker_guard(THRESHOLD, plan.cooldown)),
    ),
    "httpx-retries": (("httpx_retries",), lambda inner, plan: retries_transport(inner)),
}
CONTENDERS = ("naive", "sidestep", *PEERS)


def _limits() -> httpx.Limits:
    return httpx.Limits(max_connections=256, max_keepalive_connections=64)


def fallback(client: httpx.AsyncClient, urls: Iterable[str]) -> Callable[[], Awaitable[bool]]:
    """The hand-written failover: each target in order, until one answers below 500."""
    targets = tuple(urls)

    async def call() -> bool:
        for url in targets:
            try:
                response = await client.get(url)
            except Exception:  # noqa: S112 - an open breaker, a timeout, a 5xx raised by the glue
                continue
            if response.status_code < 500:
                return True
        return False

    return call


def sidestep_config(plan: Plan) -> dict[str, Any]:
    return {
        "breaker": {
            "failure_threshold": THRESHOLD,
            "cooldown": plan.cooldown,
            "max_cooldown": plan.max_cooldown,
            "half_open_probes": PROBES,
        },
        "routes": [
            {
                "name": "bench",
                "targets": [
                    {"name": "primary", "url": plan.urls[0]},
                    {"name": "backup", "url": plan.urls[1]},
                ],
            }
        ],
    }


def caller(name: str, plan: Plan) -> Caller:
    """Build contender `name` for `plan` (its peer must be importable)."""
    inner = httpx.AsyncHTTPTransport(limits=_limits())
    timeout = httpx.Timeout(plan.timeout)
    paths = tuple(url + "/items" for url in plan.urls)
    if name == "sidestep":
        transport = sidestep.AsyncFailoverTransport(sidestep_config(plan), transport=inner)
        client = httpx.AsyncClient(transport=transport, timeout=timeout)
        return _watched(client, paths[0])
    wrapped: httpx.AsyncBaseTransport = inner
    if name in PEERS:
        wrapped = PEERS[name][1](inner, plan)
    client = httpx.AsyncClient(transport=wrapped, timeout=timeout)
    targets = paths[1:] if name == BASELINE else paths
    return Caller(call=fallback(client, targets), close=client.aclose)


def _watched(client: httpx.AsyncClient, url: str) -> Caller:
    """sidestep's caller, with the primary's circuit transitions noted as they happen."""
    built = Caller(call=through(client, url), close=client.aclose)
    loop = asyncio.get_running_loop()

    def watch(event: str, fields: Mapping[str, Any], /) -> None:
        if fields.get("target") != "primary":
            return
        if event == "circuit.opened":
            built.opened.append(loop.time())
        elif event == "circuit.half_open":
            built.half_opened.append(loop.time())

    async def close() -> None:
        events.remove_observer(watch)
        await client.aclose()

    events.add_observer(watch)
    built.close = close
    return built


def available(names: Iterable[str]) -> tuple[list[str], list[str]]:
    """(contenders that can run, peers that are not installed)."""
    ready, absent = [], []
    for name in names:
        if name in PEERS and missing(PEERS[name][0]) is not None:
            absent.append(name)
        else:
            ready.append(name)
    return ready, absent


@dataclass(frozen=True, slots=True)
class Load:
    """How hard a failure scenario pushes: open-loop at `rate`, `inflight` at once at most."""

    requests: int
    rate: float
    inflight: int
    rounds: int


@dataclass(slots=True)
class Sample:
    """One contender's run in one round: what the caller saw, what the dead target saw."""

    tally: Tally
    dead: dict[str, Any]
    opened: list[float]
    half_opened: list[float]


BASELINE = "healthy baseline"  # plain httpx to the healthy target alone: the latency yardstick


def failure_rounds(
    dead: Mode,
    load: Load,
    *,
    timeout: float,
    cooldown: float,
    max_cooldown: float,
    down_for: float = 0.0,
    healthy_delay: float = 0.005,
) -> tuple[dict[str, list[Sample]], list[str]]:
    """Every contender against a dead primary and a healthy backup, interleaved over rounds.

    Returns the samples by contender (the healthy baseline first) and the
    peers that are not installed.
    """
    ready, absent = available(CONTENDERS)
    specs = {"dead": (dead, 0.0), "healthy": (Mode.HEALTHY, healthy_delay)}
    samples: dict[str, list[Sample]] = {name: [] for name in (BASELINE, *ready)}
    with quiet_logs(), Upstreams(specs) as upstreams:
        plan = Plan(
            (upstreams.urls["dead"] + "/v1", upstreams.urls["healthy"] + "/v1"),
            timeout=timeout,
            cooldown=cooldown,
            max_cooldown=max_cooldown,
        )

        async def rounds() -> None:
            for _ in range(load.rounds):
                for name in samples:
                    upstreams.reset({"dead": down_for})
                    built = caller(name, plan)
                    tally = Tally(load.requests)
                    try:
                        await drive(built.call, tally, concurrency=load.inflight, rate=load.rate)
                    finally:
                        await built.close()
                    dead_stats = upstreams.stats()["dead"]
                    samples[name].append(Sample(tally, dead_stats, built.opened, built.half_opened))

        asyncio.run(rounds())
    return samples, absent


def opened_at(s: Sample, wait: float = 0.0) -> float:
    """When the dead target's `THRESHOLD`-th call ended (`wait`: how long it took to fail)."""
    times = s.dead["down_call_times"]
    return times[THRESHOLD - 1] + wait if len(times) >= THRESHOLD else math.nan


def after(s: Sample, t: float) -> list[float]:
    """Latencies of the requests that started at `t` or later."""
    return [lat for start, lat in zip(s.tally.starts, s.tally.latencies, strict=True) if start >= t]


def summarise(
    samples: Mapping[str, list[Sample]], metrics: Mapping[str, Callable[[Sample], float]]
) -> dict[str, dict[str, float]]:
    """Each contender's median of each metric over its rounds."""
    return {
        name: {metric: median(f(s) for s in runs) for metric, f in metrics.items()}
        for name, runs in samples.items()
    }


# What every failure scenario reports for each contender, and in which units.
OUTCOME_UNITS = {"dead calls": "calls", "errors": "requests", "p50": "ms", "p99": "ms"}


def outcome_metrics() -> dict[str, Callable[[Sample], float]]:
    """Calls that reached the dead target, caller-visible errors, p50 and p99 latency."""
    return {
        "dead calls": lambda s: s.dead["calls"],
        "errors": lambda s: s.tally.errors,
        "p50": lambda s: ms(percentile(s.tally.latencies, 0.50)),
        "p99": lambda s: ms(percentile(s.tally.latencies, 0.99)),
    }


def no_errors(scenario: str, errors: float, rounds: int, requests: int) -> Row:
    """The verdict every failure scenario gives: no error reached the caller."""
    return verdict(
        scenario,
        "zero caller-visible errors while a healthy candidate exists",
        errors,
        "errors",
        errors == 0,
        f"worst of {rounds} rounds of {requests} requests",
    )


def matrix(
    scenario: str, table: Mapping[str, Mapping[str, float]], units: Mapping[str, str]
) -> list[Row]:
    """One row per contender and metric, tagged with the contender (`subject`) for the table."""
    rows = []
    for name, values in table.items():
        for metric, value in values.items():
            out = row(scenario, metric, value, units.get(metric, ""))
            out["subject"] = name
            rows.append(out)
    return rows


def absent_rows(scenario: str, absent: Iterable[str]) -> list[Row]:
    return [row(scenario, f"{name}: skipped", None, "", PEER_HINT) for name in absent]


def ms(seconds: float) -> float:
    return seconds * 1000


def quiet_logs() -> Any:
    """structlog events dropped while a benchmark runs (sidestep would log every skip)."""
    from sidestep._ops.demo_view import quiet_logs as quiet

    return quiet()
