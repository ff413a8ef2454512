"""The request rebuilt for another target, byte for byte as httpx would build it, cheaply.

`type(request)(method, url, headers=[...], content=body)` re-encodes every
header, looks each content header up by name and builds the header list
twice: most of what a request moved to a backup costs. `Rebuilder` makes
the same request from parts it keeps: each target's own headers encoded
once, each header name's fate (kept, dropped, a credential) judged once per
target, and where httpx puts the content headers for a method and an empty
or non-empty body learnt once per request class, from a request httpx
builds itself. What it does not know to build the same way (a streamed
body, a target that sets a content header) it leaves to the caller, which
builds it as httpx does (`as_httpx_builds`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._routes import CompiledTarget, carried, rewrite_headers
from ._run import CACHE_LIMIT

__all__ = ["Rebuilder", "as_httpx_builds"]

_CONTENT = (b"content-length", b"transfer-encoding")
_PROBE_HOST = "probe.invalid"
_Entry = tuple[bytes, bytes, bytes]  # a header as httpx keeps it: (name, lowercase name, value)
# Where httpx puts its content headers around the others: the entries before them, and
# the (name, lowercase name) of a Content-Length after them, whose value is the body's
# length (None: nothing after); None when httpx does something else.
_Layout = tuple[tuple[_Entry, ...], tuple[bytes, bytes] | None] | None


def as_httpx_builds(
    request: Any, url: Any, target: CompiledTarget, keep: bool, body: bytes | None, ext: Any
) -> Any:
    """The request for `target` built by httpx itself: the reference `Rebuilder` matches.

    A body that streams along unread (`body` None) is the caller's stream itself,
    framed as it was sent: its Content-Length (a caller's, a multipart upload's) or
    its chunking, and for an async client still an async stream (as `content=`,
    a stream that is both is taken for a sync one)."""
    sent = [(name.lower(), value) for name, value in request.headers.raw]
    headers = rewrite_headers(sent, target, keep_credentials=keep)
    if body is None:
        headers += [(n, v) for n, v in request.headers.raw if n.lower() in _CONTENT]
        return type(request)(
            request.method, url, headers=headers, stream=request.stream, extensions=ext
        )
    return type(request)(request.method, url, headers=headers, content=body, extensions=ext)


class Rebuilder:
    """Requests for other targets, as `as_httpx_builds` builds them, from kept parts."""

    __slots__ = ("_kinds", "_layouts", "_names", "_own")

    def __init__(self) -> None:
        self._layouts: dict[tuple[type[Any], str, bool], _Layout] = {}
        # (id(target), keep) -> (target, {lowercase header name: whether it goes along})
        self._names: dict[tuple[int, bool], tuple[CompiledTarget, dict[bytes, bool]]] = {}
        # id(target) -> (target, its Host and own headers encoded; None: built by httpx)
        self._own: dict[int, tuple[CompiledTarget, list[_Entry] | None]] = {}
        # request class -> (its body stream class, its headers class)
        self._kinds: dict[type[Any], tuple[Callable[[bytes], Any], Callable[[], Any]]] = {}

    def build(
        self,
        request: Any,
        url: Any,
        target: CompiledTarget,
        keep: bool,
        body: bytes | None,
        extensions: dict[str, Any],
    ) -> Any:
        """The request for `target`: `url`, the headers that go there, `body`."""
        own = self._own_headers(target)
        items = getattr(request.headers, "_list", None)
        cls = type(request)
        layout = None
        if body is not None and own is not None and items is not None:
            layout = self._layout(cls, request.method, not body)
        if layout is None or body is None or own is None or items is None:
            return as_httpx_builds(request, url, target, keep, body, extensions)
        before, after = layout
        goes = self._fates(target, keep)
        # httpx's own entries, (name as sent, lowercase name, value): each header
        # built once per target or per name, none encoded or looked up per request
        entries = list(before)
        for _, name, value in items:
            kept = goes.get(name)
            if kept is None:
                kept = self._judge(goes, name, target, keep)
            if kept:
                entries.append((name, name, value))  # sent lowercase, as rewrite_headers does
        entries += own
        if after is not None:
            entries.append((*after, str(len(body)).encode("ascii")))
        stream_cls, headers_cls = self._kinds[cls]
        headers = headers_cls()
        headers._list = entries
        rebuilt = cls(
            request.method, url, headers=headers, stream=stream_cls(body), extensions=extensions
        )
        rebuilt._content = body  # in memory, as content= leaves it
        return rebuilt

    def _own_headers(self, target: CompiledTarget) -> list[_Entry] | None:
        kept = self._own.get(id(target))
        if kept is not None and kept[0] is target:
            return kept[1]
        own: list[_Entry] | None = [
            (name.encode("ascii"), name.lower().encode("ascii"), value.encode("ascii"))
            for name, value in target.sent_headers
        ]
        if any(name.lower().encode("ascii") in _CONTENT for name, _ in target.headers):
            own = None  # a content header of its own: httpx places the others around it
        if len(self._own) < CACHE_LIMIT:
            self._own[id(target)] = (target, own)  # the target kept too: its id stays its own
        return own

    def _fates(self, target: CompiledTarget, keep: bool) -> dict[bytes, bool]:
        kept = self._names.get((id(target), keep))
        if kept is not None and kept[0] is target:
            return kept[1]
        fates: dict[bytes, bool] = {}
        if len(self._names) < CACHE_LIMIT:
            self._names[(id(target), keep)] = (target, fates)
        return fates

    @staticmethod
    def _judge(fates: dict[bytes, bool], name: bytes, target: CompiledTarget, keep: bool) -> bool:
        """Whether header `name` (lowercase, as sent) goes to `target`: `rewrite_headers`'s rule."""
        kept = carried(name.decode("latin-1"), target, keep)
        if len(fates) < CACHE_LIMIT:
            fates[name] = kept
        return kept

    def _layout(self, cls: type[Any], method: str, empty: bool) -> _Layout:
        """Where `cls` puts its content headers for `method` and an (empty) body: learnt once."""
        key = (cls, method, empty)
        try:
            return self._layouts[key]
        except KeyError:
            pass
        layout: _Layout = None
        body = b"" if empty else b"1"
        host = (b"host", b"host", _PROBE_HOST.encode("ascii"))
        try:
            probe = cls(method, f"http://{_PROBE_HOST}/", headers=[host[::2]], content=body)
        except Exception:
            probe = None  # a method it does not build: the caller's own construction decides
        entries = getattr(getattr(probe, "headers", None), "_list", None)
        if probe is not None and probe.content == body and entries and host in entries:
            at = entries.index(host)
            before, after = tuple(entries[:at]), entries[at + 1 :]
            content = all(lower in _CONTENT for _, lower, _ in (*before, *after))
            if content and not after:
                layout = (before, None)
            elif content and not empty and len(after) == 1 and after[0][2] == b"1":
                layout = (before, after[0][:2])
            self._kinds.setdefault(cls, (type(probe.stream), type(probe.headers)))
        if len(self._layouts) < CACHE_LIMIT:
            self._layouts[key] = layout
        return layout
