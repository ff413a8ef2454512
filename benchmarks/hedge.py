"""Scenario, hedge: hedged requests against a heavy tail of time to first token.

Two local fake providers answer an OpenAI chat stream: the headers at once, the
first token after a delay drawn (seeded) from a heavy-tailed distribution, as LLM
providers' queues and cold replicas make it: 95% of answers take 250 ms of work
plus a queueing wait drawn from an exponential distribution (mean 40 ms, cut at
200 ms), so 250 to 450 ms, median 278 ms; 4% take 8 s, a tail within the
hedges' default budget of 5%. Each route's calls to a provider draw the same
seeded sequence, so the routes meet the same slow answers. The requests go, in one
run and interleaved (one to each route in turn, so a busy machine slows them
alike), through three routes over the two providers:

- *ranked*: no hedge, the first provider's time to first token as it comes;
- *hedged, fixed*: a hedge after 450 ms with no first token (the fast
  answers' longest: only the slow requests are hedged);
- *hedged, adaptive*: a hedge after the first provider's recent 99th
  percentile time to first token (above the 4% that are slow), at most
  450 ms, and 450 ms until twenty are known.

Both hedged routes have the default budget (5% of requests, a bucket of 10). The caller's
time to first token (request to the first chunk in its hands) is measured,
its p50, p95, p99 and p99.9 reported, and the extra requests the providers
received. Times are as above (``--quick`` scales them by 0.1): on a busy
machine a few milliseconds of scheduling move no answer across the delay.

The targets: the hedged route's p99 within 2x its p95, for at most 5% extra
requests, and its p50 within 10% of the ranked route's.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

import httpx

import _bench as b
import sidestep
from _bench import Row

SCENARIO = "hedge"
WORK = 0.25  # seconds: a fast answer's work
QUEUE = (0.04, 0.2)  # seconds: its queueing wait, exponential: mean, and where it is cut
SLOW = 8.0  # seconds: the tail
SLOW_SHARE = 0.04
DELAY = 0.45  # seconds: the fixed hedge delay, the fast answers' longest
ADAPTIVE = 0.99  # the adaptive delay's percentile: above the share that is slow
CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


class Provider:
    """A fake LLM provider on 127.0.0.1: headers at once, the first token after a draw."""

    def __init__(self, name: str, scale: float) -> None:
        self.name = name
        self.scale = scale
        self.calls: dict[str, int] = {}  # by the x-bench-route header of the requests
        self.slow: dict[str, int] = {}  # the calls drawn from the tail, by route
        self.randoms: dict[str, random.Random] = {}  # by route, each the same sequence
        self._server: asyncio.Server | None = None
        self.port = 0

    def draw(self, route: str) -> float:
        draws = self.randoms.setdefault(route, random.Random(self.name))
        if draws.random() < SLOW_SHARE:
            return SLOW * self.scale
        wait = min(draws.expovariate(1 / QUEUE[0]), QUEUE[1])
        return (WORK + wait) * self.scale

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length, route = 0, ""
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                    elif name.strip().lower() == b"x-bench-route":
                        route = value.strip().decode()
                await reader.readexactly(length)
                self.calls[route] = self.calls.get(route, 0) + 1
                delay = self.draw(route)
                if delay >= SLOW * self.scale:
                    self.slow[route] = self.slow.get(route, 0) + 1
                writer.write(HEAD)
                await writer.drain()
                await asyncio.sleep(delay)
                writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(CHUNK), CHUNK))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


def _config(one: Provider, two: Provider, hedge: dict[str, Any] | None) -> dict[str, Any]:
    route: dict[str, Any] = {
        "name": "chat",
        "failover": {"retry_ambiguous": True},  # LLM calls: re-sending is safe
        "targets": [
            {"name": one.name, "url": f"http://127.0.0.1:{one.port}/v1"},
            {"name": two.name, "url": f"http://127.0.0.1:{two.port}/v1"},
        ],
    }
    if hedge is not None:
        route["hedge"] = hedge
    return {"routes": [route]}


async def _measure(
    configs: dict[str, dict[str, Any]], url: str, requests: int, concurrency: int
) -> dict[str, list[float]]:
    """Each request's time to first token, in seconds, by route: the routes' requests
    interleaved (one of each in turn), so a busy machine slows them alike."""
    limit = asyncio.Semaphore(concurrency)
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    times: dict[str, list[float]] = {name: [] for name in configs}
    clients = {}
    for name, config in configs.items():
        inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=4 * concurrency))
        transport = sidestep.AsyncFailoverTransport(config, transport=inner)
        clients[name] = httpx.AsyncClient(transport=transport, timeout=60)

    async def one(name: str) -> None:
        async with limit:
            start = time.perf_counter()
            headers = {"x-bench-route": name}
            async with clients[name].stream("POST", url, json=body, headers=headers) as response:
                async for _ in response.aiter_raw():
                    times[name].append(time.perf_counter() - start)
                    break

    try:
        await asyncio.gather(*(one(name) for _ in range(requests) for name in configs))
    finally:
        for client in clients.values():
            await client.aclose()
    return times


async def _run(quick: bool) -> list[Row]:
    scale = 0.1 if quick else 1.0
    requests, concurrency = (100, 30) if quick else (1000, 60)
    one, two = Provider("one", scale), Provider("two", scale)
    await one.start()
    await two.start()
    routes = {
        "ranked": None,
        "hedged, fixed": {"delay": DELAY * scale},
        "hedged, adaptive": {"adaptive": ADAPTIVE, "delay": DELAY * scale},
    }
    rows: list[Row] = []
    found: dict[str, dict[str, float]] = {}
    url = f"http://127.0.0.1:{one.port}/v1/chat/completions"
    configs = {name: _config(one, two, hedge) for name, hedge in routes.items()}
    try:
        measured = await _measure(configs, url, requests, concurrency)
    finally:
        await one.stop()
        await two.stop()
    for name, times in measured.items():
        ms = [t * 1000 for t in times]
        sent = one.calls.get(name, 0) + two.calls.get(name, 0)
        stats = {
            "p50": b.percentile(ms, 0.50),
            "p95": b.percentile(ms, 0.95),
            "p99": b.percentile(ms, 0.99),
            "p99.9": b.percentile(ms, 0.999),
            "extra": 100.0 * (sent - requests) / requests,
            "slow": 100.0 * (one.slow.get(name, 0) + two.slow.get(name, 0)) / requests,
        }
        found[name] = stats
        for metric in ("p50", "p95", "p99", "p99.9"):
            note = f"time to first token, {requests} requests, times x{scale}"
            rows.append(b.row(SCENARIO, f"{name}: {metric}", stats[metric], "ms", note))
        rows.append(b.row(SCENARIO, f"{name}: extra requests", stats["extra"], "%", "hedges sent"))
        rows.append(
            b.row(SCENARIO, f"{name}: slow answers", stats["slow"], "%", "drawn from the tail")
        )
    ranked = found["ranked"]
    for name in ("hedged, fixed", "hedged, adaptive"):
        stats = found[name]
        tail = b.ratio(stats["p99"], stats["p95"])
        rows.append(
            b.at_most(SCENARIO, f"{name}: p99 / p95", tail, 2.0, "ranked route's: see above")
        )
        rows.append(
            b.verdict(
                SCENARIO,
                f"{name}: extra requests at most 5%",
                stats["extra"],
                "%",
                stats["extra"] <= 5.0,
            )
        )
        drift = abs(stats["p50"] - ranked["p50"]) / ranked["p50"]
        rows.append(
            b.verdict(
                SCENARIO,
                f"{name}: p50 within 10% of ranked",
                100.0 * drift,
                "%",
                drift <= 0.10,
            )
        )
    return rows


def run(quick: bool) -> list[Row]:
    return asyncio.run(_run(quick))
