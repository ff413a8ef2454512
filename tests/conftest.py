"""Fixtures shared by several test modules."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import structlog

import sidestep
from drivers import KINDS, Driver, MakeDriver
from redis_cluster import RedisCluster
from redis_server import RedisMissing, RedisServer
from sidestep._settings.values import SidestepConfigWarning
from sidestep.logging import add_observer, remove_observer
from upstream import STORE_WAIT, Upstream


@pytest.fixture(autouse=True)
def structlog_as_found() -> Iterator[None]:
    """structlog left as each test found it: `capture_logs` marks it configured for good.

    sidestep logs through structlog only when the application configured it,
    so a test that captured structlog events must not change where the next
    test's events go.
    """
    configured = structlog.is_configured()
    yield
    if not configured and structlog.is_configured():
        structlog.reset_defaults()


@pytest.fixture(autouse=True)
def stores_wait_on_a_busy_machine(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stores built in a test with their default timeout wait up to `STORE_WAIT`.

    A test that passes its own `timeout` keeps it: the tests of failing open do. A test marked
    `shipped_store_timeouts` sees the shipped defaults. Processes a test starts are given
    `STORE_WAIT` in their store's settings.
    """
    if request.node.get_closest_marker("shipped_store_timeouts"):
        return
    for store in (sidestep.SqliteStore, sidestep.RedisStore):
        monkeypatch.setitem(store.__init__.__kwdefaults__, "timeout", STORE_WAIT)


@pytest.fixture
def default_structlog() -> Iterator[None]:
    """structlog as an application that never configured it finds it (sidestep then logs
    through the standard library); restored afterwards."""
    configured, saved = structlog.is_configured(), structlog.get_config()
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()
    if configured:
        structlog.configure(**saved)


@pytest.fixture
def events() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every event sidestep emits during the test, as (name, fields), in order."""
    seen: list[tuple[str, dict[str, Any]]] = []

    def hear(event: str, fields: Mapping[str, Any], /) -> None:
        seen.append((event, dict(fields)))

    add_observer(hear)
    yield seen
    remove_observer(hear)


@pytest.fixture
def a() -> Iterator[Upstream]:
    """An upstream on 127.0.0.1 named "a" (answers "a" until a test scripts it)."""
    server = Upstream(name="a")
    yield server
    server.close()


@pytest.fixture
def b() -> Iterator[Upstream]:
    """An upstream on 127.0.0.1 named "b"."""
    server = Upstream(name="b")
    yield server
    server.close()


@pytest.fixture
def c() -> Iterator[Upstream]:
    """A third upstream on 127.0.0.1, named "c"."""
    server = Upstream(name="c")
    yield server
    server.close()


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    """Each of the four transports: httpx and httpx2, sync and async."""
    return str(request.param)


@pytest.fixture
def make(kind: str) -> Iterator[MakeDriver]:
    """Build Drivers of this test's kind (closed after it); `make(config, **transport_kw)`."""
    drivers: list[Driver] = []

    def build(config: Any = None, **kw: Any) -> Driver:
        with warnings.catch_warnings():
            # settings such as failure_threshold: 1 are surprising in production, handy here
            warnings.simplefilter("ignore", SidestepConfigWarning)
            driver = Driver(kind, config, **kw)
        drivers.append(driver)
        return driver

    yield build
    for driver in drivers:
        driver.close()


# --- a real Redis for the shared-state tests (helpers in tests/redis_server.py) --------------


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server on 127.0.0.1 for the session; a missing binary fails, never skips."""
    try:
        server = RedisServer()
    except RedisMissing as exc:
        missing = str(exc)
    else:
        missing = ""
    if missing:
        pytest.fail(missing, pytrace=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session server's URL (password included), running again if a test stopped it."""
    if not redis_server.running:
        redis_server.start()
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """One Redis Cluster (3 primaries, 3 replicas) on 127.0.0.1 for the session."""
    try:
        cluster = RedisCluster()
    except RedisMissing as exc:
        missing = str(exc)
    else:
        missing = ""
    if missing:
        pytest.fail(missing, pytrace=False)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_url(redis_cluster: RedisCluster) -> str:
    """The session cluster's ``redis+cluster://`` URL (password included), whole again."""
    redis_cluster.wait_healthy()
    return redis_cluster.url


# --- end of the Redis block ------------------------------------------------------------------
