"""A rewritten target's answer, as the client must see it: the reverse of the rewrite.

The client believes it asked the URL it sent; a target that answered for it
may live elsewhere. Whatever in the answer tells the client where to go next
or what to keep is put back into the client's URL space, as reverse proxies
do (nginx ``proxy_redirect``, Apache ``ProxyPassReverse``):

- ``Location`` and ``Content-Location`` under the target's URL prefix
  (absolute, or relative to the URL the target was sent) become the same
  place under the prefix the client used, so a followed redirect comes back
  through the route and each target gets its own credentials. A URL on the
  client's own origin stays there. Any other URL is dropped: followed, it
  would carry the client's credentials to an origin they were not meant for.
  Userinfo is never kept, and from another origin neither are query
  parameters named as credentials.
- ``Set-Cookie`` from a target on another origin is dropped: the client
  would file it under its own origin and send it there.

An answer from the client's own origin and prefix is left exactly as it is.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urljoin, urlsplit

from .._common.scopes import origin_key
from .routes import Candidates, CompiledTarget, display_origin, without_credentials

__all__ = ["client_view", "may_change"]

_URLS = frozenset({b"location", b"content-location"})
_COOKIES = frozenset({b"set-cookie", b"set-cookie2"})
_WATCHED = _URLS | _COOKIES


def may_change(headers: Any) -> bool:
    """Whether an answer's headers (httpx's or httpx2's) hold one `client_view` may change:
    most answers hold none, and are handed over without a look at any value."""
    entries = getattr(headers, "_list", None)  # (name, lowercase name, value), as kept
    if entries is None:
        return any(name.lower() in _WATCHED for name, _ in headers.raw)
    for entry in entries:  # noqa: SIM110 - a loop makes no generator per answer
        if entry[1] in _WATCHED:
            return True
    return False


def client_view(
    raw: list[tuple[bytes, bytes]],
    target: CompiledTarget,
    client_url: Any,
    cands: Candidates,
) -> list[tuple[bytes, bytes]] | None:
    """The headers of `target`'s answer as the client may see them; None when unchanged.

    `client_url` is the URL the client asked (an httpx or httpx2 URL) and
    `cands` what it matched: its origin, and its path after the route prefix.
    """
    client_origin, rest = cands.origin, cands.rest
    if not any(name.lower() in _WATCHED for name, _ in raw):
        return None
    path = client_url.raw_path.decode("ascii").partition("?")[0]
    prefix = path[: len(path) - len(rest)]
    same_origin = target.origin == client_origin
    if same_origin and target.path == prefix:
        return None  # the client's own URL space: nothing to put back
    mirror = _Mirror(target, client_url, client_origin, prefix, rest)
    out: list[tuple[bytes, bytes]] = []
    for name, value in raw:
        lowered = name.lower()
        if lowered in _COOKIES:
            if not same_origin:
                continue
        elif lowered in _URLS:
            mapped = mirror.url(value.decode("latin-1"))
            if mapped is None:
                continue
            value = mapped.encode("latin-1")
        out.append((name, value))
    return out


class _Mirror:
    """Maps a URL the target issued to the client's URL space."""

    __slots__ = ("base", "client", "client_origin", "prefix", "same_origin", "target")

    def __init__(
        self, target: CompiledTarget, client_url: Any, client_origin: str, prefix: str, rest: str
    ) -> None:
        self.target = target
        self.base = f"{target.scheme}://{target.host_header}{target.path}{rest}"
        # the client's authority as it goes on the wire (IDNA), without userinfo
        host = client_url.raw_host.decode("ascii")
        self.client = display_origin(client_url.scheme, host, client_url.port)
        self.client_origin = client_origin
        self.prefix = prefix
        self.same_origin = target.origin == client_origin

    def url(self, value: str) -> str | None:
        """`value` resolved and put under the client's URL, or None when it must not be followed."""
        try:
            parts = urlsplit(urljoin(self.base, value.strip()))
            origin = origin_key(parts.scheme, parts.hostname or "", parts.port)
        except ValueError:
            return None  # no URL a client could follow anyway
        if parts.scheme not in ("http", "https"):
            return None
        path = parts.path or "/"
        target = self.target
        if origin == target.origin and (
            not target.path or path == target.path or path.startswith(target.path + "/")
        ):
            path = (self.prefix + path[len(target.path) :]) or "/"
        elif origin != self.client_origin:
            return None
        query = parts.query
        if query and not self.same_origin:
            query = without_credentials(query.encode("latin-1")).decode("latin-1")
        url = self.client + path
        if query:
            url += "?" + query
        if parts.fragment:
            url += "#" + parts.fragment
        return url
