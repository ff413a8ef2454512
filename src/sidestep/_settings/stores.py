"""The `store:` section of the configuration: which store, and its options, as data.

``store: {memory: {...}}`` (the default), ``store: {sqlite: {...}}`` or
``store: {redis: {...}}``: one key, naming the kind of store, whose mapping
holds that store's options. Each kind is one model here and one builder in
`sidestep._state.build`; a new kind is one field on `StoreSettings`, its model
and its builder.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from .values import Count, NonNegativeDuration, PositiveDuration

__all__ = [
    "KINDS",
    "MemoryStoreSettings",
    "RedisStoreSettings",
    "SqliteStoreSettings",
    "StoreSettings",
    "plain_redis_url",
]

# The defaults of `MemoryStore`, `SqliteStore` and `RedisStore`, shown by the settings;
# tests/settings/test_store_config.py checks they are the classes' own (and settings never
# import a store). A store is built with only the options that were set, so the class's
# own default is the one that applies.
_MAX_SCOPES = 10_000
_REDIS_TIMEOUT = 0.25
_REDIS_TTL = 3600.0
_REDIS_RETRY_INTERVAL = 1.0
_SQLITE_TIMEOUT = 0.1
_SQLITE_REFRESH = 0.01


# The kinds of store, in the order `StoreSettings` declares them (each has its builder).
KINDS = ("memory", "sqlite", "redis")
_REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")


def _check_redis_url(value: str) -> str:
    # Every message names the rule, never the URL: it may hold a password.
    if any(ch.isspace() or not ch.isprintable() for ch in value):
        raise ValueError("a Redis URL must not contain whitespace or control characters")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  # parsing the port is the check
    except ValueError:
        raise ValueError("the Redis URL has a malformed host or port") from None
    if parts.scheme not in _REDIS_SCHEMES:
        raise ValueError(
            "must be a redis://, rediss://, unix://, redis+cluster:// or rediss+cluster:// URL"
        )
    if parts.scheme == "unix" and not parts.path:
        raise ValueError("a unix:// Redis URL needs the socket's path")
    return value


_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def plain_redis_url(url: str) -> tuple[str, bool]:
    """`url` as redis-py reads it, and whether its scheme named a Redis Cluster
    (``redis+cluster://`` is ``redis://`` to one of the cluster's nodes)."""
    scheme, sep, rest = url.partition("://")
    if scheme in _CLUSTER_SCHEMES:
        return f"{_CLUSTER_SCHEMES[scheme]}{sep}{rest}", True
    return url, False


def redis_server(url: str) -> str:
    """The server of a Redis URL as it may be shown: scheme, host and port, never the rest."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return "unix://"
    host = parts.hostname or "localhost"
    shown = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{shown}:{parts.port or 6379}"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)


class MemoryStoreSettings(_Model):
    """`MemoryStore`: circuits inside this process."""

    max_scopes: Count = _MAX_SCOPES


class SqliteStoreSettings(_Model):
    """`SqliteStore`: circuits shared by every process on this host through one file."""

    path: Annotated[str, Field(min_length=1)]
    fingerprint_key: Annotated[str, Field(min_length=1)] | None = Field(None, repr=False)
    probe_lease: PositiveDuration | None = None
    timeout: PositiveDuration = _SQLITE_TIMEOUT
    refresh: NonNegativeDuration = _SQLITE_REFRESH
    ttl: NonNegativeDuration = _REDIS_TTL
    max_scopes: Count = _MAX_SCOPES
    retry_interval: NonNegativeDuration = _REDIS_RETRY_INTERVAL


class RedisStoreSettings(_Model):
    """`RedisStore`: circuits shared by every process and host on one Redis.

    Every option of `RedisStore`; reprs show the server (scheme, host, port) only.
    """

    url: Annotated[str, AfterValidator(_check_redis_url)]
    prefix: Annotated[str, Field(min_length=1)] = "sidestep"
    fingerprint_key: Annotated[str, Field(min_length=1)] | None = Field(None, repr=False)
    probe_lease: PositiveDuration | None = None
    timeout: PositiveDuration = _REDIS_TIMEOUT
    ttl: PositiveDuration = _REDIS_TTL
    max_scopes: Count = _MAX_SCOPES
    retry_interval: NonNegativeDuration = _REDIS_RETRY_INTERVAL
    mirror: bool = True
    cluster: bool = False

    @model_validator(mode="after")
    def _cluster_over_tcp(self) -> RedisStoreSettings:
        if self.cluster and urlsplit(self.url).scheme == "unix":
            raise ValueError("Redis Cluster is reached over TCP: a redis:// or rediss:// URL")
        return self

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for key, value in super().__repr_args__():
            yield key, (redis_server(value) if key == "url" else value)


class StoreSettings(_Model):
    """Where circuit state lives: exactly one kind of store (memory when none is named)."""

    memory: MemoryStoreSettings | None = None
    sqlite: SqliteStoreSettings | None = None
    redis: RedisStoreSettings | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> StoreSettings:
        named = [kind for kind in KINDS if getattr(self, kind) is not None]
        if len(named) > 1:
            raise ValueError(f"name one kind of store, not {len(named)}: {', '.join(named)}")
        return self

    @property
    def kind(self) -> str:
        """``"memory"``, ``"sqlite"``, ``"redis"``: the kind of store configured."""
        return next((kind for kind in KINDS if getattr(self, kind) is not None), "memory")

    @property
    def options(self) -> _Model:
        """The configured kind's settings (memory's defaults when none is named)."""
        found = getattr(self, self.kind)
        return found if found is not None else MemoryStoreSettings()

    @property
    def shared(self) -> bool:
        """Whether the store is shared between processes (its state lives outside this one)."""
        return self.kind != "memory"
