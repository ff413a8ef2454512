"""Affinity: the key that keeps a request's kin on one pool member, and the rank it gives.

A route's `affinity` names where a request's key is: a header's value, a
top-level JSON body field (a string or a number), or the first characters
of the JSON encoding of the prompt (`system` and `messages`, else `input`,
else `prompt`), which is what providers' prompt caches match on. The key is
hashed (BLAKE2b, the same in every process), and the order it gives each
pool remembered (bounded); each member's
score is then weighted rendezvous hashing's ``-weight / ln(u)``, with `u`
drawn from the key's hash mixed with the member's own: the members rank by
score, highest first. A member's loss moves only the keys it ranked first,
and its return takes them back. Pure: no I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from hashlib import blake2b
from typing import Any

__all__ = ["key_of", "rendezvous", "seed"]

_MASK = (1 << 64) - 1
_UNIT = 1.0 / (1 << 53)


def seed(text: str) -> int:
    """A 64-bit hash of `text`, the same in every process (a lone surrogate, which a
    JSON body may escape, is hashed as its code point rather than refused)."""
    data = text.encode("utf-8", "surrogatepass")
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "big")


def _mix(value: int) -> int:
    """splitmix64's finaliser: every bit of `value` stirs every bit of the result."""
    z = (value + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def rendezvous(
    key: int, positions: tuple[int, ...], seeds: Sequence[int], weights: Sequence[float]
) -> tuple[int, ...]:
    """`positions` ranked for `key` by weighted rendezvous hashing, highest score first."""
    scored = []
    for position, member, weight in zip(positions, seeds, weights, strict=True):
        u = ((_mix(key ^ member) >> 11) + 0.5) * _UNIT  # in (0, 1)
        scored.append((-weight / math.log(u), position))
    scored.sort(reverse=True)
    return tuple(position for _, position in scored)


def key_of(affinity: Any, headers: Any, body: bytes | None) -> str | None:
    """The affinity key of a request (None: it carries none, and is spread)."""
    text: str | None = None
    if affinity.header is not None:
        text = headers.get(affinity.header)
    elif body:
        if affinity.json_field is not None:
            text = _field(body, affinity.json_field)
        else:
            text = _prompt(body, affinity.prefix)
    return text or None


def _document(body: bytes) -> dict[str, Any] | None:
    if body.lstrip()[:1] != b"{":
        return None
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than it parses
        return None
    return document if isinstance(document, dict) else None


def _field(body: bytes, name: str) -> str | None:
    """A top-level field's value, when it is a string or a number."""
    if f'"{name}"'.encode() not in body:  # a substring scan spares most bodies a parse
        return None
    document = _document(body)
    value = None if document is None else document.get(name)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    return str(value)


def _prompt(body: bytes, length: int) -> str | None:
    """The first `length` characters of the JSON encoding of the body's prompt."""
    document = _document(body)
    if document is None:
        return None
    parts = [document[k] for k in ("system", "messages") if k in document]
    if not parts:
        parts = [document[k] for k in ("input", "prompt") if k in document][:1]
    if not parts:
        return None
    try:
        return json.dumps(parts, separators=(",", ":"), ensure_ascii=False)[:length]
    except RecursionError:  # parsed, but nested deeper than it encodes
        return None
