"""Redis connections for `RedisStore`: its clients (`Clients`: the sync one, and one
asyncio client per event loop), the handshake, a bound on a whole asyncio exchange
that never cancels its caller, and what differs on Redis Cluster (where the mirror
subscribes, how the origins are found).

Only the Redis modules import redis.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import threading
from collections.abc import AsyncGenerator, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
import redis.connection
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript, Script
from redis.retry import Retry

from .calls import LIST_ORIGINS, Call
from .keys import origin_of, origin_pattern
from .scripts import SCRIPT

__all__ = [
    "NO_SETINFO",
    "NO_SOCKET_TIMEOUTS",
    "Clients",
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

# The asyncio client gets no timeouts of its own: `bounded` bounds each whole
# call, without cancelling the caller. redis-py implements its socket timeouts
# with `asyncio.wait_for` and `async_timeout`, which before Python 3.12 can
# swallow a cancellation; a cancelled exchange must stop at its next await.
NO_SOCKET_TIMEOUTS: dict[str, Any] = {"socket_timeout": None, "socket_connect_timeout": None}


@dataclass(slots=True)
class LoopClient:
    script: AsyncScript
    keeper: AsyncGenerator[None, None]  # closes the client when its event loop shuts down


class Clients:
    """One store's clients, each with the script registered: the sync one (on one Redis
    made at once; on Redis Cluster on first use, as it reads the cluster's layout), and
    an asyncio one per event loop, made on its first use there.

    Args:
        url: the server (one node of a Redis Cluster with ``cluster``).
        where: the server as errors may show it (`display`).
        prefix: the store's, under which `LIST_ORIGINS` finds the origins.
        timeout: seconds each round trip of the sync client may take.
        cluster: `url` names a node of a Redis Cluster.
    """

    def __init__(self, url: str, where: str, prefix: str, timeout: float, *, cluster: bool) -> None:
        self._url = url
        self._prefix = prefix
        self._cluster = cluster
        self._options: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "decode_responses": True,
            # RESP2: the script's replies need nothing newer, and redis-py 8's RESP3
            # handshake adds a round trip (maintenance notifications) to every connection.
            "protocol": 2,
            **NO_SETINFO,
        }
        self._lock = threading.Lock()
        self._client: redis.Redis | redis.cluster.RedisCluster | None = None
        self._script: Script | None = None
        if cluster:
            if url.partition("://")[0] not in ("redis", "rediss"):
                raise ValueError(f"Redis Cluster needs a redis:// or rediss:// URL: {where}")
            # The client is made on first use (redis-py's reads the layout as it is made);
            # the URL is read now, so a first use never meets an unusable one.
            try:
                redis.connection.parse_url(url)  # type: ignore[no-untyped-call]
                usable = True
            except Exception:  # no I/O happens here: whatever it is, the URL is unusable
                usable = False
            if not usable:
                raise ValueError(f"not a usable Redis URL: {where}")
        else:
            client: redis.Redis | None
            try:
                client = redis.Redis.from_url(
                    url, retry=Retry(NoBackoff(), 0), redis_connect_func=connect, **self._options
                )
            except Exception:  # no I/O happens here: whatever it is, the URL is unusable
                client = None
            if client is None:
                # Raised outside the handler, so the library's error (which may quote
                # the URL's password) is not kept as this one's context.
                raise ValueError(f"not a usable Redis URL: {where}")
            self._client = client
            self._script = client.register_script(SCRIPT)
        self._async: dict[asyncio.AbstractEventLoop, LoopClient] = {}

    def sync_script(self) -> Script:
        script = self._script
        if script is not None:
            return script
        with self._lock:
            if self._script is None:
                # Redis Cluster: made on first use, as it reads the cluster's layout. No
                # script on connect: redis-py loads it on every primary at NOSCRIPT.
                client = redis.cluster.RedisCluster.from_url(
                    self._url, retry=Retry(NoBackoff(), 1), **self._options
                )
                self._client = client
                self._script = client.register_script(SCRIPT)
            return self._script

    def new_subscription(self) -> Any:
        """A new subscription for the mirror (on Redis Cluster, on any node)."""
        self.sync_script()  # on Redis Cluster, makes the client
        return subscription(self._client)

    def call(self, call: Call) -> Any:
        script = self.sync_script()
        if call is LIST_ORIGINS:
            return scan_origins(self._client, self._prefix)
        return script(keys=call.keys, args=call.args)

    async def acall(self, script: AsyncScript, call: Call) -> Any:
        if call is LIST_ORIGINS:
            return await ascan_origins(script.registered_client, self._prefix)
        return await script(keys=call.keys, args=call.args)

    async def async_script(self) -> AsyncScript:
        """This event loop's script (an asyncio client is bound to the loop it runs on)."""
        loop = asyncio.get_running_loop()
        entry = self._async.get(loop)
        if entry is not None:
            return entry.script
        with self._lock:  # loops in several threads may share the store
            for old in [old for old in self._async if old.is_closed()]:
                del self._async[old]  # its keeper closed its client as the loop shut down
            entry = self._async.get(loop)
            new = entry is None
            if entry is None:
                client: redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster
                if self._cluster:
                    client = redis.asyncio.cluster.RedisCluster.from_url(
                        self._url,
                        retry=AsyncRetry(NoBackoff(), 1),
                        **{**self._options, **NO_SOCKET_TIMEOUTS},
                    )
                else:
                    client = redis.asyncio.Redis.from_url(
                        self._url,
                        retry=AsyncRetry(NoBackoff(), 0),
                        redis_connect_func=aconnect,
                        **{**self._options, **NO_SOCKET_TIMEOUTS},
                    )
                entry = self._async[loop] = LoopClient(
                    client.register_script(SCRIPT), keeper(client)
                )
        if new:
            # Started here, the keeper is one of this loop's async generators, which
            # the loop closes as it shuts down: that closes the client's connections.
            await entry.keeper.asend(None)
        return entry.script

    def close(self) -> None:
        """Close the sync client's connections (used again, it reconnects)."""
        if self._client is not None:
            self._client.close()

    async def aclose(self) -> None:
        """Close the running asyncio event loop's client (the sync one stays open)."""
        if not on_asyncio():
            return  # under trio the async methods use the sync client
        with self._lock:
            entry = self._async.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry.keeper.aclose()


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
