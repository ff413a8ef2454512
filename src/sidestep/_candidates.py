"""A request's candidates, and the request rebuilt for each of them.

request -> route -> candidates: the route a request matches (remembered,
bounded), or its own origin; the body it can replay; and, per target, the
request rewritten (URL, Host, headers, JSON fields, credentials kept only
where they may go).
"""

from __future__ import annotations

from typing import Any

from ._routes import (
    Candidates,
    CompiledTarget,
    display_origin,
    merge_json,
    without_credentials,
)
from ._run import CACHE_LIMIT, CoreState, Run
from ._scopes import ScopeFacts, origin_key

__all__ = ["Candidacy"]


class Candidacy(CoreState):
    """A request's candidates, and the request rebuilt for each of them."""

    def _start(self, request: Any) -> Run:
        url = request.url
        try:
            # The parsed parts both flavours keep: plain tuple fields, far cheaper
            # per request than the public properties, which decode on each access.
            ref = url._uri_reference
            where = (ref.scheme, ref.host, ref.port)
            path = ref.path or "/"  # still percent-encoded, as it goes on the wire
        except AttributeError:
            where = (url.scheme, url.host, url.port)
            path = url.raw_path.decode("ascii").partition("?")[0]
        cands = None
        if self.router.routes:
            cands = self._matched.get((where, path))
            if cands is None:
                cands = self.router.match(self._origin(where, url), path)
                if cands is not None and len(self._matched) < CACHE_LIMIT:
                    self._matched[(where, path)] = cands  # the same answer every time
        if cands is None:
            cands = self._own.get(where) or self._own_origin(where, url)
        policy = cands.route.policy if cands.route else self.config.failover
        deadline = self.clock() + policy.total_timeout if policy.total_timeout else None
        content = getattr(request, "_content", None)
        if content is not None:
            body = content
        elif len(cands.targets) > 1 or policy.max_attempts_per_target > 1:
            body = self._streamed_body(request)  # it may have to be sent again
        else:
            body = None  # sent once, as it streams: nothing is read ahead
        return Run(request, cands, policy, body, deadline, "" if cands.route else path)

    def _candidate(self, run: Run, index: int, target: CompiledTarget) -> None:
        """Candidate `index`'s request and body, kept as `run.sent` and `run.sent_body`."""
        if index == 0 and run.cands.direct:
            run.sent, run.sent_body = run.request, run.body
        else:
            run.sent, run.sent_body = self._rewrite(run, target)

    def _scope_facts(self, run: Run, target: CompiledTarget) -> ScopeFacts:
        """What the scopes of the candidate's request (`_candidate`) are made of."""
        sent = run.sent
        return ScopeFacts(
            target.origin,
            sent.headers,
            run.sent_body,
            self._fingerprint,
            url=sent.url,
            path=run.endpoint,
            extensions=sent.extensions,
        )

    def _target_url(self, url: Any, target: CompiledTarget, rest: str, keep: bool) -> Any:
        """`url` moved to `target` (credentials in it kept only if `keep`), remembered:
        URLs are immutable, and parsing one is most of the cost of a rewrite."""
        try:
            key: tuple[int, Any] = (id(target), url._uri_reference)  # a tuple of its parts
        except AttributeError:
            key = (id(target), str(url))  # the whole URL: its userinfo too, never shared
        kept = self._moved.get(key)
        if kept is not None and kept[0] is target:
            return kept[1]
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
        if len(self._moved) < CACHE_LIMIT:
            self._moved[key] = (target, moved)  # the target kept too: its id stays its own
        return moved

    def _origin(self, where: tuple[str, str, int | None], url: Any) -> str:
        """The origin key of a URL whose (scheme, host, port) is `where` (cached; bounded)."""
        origin = self._origins.get(where)
        if origin is None:
            origin = origin_key(url.scheme, url.host, url.port)
            if len(self._origins) < CACHE_LIMIT:
                self._origins[where] = origin
        return origin

    def _own_origin(self, where: tuple[str, str, int | None], url: Any) -> Candidates:
        """An unrouted request: one candidate, its own origin (cached; bounded)."""
        origin = self._origin(where, url)
        scheme, host, port = url.scheme, url.host, url.port
        shown = display_origin(scheme, host, port)
        target = CompiledTarget(shown, scheme, host, port, "", origin, shown)
        cands = Candidates(None, (target,), "", origin, direct=True)
        if len(self._own) < CACHE_LIMIT:
            self._own[where] = cands
        return cands

    def _streamed_body(self, request: Any) -> bytes | None:
        """The body of a request whose content is not in memory yet, when it can be replayed."""
        if isinstance(request.stream, (self.flavour.multipart, self._byte_stream)):
            # in-memory parts, or bytes passed as a stream (a followed redirect's body)
            return request.read()  # type: ignore[no-any-return]
        return None

    def _rewrite(self, run: Run, target: CompiledTarget) -> tuple[Any, bytes | None]:
        """The request rebuilt for `target`, and its body.

        Credentials — credential headers, URL userinfo, credential query
        parameters — go to another origin only when the target inherits them.
        """
        request = run.request
        keep = target.origin == run.cands.origin or target.inherit_credentials
        body = run.body
        if body is not None and target.json_fields:
            body = merge_json(body, target.json_fields)
        url = self._target_url(request.url, target, run.cands.rest, keep)
        extensions = {k: v for k, v in request.extensions.items() if k != "sni_hostname"}
        return self._rebuilder.build(request, url, target, keep, body, extensions), body
