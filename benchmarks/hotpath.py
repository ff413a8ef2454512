"""Scenario, hotpath: what sidestep itself costs per request, healthy and in an outage.

Three measures, each sidestep's next to the peer breakers' in the same run:

- *isolated*: the transport's own ``handle_request`` called in a tight loop
  over an inner ``httpx.MockTransport``, minus the inner transport alone —
  the wrapper's cost with no client around it (httpx and httpx2, sync and
  async); and a pool's pick: four keys to one API as a pool of each
  ``balance``, minus the same four as a ranked route;
- *client*: a whole client over ``MockTransport`` (as the overhead scenario),
  for httpx2 too, in 45 rounds of its own (a ratio near its limit, and only
  two variants to sample: more rounds narrow its median cheaply);
- *skip* and *sustained outage*: the primary of a route suspended (open),
  every request skipping it for the backup. The skip's cost is that
  isolated time minus a route that sends straight to the backup (the same
  rewrite, no skip); the outage runs a sync client paced at 1,000 requests/s
  and compares its CPU time per request with the same client while healthy,
  the two taking turns in blocks of 50 requests within each round (so that
  the machine's slow spells fall on both alike).

Samples are interleaved; times are medians of the process's CPU time, so
that other work on a busy machine does not count, and each cost or ratio is
the median of the rounds' own (samples side by side share the machine's
state of the moment: a slow spell cancels out).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import httpx
import httpx2

import _bench as b
import overhead
import sidestep
import sidestep.httpx2
from _bench import Row

SCENARIO = "hotpath"
URL = overhead.URL
ROUTED = overhead.ROUTED
BREAKER = {"failure_threshold": b.THRESHOLD, "cooldown": 3600, "max_cooldown": 3600}
OUTAGE = {**ROUTED, "breaker": BREAKER}
# The same rewrite to the backup as in the outage, with no candidate to skip.
VIA_BACKUP = {
    "routes": [
        {
            "name": "api",
            "match": ["http://api.example/v1"],
            "targets": [{"name": "backup", "url": "http://backup.example/v1"}],
        }
    ]
}
RATE = 1000.0  # requests per second in the sustained outage
# Four keys to one API, as a ranked route and as a pool of each strategy: every request
# is rewritten for its key either way (each sets its own credential), so a pool's cost
# over the ranked route is the pick and the counting alone.
KEYS = [
    {
        "name": f"key-{k}",
        "url": "http://api.example/v1",
        "headers": {"authorization": f"Bearer {k}"},
    }
    for k in "abcd"
]
RANKED = {"routes": [{"name": "api", "targets": KEYS}]}
BALANCES = ("weighted", "least_in_flight", "latency")
POOLED = {
    balance: {"routes": [{"name": "api", "balance": balance, "targets": KEYS}]}
    for balance in BALANCES
}
POOL_PICK = 1.0  # µs a pool pick may add per request over the ranked route (issue #30)


def _ok(module: Any) -> Callable[[Any], Any]:
    def answer(request: Any) -> Any:
        return module.Response(200, content=b'{"ok":true}')

    return answer


def _down(module: Any) -> Callable[[Any], Any]:
    """The primary answers 503 (enough to open its circuit), the backup 200."""

    def answer(request: Any) -> Any:
        if request.url.host == "api.example":
            return module.Response(503, content=b"down")
        return module.Response(200, content=b'{"ok":true}')

    return answer


def _opened(side: Any, module: Any, cls: Any) -> Any:
    """A `cls` transport whose route's primary is open for the rest of the run.

    A sync transport opens it in a store the returned one shares; the
    returned one's inner transport answers like every other variant's.
    """
    store = sidestep.MemoryStore()
    opener = side.FailoverTransport(
        OUTAGE, transport=module.MockTransport(_down(module)), store=store
    )
    request = module.Request("GET", URL)
    for _ in range(b.THRESHOLD):
        opener.handle_request(request).close()
    return cls(OUTAGE, transport=module.MockTransport(_ok(module)), store=store)


# -- isolated ------------------------------------------------------------------------------


def _isolated(module: Any, side: Any, colour: str) -> dict[str, Callable[[], Any]]:
    """The transports measured alone: bare, sidestep's, and (httpx) the peers'."""
    cls = side.AsyncFailoverTransport if colour == "async" else side.FailoverTransport

    def mock() -> Any:
        return module.MockTransport(_ok(module))

    variants: dict[str, Callable[[], Any]] = {
        "bare": mock,
        "sidestep": lambda: cls(transport=mock()),
        "sidestep, routed": lambda: cls(ROUTED, transport=mock()),
        "sidestep, via backup": lambda: cls(VIA_BACKUP, transport=mock()),
        "sidestep, primary open": lambda: _opened(side, module, cls),
        "sidestep, ranked 4 keys": lambda: cls(RANKED, transport=mock()),
    }
    for balance, config in POOLED.items():
        variants[f"sidestep, pool of 4 keys, {balance}"] = partial(cls, config, transport=mock())
    if module is httpx:
        peers = overhead._async_variants()[0] if colour == "async" else overhead._sync_variants()
        for name, make in peers.items():
            if "sidestep" not in name and "bare" not in name:
                variants[name] = make
    return variants


# -- whole clients (httpx2; httpx's are in the overhead scenario) ---------------------------


def _clients(colour: str) -> dict[str, Callable[[], Any]]:
    client = httpx2.AsyncClient if colour == "async" else httpx2.Client
    cls = (
        sidestep.httpx2.AsyncFailoverTransport
        if colour == "async"
        else sidestep.httpx2.FailoverTransport
    )

    def mock() -> Any:
        return httpx2.MockTransport(_ok(httpx2))

    return {
        f"client httpx2 {colour} bare": lambda: client(transport=mock()),
        f"client httpx2 {colour} sidestep, routed": lambda: client(
            transport=cls(ROUTED, transport=mock())
        ),
    }


# -- the sustained outage -------------------------------------------------------------------


BLOCK = 50  # requests a paced client sends before the other one takes over


def _paced(transports: dict[str, Any], requests: int) -> dict[str, float]:
    """CPU seconds per request of sync clients, one per transport, `requests` each at
    `RATE` per second: they take turns in blocks of `BLOCK` (the first turn alternating),
    so that the machine's slow and quiet spells fall on all of them alike."""
    with contextlib.ExitStack() as stack:
        clients = {
            name: stack.enter_context(httpx.Client(transport=t)) for name, t in transports.items()
        }
        for client in clients.values():
            for _ in range(20):
                client.get(URL)
        gc.collect()
        cpu = dict.fromkeys(clients, 0.0)
        interval = 1.0 / RATE
        due = time.perf_counter()
        order = list(clients.items())
        for block in range(0, requests, BLOCK):
            for name, client in order if block // BLOCK % 2 == 0 else order[::-1]:
                started = time.process_time()
                for _ in range(min(BLOCK, requests - block)):
                    client.get(URL).raise_for_status()
                    due += interval
                    pause = due - time.perf_counter()
                    if pause > 0:
                        time.sleep(pause)
                cpu[name] += time.process_time() - started
        return {name: spent / requests for name, spent in cpu.items()}


def _outage_variants() -> dict[str, Callable[[], Any]]:
    return {
        "healthy": lambda: sidestep.FailoverTransport(
            OUTAGE, transport=httpx.MockTransport(_ok(httpx))
        ),
        "primary open": lambda: _opened(sidestep, httpx, sidestep.FailoverTransport),
    }


# -- the scenario ------------------------------------------------------------------------------


def run(quick: bool) -> list[Row]:
    rounds, requests, paced = (1, 30, 30) if quick else (15, 2000, 1000)
    # Whole clients: a ratio near its limit, two variants only, so three times the rounds.
    client_rounds = 1 if quick else 45
    times: dict[str, list[float]] = {}
    flavours = (("httpx", httpx, sidestep), ("httpx2", httpx2, sidestep.httpx2))

    async def measure_async() -> None:
        for _ in range(rounds):
            for label, module, side in flavours:
                request = module.Request("GET", URL)
                for name, make in _isolated(module, side, "async").items():
                    send = partial(make().handle_async_request, request)
                    sample = await b.cpu_per_call_async(send, requests)
                    times.setdefault(f"{label} async {name}", []).append(sample)
        for _ in range(client_rounds):
            for name, make in _clients("async").items():
                async with make() as client:
                    sample = await b.cpu_per_call_async(partial(client.get, URL), requests)
                times.setdefault(name, []).append(sample)

    with b.quiet_logs():
        asyncio.run(measure_async())
        for _ in range(rounds):
            for label, module, side in flavours:
                request = module.Request("GET", URL)
                for name, make in _isolated(module, side, "sync").items():
                    handle = partial(make().handle_request, request)
                    sample = b.cpu_per_call(handle, requests)
                    times.setdefault(f"{label} sync {name}", []).append(sample)
        for _ in range(client_rounds):
            for name, make in _clients("sync").items():
                with make() as client:
                    sample = b.cpu_per_call(partial(client.get, URL), requests)
                times.setdefault(name, []).append(sample)
        for _ in range(rounds):
            made = {name: make() for name, make in _outage_variants().items()}
            for name, sample in _paced(made, paced).items():
                times.setdefault(f"outage at 1,000/s: {name}", []).append(sample)
    samples = {name: [t * 1e6 for t in values] for name, values in times.items()}
    return _rows(samples) + _verdicts(samples, rounds, requests, paced, client_rounds)


def _rows(samples: dict[str, list[float]]) -> list[Row]:
    medians = {name: b.median(values) for name, values in samples.items()}
    rows: list[Row] = []
    for label in ("httpx", "httpx2"):
        for colour in ("async", "sync"):
            prefix = f"{label} {colour} "
            bare = prefix + "bare"
            for name, value in medians.items():
                if name.startswith(prefix) and name != bare:
                    rows.append(
                        b.row(
                            SCENARIO,
                            f"isolated: {name}",
                            b.paired_difference(samples[name], samples[bare]),
                            "µs/request",
                            f"{value:.1f} µs through it, {medians[bare]:.1f} µs bare",
                        )
                    )
    for colour in ("async", "sync"):
        bare = f"client httpx2 {colour} bare"
        ours = f"client httpx2 {colour} sidestep, routed"
        ratio = b.paired_ratio(samples[ours], samples[bare])
        rows.append(b.row(SCENARIO, bare, medians[bare], "µs/request", ""))
        rows.append(b.row(SCENARIO, ours, medians[ours], "µs/request", f"{ratio:.2f}x bare httpx2"))
    for name in ("healthy", "primary open"):
        key = f"outage at 1,000/s: {name}"
        rows.append(b.row(SCENARIO, key, medians[key], "µs CPU/request", "sync client"))
    return rows


def _verdicts(
    samples: dict[str, list[float]], rounds: int, requests: int, paced: int, client_rounds: int
) -> list[Row]:
    note = f"median of {rounds} rounds' differences, samples of {requests} requests"
    rows = []
    for label in ("httpx", "httpx2"):
        for colour in ("async", "sync"):
            prefix = f"{label} {colour} "
            cost = b.paired_difference(
                samples[prefix + "sidestep, routed"], samples[prefix + "bare"]
            )
            rows.append(
                b.verdict(
                    SCENARIO,
                    f"{label} {colour}: isolated wrapper cost <= 3 µs/request",
                    cost,
                    "µs",
                    cost <= 3.0,
                    note,
                )
            )
            skip = b.paired_difference(
                samples[prefix + "sidestep, primary open"], samples[prefix + "sidestep, via backup"]
            )
            rows.append(
                b.verdict(
                    SCENARIO,
                    f"{label} {colour}: a skipped candidate <= 5 µs",
                    skip,
                    "µs",
                    skip <= 5.0,
                    "primary open minus straight to the backup (the same rewrite), "
                    "median of the rounds' differences",
                )
            )
            ranked = samples[prefix + "sidestep, ranked 4 keys"]
            picks = {
                balance: b.paired_difference(
                    samples[f"{prefix}sidestep, pool of 4 keys, {balance}"], ranked
                )
                for balance in BALANCES
            }
            worst = max(picks.values())
            rows.append(
                b.verdict(
                    SCENARIO,
                    f"{label} {colour}: a pool pick adds <= {POOL_PICK:g} µs/request"
                    " over a ranked route",
                    worst,
                    "µs",
                    worst <= POOL_PICK,
                    "the worst of "
                    + ", ".join(f"{balance} {cost:+.2f}" for balance, cost in picks.items())
                    + " µs: a pool of 4 keys minus the same 4 ranked, "
                    "median of the rounds' differences",
                )
            )
    for colour in ("async", "sync"):
        rows.append(
            b.at_most(
                SCENARIO,
                f"httpx2 {colour}: sidestep (routed) <= 1.05x bare httpx2 per request",
                b.paired_ratio(
                    samples[f"client httpx2 {colour} sidestep, routed"],
                    samples[f"client httpx2 {colour} bare"],
                ),
                1.05,
                f"median of {client_rounds} rounds' ratios, samples of {requests} requests",
            )
        )
    healthy = samples["outage at 1,000/s: healthy"]
    outage = samples["outage at 1,000/s: primary open"]
    rows.append(
        b.at_most(
            SCENARIO,
            "sustained outage at 1,000 requests/s: CPU per request <= 1.10x healthy",
            b.paired_ratio(outage, healthy),
            1.10,
            f"{b.median(outage):.1f} µs vs {b.median(healthy):.1f} µs (medians); sync client "
            f"over MockTransport; median of {rounds} rounds' ratios, samples of {paced} requests",
        )
    )
    return rows
