"""The admin app's decisions, without I/O: authorise, route, answer.

`handle` takes one request's method, path, query, ``Authorization`` header
and peer, and yields the store operations it needs (`ListRows`, `ClearRow`)
to the shell that performs them, sync (WSGI) or async (ASGI), then returns
the `Answer`; `advance` takes it one step, so a shell may run the step after
a listing (filtering, a page of rows, its JSON or HTML) off its event loop.
A page of a listing, and its tag, are kept with the listing (`Listed.answers`):
asked again of a store that has not changed, they are not worked out again.
Clearing names who asked: the audit event's ``who``.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import hashlib
import hmac
import html
import json
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from .._common.turns import Turns
from .._core.listing import Listed, as_json, passes
from .._state.protocol import ScopeStatus

__all__ = [
    "MAX_PAGE",
    "Answer",
    "ClearRow",
    "ListRows",
    "Origins",
    "Token",
    "advance",
    "handle",
    "tokens_of",
]

_FILTERS = ("route", "target", "reason")
MAX_PAGE = 10_000
"""The most rows one answer holds, and how many it holds unless ``?limit=`` says fewer:
the memory store's default bound, so a listing that held every row still does."""
_LINES = 64
"""Rows' lines hashed at once into a page's tag."""
_KEPT = 16
"""Pages (with their tags) a listing keeps for requests that ask for them again."""
_PAGE = Path(__file__).with_name("admin_page.html").read_text(encoding="utf-8")
_API_HEADERS = [
    ("content-type", "application/json"),
    ("cache-control", "no-store"),
    ("x-content-type-options", "nosniff"),
]


@dataclass(frozen=True)
class Token:
    """One bearer token the admin app accepts: its name (for the audit record) and secret.

    A token with ``may_clear=False`` reads but cannot clear. The secret never
    appears in a repr, a log or an answer.
    """

    name: str
    secret: str = field(repr=False)
    may_clear: bool = True

    def __post_init__(self) -> None:
        if not self.name or not self.name.isprintable() or self.name != self.name.strip():
            raise ValueError("a token's name must be non-empty and printable")
        # ASCII: servers read a header as latin-1, so a client's UTF-8 would never match
        secret = self.secret
        if not secret or not secret.isascii() or not secret.isprintable() or " " in secret:
            raise ValueError(
                f"token {self.name!r}: the secret must be non-empty printable ASCII, no spaces"
            )


def tokens_of(
    token: str | Token | Sequence[Token] | None, allow_unauthenticated: bool
) -> tuple[Token, ...]:
    """The tokens an app accepts; raises unless there is one or unauthenticated use is allowed."""
    if isinstance(token, str):
        found: tuple[Token, ...] = (Token("admin", token),)
    elif isinstance(token, Token):
        found = (token,)
    else:
        found = tuple(token or ())
        if not all(isinstance(t, Token) for t in found):
            raise TypeError("token must be a string, a Token or a sequence of Tokens")
    names = [t.name for t in found]
    if len(set(names)) != len(names):
        raise ValueError("token names must be unique")
    if not found and not allow_unauthenticated:
        raise ValueError(
            "the admin app needs a token (token=...); pass allow_unauthenticated=True"
            " only behind something that authenticates every request itself"
        )
    return found


@dataclass(frozen=True)
class ListRows:
    """Effect: the store's rows (a `Listed`), the configured routes, and the store's clock
    reading (None when the store did not answer)."""


@dataclass(frozen=True)
class ClearRow:
    """Effect: clear `scope_id`; the row as it was (or None) and the store's clock reading
    (None when the store did not answer)."""

    scope_id: str
    who: str  # the token's name and the peer: the audit record's


@dataclass(frozen=True)
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


_Steps = Generator[ListRows | ClearRow, Any, Answer]
_ANONYMOUS = Token("anonymous", "-")


def advance(steps: _Steps, reply: Any) -> ListRows | ClearRow | Answer:
    """Send `reply` to the steps of `handle`: the next effect to perform, or the answer."""
    try:
        return steps.send(reply)
    except StopIteration as done:
        answer: Answer = done.value
        return answer


@dataclass(frozen=True, slots=True)
class Origins:
    """What a request says of where it comes from: its ``Origin``, ``Sec-Fetch-Site`` and
    ``Host`` headers (None for each it lacks)."""

    origin: str | None = None
    fetch_site: str | None = None
    host: str | None = None


def handle(
    method: str,
    path: str,
    query: str,
    authorization: str | None,
    peer: str,
    base: str,
    tokens: tuple[Token, ...],
    origins: Origins = Origins(),
    if_none_match: str | None = None,
) -> _Steps:
    """Answer one request; `path` is below the app's mount point, `base` that mount point.

    `if_none_match` is the request's ``If-None-Match``: a listing whose rows say what
    they said under that tag answers 304, with no body.
    """
    who = _ANONYMOUS if not tokens else _authorise(authorization, tokens)
    if who is None:
        return _unauthorised(path)
    if method not in _SAFE_METHODS and _cross_site(origins):
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
        rows, routes, now = listed
        return _page(rows, routes, now, base, who)
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
        rows, routes, now = listed
        page = _Page(filters, limit, params.get("after", ""), if_none_match)
        return _listing(rows, routes, now, page)
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
    if not given.isascii() or not given.isdigit() or int(given) < 1:
        return None
    return min(int(given), MAX_PAGE)


@dataclass(frozen=True, slots=True)
class _Page:
    """What a request asks of a listing: its filters, at most `limit` rows from just past
    `after`, and (`known`, from ``If-None-Match``) the tags of the answers it holds."""

    filters: Mapping[str, str]
    limit: int
    after: str
    known: str | None


def _listing(listed: Listed, routes: dict[str, list[str]], now: float, asked: _Page) -> Answer:
    """One page of the rows that pass the filters, in ``scope_id`` order, from just past
    ``after``; 304 when they say what the page the client holds said.

    ``total`` counts every row that passes; ``next`` is the ``after`` of the next
    page (None on the last), so pages join into the whole list even while scopes
    come and go between them.
    """
    head, page, tag = _chosen(listed, routes, asked)
    if _held(asked.known, tag):
        return Answer(304, [("etag", tag), ("cache-control", "no-store")], b"")
    wall = time.time()
    turns = Turns()
    rows = []
    for s in page:
        rows.append(listed.encoded(s, now, wall))
        turns()
    body = f'{json.dumps(head)[:-1]}, "suspensions": [{", ".join(rows)}]}}'.encode()
    headers = [*_API_HEADERS, ("etag", tag), ("content-length", str(len(body)))]
    return Answer(200, headers, body)


def _chosen(
    listed: Listed, routes: dict[str, list[str]], asked: _Page
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


def _held(known: str | None, tag: str) -> bool:
    """Whether ``If-None-Match`` names `tag` (compared weakly, as that header is) or ``*``."""
    if known is None:
        return False
    opaque = tag.removeprefix("W/")
    return any(t.strip() in ("*", opaque, tag) for t in known.split(","))


def _cross_site(origins: Origins) -> bool:
    """Whether a browser says the request comes from another origin than the app's own.

    ``Sec-Fetch-Site`` decides where a browser sends it; else ``Origin`` (sent with
    every state-changing fetch) must name this app's host and port, as ``Host`` does
    (the scheme is left out: a proxy in front may end TLS). A request with neither
    header comes from no browser page (a script, curl).
    """
    site = origins.fetch_site
    if site is not None:
        return site.strip().lower() not in ("same-origin", "none")
    origin = origins.origin
    if origin is None:
        return False
    _, found, authority = origin.strip().lower().partition("://")
    host = _without_default_port((origins.host or "").strip().lower())
    return not (found and host) or _without_default_port(authority) != host


def _without_default_port(authority: str) -> str:
    return authority.removesuffix(":80").removesuffix(":443")


def _authorise(authorization: str | None, tokens: tuple[Token, ...]) -> Token | None:
    """The token the header carries, compared in constant time with every token; None if none.

    ``Bearer <token>``, or ``Basic`` with the token as the password (any user
    name): the one way a browser sends a header by itself.
    """
    offered = _credential(authorization or "")
    if offered is None:
        return None
    digest = hashlib.sha256(offered.encode()).digest()
    found = None
    for token in tokens:  # every token compared, so timing says nothing about which matched
        if hmac.compare_digest(digest, hashlib.sha256(token.secret.encode()).digest()):
            found = token
    return found


def _credential(authorization: str) -> str | None:
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return value
    if scheme.lower() == "basic" and value:
        try:
            decoded = base64.b64decode(value, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        password = decoded.partition(":")[2]
        return password or None
    return None


def _json(status: int, payload: object, extra: Sequence[tuple[str, str]] = ()) -> Answer:
    body = json.dumps(payload).encode()
    return Answer(status, [*_API_HEADERS, ("content-length", str(len(body))), *extra], body)


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


# --- the status page ------------------------------------------------------------------------

_SCRIPT = _PAGE.split("<script>", 1)[1].split("</script>", 1)[0]
_STYLE = _PAGE.split("<style>", 1)[1].split("</style>", 1)[0]


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


_CSP = "; ".join(
    [
        "default-src 'none'",
        f"script-src {_csp_hash(_SCRIPT)}",
        f"style-src {_csp_hash(_STYLE)}",
        "connect-src 'self'",
        "img-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
_PAGE_HEADERS = [
    ("content-type", "text/html; charset=utf-8"),
    ("content-security-policy", _CSP),
    ("cache-control", "no-store"),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
]


_PER_TARGET = 20
"""Scopes the page's HTML lists under one target; a line counts the rest."""
_ORIGINS = 100
"""Unrouted origins the page's HTML lists; a line counts the rest."""


def _page(
    listed: Listed, routes: dict[str, list[str]], now: float, base: str, who: Token
) -> Answer:
    statuses = listed.by_id()  # the API's order, which the script keeps
    body = (
        _PAGE.replace("{{base}}", html.escape(base.rstrip("/") + "/"))
        .replace("{{may_clear}}", "true" if who.may_clear else "false")
        .replace("{{summary}}", html.escape(_summary(statuses)))
        .replace("{{rows}}", _table(listed, statuses, routes, now))
    ).encode()
    return Answer(200, [*_PAGE_HEADERS, ("content-length", str(len(body)))], body)


def _summary(statuses: list[ScopeStatus]) -> str:
    """What the page says above its table; its script says it alike."""
    if not statuses:
        return "Every target is healthy."
    states = {"open": 0, "half_open": 0, "closed": 0}
    turns = Turns()
    for status in statuses:
        states[status.state.value] = states.get(status.state.value, 0) + 1
        turns()
    counts = ", ".join(f"{n:,} {state.replace('_', '-')}" for state, n in states.items() if n)
    n = len(statuses)
    return f"{n:,} {'scope is' if n == 1 else 'scopes are'} not healthy: {counts}."


def _table(
    listed: Listed, statuses: list[ScopeStatus], routes: Mapping[str, list[str]], now: float
) -> str:
    """The table as the page first shows it (and as it stays with scripts off).

    Every route's targets are listed, but not every scope: a target lists its
    first `_PER_TARGET` scopes and counts the rest, and the unrouted origins
    their first `_ORIGINS`, so that the page stays small with thousands of
    scopes. With scripts on, the page then shows them all.
    """
    wall = time.time()
    turns = Turns()
    by_target: dict[tuple[str | None, str], list[ScopeStatus]] = {}
    for status in statuses:
        for pair in listed.pairs(status):
            by_target.setdefault(pair, []).append(status)
        turns()
    groups: list[tuple[str | None, list[str]]] = [(name, names) for name, names in routes.items()]
    unrouted = sorted({t for (r, t) in by_target if r is None})
    if unrouted:
        groups.append((None, unrouted))
    lines = []
    for route, targets in groups:
        title = html.escape(route) if route is not None else "unrouted origins"
        lines.append(f'<tbody><tr class="route"><th colspan="7">{title}</th></tr>')
        shown = targets if route is not None else targets[:_ORIGINS]
        for target in shown:
            found = by_target.get((route, target), [])
            if not found:
                lines.append(_tr(target, None))
            for index, status in enumerate(found[:_PER_TARGET]):
                cells = as_json(listed.row(status), now, wall)
                lines.append(_tr(target if index == 0 else "", cells))
            if len(found) > _PER_TARGET:
                lines.append(_more(len(found) - _PER_TARGET))
        if len(shown) < len(targets):
            rest = sum(len(by_target[(None, t)]) for t in targets[len(shown) :])
            lines.append(_more(rest, len(targets) - len(shown)))
        lines.append("</tbody>")
    return "\n".join(lines)


def _more(scopes: int, origins: int = 0) -> str:
    """A line counting what the HTML leaves out: more scopes, of `origins` more origins."""
    said = f"{scopes:,} more scope{'' if scopes == 1 else 's'}"
    if origins:
        said = f"{origins:,} more origin{'' if origins == 1 else 's'} ({said})"
    return (
        f'<tr class="more"><td colspan="7">{said}, listed with scripts on,'
        " by <code>GET suspensions</code> and by <code>sidestep suspensions</code></td></tr>"
    )


def _tr(target: str, row: dict[str, Any] | None) -> str:
    name = f"<td>{html.escape(target)}</td>"
    if row is None:
        return f'<tr class="healthy">{name}<td>—</td><td>healthy</td>{"<td></td>" * 4}</tr>'
    retry = row["retry_in"]
    countdown = "until cleared" if retry is None else f"{retry:.0f}s"
    scope_id = html.escape(row["scope_id"])
    return (
        f'<tr class="{html.escape(row["state"])}" data-scope="{scope_id}">{name}'
        f"<td>{html.escape(row['scope'])}</td><td>{html.escape(row['state'])}</td>"
        f"<td>{html.escape(row['reason'] or '')}</td>"
        f'<td class="retry" data-retry="{"" if retry is None else retry}">{countdown}</td>'
        f"<td>{html.escape(row['opened_at'] or '')}</td>"
        f'<td><button type="button" class="clear" data-scope="{scope_id}" disabled>Clear</button>'
        "</td></tr>"
    )
