"""A real Redis Cluster on 127.0.0.1: 3 primaries and 3 replicas, started by the tests.

`RedisCluster` runs six ``redis-server --cluster-enabled yes`` processes in
a temporary directory (no persistence, a password, a short
``cluster-node-timeout`` so a failover takes a second or two), joins them
with ``redis-cli --cluster create … --cluster-replicas 1`` and waits until
every node reports ``cluster_state:ok``. `kill` stops a node as a crash
would; `revive` starts it again on its old port and config file, so it
rejoins (a killed primary comes back as a replica of the one that replaced
it) and the cluster is whole for the next test.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from redis_server import PASSWORD, RedisMissing
from upstream import free_port

NODES = 6
NODE_TIMEOUT_MS = (
    1000  # how long a silent primary takes to be failed over: about this, plus an election
)


def _cluster_ports(n: int) -> list[int]:
    """`n` free ports whose cluster bus ports (+10000) are free as well."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port + 10000 > 65535 or port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


class RedisCluster:
    """Six nodes, three primaries with a replica each; `url` names one node (password included)."""

    def __init__(self, *, password: str = PASSWORD) -> None:
        binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if binary is None or cli is None:
            raise RedisMissing(
                "redis-server and redis-cli are needed for the Redis Cluster tests "
                "(Debian/Ubuntu: apt-get install redis-server)"
            )
        self.binary, self.cli = binary, cli
        self.password = password
        self.ports = _cluster_ports(NODES)
        self.url = self.url_for(self.ports[0])
        self._dir = Path(tempfile.mkdtemp(prefix="sidestep-cluster-"))
        self._processes: dict[int, subprocess.Popen[bytes]] = {}

    def __repr__(self) -> str:
        return f"RedisCluster(ports={self.ports})"

    # -- the nodes ----------------------------------------------------------------------

    def _start_node(self, port: int) -> None:
        command = [
            self.binary,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--dir", str(self._dir),
            "--cluster-enabled", "yes",
            "--cluster-config-file", f"nodes-{port}.conf",
            "--logfile", f"node-{port}.log",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            # A replica takes over however long ago it last heard its primary, and
            # syncs at once (not after the default 5 s wait for more replicas).
            "--cluster-replica-validity-factor", "0",
            "--repl-diskless-sync-delay", "0",
            "--save", "",
            "--appendonly", "no",
            "--requirepass", self.password,
            "--masterauth", self.password,
        ]  # fmt: skip
        self._processes[port] = subprocess.Popen(  # noqa: S603  # a fixed binary, our own arguments
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def start(self, timeout: float = 30.0, tries: int = 2) -> None:
        """Start the six nodes, join them into one cluster and wait until it serves every slot.

        A cluster that does not come up is stopped and made again on fresh ports,
        `tries` times in all: the ports were free when chosen, and another process on
        the machine (a second test run, in parallel) may have taken one since. The
        error says what each node's log ended with.
        """
        for attempt in range(1, tries + 1):
            try:
                self._create(timeout)
                return
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                logs = self._log_tails()
                self.stop()
                if attempt == tries:
                    raise RuntimeError(f"{exc} ({tries} tries); the nodes' logs: {logs}") from exc
                self.ports = _cluster_ports(NODES)
                self.url = self.url_for(self.ports[0])
                self._dir = Path(tempfile.mkdtemp(prefix="sidestep-cluster-"))
            except BaseException:
                self.stop()
                raise

    def _log_tails(self) -> dict[int, list[str]]:
        """The last lines each node logged (what a failed start leaves to look at)."""
        tails: dict[int, list[str]] = {}
        for port in self.ports:
            path = self._dir / f"node-{port}.log"
            try:
                tails[port] = path.read_text(errors="replace").splitlines()[-3:]
            except OSError:
                tails[port] = []
        return tails

    def _create(self, timeout: float) -> None:
        for port in self.ports:
            self._start_node(port)
        self._wait(lambda: all(self.node_answers(port) for port in self.ports), timeout)
        create = [
            self.cli, "-a", self.password, "--no-auth-warning",
            "--cluster", "create", *(f"127.0.0.1:{port}" for port in self.ports),
            "--cluster-replicas", "1", "--cluster-yes",
        ]  # fmt: skip
        subprocess.run(  # noqa: S603  # a fixed binary, our own arguments
            create,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
        )
        self.wait_healthy(timeout)

    def stop(self) -> None:
        for port in list(self._processes):
            self.kill(port)
        shutil.rmtree(self._dir, ignore_errors=True)

    def kill(self, port: int) -> None:
        """SIGKILL one node, as a crash would."""
        process = self._processes.pop(port, None)
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)

    def revive(self, port: int, timeout: float = 30.0) -> None:
        """Start a killed node again on its config file and wait until the cluster is whole."""
        self._start_node(port)
        self.wait_healthy(timeout)

    # -- looking at it ------------------------------------------------------------------

    def running(self) -> list[int]:
        """The ports of the nodes started and not killed."""
        return sorted(self._processes)

    def url_for(self, port: int) -> str:
        """A ``redis+cluster://`` URL naming the node on `port`."""
        return f"redis+cluster://:{self.password}@127.0.0.1:{port}/0"

    def node(self, port: int, timeout: float = 1.0) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1",
            port=port,
            password=self.password,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            decode_responses=True,
        )

    def node_answers(self, port: int) -> bool:
        try:
            with self.node(port, 0.2) as client:
                return bool(client.ping())
        except (redis.RedisError, OSError):
            return False

    def info(self, port: int) -> dict[str, str]:
        with self.node(port) as client:
            text = client.execute_command("CLUSTER", "INFO")
        if isinstance(text, bytes):
            text = text.decode()
        return dict(line.split(":", 1) for line in str(text).split() if ":" in line)

    def primaries(self) -> list[int]:
        """The ports of the connected primaries serving slots, as a running node sees them."""
        for port in self._processes:
            try:
                with self.node(port) as client:
                    text = client.execute_command("CLUSTER", "NODES")
            except (redis.RedisError, OSError):
                continue
            found = []
            for line in str(text).splitlines():
                _, address, flags, _, _, _, _, link, *slots = line.split()
                if "master" in flags and "fail" not in flags and link == "connected" and slots:
                    found.append(int(address.split("@")[0].rsplit(":", 1)[1]))
            return sorted(found)
        return []

    def owner(self, key: str) -> int:
        """The port of the primary serving `key`'s slot now."""
        port = self.primaries()[0]
        with self.node(port) as client:
            slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
            text = client.execute_command("CLUSTER", "NODES")
        for line in str(text).splitlines():
            _, address, flags, _, _, _, _, link, *slots = line.split()
            if "master" not in flags or "fail" in flags or link != "connected":
                continue
            for span in slots:
                low, _, high = span.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    return int(address.split("@")[0].rsplit(":", 1)[1])
        raise LookupError(f"no primary serves slot {slot}")

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until every running node reports cluster_state:ok and knows every node, three
        primaries serve the slots and every replica is in sync with its primary."""

        def healthy() -> bool:
            try:
                return (
                    all(
                        self.info(port).get("cluster_state") == "ok"
                        and self.info(port).get("cluster_known_nodes") == str(NODES)
                        for port in self._processes
                    )
                    and len(self.primaries()) == NODES // 2
                    and self._replicas_in_sync()
                )
            except (redis.RedisError, OSError):
                return False

        self._wait(healthy, timeout)

    def _replicas_in_sync(self) -> bool:
        primaries = set(self.primaries())
        for port in self._processes:
            if port in primaries:
                continue
            with self.node(port) as client:
                if client.info("replication").get("master_link_status") != "up":
                    return False
        return True

    def keys(self, pattern: str) -> list[str]:
        """Every key matching `pattern` on every primary."""
        found: list[str] = []
        for port in self.primaries():
            with self.node(port) as client:
                found += client.scan_iter(match=pattern)
        return sorted(found)

    @staticmethod
    def _wait(condition: object, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not condition():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis Cluster did not come up in time")
            time.sleep(0.05)
