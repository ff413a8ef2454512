"""The admin API's listing: one page of a store's rows, filtered, with its weak ETag.

`listing` answers a `Page` asked of a `Listed`: the rows that pass the filters,
in ``scope_id`` order, from just past ``after``, encoded as JSON with the
pooled routes' members (``pools``); or 304 when they say what the page the
client holds said. A page, and its tag, are kept
with the listing (`Listed.answers`): asked again of a store that has not
changed, they are not worked out again.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._common.turns import Turns
from .._core.listed import Listed
from .._core.listing_row import passes
from .._state.protocol import ScopeStatus
from .admin_answer import API_HEADERS, Answer

__all__ = ["Page", "listing"]

_LINES = 64
"""Rows' lines hashed at once into a page's tag."""
_KEPT = 16
"""Pages (with their tags) a listing keeps for requests that ask for them again."""


@dataclass(frozen=True, slots=True)
class Page:
    """What a request asks of a listing: its filters, at most `limit` rows from just past
    `after`, and (`known`, from ``If-None-Match``) the tags of the answers it holds."""

    filters: Mapping[str, str]
    limit: int
    after: str
    known: str | None


def listing(
    listed: Listed,
    routes: dict[str, list[str]],
    now: float,
    asked: Page,
    pools: Mapping[str, Any] | None = None,
) -> Answer:
    """One page of the rows that pass the filters, in ``scope_id`` order, from just past
    ``after``; 304 when they say what the page the client holds said.

    ``total`` counts every row that passes; ``next`` is the ``after`` of the next
    page (None on the last), so pages join into the whole list even while scopes
    come and go between them. ``pools`` are the pooled routes' members, read
    for this answer (never kept with the listing): the tag says them too.
    """
    head, page, tag = _chosen(listed, routes, asked)
    head = {"routes": head["routes"], "pools": pools or {}, **head}
    if pools:
        tag = _with_pools(tag, pools)
    if _held(asked.known, tag):
        return Answer(304, [("etag", tag), ("cache-control", "no-store")], b"")
    wall = time.time()
    turns = Turns()
    rows = []
    for s in page:
        rows.append(listed.encoded(s, now, wall))
        turns()
    body = f'{json.dumps(head)[:-1]}, "suspensions": [{", ".join(rows)}]}}'.encode()
    headers = [*API_HEADERS, ("etag", tag), ("content-length", str(len(body)))]
    return Answer(200, headers, body)


def _chosen(
    listed: Listed, routes: dict[str, list[str]], asked: Page
) -> tuple[dict[str, Any], list[ScopeStatus], str]:
    """The head, the rows and the tag of the page `asked` for: worked out once per listing
    (a store that has not changed is listed again as the same `Listed`)."""
    key = ("page", tuple(sorted(asked.filters.items())), asked.limit, asked.after)
    found = listed.answers.get(key)
    if found is not None and found[0]["routes"] == routes:
        return found  # type: ignore[no-any-return]
    turns = Turns()
    kept = listed.by_id()
    if asked.filters:
        passing = []
        for s in kept:
            if passes(listed.pairs(s), s.reason, asked.filters):
                passing.append(s)
            turns()
        kept = passing
    start = bisect.bisect_right(kept, asked.after, key=_scope_id) if asked.after else 0
    page = kept[start : start + asked.limit]
    more = start + asked.limit < len(kept)
    head = {"routes": routes, "total": len(kept), "next": page[-1].scope_id if more else None}
    found = (head, page, _tag(listed, head, page, turns))
    if len(listed.answers) >= _KEPT:
        listed.answers.clear()
    listed.answers[key] = found
    return found


def _scope_id(status: ScopeStatus) -> str:
    return status.scope_id


def _tag(listed: Listed, head: dict[str, Any], page: list[ScopeStatus], turns: Turns) -> str:
    """A weak entity tag of what the page says, to the second: the same rows, in the same
    states, for the same reasons, with the same counts and windows, give the same tag
    (``retry_in`` and ``opened_at`` are read off a moving clock; the window is not)."""
    digest = hashlib.blake2b(json.dumps(head, sort_keys=True).encode(), digest_size=12)
    for i in range(0, len(page), _LINES):
        digest.update("".join([listed.line(s) for s in page[i : i + _LINES]]).encode())
        turns()
    return f'W/"{digest.hexdigest()}"'


def _with_pools(tag: str, pools: Mapping[str, Any]) -> str:
    """The tag of a page that also says `pools`: another whenever a member's figures move."""
    digest = hashlib.blake2b(tag.encode(), digest_size=12)
    digest.update(json.dumps(pools, sort_keys=True).encode())
    return f'W/"{digest.hexdigest()}"'


def _held(known: str | None, tag: str) -> bool:
    """Whether ``If-None-Match`` names `tag` (compared weakly, as that header is) or ``*``."""
    if known is None:
        return False
    opaque = tag.removeprefix("W/")
    return any(t.strip() in ("*", opaque, tag) for t in known.split(","))
