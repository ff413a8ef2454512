"""How sidestep names its keys in Redis: each origin's under one hash tag (one slot of
Redis Cluster), and how a key found by SCAN is told to be one of ours."""

from __future__ import annotations

import functools
import hashlib

__all__ = ["anchor", "origin_hash", "origin_of", "origin_pattern"]


@functools.lru_cache(maxsize=1024)
def origin_hash(origin: str) -> str:
    return hashlib.blake2b(origin.encode(), digest_size=8).hexdigest()


def anchor(prefix: str, oh: str) -> str:
    """The base of every key of one origin (the script's ``base``): its hash tag puts
    them all in one slot of Redis Cluster, and as a call's key it routes the call there."""
    return f"{prefix}:{{{oh}}}"


def origin_pattern(prefix: str) -> str:
    """A SCAN pattern matching each origin's sorted set (``<anchor>:o``), one per origin."""
    escaped = "".join("\\" + ch if ch in "*?[]\\" else ch for ch in prefix)
    return f"{escaped}:{{*}}:o"


def origin_of(prefix: str, key: str) -> str | None:
    """The origin hash of a key `origin_pattern` matched, if it is one of ours."""
    oh = key[len(prefix) + 2 : -3]
    return oh if len(oh) == 16 and all(c in "0123456789abcdef" for c in oh) else None
