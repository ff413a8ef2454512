"""Whether a request comes from the admin app's own origin, as a browser says.

`Origins` holds what a request says of where it comes from; `cross_site` tells
a change that a browser sends from another origin, which the app refuses.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Origins", "cross_site"]


@dataclass(frozen=True, slots=True)
class Origins:
    """What a request says of where it comes from: its ``Origin``, ``Sec-Fetch-Site`` and
    ``Host`` headers (None for each it lacks)."""

    origin: str | None = None
    fetch_site: str | None = None
    host: str | None = None


def cross_site(origins: Origins) -> bool:
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
