"""A real redis-server on 127.0.0.1, started and stopped by tests and benchmarks.

`RedisServer` runs ``redis-server`` as a subprocess with no persistence and
a password (so every URL carries one, as production URLs do), waits until it
answers PING, and can be stopped and restarted on the same port to stage an
outage. `DelayProxy` sits in front of one to make its replies slow or late.
A machine without redis-server gets a clear error, never a skip.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
import uuid

import redis

from upstream import free_port

PASSWORD = "s3cret-redis-pw"


class RedisMissing(RuntimeError):
    """redis-server is not installed."""


class RedisServer:
    """One redis-server process; `url` includes the password."""

    def __init__(self, *, password: str = PASSWORD) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisMissing(
                "redis-server is not installed; the shared-state tests need a real Redis "
                "(Debian/Ubuntu: apt-get install redis-server)"
            )
        self.binary = binary
        self.password = password
        self.port = free_port()
        self.url = f"redis://:{password}@127.0.0.1:{self.port}/0"
        self._process: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"RedisServer(port={self.port}, running={self.running})"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and wait until it answers PING."""
        command = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--requirepass", self.password,
        ]  # fmt: skip
        self._process = subprocess.Popen(  # noqa: S603  # a fixed binary, arguments of our own
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        while not self.ping():
            if self._process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self._process.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("redis-server did not answer PING in time")
            time.sleep(0.02)

    def stop(self) -> None:
        """Kill the server (its data is gone: nothing is persisted)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def ping(self) -> bool:
        try:
            with self.client(timeout=0.2) as client:
                return bool(client.ping())
        except (redis.RedisError, OSError):
            return False

    def client(self, timeout: float = 2.0) -> redis.Redis:
        """A plain client on this server, for looking at what the store wrote."""
        return redis.Redis.from_url(
            self.url, socket_timeout=timeout, socket_connect_timeout=timeout, decode_responses=True
        )

    def keys(self, prefix: str) -> list[str]:
        with self.client() as client:
            return sorted(client.scan_iter(match=f"{prefix}:*"))


def fresh_prefix() -> str:
    """A prefix nobody else uses, so tests sharing one server never see each other's keys."""
    return f"t{uuid.uuid4().hex[:12]}"


class DelayProxy:
    """A TCP proxy on 127.0.0.1 in front of `server` that holds back the server's replies.

    Every chunk the server sends waits `delay` seconds, or `hold(n, seconds)`
    delays only the next `n`; `replies` counts the chunks passed on (one per
    reply for the small replies a store gets, when its commands are not pipelined).
    """

    def __init__(self, server: RedisServer) -> None:
        self.delay = 0.0
        self.replies = 0
        self._held, self._held_for = 0, 0.0
        self._target = server.port
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"redis://:{server.password}@127.0.0.1:{self.port}/0"
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self, n: int, seconds: float) -> None:
        """Delay the next `n` replies (whichever connection they are on) by `seconds`."""
        with self._lock:
            self._held, self._held_for = n, seconds

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self._target))
            except OSError:
                return
            with self._lock:
                self._sockets += (client, upstream)
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pause(self) -> float:
        with self._lock:
            self.replies += 1
            if self._held:
                self._held -= 1
                return self._held_for
            return self.delay

    def _pipe(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        try:
            while data := source.recv(65536):
                if replies:
                    time.sleep(self._pause())
                sink.sendall(data)
        except OSError:
            pass
        finally:
            source.close()
            sink.close()
