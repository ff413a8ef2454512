"""The admin app's decisions, without I/O: authorise, route, answer.

`handle` takes one request's method, path, query, ``Authorization`` header
and peer, and yields the store operations it needs (`ListRows`, `ClearRow`)
to the shell that performs them, sync (WSGI) or async (ASGI), then returns
the `Answer`; `advance` takes it one step, so a shell may run the step after
a listing (filtering, a page of rows, its JSON or HTML) off its event loop.
`admin_tokens` says who asks and `admin_origins` from where; a page of the
listing is worked out in `admin_listing`, the status page in `admin_page`.
Clearing names who asked: the audit event's ``who``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from .._core.listed import Listed
from .._core.listing_row import as_json
from .admin_answer import API_HEADERS, Answer
from .admin_listing import Page, listing
from .admin_origins import Origins, cross_site
from .admin_page import status_page
from .admin_tokens import Token, authorise

__all__ = [
    "MAX_PAGE",
    "ClearRow",
    "ListReply",
    "ListRows",
    "advance",
    "handle",
]

_FILTERS = ("route", "target", "reason")
MAX_PAGE = 10_000
"""The most rows one answer holds, and how many it holds unless ``?limit=`` says fewer:
the memory store's default bound, so a listing that held every row still does."""


@dataclass(frozen=True)
class ListRows:
    """Effect: the store's rows (a `Listed`), the configured routes, the store's clock
    reading and the pooled routes' members (`ListReply`; None when the store did not
    answer)."""


ListReply = tuple[Listed, dict[str, list[str]], float, dict[str, dict[str, Any]]]


@dataclass(frozen=True)
class ClearRow:
    """Effect: clear `scope_id`; the row as it was (or None) and the store's clock reading
    (None when the store did not answer)."""

    scope_id: str
    who: str  # the token's name and the peer: the audit record's


_Steps = Generator[ListRows | ClearRow, Any, Answer]
_ANONYMOUS = Token("anonymous", "-")
_NO_ORIGINS = Origins()


def advance(steps: _Steps, reply: Any) -> ListRows | ClearRow | Answer:
    """Send `reply` to the steps of `handle`: the next effect to perform, or the answer."""
    try:
        return steps.send(reply)
    except StopIteration as done:
        answer: Answer = done.value
        return answer


def handle(
    method: str,
    path: str,
    query: str,
    authorization: str | None,
    peer: str,
    base: str,
    tokens: tuple[Token, ...],
    origins: Origins = _NO_ORIGINS,
    if_none_match: str | None = None,
) -> _Steps:
    """Answer one request; `path` is below the app's mount point, `base` that mount point.

    `if_none_match` is the request's ``If-None-Match``: a listing whose rows say what
    they said under that tag answers 304, with no body.
    """
    who = _ANONYMOUS if not tokens else authorise(authorization, tokens)
    if who is None:
        return _unauthorised(path)
    if method not in _SAFE_METHODS and cross_site(origins):
        # A browser attaches an operator's cached Basic credentials (or an authenticating
        # proxy its bearer header) to whatever a page sends, and a host app's CORS policy
        # may let another origin's script send a DELETE: a change that a browser says
        # comes from another origin is refused, whatever it carries.
        return _json(403, {"error": "cross_origin"})
    if path in ("", "/"):
        if method not in ("GET", "HEAD"):
            return _not_allowed("GET, HEAD")
        listed = yield ListRows()
        if listed is None:
            return _unavailable()
        rows, routes, now, pools = listed
        return status_page(rows, routes, now, base, who, pools)
    if path == "/suspensions":
        if method not in ("GET", "HEAD"):
            return _not_allowed("GET, HEAD")
        params = dict(parse_qsl(query))
        filters = {k: v for k, v in params.items() if k in _FILTERS}
        limit = _limit(params.get("limit"))
        if limit is None:
            return _json(400, {"error": "invalid_limit"})
        listed = yield ListRows()
        if listed is None:
            return _unavailable()
        rows, routes, now, pools = listed
        page = Page(filters, limit, params.get("after", ""), if_none_match)
        return listing(rows, routes, now, page, pools)
    if path.startswith("/suspensions/") and "/" not in path[len("/suspensions/") :]:
        if method != "DELETE":
            return _not_allowed("DELETE")
        if not who.may_clear:
            return _json(403, {"error": "forbidden"})
        cleared = yield ClearRow(path[len("/suspensions/") :], f"{who.name}@{peer}")
        if cleared is None:
            return _unavailable()
        row, now = cleared
        if row is None:
            return _json(404, {"error": "not_found"})
        return _json(200, as_json(row, now, time.time()))
    return _json(404, {"error": "not_found"})


_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _limit(given: str | None) -> int | None:
    """The rows a page holds: ``?limit=`` (at most `MAX_PAGE`), else `MAX_PAGE`; None if invalid."""
    if given is None:
        return MAX_PAGE
    if not given.isascii() or not given.isdigit():
        return None
    digits = given.lstrip("0")
    if len(digits) > len(str(MAX_PAGE)):  # past MAX_PAGE, however many digits (no int() of them)
        return MAX_PAGE
    return min(int(digits), MAX_PAGE) if digits else None


def _json(status: int, payload: object, extra: Sequence[tuple[str, str]] = ()) -> Answer:
    body = json.dumps(payload).encode()
    return Answer(status, [*API_HEADERS, ("content-length", str(len(body))), *extra], body)


def _unauthorised(path: str) -> Answer:
    # the same answer for a missing, malformed or wrong token; the page also invites a
    # browser's own login prompt (Basic, the token as the password)
    challenge = 'Basic realm="sidestep", charset="UTF-8"' if path in ("", "/") else "Bearer"
    return _json(401, {"error": "unauthorized"}, [("www-authenticate", challenge)])


def _unavailable() -> Answer:
    # the shared store is down: what it holds is unknown, so neither "none" nor "not found"
    return _json(503, {"error": "store_unavailable"}, [("retry-after", "1")])


def _not_allowed(allowed: str) -> Answer:
    return _json(405, {"error": "method_not_allowed"}, [("allow", allowed)])
