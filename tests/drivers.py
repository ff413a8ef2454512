"""One synchronous face over the four transports (httpx and httpx2, sync and async).

Socket-level tests take a `Driver` and run once per transport: the async
clients live on an event loop in a background thread, so one test body can
drive all four, and concurrency tests use tasks for async and threads for sync.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import httpx2

import sidestep
import sidestep.httpx2

T = TypeVar("T")

KINDS = ("httpx-sync", "httpx-async", "httpx2-sync", "httpx2-async")
MakeDriver = Callable[..., "Driver"]  # the `make` fixture: a Driver of the test's kind


@dataclass
class Result:
    status: int
    body: bytes
    headers: dict[str, str]
    extensions: dict[str, Any]

    @property
    def text(self) -> str:
        return self.body.decode()


class Driver:
    """A client over a sidestep transport of one kind, used synchronously."""

    def __init__(self, kind: str, config: Any = None, **transport_kw: Any) -> None:
        self.kind = kind
        self.http: Any = httpx2 if kind.startswith("httpx2") else httpx
        self.is_async = kind.endswith("async")
        module: Any = sidestep.httpx2 if self.http is httpx2 else sidestep
        timeout = transport_kw.pop("timeout", 5.0)
        limits = transport_kw.pop("limits", None)
        inner_kw = {"limits": limits} if limits is not None else {}
        if self.is_async:
            self.loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
            self._thread.start()

            async def build() -> Any:
                inner = self.inner = self.http.AsyncHTTPTransport(**inner_kw)
                self.transport = module.AsyncFailoverTransport(
                    config, transport=inner, **transport_kw
                )
                return self.http.AsyncClient(transport=self.transport, timeout=timeout)

            self.client = self.run(build())
        else:
            inner = self.inner = self.http.HTTPTransport(**inner_kw)
            self.transport = module.FailoverTransport(config, transport=inner, **transport_kw)
            self.client = self.http.Client(transport=self.transport, timeout=timeout)

    def pooled(self, port: int) -> list[bool]:
        """Whether each connection to 127.0.0.1:`port` in the client's pool (the inner
        transport's) is idle, free for the next request, rather than held by one."""
        connections = self.inner._pool.connections
        return [c.is_idle() for c in connections if c._origin.port == port]

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        if self.is_async:
            self.run(self.client.aclose())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(60)
            self.loop.close()
        else:
            self.client.close()

    def request(self, method: str, url: str, **kw: Any) -> Result:
        if self.is_async:
            return self.run(self._arequest(method, url, **kw))
        response = self.client.request(method, url, **kw)
        return Result(
            response.status_code, response.content, dict(response.headers), response.extensions
        )

    async def _arequest(self, method: str, url: str, **kw: Any) -> Result:
        response = await self.client.request(method, url, **kw)
        return Result(
            response.status_code, response.content, dict(response.headers), response.extensions
        )

    def get(self, url: str, **kw: Any) -> Result:
        return self.request("GET", url, **kw)

    def post(self, url: str, **kw: Any) -> Result:
        return self.request("POST", url, **kw)

    def many(
        self, n: int, method: str, url: str, *, concurrency: int | None = None, **kw: Any
    ) -> list[Result | BaseException]:
        """`n` requests at once: tasks on one loop for async (at most `concurrency` in flight), 32 threads for sync."""
        if self.is_async:
            limit = asyncio.Semaphore(concurrency or n)

            async def one() -> Result:
                async with limit:
                    return await self._arequest(method, url, **kw)

            async def all_at_once() -> list[Result | BaseException]:
                return list(
                    await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
                )

            return self.run(all_at_once(), timeout=300)  # bounds a hang only

        def one(_: int) -> Result | BaseException:
            try:
                return self.request(method, url, **kw)
            except Exception as exc:
                return exc

        with ThreadPoolExecutor(max_workers=32) as pool:
            return list(pool.map(one, range(n)))

    def first_chunk(self, method: str, url: str, **kw: Any) -> bytes:
        """Stream a response, keep its first chunk and close it, the rest unread."""
        if self.is_async:

            async def go() -> bytes:
                async with self.client.stream(method, url, **kw) as response:
                    async for chunk in response.aiter_raw():
                        return bytes(chunk)
                return b""

            return self.run(go())
        with self.client.stream(method, url, **kw) as response:
            for chunk in response.iter_raw():
                return bytes(chunk)
        return b""

    def stream(self, method: str, url: str, on_chunk: Callable[[bytes], None], **kw: Any) -> Result:
        """Stream a response, calling `on_chunk` as each chunk arrives."""
        if self.is_async:

            async def go() -> Result:
                async with self.client.stream(method, url, **kw) as response:
                    chunks = []
                    async for chunk in response.aiter_raw():
                        on_chunk(chunk)
                        chunks.append(chunk)
                    return Result(
                        response.status_code,
                        b"".join(chunks),
                        dict(response.headers),
                        response.extensions,
                    )

            return self.run(go())
        with self.client.stream(method, url, **kw) as response:
            chunks = []
            for chunk in response.iter_raw():
                on_chunk(chunk)
                chunks.append(chunk)
            return Result(
                response.status_code, b"".join(chunks), dict(response.headers), response.extensions
            )


class FakeClock:
    """Monotonic seconds that move only when a test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


def route(*targets: tuple[str, str], **extra: Any) -> dict[str, Any]:
    """A config with one route "chat" over `targets` given as (name, url) pairs."""
    breaker = extra.pop("breaker", {})
    failover = extra.pop("failover", {})
    route_extra = extra.pop("route", {})
    target_extra = extra.pop("targets", {})
    return {
        "breaker": {"failure_threshold": 2, "cooldown": 10, **breaker},
        "failover": failover,
        "routes": [
            {
                "name": "chat",
                "targets": [{"name": n, "url": u, **target_extra.get(n, {})} for n, u in targets],
                **route_extra,
            }
        ],
        **extra,
    }


def outcome(d: Driver, url: str) -> Any:
    """The status of GET `url`, or the exception's class."""
    try:
        return d.get(url).status
    except Exception as exc:
        return type(exc).__name__


def elapsed(fn: Callable[[], T]) -> tuple[T, float]:
    start = time.monotonic()
    value = fn()
    return value, time.monotonic() - start


@dataclass
class Pair:
    """Two upstreams, `a` and `b`, routed as targets of one route."""

    a: Any
    b: Any
