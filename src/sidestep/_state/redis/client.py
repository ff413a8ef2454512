"""Redis connections for `RedisStore`: the handshake, one asyncio client per event loop,
a bound on a whole asyncio exchange that never cancels its caller, and what differs
on Redis Cluster (where the mirror subscribes, how the origins are found).

Only the Redis modules import redis.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import AsyncGenerator, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.commands.core import AsyncScript

import redis

from .keys import origin_of, origin_pattern
from .scripts import SCRIPT

__all__ = [
    "NO_SETINFO",
    "NO_SOCKET_TIMEOUTS",
    "LoopClient",
    "aconnect",
    "ascan_origins",
    "bounded",
    "connect",
    "display",
    "keeper",
    "on_asyncio",
    "scan_origins",
    "subscription",
]

T = TypeVar("T")

# CLIENT SETINFO would cost two round trips per new connection (redis-py 7
# names the switch `driver_info`, earlier versions `lib_name`/`lib_version`).
NO_SETINFO: dict[str, Any] = (
    {"driver_info": None}
    if "driver_info" in inspect.signature(redis.Redis.__init__).parameters
    else {"lib_name": None, "lib_version": None}
)

# The asyncio client gets no timeouts of its own: `_bounded` bounds each whole
# call, without cancelling the caller. redis-py implements its socket timeouts
# with `asyncio.wait_for` and `async_timeout`, which before Python 3.12 can
# swallow a cancellation; a cancelled exchange must stop at its next await.
NO_SOCKET_TIMEOUTS: dict[str, Any] = {"socket_timeout": None, "socket_connect_timeout": None}


@dataclass(slots=True)
class LoopClient:
    script: AsyncScript
    keeper: AsyncGenerator[None, None]  # closes the client when its event loop shuts down


async def bounded(exchange: Coroutine[Any, Any, T], timeout: float) -> T:
    """Await `exchange` for at most ``timeout`` seconds in all, cancel-safe.

    The exchange runs as a task of its own and the caller only waits for
    it, so the bound never cancels the caller: a cancellation of the caller
    that arrives as the time runs out is the caller's, never taken for a
    Redis timeout (a cancel scope's deadline can swallow it before Python
    3.12, as can redis-py's own socket timeouts). Either way the exchange
    is cancelled; redis-py closes the connection it was using.
    """
    task = asyncio.ensure_future(exchange)
    try:
        done, _ = await asyncio.wait((task,), timeout=timeout)
    except BaseException:
        task.cancel()
        task.add_done_callback(_retrieve)
        raise
    if not done:
        task.cancel()
        task.add_done_callback(_retrieve)
        raise TimeoutError(f"Redis did not answer within {timeout}s")
    return task.result()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Collect the outcome of an exchange nobody waits for any more, so none is reported."""
    if not task.cancelled():
        task.exception()


def connect(connection: Any) -> None:
    """A new sync connection: the usual handshake, then the script loaded, so no
    call meets NOSCRIPT (even after the server restarted empty)."""
    connection.on_connect()
    connection.send_command("SCRIPT", "LOAD", SCRIPT)
    connection.read_response()


async def aconnect(connection: Any) -> None:
    """`connect` for an asyncio connection."""
    await connection.on_connect()
    await connection.send_command("SCRIPT", "LOAD", SCRIPT)
    await connection.read_response()


async def keeper(
    client: redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster,
) -> AsyncGenerator[None, None]:
    """Holds `client` until its event loop shuts down its async generators, then closes it."""
    try:
        yield
    finally:
        await client.aclose()


def subscription(client: Any) -> Any:
    """A new pub/sub object for the mirror. On Redis Cluster on any node, picked at
    random: a publish reaches every node, and after a lost node the next try goes
    elsewhere."""
    if isinstance(client, redis.cluster.RedisCluster):
        node = random.choice(client.get_nodes())  # type: ignore[no-untyped-call]  # noqa: S311  # spreading, not secrecy
        return client.pubsub(node=node, ignore_subscribe_messages=False)  # type: ignore[no-untyped-call]
    return client.pubsub(ignore_subscribe_messages=False)


def scan_origins(client: Any, prefix: str) -> list[str]:
    """The hashes of the origins holding keys under `prefix`: a SCAN of every primary
    (redis-py's cluster client scans them all) for each origin's sorted set."""
    keys = client.scan_iter(match=origin_pattern(prefix), count=1000, _type="zset")
    return _origins_in(prefix, keys)


async def ascan_origins(client: Any, prefix: str) -> list[str]:
    """`scan_origins` on an asyncio client."""
    scan = client.scan_iter(match=origin_pattern(prefix), count=1000, _type="zset")
    return _origins_in(prefix, [key async for key in scan])


def _origins_in(prefix: str, keys: Any) -> list[str]:
    found = (origin_of(prefix, key) for key in keys)
    return list(dict.fromkeys(oh for oh in found if oh is not None))


def on_asyncio() -> bool:
    """Running under asyncio (redis.asyncio works there; elsewhere a worker thread does)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def display(url: str) -> str:
    """The server as logs may show it: scheme, host and port; never userinfo, path or query."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return "[invalid Redis URL]"
    if parts.scheme == "unix":
        return "unix://"
    shown = f"[{host}]" if host and ":" in host else host or "localhost"
    return f"{parts.scheme}://{shown}:{port or 6379}"
