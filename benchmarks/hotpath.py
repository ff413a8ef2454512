"""Scenario, hotpath: what sidestep itself costs per request, healthy and in an outage.

Three measures, each sidestep's next to the peer breakers' in the same run:

- *isolated*: the transport's own ``handle_request`` called in a tight loop
  over an inner ``httpx.MockTransport``, minus the inner transport alone —
  the wrapper's cost with no client around it (httpx and httpx2, sync and
  async);
- *client*: a whole client over ``MockTransport`` (as the overhead scenario),
  for httpx2 too;
- *skip* and *sustained outage*: the primary of a route suspended (open),
  every request skipping it for the backup. The skip's cost is that
  isolated time minus a route that sends straight to the backup (the same
  rewrite, no skip); the outage runs a sync client paced at 1,000 requests/s
  and compares its CPU time per request with the same client while healthy.

Samples are interleaved and medians reported; times are the process's CPU
time, so that other work on a busy machine does not count.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
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


def _ok(module: Any) -> Callable[[Any], Any]:
    def answer(request: Any) -> Any:
        return module.Response(200, content=b'{"ok":true}')

    return answer


class _Primary:
    """An upstream pair whose primary answers 503 while `down`: enough to open its circuit."""

    def __init__(self, module: Any) -> None:
        self.down = False
        self._module = module

    def __call__(self, request: Any) -> Any:
        if self.down and request.url.host == "api.example":
            return self._module.Response(503, content=b"down")
        return self._module.Response(200, content=b'{"ok":true}')


def _opened(cls: Any, module: Any) -> Any:
    """A sidestep transport whose route's primary is open for the rest of the run."""
    primary = _Primary(module)
    primary.down = True
    transport = cls(OUTAGE, transport=module.MockTransport(primary))
    request = module.Request("GET", URL)
    for _ in range(b.THRESHOLD):
        transport.handle_request(request).close()
    primary.down = False
    return transport


async def _opened_async(cls: Any, module: Any) -> Any:
    primary = _Primary(module)
    primary.down = True
    transport = cls(OUTAGE, transport=module.MockTransport(primary))
    request = module.Request("GET", URL)
    for _ in range(b.THRESHOLD):
        await transport.handle_async_request(request)
    primary.down = False
    return transport


# -- isolated ------------------------------------------------------------------------------


def _sync_isolated(module: Any, side: Any) -> dict[str, Callable[[], Any]]:
    mock = lambda: module.MockTransport(_ok(module))  # noqa: E731
    variants: dict[str, Callable[[], Any]] = {
        "bare": mock,
        "sidestep": lambda: side.FailoverTransport(transport=mock()),
        "sidestep, routed": lambda: side.FailoverTransport(ROUTED, transport=mock()),
        "sidestep, via backup": lambda: side.FailoverTransport(VIA_BACKUP, transport=mock()),
        "sidestep, primary open": lambda: _opened(side.FailoverTransport, module),
    }
    if module is httpx:
        for name, make in overhead._sync_variants().items():
            if "sidestep" not in name and "bare" not in name:
                variants[name] = make
    return variants


def _async_isolated(module: Any, side: Any) -> dict[str, Callable[[], Any]]:
    mock = lambda: module.MockTransport(_ok(module))  # noqa: E731
    variants: dict[str, Callable[[], Any]] = {
        "bare": mock,
        "sidestep": lambda: side.AsyncFailoverTransport(transport=mock()),
        "sidestep, routed": lambda: side.AsyncFailoverTransport(ROUTED, transport=mock()),
        "sidestep, via backup": lambda: side.AsyncFailoverTransport(VIA_BACKUP, transport=mock()),
        "sidestep, primary open": lambda: _opened_async(side.AsyncFailoverTransport, module),
    }
    if module is httpx:
        variants_peers, _ = overhead._async_variants()
        for name, make in variants_peers.items():
            if "sidestep" not in name and "bare" not in name:
                variants[name] = make
    return variants


def _sync_loop(transport: Any, module: Any, requests: int) -> float:
    request = module.Request("GET", URL)
    for _ in range(20):
        transport.handle_request(request)
    gc.collect()
    started = time.process_time()
    for _ in range(requests):
        transport.handle_request(request)
    return (time.process_time() - started) / requests


async def _async_loop(transport: Any, module: Any, requests: int) -> float:
    request = module.Request("GET", URL)
    for _ in range(20):
        await transport.handle_async_request(request)
    gc.collect()
    started = time.process_time()
    for _ in range(requests):
        await transport.handle_async_request(request)
    return (time.process_time() - started) / requests


async def _made(make: Callable[[], Any]) -> Any:
    made = make()
    return await made if asyncio.iscoroutine(made) else made


# -- whole clients (httpx2; httpx's are in the overhead scenario) ---------------------------


def _client_variants() -> dict[str, tuple[bool, Callable[[], Any]]]:
    mock = lambda: httpx2.MockTransport(_ok(httpx2))  # noqa: E731
    return {
        "client httpx2 sync bare": (False, lambda: httpx2.Client(transport=mock())),
        "client httpx2 sync sidestep, routed": (
            False,
            lambda: httpx2.Client(
                transport=sidestep.httpx2.FailoverTransport(ROUTED, transport=mock())
            ),
        ),
        "client httpx2 async bare": (True, lambda: httpx2.AsyncClient(transport=mock())),
        "client httpx2 async sidestep, routed": (
            True,
            lambda: httpx2.AsyncClient(
                transport=sidestep.httpx2.AsyncFailoverTransport(ROUTED, transport=mock())
            ),
        ),
    }


def _client_sync(make: Callable[[], Any], requests: int) -> float:
    with make() as client:
        for _ in range(20):
            client.get(URL)
        gc.collect()
        started = time.process_time()
        for _ in range(requests):
            client.get(URL)
        return (time.process_time() - started) / requests


async def _client_async(make: Callable[[], Any], requests: int) -> float:
    async with make() as client:
        for _ in range(20):
            await client.get(URL)
        gc.collect()
        started = time.process_time()
        for _ in range(requests):
            await client.get(URL)
        return (time.process_time() - started) / requests


# -- the sustained outage -------------------------------------------------------------------


def _paced(transport: Any, requests: int) -> float:
    """CPU seconds per request of a sync client sending `requests` at `RATE` per second."""
    with httpx.Client(transport=transport) as client:
        for _ in range(20):
            client.get(URL)
        gc.collect()
        interval = 1.0 / RATE
        due = time.perf_counter()
        started = time.process_time()
        for _ in range(requests):
            client.get(URL).raise_for_status()
            due += interval
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        return (time.process_time() - started) / requests


def _outage_variants() -> dict[str, Callable[[], Any]]:
    return {
        "healthy": lambda: sidestep.FailoverTransport(
            OUTAGE, transport=httpx.MockTransport(_ok(httpx))
        ),
        "primary open": lambda: _opened(sidestep.FailoverTransport, httpx),
    }


# -- the scenario ------------------------------------------------------------------------------


def run(quick: bool) -> list[Row]:
    rounds, requests, paced = (1, 30, 30) if quick else (9, 3000, 1000)
    times: dict[str, list[float]] = {}
    flavours = (("httpx", httpx, sidestep), ("httpx2", httpx2, sidestep.httpx2))

    async def isolated_async() -> None:
        for _ in range(rounds):
            for label, module, side in flavours:
                for name, make in _async_isolated(module, side).items():
                    transport = await _made(make)
                    sample = await _async_loop(transport, module, requests)
                    times.setdefault(f"{label} async {name}", []).append(sample)
            for name, (is_async, make) in _client_variants().items():
                if is_async:
                    times.setdefault(name, []).append(await _client_async(make, requests))

    with b.quiet_logs():
        asyncio.run(isolated_async())
        for _ in range(rounds):
            for label, module, side in flavours:
                for name, make in _sync_isolated(module, side).items():
                    sample = _sync_loop(make(), module, requests)
                    times.setdefault(f"{label} sync {name}", []).append(sample)
            for name, (is_async, make) in _client_variants().items():
                if not is_async:
                    times.setdefault(name, []).append(_client_sync(make, requests))
        for _ in range(max(1, rounds // 3)):
            for name, make in _outage_variants().items():
                times.setdefault(f"outage at 1,000/s: {name}", []).append(_paced(make(), paced))
    medians = {name: b.median(samples) * 1e6 for name, samples in times.items()}
    return _rows(medians) + _verdicts(medians, rounds, requests)


def _rows(medians: dict[str, float]) -> list[Row]:
    rows: list[Row] = []
    for label in ("httpx", "httpx2"):
        for colour in ("async", "sync"):
            prefix = f"{label} {colour} "
            bare = medians[prefix + "bare"]
            for name, value in medians.items():
                if name.startswith(prefix) and name != prefix + "bare":
                    rows.append(
                        b.row(
                            SCENARIO,
                            f"isolated: {name}",
                            value - bare,
                            "µs/request",
                            f"{value:.1f} µs through it, {bare:.1f} µs bare",
                        )
                    )
    for colour in ("async", "sync"):
        bare = medians[f"client httpx2 {colour} bare"]
        ours = medians[f"client httpx2 {colour} sidestep, routed"]
        rows.append(b.row(SCENARIO, f"client httpx2 {colour} bare", bare, "µs/request", ""))
        rows.append(
            b.row(
                SCENARIO,
                f"client httpx2 {colour} sidestep, routed",
                ours,
                "µs/request",
                f"{b.ratio(ours, bare):.2f}x bare httpx2",
            )
        )
    for name in ("healthy", "primary open"):
        key = f"outage at 1,000/s: {name}"
        rows.append(b.row(SCENARIO, key, medians[key], "µs CPU/request", "sync client"))
    return rows


def _verdicts(medians: dict[str, float], rounds: int, requests: int) -> list[Row]:
    note = f"median of {rounds} interleaved samples of {requests} requests"
    rows = []
    for label in ("httpx", "httpx2"):
        for colour in ("async", "sync"):
            prefix = f"{label} {colour} "
            cost = medians[prefix + "sidestep, routed"] - medians[prefix + "bare"]
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
            skip = (
                medians[prefix + "sidestep, primary open"]
                - medians[prefix + "sidestep, via backup"]
            )
            rows.append(
                b.verdict(
                    SCENARIO,
                    f"{label} {colour}: a skipped candidate <= 5 µs",
                    skip,
                    "µs",
                    skip <= 5.0,
                    "primary open minus straight to the backup (the same rewrite)",
                )
            )
    for colour in ("async", "sync"):
        bare = medians[f"client httpx2 {colour} bare"]
        ratio = b.ratio(medians[f"client httpx2 {colour} sidestep, routed"], bare)
        rows.append(
            b.verdict(
                SCENARIO,
                f"httpx2 {colour}: sidestep (routed) <= 1.05x bare httpx2 per request",
                ratio,
                "x",
                ratio <= 1.05,
                note,
            )
        )
    healthy = medians["outage at 1,000/s: healthy"]
    outage = medians["outage at 1,000/s: primary open"]
    ratio = b.ratio(outage, healthy)
    rows.append(
        b.verdict(
            SCENARIO,
            "sustained outage at 1,000 requests/s: CPU per request <= 1.10x healthy",
            ratio,
            "x",
            ratio <= 1.10,
            f"{outage:.1f} µs vs {healthy:.1f} µs; sync client over MockTransport",
        )
    )
    return rows
