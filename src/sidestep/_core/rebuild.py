"""The request rebuilt for another target, byte for byte as httpx would build it, cheaply.

`type(request)(method, url, headers=[...], content=body)` parses the URL,
re-encodes every header, looks each content header up by name and builds
the header list twice: most of what a request moved to a backup costs.
`Rebuilder` makes the same request from parts it keeps, per target (a
`_Plan`): the moved URL of each URL asked, the target's own headers encoded
once, each header name's fate (kept, dropped, a credential) judged once.
Per request class, method and empty or non-empty body (a `_Shape`), it
learns once, from requests httpx builds itself, where httpx puts the
content headers and whether a request assembled attribute by attribute is
the one its constructor makes. What it does not know to build the same way
(a streamed body, a target that sets a content header, a request class it
cannot assemble) it leaves to httpx's own construction (`as_httpx_builds`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .memories import remember
from .routes import CompiledTarget, carried, rewrite_headers, without_credentials

__all__ = ["Rebuilder", "as_httpx_builds", "moved_url", "with_extensions"]

_CONTENT = (b"content-length", b"transfer-encoding")
_PROBE_HOST = "probe.invalid"
_Entry = tuple[bytes, bytes, bytes]  # a header as httpx keeps it: (name, lowercase name, value)


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


def moved_url(url: Any, target: CompiledTarget, rest: str, keep: bool) -> Any:
    """`url` (the caller's, `rest` its path after the route's prefix) moved to `target`:
    credentials in it (userinfo, credential query parameters) kept only if `keep`
    (`CompiledTarget.takes_callers_credentials`)."""
    query: bytes = url.query
    if query and not keep:
        query = without_credentials(query)
    moved = url.copy_with(
        scheme=target.scheme,
        host=target.host,
        port=target.port,
        # an empty query ("?") kept as the caller wrote it, as httpx sends it
        raw_path=(target.path + rest).encode("ascii")
        + (b"?" + query if query or url.raw_path.endswith(b"?") else b""),
    )
    if not keep and moved.userinfo:
        moved = moved.copy_with(userinfo=b"")
    return moved


def with_extensions(request: Any, extensions: dict[str, Any]) -> Any:
    """`request` as it is, with `extensions` of its own: a shallow copy (the same URL,
    headers, stream and body), so that the request it was made from — the caller's
    own, or the one kept for the next attempt — keeps its own extensions."""
    copied = object.__new__(type(request))
    copied.__dict__.update(vars(request))
    copied.extensions = extensions
    return copied


class _Plan:
    """What is kept for one target."""

    __slots__ = ("fates", "own", "target", "urls")

    def __init__(self, target: CompiledTarget) -> None:
        self.target = target  # kept so that its id stays its own
        # its Host and own headers encoded (never a content header: httpx places those)
        self.own: list[_Entry] = [
            (name.encode("ascii"), name.lower().encode("ascii"), value.encode("ascii"))
            for name, value in target.sent_headers
        ]
        # per `keep` (False, True): {lowercase header name: whether it goes along}
        self.fates: tuple[dict[bytes, bool], dict[bytes, bool]] = ({}, {})
        # per `keep`: {the URL's parsed parts (or its text): the URL moved here} (a URL
        # decides the path after its route's prefix)
        self.urls: tuple[dict[Any, Any], dict[Any, Any]] = ({}, {})


# Where httpx puts its content headers around the others, and how to make the request:
# (entries before them, the (name, lowercase name) of a Content-Length after them whose
# value is the body's length (None: nothing after), the body stream class, the headers
# class, whether assembling attribute by attribute makes the constructor's request).
_Shape = tuple[
    tuple[_Entry, ...], tuple[bytes, bytes] | None, Callable[[bytes], Any], Callable[[], Any], bool
]


class Rebuilder:
    """Requests for other targets, as `as_httpx_builds` builds them, from kept parts."""

    __slots__ = ("_plans", "_shapes")

    def __init__(self) -> None:
        self._plans: dict[int, _Plan] = {}  # id(target) -> its plan
        # (request class, method, empty body) -> its shape; None: httpx builds it
        self._shapes: dict[tuple[type[Any], str, bool], _Shape | None] = {}

    def build(
        self, request: Any, target: CompiledTarget, rest: str, keep: bool, body: bytes | None
    ) -> Any:
        """The request for `target`: its URL moved, the headers that go there, `body`."""
        plan = self._plans.get(id(target))
        if plan is None or plan.target is not target:
            plan = self._plan(target)
        url = request.url
        try:
            key: Any = url._uri_reference  # its parsed parts: a tuple
        except AttributeError:
            key = str(url)  # the whole URL: its userinfo too, never shared
        moved = plan.urls[keep].get(key)
        if moved is None:
            moved = self._moved(plan, url, key, rest, keep)
        extensions = request.extensions
        if "sni_hostname" in extensions:  # the caller's server name is not the target's
            extensions = {k: v for k, v in extensions.items() if k != "sni_hostname"}
        else:
            extensions = dict(extensions)
        own = plan.own
        items = getattr(request.headers, "_list", None)
        cls = type(request)
        shape = None
        if body is not None and items is not None:
            method = request.method
            try:
                shape = self._shapes[(cls, method, not body)]
            except KeyError:
                shape = self._shape(cls, method, not body)
        if shape is None or body is None or items is None:
            return as_httpx_builds(request, moved, target, keep, body, extensions)
        before, after, stream_cls, headers_cls, assemble = shape
        goes = plan.fates[keep]
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
        if assemble:
            return _assembled(
                cls, request.method, moved, entries, headers_cls, body, stream_cls, extensions
            )
        headers = headers_cls()
        headers._list = entries
        rebuilt = cls(
            request.method, moved, headers=headers, stream=stream_cls(body), extensions=extensions
        )
        rebuilt._content = body  # in memory, as content= leaves it
        return rebuilt

    def _plan(self, target: CompiledTarget) -> _Plan:
        """A new plan for `target`, remembered by its id (the plan keeps the target)."""
        return remember(self._plans, id(target), _Plan(target))

    @staticmethod
    def _moved(plan: _Plan, url: Any, key: Any, rest: str, keep: bool) -> Any:
        """`url` (known as `key`) moved to the plan's target, remembered."""
        return remember(plan.urls[keep], key, moved_url(url, plan.target, rest, keep))

    @staticmethod
    def _judge(fates: dict[bytes, bool], name: bytes, target: CompiledTarget, keep: bool) -> bool:
        """Whether header `name` (lowercase, as sent) goes to `target`: `rewrite_headers`'s rule."""
        return remember(fates, name, carried(name.decode("latin-1"), target, keep))

    def _shape(self, cls: type[Any], method: str, empty: bool) -> _Shape | None:
        """How `cls` is built for `method` and an (empty) body: learnt once, from httpx."""
        shape: _Shape | None = None
        body = b"" if empty else b"1"
        host = (b"host", b"host", _PROBE_HOST.encode("ascii"))
        url = f"http://{_PROBE_HOST}/"
        try:
            probe = cls(method, url, headers=[host[::2]], content=body)
        except Exception:
            probe = None  # a method it does not build: the caller's own construction decides
        entries = getattr(getattr(probe, "headers", None), "_list", None)
        if probe is not None and probe.content == body and entries and host in entries:
            at = entries.index(host)
            before, after = tuple(entries[:at]), entries[at + 1 :]
            content = all(lower in _CONTENT for _, lower, _ in (*before, *after))
            kinds = type(probe.stream), type(probe.headers)
            if content and not after:
                shape = (before, None, *kinds, _assembles(probe, *kinds))
            elif content and not empty and len(after) == 1 and after[0][2] == b"1":
                shape = (before, after[0][:2], *kinds, _assembles(probe, *kinds))
        return remember(self._shapes, (cls, method, empty), shape)


def _assembled(
    cls: Any,
    method: str,
    url: Any,
    entries: list[_Entry],
    headers_cls: Any,
    body: bytes,
    stream_cls: Callable[[bytes], Any],
    extensions: dict[str, Any],
) -> Any:
    """The request `cls(method, url, headers=..., stream=..., extensions=...)` makes
    (its content read), set attribute by attribute: none parsed or copied again."""
    headers = headers_cls.__new__(headers_cls)
    headers._list = entries
    headers._encoding = None
    request = cls.__new__(cls)
    request.method = method
    request.url = url
    request.headers = headers
    request.extensions = extensions
    request.stream = stream_cls(body)
    request._content = body
    return request


def _assembles(probe: Any, stream_cls: Any, headers_cls: Any) -> bool:
    """Whether `_assembled` makes what the constructor makes of `probe`'s parts."""
    body = probe.content
    try:
        headers = headers_cls()
        headers._list = list(probe.headers._list)
        made = type(probe)(
            probe.method, probe.url, headers=headers, stream=stream_cls(body), extensions={}
        )
        made._content = body
        entries = list(probe.headers._list)
        ours = _assembled(
            type(probe), probe.method, probe.url, entries, headers_cls, body, stream_cls, {}
        )
    except Exception:
        return False
    same = vars(made).keys() == vars(ours).keys() and vars(made.headers) == vars(ours.headers)
    return (
        same
        and all(
            getattr(made, name) == getattr(ours, name)
            for name in vars(made)
            if name not in ("headers", "stream")
        )
        and type(made.stream) is type(ours.stream)
        and b"".join(made.stream) == b"".join(ours.stream)
    )
