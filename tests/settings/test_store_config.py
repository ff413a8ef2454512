"""The `store:` section: validation that never shows a URL's password, defaults that are the
stores' own, and the store that install() and the transports build from it."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sidestep
from sidestep._settings.config import as_config
from sidestep._settings.stores import MemoryStoreSettings, RedisStoreSettings, SqliteStoreSettings
from sidestep._state.build import build_store

PASSWORD = "S3CR3Tstorepassword"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.shipped_store_timeouts
def test_the_defaults_are_the_stores_own() -> None:
    """Every option of RedisStore, SqliteStore and MemoryStore is a key, with the class's own default."""
    for store, settings, first in [
        (sidestep.RedisStore, RedisStoreSettings, "url"),
        (sidestep.SqliteStore, SqliteStoreSettings, "path"),
    ]:
        parameters = inspect.signature(store.__init__).parameters
        options = {name: p.default for name, p in parameters.items() if name not in ("self", first)}
        assert set(options) == set(settings.model_fields) - {first}, store
        built = settings.model_validate({first: "redis://localhost"})
        for name, default in options.items():
            assert getattr(built, name) == default, (store, name)
    memory = inspect.signature(sidestep.MemoryStore.__init__).parameters
    assert MemoryStoreSettings().max_scopes == memory["max_scopes"].default


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ({"redis": {"url": f"http://:{PASSWORD}@host"}}, "store.redis.url: must be a redis://"),
        ({"redis": {"url": f"redis://:{PASSWORD}@host:99999"}}, "malformed host or port"),
        ({"redis": {"url": f"redis://:{PASSWORD}@h", "timeout": 0}}, "store.redis.timeout"),
        ({"redis": {"url": f"redis://:{PASSWORD}@h", "prefix": ""}}, "store.redis.prefix"),
        ({"redis": {"url": "redis://h"}, "memory": {}}, "name one kind of store, not 2"),
        ({"memory": {"max_scopes": 0}}, "store.memory.max_scopes"),
        ({"memory": {"max_scopes": True}}, "not true or false"),
        ({"sqlite": {}}, "store.sqlite.path: a required key is missing"),
        ({"sqlite": {"path": "s.db"}, "memory": {}}, "name one kind of store, not 2"),
        ({"sqlite": {"path": "s.db", "refresh": -1}}, "store.sqlite.refresh"),
    ],
)
def test_invalid_store_settings_name_the_key_never_the_url(store: object, message: str) -> None:
    """Each invalid store setting is a ConfigError naming its key path and rule, never the URL's password."""
    with pytest.raises(sidestep.ConfigError) as caught:
        as_config({"store": store})
    assert message in str(caught.value)
    assert PASSWORD not in str(caught.value) and caught.value.__suppress_context__


def test_reprs_show_the_server_only() -> None:
    """A Redis store's settings show scheme, host and port: no password, no fingerprint key, no database."""
    config = as_config(
        {
            "store": {
                "redis": {"url": f"redis://u:{PASSWORD}@cache:6380/3", "fingerprint_key": PASSWORD}
            }
        }
    )
    for text in (repr(config), repr(config.store), str(config.store)):
        assert PASSWORD not in text and "/3" not in text
        assert "redis://cache:6380" in text


def test_the_kind_builds_its_store(redis_url: str) -> None:
    """memory (also when no store is named) builds a MemoryStore with its max_scopes; redis a RedisStore with every option."""
    assert type(build_store(as_config({}).store)) is sidestep.MemoryStore
    assert as_config({}).store.kind == "memory" and not as_config({}).store.shared
    memory = build_store(as_config({"store": {"memory": {"max_scopes": 7}}}).store)
    assert memory._max == 7  # type: ignore[attr-defined]
    settings = as_config(
        {"store": {"redis": {"url": redis_url, "prefix": "p1", "ttl": "2m"}}}
    ).store
    redis_store = build_store(settings)
    try:
        assert type(redis_store) is sidestep.RedisStore
        assert redis_store._prefix == "p1" and redis_store._calls.ttl_ms == "120000"  # type: ignore[attr-defined]
        assert settings.shared
    finally:
        redis_store.close()  # type: ignore[attr-defined]


def test_sqlite_builds_a_sqlite_store_with_its_options(tmp_path: Path) -> None:
    """sqlite builds a SqliteStore on the configured file with the configured refresh; it is shared."""
    path = tmp_path / "state.db"
    settings = as_config({"store": {"sqlite": {"path": str(path), "refresh": "50ms"}}}).store
    store = build_store(settings)
    try:
        assert type(store) is sidestep.SqliteStore
        assert store._path == str(path) and store._refresh == 0.05  # type: ignore[attr-defined]
        assert settings.kind == "sqlite" and settings.shared
    finally:
        store.close()  # type: ignore[attr-defined]


def test_install_uses_the_configured_store_and_keeps_it_while_it_is_the_same(
    tmp_path: Path, redis_url: str
) -> None:
    """install(config) builds the store the file names; installing the same store setting again keeps the store (and its circuits); another setting builds anew."""
    import sidestep._shells.adopt as adopt

    path = tmp_path / "sidestep.yaml"
    path.write_text(f"store: {{redis: {{url: '{redis_url}', prefix: p2}}}}\n")
    try:
        sidestep.install(sidestep.load_config(path))
        first = adopt._installed.store if adopt._installed else None
        assert type(first) is sidestep.RedisStore
        sidestep.install(sidestep.load_config(path))
        assert adopt._installed is not None and adopt._installed.store is first
        sidestep.install({"store": {"memory": {"max_scopes": 5}}})
        assert type(adopt._installed.store) is sidestep.MemoryStore
    finally:
        sidestep.uninstall()
        if first is not None:
            first.close()


def test_sidestep_run_installs_the_configured_store(tmp_path: Path, redis_url: str) -> None:
    """A program started by `sidestep run` with a file naming Redis has a RedisStore installed, with the file's prefix, in its own interpreter."""
    path = tmp_path / "sidestep.yaml"
    path.write_text(f"store: {{redis: {{url: '{redis_url}', prefix: run-prefix}}}}\n")
    program = (
        "import sidestep._shells.adopt as adopt; s = adopt._installed.store; "
        "print(type(s).__name__, s._prefix)"
    )
    done = subprocess.run(  # noqa: S603  # our own interpreter and module
        [
            sys.executable,
            "-m",
            "sidestep",
            "run",
            "-c",
            str(path),
            "--",
            sys.executable,
            "-c",
            program,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["RedisStore", "run-prefix"]
    assert PASSWORD not in done.stderr
