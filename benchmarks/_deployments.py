"""Fake OpenAI-compatible deployments on 127.0.0.1 for the spread benchmark, in a child process.

Each deployment is a real HTTP server (uvicorn, one port each) answering
``POST /v1/chat/completions`` as OpenAI does, without streaming. It is a
queue: ``slots`` requests are served at once, each in ``service * slowness``
seconds, and the others wait for a slot, so a deployment's latency grows
with its own requests in flight and with nothing else. An optional rate
limit refills continuously (``limit`` requests per ``period``, the bucket
full at the start), announces itself on every answer with OpenAI's headers
(``x-ratelimit-limit-requests``, ``x-ratelimit-remaining-requests``,
``x-ratelimit-reset-requests`` as a Go duration such as ``1s`` or ``6m0s``)
and answers 429 when spent, without ``Retry-After``, before queueing. A
deployment can be taken down (503 to every request) and brought back.

The answer's ``system_fingerprint`` is the deployment's name, so a caller
knows which member served each request whatever routed it. The servers
count what they served, their 429s and their 503s.

The servers run in a process of their own, so that their work does not
share a core with the client measured (times are on the monotonic clock,
which both processes share on Linux).
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

from _bench import Child, obey


@dataclass(frozen=True, slots=True)
class Deployment:
    """One fake deployment: its name, its queue and its rate limit (None: unlimited)."""

    name: str
    slots: int = 8
    service: float = 0.5  # seconds a request holds a slot, before `slowness`
    slowness: float = 1.0
    limit: int | None = None  # requests per `period`, refilled continuously
    period: float = 60.0


def go_duration(seconds: float) -> str:
    """`seconds` as Go's `time.Duration.String()` writes it, as OpenAI sends it.

    ``20ms``, ``1.5s``, ``6m0s``: milliseconds below a second, else hours and
    minutes from the first that is not zero, then seconds with their fraction.
    """
    millis = max(0, round(seconds * 1000))
    if millis == 0:
        return "0s"
    if millis < 1000:
        return f"{millis}ms"
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    return f"{minutes}m{secs}" if minutes else secs


class _Bucket:
    """A continuously refilling request limit: `limit` requests per `period` seconds."""

    def __init__(self, limit: int, period: float) -> None:
        self.limit = limit
        self.rate = limit / period
        self.level = float(limit)
        self.at = time.monotonic()

    def take(self) -> tuple[bool, dict[str, str]]:
        """Whether a request may be served now, and the headers the answer carries."""
        now = time.monotonic()
        self.level = min(self.limit, self.level + (now - self.at) * self.rate)
        self.at = now
        allowed = self.level >= 1
        if allowed:
            self.level -= 1
        headers = {
            "x-ratelimit-limit-requests": str(self.limit),
            "x-ratelimit-remaining-requests": str(math.floor(self.level)),
            "x-ratelimit-reset-requests": go_duration((self.limit - self.level) / self.rate),
        }
        return allowed, headers


class _Server:
    """One deployment's ASGI app and its counts."""

    def __init__(self, spec: Deployment) -> None:
        self.spec = spec
        self.slots = asyncio.Semaphore(spec.slots)
        self.down = False
        self.reset()

    def reset(self) -> None:
        self.served = self.limited = self.refused = 0
        self.inflight = self.peak = 0
        self.bucket = _Bucket(self.spec.limit, self.spec.period) if self.spec.limit else None

    def stats(self) -> dict[str, int]:
        return {
            "served": self.served,
            "429": self.limited,
            "503": self.refused,
            "peak in flight": self.peak,
        }

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return  # lifespan: nothing to start
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["method"] != "POST" or not scope["path"].endswith("/chat/completions"):
            await _answer(send, 404, {"error": {"message": "not found"}}, {})
            return
        if self.down:
            self.refused += 1
            error = {"message": "unavailable", "type": "server_error"}
            await _answer(send, 503, {"error": error}, {})
            return
        headers: dict[str, str] = {}
        if self.bucket is not None:
            allowed, headers = self.bucket.take()
            if not allowed:
                self.limited += 1
                error = {
                    "message": "Rate limit reached for requests",
                    "type": "requests",
                    "code": "rate_limit_exceeded",
                }
                await _answer(send, 429, {"error": error}, headers)
                return
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        try:
            async with self.slots:
                await asyncio.sleep(self.spec.service * self.spec.slowness)
        finally:
            self.inflight -= 1
        self.served += 1
        request = json.loads(body or b"{}")
        await _answer(send, 200, _completion(self.spec.name, request.get("model", "")), headers)


def _completion(name: str, model: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{name}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": name,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": f"served by {name}"},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 8, "completion_tokens": 4, "total_tokens": 12},
    }


async def _answer(send: Any, status: int, payload: Any, headers: Mapping[str, str]) -> None:
    data = json.dumps(payload).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


class Deployments:
    """Fake deployments served by a child process; a context manager.

    `urls` maps each name to its base URL (``http://127.0.0.1:PORT/v1``);
    `reset()` zeroes the counts and fills the buckets, `down()` takes
    deployments down or brings them back, `stats()` reads the counts.
    """

    def __init__(self, specs: Iterable[Deployment]) -> None:
        self.specs = {spec.name: spec for spec in specs}
        self.urls: dict[str, str] = {}
        specs_data = [asdict(spec) for spec in self.specs.values()]
        self._child = Child(_serve, (specs_data,), "the deployments' process")

    def __enter__(self) -> Deployments:
        ports: dict[str, int] = self._child.start()
        self.urls = {name: f"http://127.0.0.1:{port}/v1" for name, port in ports.items()}
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._child.stop()

    def reset(self) -> None:
        self._child.ask("reset", None)

    def down(self, states: Mapping[str, bool]) -> None:
        """Take each named deployment down (True: 503 to everything) or bring it back (False)."""
        self._child.ask("down", dict(states))

    def stats(self) -> dict[str, dict[str, int]]:
        result: dict[str, dict[str, int]] = self._child.ask("stats", None)
        return result


def _serve(conn: Connection, specs: list[dict[str, Any]]) -> None:
    asyncio.run(_serve_async(conn, [Deployment(**spec) for spec in specs]))


async def _serve_async(conn: Connection, specs: list[Deployment]) -> None:
    import uvicorn

    apps = {spec.name: _Server(spec) for spec in specs}
    servers, sockets, tasks = [], {}, []
    for name, app in apps.items():
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sockets[name] = sock
        config = uvicorn.Config(
            app, log_level="error", access_log=False, lifespan="off", backlog=512
        )
        server = uvicorn.Server(config)
        servers.append(server)
        tasks.append(asyncio.create_task(server.serve(sockets=[sock])))
    for _ in range(3000):  # uvicorn says it is ready with a flag, not an event: 30 s at most
        if all(server.started for server in servers):
            break
        await asyncio.sleep(0.01)
    else:
        raise RuntimeError("the deployments did not start listening")

    def handle(command: str, argument: Any) -> Any:
        if command == "reset":
            for app in apps.values():
                app.reset()
        elif command == "down":
            for key, state in argument.items():
                apps[key].down = state
        else:
            return {key: app.stats() for key, app in apps.items()}
        return None

    conn.send({name: sock.getsockname()[1] for name, sock in sockets.items()})
    try:
        await obey(conn, handle)
    finally:
        for server in servers:
            server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
