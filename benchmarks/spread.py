"""Scenario spread: sharing load across equivalent deployments, against LiteLLM's Router.

    python benchmarks/run.py spread            # about three minutes; --quick: under half a minute

Side by side in one run, on fake OpenAI-compatible deployments served on
127.0.0.1 (``_deployments.py``: a queue of ``slots`` per deployment, OpenAI's
rate-limit headers), callers using the ``openai`` SDK or LiteLLM's Router
(``_routers.py``) in five cases, each contender in turn on the same servers
after a short warm-up (``_traffic.py``). The sizes below are the full run's;
``--quick`` shrinks every time and count, and its numbers mean nothing.

- **equal**: 4 equal replicas of 8 slots (0.5 s a request), 32 callers in a
  closed loop for 5 s. Targets: no member above 27% of requests; p99 within
  10% of the even split's (least in flight, the best a client can do here,
  run in this case only). Judged on the pools that balance by load: the
  weighted pool draws by weight alone, blind to load by design, and is
  shown beside them (its target is the weights case's).
- **slow**: 2 replicas of 8 slots, the first listed 10x slower (2 s against
  0.2 s), 32 callers for 5 s. Target: the fast one serves ≥ 85% of requests
  (judged on the pools that balance by load, as above).
- **keys**: 3 keys (3 deployments) of 60 requests each per window, refilled
  continuously, and 5/6 of their total offered at a steady rate for 8 s:
  the issue's 60 requests/min per key under 150/min, with the minute scaled
  down to a 4 s window so that a run takes seconds. Targets: ≥ 99% served,
  no 429 reaching the caller, upstream 429s ≤ 1% of requests. LiteLLM is
  given each key's limit per real minute (``rpm``: 900), which it counts per
  calendar minute, so its own accounting never holds a key back here.
- **weights**: 2 replicas weighted 70/30, 5,000 requests (1,000 for LiteLLM,
  whose client CPU bounds its rate). Target: the 70 member's share within ±2
  points.
- **affinity**: 4 replicas, 100 conversations of 4 + 2 + 3 turns (an
  ``x-session-id`` header): turns while all are healthy, then while the
  first member is down (503), then after it is back and its breaker window
  has passed. Targets: ≥ 99% of a conversation's turns on one member while
  all are healthy; ≥ 95% of the lost member's conversations back on it
  (their last turn) once it returns. LiteLLM has no affinity: its
  simple-shuffle shows what spreading without it does.

Per contender and case: requests/s, p50/p99 latency of the answered
requests, each member's share (in the order the members are listed), 429s
answered upstream and reaching the caller, other errors, and the client's
CPU per request. The targets are the pools feature's (issue 30), judged on
each sidestep pool configuration; a build whose ``sidestep.Config`` refuses
pools reports those rows as not available and judges its ranked route.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import _bench as b
import _routers as r
from _bench import Row
from _deployments import Deployment, Deployments
from _traffic import CALLERS, Drive, Run, closed_loop, conversations, measure, open_loop

SCENARIO = "spread"
SHUFFLE = ("simple-shuffle",)
EVEN = "even split (least in flight)"
RANKED = "sidestep ranked route"
NO_POOLS = "pools not available in this build"


def pool_name(balance: str, extra: str = "") -> str:
    return f"sidestep pool, {balance}{extra}"


@dataclass(frozen=True, slots=True)
class Sizes:
    """How long and how hard each case runs."""

    equal_service: float
    equal_seconds: float
    slow_service: float
    slow_seconds: float
    keys_limit: int
    keys_period: float
    keys_seconds: float
    weights_requests: int
    conversations: int
    turns: tuple[int, int, int]  # per conversation: all healthy, one member down, back


FULL = Sizes(0.5, 5.0, 0.2, 5.0, 60, 4.0, 8.0, 5000, 100, (4, 2, 3))
QUICK = Sizes(0.05, 0.4, 0.02, 0.4, 10, 0.5, 1.0, 250, 16, (3, 2, 2))


def deployments(s: Sizes) -> list[Deployment]:
    """Every case's members, served by one process for the whole run."""
    keys = {"limit": s.keys_limit, "period": s.keys_period}
    return [
        *(Deployment(f"r{i}", slots=8, service=s.equal_service) for i in range(1, 5)),
        Deployment("slow", slots=8, service=s.slow_service, slowness=10.0),
        Deployment("fast", slots=8, service=s.slow_service),
        *(Deployment(f"key-{k}", slots=16, service=0.05, **keys) for k in "abc"),  # type: ignore[arg-type]
        Deployment("w70", slots=64, service=0.002),
        Deployment("w30", slots=64, service=0.002),
        *(Deployment(f"m{i}", slots=16, service=0.02) for i in range(1, 5)),
    ]


# -- who runs in which case -----------------------------------------------------------------


@dataclass(slots=True)
class Lineup:
    """A case's contenders (name -> how to build it) and those that cannot run (name -> why)."""

    ready: dict[str, Callable[[], r.Router]] = field(default_factory=dict)
    absent: dict[str, str] = field(default_factory=dict)


def lineup(
    urls: Mapping[str, str],
    *,
    even: bool = True,
    ranked: bool = True,
    balances: tuple[str, ...] = r.POOL_BALANCES,
    strategies: tuple[str, ...] = r.LITELLM_STRATEGIES,
    weights: Mapping[str, float] | None = None,
    affinity: bool = False,
    rpm: int | None = None,
) -> Lineup:
    out = Lineup()
    if even:
        out.ready[EVEN] = lambda: r.even_router(urls)
    if ranked:
        config = r.ranked_config(urls)
        out.ready[RANKED] = lambda: r.sidestep_router(RANKED, urls, config)
    for balance in balances:
        name = pool_name(balance, ", affinity" if affinity else "")
        pool = r.pool_config(urls, balance, weights=weights, affinity=affinity)
        why = r.refused(pool)
        if why is None:
            out.ready[name] = lambda n=name, c=pool: r.sidestep_router(n, urls, c)  # type: ignore[misc]
        else:
            out.absent[name] = f"{NO_POOLS}: {why}"
    if strategies and r.litellm_module() is None:
        out.absent["LiteLLM"] = b.PEER_HINT
    else:
        for strategy in strategies:
            out.ready[f"LiteLLM {strategy}"] = (
                lambda s=strategy: r.litellm_router(s, urls, weights=weights, rpm=rpm)  # type: ignore[misc]
            )
    return out


async def play(servers: Deployments, line: Lineup, drive: Drive) -> dict[str, Run]:
    """Each ready contender's run, one after the other; one that fails is listed with why."""
    runs = {}
    for name, build in line.ready.items():
        try:
            runs[name] = await measure(servers, build, drive)
        except Exception as exc:  # the others still run; the table says what went wrong
            line.absent[name] = f"could not run: {type(exc).__name__}: {exc}"[:160]
    return runs


# -- rows ------------------------------------------------------------------------------------

UNITS = {
    "requests/s": "",
    "p50": "ms",
    "p99": "ms",
    "share": "%",
    "429s upstream": "",
    "429s to caller": "",
    "errors": "",
    "served": "%",
    "one member": "%",
    "back": "%",
    "client CPU": "ms/request",
}


def measures(run: Run, members: list[str]) -> dict[str, Any]:
    """What every case reports of a run; the shares in the order `members` are listed."""
    return {
        "requests/s": b.ratio(run.answered, run.elapsed),
        "p50": b.ms(b.percentile(run.latencies, 0.50)),
        "p99": b.ms(b.percentile(run.latencies, 0.99)),
        "share": " ".join(f"{run.share(m):.0f}" for m in members),
        "429s upstream": sum(s["429"] for s in run.upstream.values()),
        "429s to caller": run.limited,
        "errors": run.errors,
        "client CPU": b.ms(b.ratio(run.cpu, run.offered)),
    }


def grid(case: str, table: Mapping[str, Mapping[str, Any]]) -> list[Row]:
    """A case's measures, one row per contender and measure, its subject named by the case."""
    return b.matrix(SCENARIO, {f"{case}: {name}": values for name, values in table.items()}, UNITS)


def about(case: str, members: list[str], note: str, line: Lineup) -> list[Row]:
    rows = [b.row(SCENARIO, f"{case}: members", " ".join(members), "", note)]
    rows += [
        b.row(SCENARIO, f"{case}: {name}: skipped", None, "", why)
        for name, why in line.absent.items()
    ]
    return rows


def judged(runs: Mapping[str, Run], by_load: bool = False) -> dict[str, tuple[Run, str]]:
    """The runs the targets are judged on: each sidestep pool's, else the ranked route's.
    With `by_load` (the cases that measure spreading by load), not the weighted pool's:
    it draws by weight alone, blind to load by design (its target is the weights case's),
    and its row stays in the table beside the others."""
    blind = pool_name("weighted") if by_load else None
    pools = {
        name: (run, "")
        for name, run in runs.items()
        if name.startswith("sidestep pool") and name != blind
    }
    if pools or RANKED not in runs:
        return pools
    return {RANKED: (runs[RANKED], f"{NO_POOLS}: judged on the ranked route")}


def sticky(run: Run, phase: int) -> tuple[int, int]:
    """(turns on each conversation's most used member, turns answered) in `phase`."""
    kept = total = 0
    for phases in run.turns.values():
        answered = [m for m in phases[phase] if m is not None] if len(phases) > phase else []
        if answered:
            kept += Counter(answered).most_common(1)[0][1]
            total += len(answered)
    return kept, total


def homecoming(run: Run, lost: str) -> tuple[int, int]:
    """(the lost member's conversations whose last turn is back on it, its conversations)."""
    back = homed = 0
    for phases in run.turns.values():
        first = Counter(m for m in phases[0] if m is not None).most_common(1)
        if first and first[0][0] == lost:
            homed += 1
            back += phases[-1][-1] == lost
    return back, homed


# -- the cases -------------------------------------------------------------------------------


async def equal(servers: Deployments, s: Sizes) -> list[Row]:
    members = ["r1", "r2", "r3", "r4"]
    line = lineup({m: servers.urls[m] for m in members})
    runs = await play(servers, line, closed_loop(seconds=s.equal_seconds))
    table = {name: measures(run, members) for name, run in runs.items()}
    rows = about(
        "equal", members, f"8 slots each, {s.equal_service:g} s a request; {CALLERS} callers", line
    )
    rows += grid("equal", table)
    base = table.get(EVEN, {}).get("p99", float("nan"))
    for name, (run, note) in judged(runs, by_load=True).items():
        top = max(run.share(m) for m in members)
        rows.append(
            b.verdict(SCENARIO, f"equal, {name}: no member above 27%", top, "%", top <= 27, note)
        )
        p99 = table[name]["p99"]
        slower = b.ratio(p99, base)
        detail = f"{p99:.0f} ms against {base:.0f} ms" + (f"; {note}" if note else "")
        rows.append(
            b.at_most(SCENARIO, f"equal, {name}: p99 <= 1.1x the even split's", slower, 1.1, detail)
        )
    return rows


async def slow(servers: Deployments, s: Sizes) -> list[Row]:
    members = ["slow", "fast"]
    line = lineup({m: servers.urls[m] for m in members}, even=False)
    runs = await play(servers, line, closed_loop(seconds=s.slow_seconds))
    table = {name: measures(run, members) for name, run in runs.items()}
    times = f"{s.slow_service * 10:g} s and {s.slow_service:g} s"
    note = f"8 slots each, {times} a request; {CALLERS} callers"
    rows = about("slow", members, note, line) + grid("slow", table)
    for name, (run, why) in judged(runs, by_load=True).items():
        fast = run.share("fast")
        rows.append(
            b.verdict(SCENARIO, f"slow, {name}: the fast one >= 85%", fast, "%", fast >= 85, why)
        )
    return rows


async def keys(servers: Deployments, s: Sizes) -> list[Row]:
    members = ["key-a", "key-b", "key-c"]
    rate = 3 * s.keys_limit / s.keys_period * 150 / 180
    total = round(rate * s.keys_seconds)
    rpm = round(s.keys_limit * 60 / s.keys_period)
    line = lineup({m: servers.urls[m] for m in members}, even=False, rpm=rpm)
    runs = await play(servers, line, open_loop(rate, total))
    table = {}
    for name, run in runs.items():
        table[name] = measures(run, members)
        table[name]["served"] = 100 * run.answered / run.offered
    note = (
        f"{s.keys_limit} requests per {s.keys_period:g} s each; {total} requests at {rate:g}/s; "
        f"LiteLLM rpm={rpm}"
    )
    rows = about("keys", members, note, line) + grid("keys", table)
    for name, (run, why) in judged(runs).items():
        served = table[name]["served"]
        upstream = 100 * table[name]["429s upstream"] / run.offered
        ok = served >= 99 and run.limited == 0 and upstream <= 1
        detail = f"429s to the caller {run.limited}, upstream 429s {upstream:.1f}% of requests"
        target = f"keys, {name}: >= 99% served, no 429 to the caller, upstream 429s <= 1%"
        rows.append(
            b.verdict(
                SCENARIO, target, served, "% served", ok, "; ".join(filter(None, (detail, why)))
            )
        )
    return rows


async def weights(servers: Deployments, s: Sizes) -> list[Row]:
    members = ["w70", "w30"]
    split = {"w70": 70.0, "w30": 30.0}
    urls = {m: servers.urls[m] for m in members}
    ours = lineup(urls, even=False, balances=("weighted",), strategies=(), weights=split)
    runs = await play(servers, ours, closed_loop(total=s.weights_requests))
    # LiteLLM's client CPU bounds its rate (about 10 ms a request here): fewer requests
    theirs = lineup(urls, even=False, ranked=False, balances=(), strategies=SHUFFLE, weights=split)
    runs |= await play(servers, theirs, closed_loop(total=s.weights_requests // 5))
    table = {name: measures(run, members) for name, run in runs.items()}
    note = f"weights 70/30; {s.weights_requests} requests, {s.weights_requests // 5} for LiteLLM"
    line = Lineup(absent=ours.absent | theirs.absent)
    rows = about("weights", members, note, line)
    rows += grid("weights", table)
    for name, (run, why) in judged(runs).items():
        share = run.share("w70")
        target = f"weights, {name}: the 70 member's share within 70 +/- 2"
        rows.append(b.verdict(SCENARIO, target, share, "%", abs(share - 70) <= 2, why))
    return rows


async def affinity(servers: Deployments, s: Sizes) -> list[Row]:
    members = ["m1", "m2", "m3", "m4"]
    urls = {m: servers.urls[m] for m in members}
    # LiteLLM has no affinity: one strategy shows what spreading without it does to conversations
    line = lineup(
        urls, even=False, balances=("least_in_flight",), strategies=SHUFFLE, affinity=True
    )
    # Probes of the lost member failed while it was down, each doubling its window up to
    # max_cooldown: past that, whatever the doublings, it is tried again.
    pause = 1.25 * r.BREAKER["max_cooldown"]
    drive = conversations(s.conversations, s.turns, "m1", pause)
    runs = await play(servers, line, drive)
    table = {}
    for name, run in runs.items():
        kept, total = sticky(run, 0)
        back, homed = homecoming(run, "m1")
        table[name] = measures(run, members)
        table[name]["one member"] = 100 * b.ratio(kept, total)
        table[name]["back"] = 100 * b.ratio(back, homed)
    turns = "/".join(str(t) for t in s.turns)
    note = f"{s.conversations} conversations, {turns} turns while healthy / m1 down / m1 back"
    rows = about("affinity", members, note, line) + grid("affinity", table)
    for name, (_, why) in judged(runs).items():
        one = table[name]["one member"]
        back = table[name]["back"]
        target = f"affinity, {name}: >= 99% of a conversation's turns on one member"
        rows.append(b.verdict(SCENARIO, target, one, "%", one >= 99, why))
        target = f"affinity, {name}: >= 95% of the lost member's conversations back on it"
        rows.append(b.verdict(SCENARIO, target, back, "%", back >= 95, why))
    return rows


CASES = (equal, slow, keys, weights, affinity)


def run(quick: bool) -> list[Row]:
    if b.missing(("openai", "httpx2")) is not None:
        return [b.row(SCENARIO, "skipped", None, "", "needs the openai SDK: pip install openai")]
    sizes = QUICK if quick else FULL
    rows: list[Row] = []
    with b.quiet_logs(), Deployments(deployments(sizes)) as servers:

        async def every() -> None:
            for case in CASES:
                rows.extend(await case(servers, sizes))

        asyncio.run(every())
    return rows
