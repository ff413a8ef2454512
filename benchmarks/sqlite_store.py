"""Scenario sqlite_store: what sharing circuit state through a SQLite file costs.

Three parts:

- the store alone, one process: one admission plus one verdict, in
  microseconds, for `MemoryStore` and `SqliteStore` on a healthy and on an
  unhealthy origin, with the default ``refresh`` and with ``refresh=0``, and
  one refusal of an origin the file holds open;
- requests per second through the sync and async transports to a local
  upstream with either store;
- scale: 1, 4 and 8 worker processes on one file keeping 20, 1,000 and
  10,000 scopes — open ones, and up to FLAPPING that one more process fails
  and heals meanwhile, one change every 5 ms. Each worker admits under
  asyncio, in turn, a request to a healthy origin and one to an origin the
  file holds open, a few hundred a second; it reports the latency of each
  admission, the longest time one step of `admit_async` held its event
  loop (in wall-clock time, and in the loop thread's CPU time: the
  difference is time it waited for a core), its fallbacks to memory and the
  admissions the open origins were given (0 expected). The largest
  configuration runs again with a `MemoryStore` in each process (the
  control: what the machine's load costs with no file). Then six workers at
  20 requests/s each (every request tries an upstream the file holds open,
  then a healthy one) with 10,000 scopes kept, for 6 s.

The targets: a healthy request costs at most 5 µs more than with the memory
store; with 10,000 scopes and 8 processes a healthy admission's p99 is at
most 1 ms, no event-loop stall exceeds 5 ms and a refusal's median is at most
50 µs; the six-worker run falls back to memory 0 times and sends the open
upstream nothing. Variants of the single-process part are interleaved
(A B A B …) and each figure is the median over the runs.

    python benchmarks/sqlite_store.py [--quick] [store|transport|scale|traffic ...]
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Coroutine, Generator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from _stores import (  # noqa: E402
    FAIL,
    OK,
    POLICY,
    SUSPENSIONS,
    async_rps,
    facts,
    interleaved,
    pair_us,
    sicken,
    sync_rps,
)
from sidestep._answers.classify import Kind, Verdict  # noqa: E402
from sidestep._common.scopes import ScopeKind  # noqa: E402
from sidestep._settings.policies import BreakerPolicy  # noqa: E402
from sidestep._settings.values import SidestepConfigWarning  # noqa: E402
from sidestep._state.memory import DEFAULT_MAX_SCOPES, MemoryStore  # noqa: E402
from sidestep._state.sqlite.store import SqliteStore  # noqa: E402
from upstream import Upstream  # noqa: E402

SCENARIO = "sqlite_store"
BUDGET_US = 5.0  # what a healthy request may cost on top of the memory store
HEALTHY_P99_MS = 1.0  # with 10,000 scopes and 8 processes
STALL_MS = 5.0  # the longest an admission may hold its event loop
REFUSAL_US = 50.0
FLAPPING = 100  # origins the recorder fails and heals in turn
CONNECT_FAIL = Verdict(Kind.FAILURE, "unavailable", ScopeKind.ORIGIN, failover=True)
CONTEXT = multiprocessing.get_context("spawn")

Row = dict[str, Any]


def _row(metric: str, value: float, unit: str, note: str = "", **extra: Any) -> Row:
    return {
        "scenario": SCENARIO,
        "metric": metric,
        "value": value,
        "unit": unit,
        "note": note,
        **extra,
    }


def _target(metric: str, value: float, unit: str, limit: float, note: str = "") -> Row:
    ok = value <= limit
    return _row(metric, value, unit, note or f"target {limit:g} {unit}", verdict=_verdict(ok))


def _verdict(ok: bool) -> str:
    return "pass" if ok else "fail"


def kept(i: int) -> str:
    """The origin of the i-th scope the file keeps open."""
    return f"https://kept{i}.example:443"


def open_origin(store: Any, origin: str, policy: BreakerPolicy = POLICY) -> None:
    """Fail `origin` (connections refused: its own scope) until the file holds it open."""
    for _ in range(policy.failure_threshold):
        ticket = store.admit(facts(store, origin=origin), policy, 0.0).ticket
        if ticket is None:
            return
        store.record(ticket, CONNECT_FAIL, policy, SUSPENSIONS, 0.0)


# -- one process: the store alone ---------------------------------------------------------


def _refusal_us(store: Any, n: int) -> float:
    """Microseconds per refusal of an origin the store holds open."""
    held = facts(store, origin=kept(0))
    start = time.perf_counter()
    for _ in range(n):
        assert store.admit(held, POLICY, 0.0).ticket is None
    return (time.perf_counter() - start) / n * 1e6


def _store_rows(where: Path, quick: bool) -> list[Row]:
    n, runs = (200, 2) if quick else (20_000, 7)
    memory, memory_sick = MemoryStore(), MemoryStore()
    healthy = SqliteStore(where / "healthy.db")
    every = SqliteStore(where / "every.db", refresh=0)
    sick = SqliteStore(where / "sick.db")
    sicken(memory_sick)
    sicken(sick)
    for store in (memory_sick, sick):
        open_origin(store, kept(0))
    medians = interleaved(
        {
            "memory, healthy origin": lambda: pair_us(memory, n),
            "sqlite, healthy origin": lambda: pair_us(healthy, n),
            "sqlite, healthy origin, refresh=0": lambda: pair_us(every, n),
            "memory, unhealthy origin": lambda: pair_us(memory_sick, max(10, n // 20)),
            "sqlite, unhealthy origin": lambda: pair_us(sick, max(10, n // 20)),
            "memory, refusal": lambda: _refusal_us(memory_sick, n),
            "sqlite, refusal": lambda: _refusal_us(sick, n),
        },
        runs,
    )
    for store in (healthy, every, sick):
        assert store.fallbacks == 0, "the benchmark fell back to memory: numbers are not the file's"
        store.close()
    notes = {
        "sqlite, healthy origin": "no statement; the file asked whether it changed every 10 ms",
        "sqlite, healthy origin, refresh=0": "PRAGMA data_version on every request",
        "sqlite, unhealthy origin": "another model's scope open: read from the view, no write",
        "sqlite, refusal": "the origin's own scope open: no write transaction",
    }
    added = medians["sqlite, healthy origin"] - medians["memory, healthy origin"]
    return [
        *(
            _row(
                f"{'refusal' if 'refusal' in name else 'admit+record'}: {name}",
                value,
                "us",
                notes.get(name, ""),
            )
            for name, value in medians.items()
        ),
        _row(
            "healthy request: added over memory",
            added,
            "us",
            f"budget {BUDGET_US:g} us",
            verdict=_verdict(added <= BUDGET_US),
        ),
    ]


def _transport_rows(where: Path, quick: bool) -> list[Row]:
    n, runs = (50, 2) if quick else (1500, 5)
    upstream = Upstream()
    target = upstream.url + "/v1/items"
    sqlite = SqliteStore(where / "transport.db")
    memory = MemoryStore()
    try:
        medians = interleaved(
            {
                "sync, MemoryStore": lambda: sync_rps(memory, target, n),
                "sync, SqliteStore": lambda: sync_rps(sqlite, target, n),
                "async, MemoryStore": lambda: async_rps(memory, target, n),
                "async, SqliteStore": lambda: async_rps(sqlite, target, n),
            },
            runs,
        )
        assert sqlite.fallbacks == 0
    finally:
        sqlite.close()
        upstream.close()
    note = "sequential requests to a local upstream, healthy origin"
    return [_row(f"requests/s: {name}", value, "req/s", note) for name, value in medians.items()]


# -- several processes on one file ----------------------------------------------------------


class _Timed:
    """Awaits a coroutine, timing each step it runs on the event loop (up to a suspension):
    the longest in wall-clock time, and the longest in CPU time of the loop's thread (the
    work done; what wall-clock time adds is time the thread waited to run: the machine's
    other processes, or the interpreter's lock)."""

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.coro = coro
        self.longest = 0.0
        self.cpu = 0.0

    def _took(self, wall: float, cpu: float) -> None:
        self.longest = max(self.longest, wall)
        self.cpu = max(self.cpu, cpu)

    def __await__(self) -> Generator[Any, Any, Any]:
        value: Any = None
        error: BaseException | None = None
        while True:
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                yielded = self.coro.send(value) if error is None else self.coro.throw(error)
            except StopIteration as stop:
                self._took(time.perf_counter() - started, time.thread_time() - cpu)
                return stop.value
            self._took(time.perf_counter() - started, time.thread_time() - cpu)
            value, error = None, None
            try:
                value = yield yielded
            except BaseException as exc:  # handed to the coroutine, as await does
                error = exc


def _open_kept(scopes: int) -> int:
    """How many open scopes make `scopes` kept with the recorder's: the default bound is
    not passed (past it, the oldest open scope would be forgotten)."""
    return min(scopes, DEFAULT_MAX_SCOPES - FLAPPING)


def _populate(path: Path, scopes: int) -> None:
    """A file keeping open scopes, one per origin (an hour's window each)."""
    store = SqliteStore(path, timeout=30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)  # one failure opens: quicker
        at_once = BreakerPolicy(failure_threshold=1, cooldown=3600, max_cooldown=3600)
    for i in range(_open_kept(scopes)):
        open_origin(store, kept(i), at_once)
    assert len(store) == _open_kept(scopes)
    assert store.fallbacks == 0
    store.close()


def _recorder(path: str, start: Any, stop: Any, out: Any) -> None:
    """In a child: one change to the file every 5 ms — a failure, then a success that heals it
    again — on FLAPPING origins in turn; reports the changes made and its fallbacks."""
    store = SqliteStore(path)
    start.wait()
    changes, i = 0, 0
    next_at = time.monotonic()
    while not stop.is_set():
        origin = f"https://flapping{i % FLAPPING}.example:443"
        verdict = FAIL if (i // FLAPPING) % 2 == 0 else OK
        i += 1
        ticket = store.admit(facts(store, origin=origin), POLICY, 0.0).ticket
        if ticket is not None:
            store.record(ticket, verdict, POLICY, SUSPENSIONS, 0.0)
            changes += 1
        next_at += 0.005
        time.sleep(max(0.0, next_at - time.monotonic()))
    out.put(("recorder", changes, store.fallbacks))
    store.close()


def _worker(
    path: str, scopes: int, seconds: float, start: Any, out: Any, memory: bool = False
) -> None:
    """In a child: admissions under asyncio, a healthy origin and an open one in turn; with
    `memory`, on a memory store of this process keeping as many open scopes (the control)."""

    async def main() -> tuple[list[float], list[float], tuple[float, float], int, int]:
        store: Any = MemoryStore() if memory else SqliteStore(path)
        if memory:
            for i in range(_open_kept(scopes)):
                open_origin(store, kept(i))
        healthy = facts(store, origin="https://healthy.example:443")
        await store.admit_async(healthy, POLICY, 0.0)  # the file opened and read: not timed
        rng = random.Random()
        start.wait()
        times: dict[bool, list[float]] = {True: [], False: []}
        longest, cpu, given = 0.0, 0.0, 0
        opened = _open_kept(scopes)
        ends = time.monotonic() + seconds
        turn = False
        while time.monotonic() < ends:
            turn = not turn
            request = healthy if turn else facts(store, origin=kept(rng.randrange(opened)))
            timed = _Timed(store.admit_async(request, POLICY, 0.0))
            began = time.perf_counter()
            admission = await timed
            times[turn].append(time.perf_counter() - began)
            longest, cpu = max(longest, timed.longest), max(cpu, timed.cpu)
            if admission.ticket is not None:
                given += not turn
                await store.record_async(admission.ticket, OK, POLICY, SUSPENSIONS, 0.0)
            await asyncio.sleep(0.003)
        fallbacks = getattr(store, "fallbacks", 0)
        if not memory:
            store.close()
        return times[True], times[False], (longest, cpu), fallbacks, given

    out.put(("worker", *asyncio.run(main())))


def _traffic(path: str, seconds: float, start: Any, out: Any) -> None:
    """In a child: 20 requests/s, each trying an upstream the file holds open (kept 0),
    then a healthy one; reports the admissions the open one was given, the slowest
    admission and the fallbacks to memory."""
    store = SqliteStore(path)
    primary = facts(store, origin=kept(0))
    backup = facts(store, origin="https://backup.example:443")
    store.admit(backup, POLICY, 0.0)
    start.wait()
    given, slowest = 0, 0.0
    next_at = ends = time.monotonic()
    ends += seconds
    while time.monotonic() < ends:
        began = time.perf_counter()
        ticket = store.admit(primary, POLICY, 0.0).ticket
        if ticket is not None:
            given += 1  # sent to the dead upstream: its failure is recorded
            store.record(ticket, CONNECT_FAIL, POLICY, SUSPENSIONS, 0.0)
        ticket = store.admit(backup, POLICY, 0.0).ticket
        slowest = max(slowest, time.perf_counter() - began)
        if ticket is not None:
            store.record(ticket, OK, POLICY, SUSPENSIONS, 0.0)
        next_at += 0.05
        time.sleep(max(0.0, next_at - time.monotonic()))
    out.put(("traffic", given, slowest, store.fallbacks))
    store.close()


def _run_processes(
    targets: list[tuple[Any, tuple[Any, ...]]], path: Path, memory: bool = False
) -> list[Any]:
    """Start the workers and the recorder, let them go together, and gather their reports
    (`memory`: the workers' last argument, after the start event and the queue)."""
    start, stop, out = CONTEXT.Event(), CONTEXT.Event(), CONTEXT.Queue()
    recorder = CONTEXT.Process(target=_recorder, args=(str(path), start, stop, out))
    extra = (memory,) if memory else ()
    processes = [CONTEXT.Process(target=t, args=(*args, start, out, *extra)) for t, args in targets]
    for process in (recorder, *processes):
        process.start()
    start.set()
    reports = [out.get(timeout=600) for _ in processes]
    stop.set()
    reports.append(out.get(timeout=60))
    for process in (recorder, *processes):
        process.join(60)
    return reports


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _measure(
    path: Path, scopes: int, processes: int, seconds: float, memory: bool = False
) -> dict[str, Any]:
    """One configuration: the workers' admissions and longest steps, and the recorder's work."""
    reports = _run_processes([(_worker, (str(path), scopes, seconds))] * processes, path, memory)
    found = [r for r in reports if r[0] == "worker"]
    (recorder,) = [r for r in reports if r[0] == "recorder"]
    return {
        "healthy": [t for r in found for t in r[1]],
        "refused": [t for r in found for t in r[2]],
        "stall": max(r[3][0] for r in found),
        "cpu": max(r[3][1] for r in found),
        "fallbacks": sum(r[4] for r in found) + recorder[2],
        "given": sum(r[5] for r in found),
        "changes": recorder[1],
    }


def _scale_rows(where: Path, quick: bool) -> list[Row]:
    sizes, counts, seconds = (
        ((20, 1000), (1, 2), 0.3) if quick else ((20, 1000, 10_000), (1, 4, 8), 3.0)
    )
    rows: list[Row] = []
    for scopes in sizes:
        template = where / f"kept-{scopes}.db"
        _populate(template, scopes)
        for processes in counts:
            path = where / f"run-{scopes}-{processes}.db"
            shutil.copy(template, path)
            m = _measure(path, scopes, processes, seconds)
            healthy, refused = m["healthy"], m["refused"]
            axes = f"{processes} processes, {scopes:,} scopes"
            note = f"{len(healthy)} admissions; recorder: {m['changes']} changes"
            rows += [
                _row(f"healthy admission p50: {axes}", _percentile(healthy, 0.5) * 1e3, "ms", note),
                _row(f"healthy admission p99: {axes}", _percentile(healthy, 0.99) * 1e3, "ms"),
                _row(f"refusal p50: {axes}", _percentile(refused, 0.5) * 1e6, "us"),
                _row(f"refusal p99: {axes}", _percentile(refused, 0.99) * 1e6, "us"),
                _row(f"longest event-loop step: {axes}", m["stall"] * 1e3, "ms", "wall clock"),
                _row(
                    f"longest event-loop step, CPU: {axes}",
                    m["cpu"] * 1e3,
                    "ms",
                    "the loop's thread at work",
                ),
                _row(
                    f"fallbacks to memory: {axes}",
                    m["fallbacks"],
                    "",
                    f"admissions given to the open origin: {m['given']}",
                ),
            ]
            if scopes == max(sizes) and processes == max(counts):
                rows += _targets(axes, m)
                # The control: each process with a memory store keeping as many scopes, the
                # same admissions, the recorder still writing: what the machine alone costs.
                c = _measure(path, scopes, processes, seconds, memory=True)
                rows += [
                    _row(
                        f"control, MemoryStore: {axes}, {name}",
                        value,
                        unit,
                        "each process its own memory store",
                    )
                    for name, value, unit in (
                        ("healthy admission p99", _percentile(c["healthy"], 0.99) * 1e3, "ms"),
                        ("refusal p50", _percentile(c["refused"], 0.5) * 1e6, "us"),
                        ("longest event-loop step", c["stall"] * 1e3, "ms"),
                        ("longest event-loop step, CPU", c["cpu"] * 1e3, "ms"),
                    )
                ]
            path.unlink()
    return rows


def _targets(axes: str, m: dict[str, Any]) -> list[Row]:
    return [
        _target(
            f"healthy admission p99, {axes}",
            _percentile(m["healthy"], 0.99) * 1e3,
            "ms",
            HEALTHY_P99_MS,
        ),
        _target(f"event-loop stall, {axes}", m["stall"] * 1e3, "ms", STALL_MS),
        _target(f"event-loop stall, CPU, {axes}", m["cpu"] * 1e3, "ms", STALL_MS),
        _target(f"refusal p50, {axes}", _percentile(m["refused"], 0.5) * 1e6, "us", REFUSAL_US),
        _target(f"open origin admitted, {axes}", m["given"], "", 0),
    ]


def _traffic_rows(where: Path, quick: bool) -> list[Row]:
    scopes, seconds = (1000, 0.5) if quick else (10_000, 6.0)
    path = where / f"kept-{scopes}.db"
    if not path.exists():
        _populate(path, scopes)
    reports = _run_processes([(_traffic, (str(path), seconds))] * 6, path)
    traffic = [r for r in reports if r[0] == "traffic"]
    (recorder,) = [r for r in reports if r[0] == "recorder"]
    axes = f"6 workers at 20 requests/s, {scopes:,} scopes, {seconds:g} s"
    return [
        _target(f"fallbacks to memory, {axes}", sum(r[3] for r in traffic) + recorder[2], "", 0),
        _target(f"requests to the open upstream, {axes}", sum(r[1] for r in traffic), "", 0),
        _row(
            f"slowest request's admissions, {axes}",
            max(r[2] for r in traffic) * 1e3,
            "ms",
            f"recorder: {recorder[1]} changes",
        ),
    ]


def run(quick: bool) -> list[Row]:
    """The scenario's rows: store cost, transport throughput, and several processes at scale."""
    with tempfile.TemporaryDirectory() as where:
        return (
            _store_rows(Path(where), quick)
            + _transport_rows(Path(where), quick)
            + _scale_rows(Path(where), quick)
            + _traffic_rows(Path(where), quick)
        )


if __name__ == "__main__":
    only = [a for a in sys.argv[1:] if not a.startswith("--")]
    quick = "--quick" in sys.argv
    parts = {
        "store": _store_rows,
        "transport": _transport_rows,
        "scale": _scale_rows,
        "traffic": _traffic_rows,
    }
    with tempfile.TemporaryDirectory() as where:
        for name, part in parts.items():
            if only and name not in only:
                continue
            for r in part(Path(where), quick):
                mark = f"  [{r['verdict']}]" if "verdict" in r else ""
                print(f"{r['metric']:<70} {r['value']:>12,.3f} {r['unit']:<6} {r['note']}{mark}")
