"""The admin app's status page: `admin_page.html` filled in with a store's rows.

`status_page` answers ``GET /``: the routes, their targets and each scope's
row as a table that stays small with thousands of scopes (the page's script
then lists them all), and under it each pooled route's members (`pool_view`),
under a content security policy that allows the page's own script and style
only. Every value is escaped; the script sets text, never markup.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._common.turns import Turns
from .._core.listed import Listed
from .._core.listing_row import as_json
from .._state.protocol import ScopeStatus
from .admin_answer import Answer
from .admin_tokens import Token

__all__ = ["status_page"]

_PAGE = Path(__file__).with_name("admin_page.html").read_text(encoding="utf-8")
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


_SLOTS = re.compile(r"\{\{(base|may_clear|summary|rows|pools)\}\}")
"""The places in `admin_page.html` the page's values go."""

_PER_TARGET = 20
"""Scopes the page's HTML lists under one target; a line counts the rest."""
_ORIGINS = 100
"""Unrouted origins the page's HTML lists; a line counts the rest."""


def status_page(
    listed: Listed,
    routes: dict[str, list[str]],
    now: float,
    base: str,
    who: Token,
    pools: Mapping[str, Any] | None = None,
) -> Answer:
    statuses = listed.by_id()  # the API's order, which the script keeps
    values = {
        "base": html.escape(base.rstrip("/") + "/"),
        "may_clear": "true" if who.may_clear else "false",
        "summary": html.escape(_summary(statuses)),
        "rows": _table(listed, statuses, routes, now),
        "pools": _pools(pools or {}),
    }
    # in one pass: a name that reads "{{pools}}" in the rows stays as it reads
    body = _SLOTS.sub(lambda slot: values[slot[1]], _PAGE).encode()
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


_POOLS_NOTE = (
    "Each pooled route's members as this process counts them: attempts in flight now,"
    " the latency estimate (time to first byte, decaying), its headroom (whether the rate"
    " limits it announced have room for another request), and its share of the attempts"
    " this process has sent the route's members since it started."
)


def _pools(pools: Mapping[str, Any]) -> str:
    """The pools' section, as the page first shows it; none without a pooled route."""
    if not pools:
        return ""
    lines = [
        "<h2>Pools</h2>",
        f'<p class="note">{html.escape(_POOLS_NOTE)}</p>',
        '<table id="pools"><thead><tr><th>member</th><th>tier</th><th>weight</th>'
        "<th>in flight</th><th>latency</th><th>headroom</th><th>attempts</th>"
        "<th>share</th></tr></thead>",
    ]
    for route, pool in pools.items():
        title = f"{route} — balance: {pool['balance']}"
        lines.append(f'<tbody><tr class="route"><th colspan="8">{html.escape(title)}</th></tr>')
        for m in pool["members"]:
            room = m["rate_limit_room"]
            cells = (
                m["target"],
                str(m["tier"]),
                f"{m['weight']:g}",
                str(m["in_flight"]),
                "—" if m["latency_s"] is None else f"{m['latency_s'] * 1000:.1f} ms",
                "yes" if room else "no",
                f"{m['attempts']:,}",
                "—" if m["share"] is None else f"{m['share'] * 100:.1f}%",
            )
            shown = "".join(f"<td>{html.escape(c)}</td>" for c in cells)
            lines.append(f'<tr class="member{"" if room else " full"}">{shown}</tr>')
        lines.append("</tbody>")
    lines.append("</table>")
    return "\n".join(lines)
