"""Scenario ratelimit: the primary allows N requests per window, then answers 429.

Like OpenAI, the primary says on every answer how many requests its window
has left and when it resets (``x-ratelimit-remaining-requests``,
``x-ratelimit-reset-requests``), and its 429s carry the reset but no
``Retry-After``. The backup always answers. Requests arrive at a steady rate,
faster than the primary allows, so each window is spent.

Reported for sidestep with and without ``avoid_rate_limits``: the 429s the
primary answered, the requests each target served, and caller-visible errors.
Without it, every spent window costs at least one 429 (the request that finds
the window spent, which then fails over); with it, the answer that spends the
window suspends the primary until the reset, and the next request goes
straight to the backup.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx

import _bench as b
import sidestep
from _bench import Row

SCENARIO = "ratelimit"
CONTENDERS = {"sidestep": False, "sidestep, avoid_rate_limits": True}


class RateLimited:
    """An HTTP/1.1 upstream on 127.0.0.1: `allowed` requests per fixed `window` seconds."""

    def __init__(self, name: str, allowed: int, window: float) -> None:
        self.name = name
        self.allowed = allowed
        self.window = window
        self.counts: Counter[int] = Counter()
        self._index = -1
        self._used = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self.url = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in self._handlers:
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()

    def _answer(self) -> tuple[int, dict[str, str]]:
        now = asyncio.get_running_loop().time()
        index = int(now // self.window)
        if index != self._index:
            self._index, self._used = index, 0
        reset = f"{(index + 1) * self.window - now:.3f}s"
        if self._used >= self.allowed:
            return 429, {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": reset}
        self._used += 1
        left = str(self.allowed - self._used)
        return 200, {"x-ratelimit-remaining-requests": left, "x-ratelimit-reset-requests": reset}

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if length:
                    await reader.readexactly(length)
                status, headers = self._answer()
                self.counts[status] += 1
                body = self.name.encode() if status == 200 else b'{"error": "rate limited"}'
                lines = [f"HTTP/1.1 {status} X", f"content-length: {len(body)}"]
                lines += [f"{k}: {v}" for k, v in headers.items()]
                writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went away, or the server stops
        finally:
            self._handlers.discard(task)
            writer.close()


async def one_round(
    avoid: bool, requests: int, rate: float, allowed: int, window: float
) -> dict[str, float]:
    primary = RateLimited("primary", allowed, window)
    backup = RateLimited("backup", allowed=10**9, window=3600.0)
    await primary.start()
    await backup.start()
    config: dict[str, Any] = {
        "routes": [
            {
                "name": "chat",
                "avoid_rate_limits": avoid,
                "targets": [
                    {"name": "primary", "url": primary.url + "/v1"},
                    {"name": "backup", "url": backup.url + "/v1"},
                ],
            }
        ],
    }
    transport = sidestep.AsyncFailoverTransport(config, transport=httpx.AsyncHTTPTransport())
    served: Counter[str] = Counter()
    errors = 0
    with b.quiet_logs():
        client = httpx.AsyncClient(transport=transport, timeout=5.0)

        async def call() -> None:
            nonlocal errors
            try:
                response = await client.post(primary.url + "/v1/chat", json={"model": "m"})
                served[response.text if response.status_code == 200 else "error"] += 1
            except httpx.HTTPError:
                errors += 1

        loop = asyncio.get_running_loop()
        start = loop.time()
        tasks = []
        for i in range(requests):
            delay = start + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(call()))
        await asyncio.gather(*tasks)
        elapsed = loop.time() - start
        await client.aclose()
    await primary.stop()
    await backup.stop()
    return {
        "429s from the primary": primary.counts[429],
        "served by the primary": served["primary"],
        "served by the backup": served["backup"],
        "errors": errors + served["error"],
        "windows": elapsed / window,
    }


def run(quick: bool) -> list[Row]:
    allowed = 5 if quick else 20
    window = 0.2 if quick else 1.0
    rate = 4 * allowed / window  # four times what the primary allows
    requests = int(rate * window * (3 if quick else 10))
    rounds = 1 if quick else 3
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in CONTENDERS}
    for _ in range(rounds):  # interleaved
        for name, avoid in CONTENDERS.items():
            samples[name].append(asyncio.run(one_round(avoid, requests, rate, allowed, window)))
    metrics = ["429s from the primary", "served by the primary", "served by the backup", "errors"]
    units = {m: "requests" for m in metrics}
    units["429s from the primary"] = "responses"
    table = {
        name: {m: float(b.median(s[m] for s in rows)) for m in metrics}
        for name, rows in samples.items()
    }
    out = b.matrix(SCENARIO, table, units)
    windows = b.median(s["windows"] for s in samples["sidestep, avoid_rate_limits"])
    plain = table["sidestep"]["429s from the primary"]
    avoided = table["sidestep, avoid_rate_limits"]["429s from the primary"]
    note = (
        f"{requests} requests at {rate:g}/s over ~{windows:.0f} windows of {window:g} s, "
        f"{allowed} allowed per window; without it: {plain:g} 429s"
    )
    return [
        *out,
        b.verdict(
            SCENARIO,
            "avoid_rate_limits: no 429 from the primary, whose answers say when it is spent",
            avoided,
            "responses",
            avoided == 0 and plain > 0,
            note,
        ),
        b.verdict(
            SCENARIO,
            "no caller-visible errors either way",
            max(t["errors"] for t in table.values()),
            "requests",
            all(t["errors"] == 0 for t in table.values()),
        ),
    ]
