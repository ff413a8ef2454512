"""A request's candidates, and the request rebuilt for each of them.

request -> route -> candidates: the route a request matches (remembered,
bounded), or its own origin; the body it can replay; the candidates a
request naming provider state never reaches; and, per target, the request
rewritten (URL, Host, headers, JSON fields, credentials kept only where they
may go).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .._common.scopes import ScopeFacts, origin_key
from ..logging import emit
from .memories import remember
from .routes import Candidates, CompiledTarget, display_origin, merge_json
from .run import CoreState, Run

__all__ = ["Candidacy"]


class Candidacy(CoreState):
    """A request's candidates, and the request rebuilt for each of them."""

    def _start(self, request: Any, cands: Candidates) -> Run:
        """The run of a request to `cands` (`Core.decide`), its body read if it may be replayed."""
        run = Run()
        run.request = run.sent = request
        run.cands = cands
        total = cands.policy.total_timeout
        if total:
            run.deadline = self.clock() + total
        content = getattr(request, "_content", None)
        if content is not None:
            run.body = run.sent_body = content
        elif cands.replay:
            run.body = run.sent_body = self._streamed_body(request)  # it may be sent again
        # else sent once, as it streams: nothing is read ahead (`body` None)
        if cands.route is None:
            run.endpoint = cands.rest
        return run

    def _match(self, key: tuple[str, str, int | None, str], url: Any) -> Candidates:
        """The candidates of requests to `key` (scheme, host, port, path): the route
        matched, or the request's own origin (its path all of `rest`); remembered."""
        where, path = key[:3], key[3] or "/"
        cands = None
        if self.router.routes:
            cands = self.router.match(self._origin(where, url), path)
        if cands is None:
            own = self._own.get(where) or self._own_origin(where, url)
            cands = replace(own, rest=path)
        return remember(self._matched, key, cands)  # the same answer every time

    def _kept_out(self, run: Run, target: CompiledTarget) -> bool:
        """Whether a candidate on another provider account than the request's own target
        (`Candidates.others`) is left out because the request names state kept there.

        Asked only as the request would move to such a candidate, once per
        request: its path was judged with its candidates, its body is looked
        at now. A candidate left out costs no attempt; it is named in the
        attribution and, when the request is watched, by `candidate.excluded`.
        """
        cands = run.cands
        held = run.holds_state
        if held is None:
            held = cands.pinned or (bool(run.body) and self._names_state(run))
            run.holds_state = held
        if held:
            run.excluded += (target,)
            if run.watched:
                emit(
                    "candidate.excluded",
                    route=cands.name,
                    target=target.name,
                    own=cands.targets[0].name,
                    reason="provider_state",
                    rule="path" if cands.pinned else "body",
                )
        return held

    def _names_state(self, run: Run) -> bool:
        """Whether the request's body names state kept by one provider (a body still to
        stream, sent once, is not looked at)."""
        route = run.cands.route
        state = None if route is None else route.state
        body = run.body
        return state is not None and body is not None and state.names_state(body)

    def _candidate(self, run: Run, index: int, target: CompiledTarget) -> None:
        """Candidate `index`'s request and body, kept as `run.sent` and `run.sent_body`:
        the first of a `direct` route's is the request itself (as `_start` left it);
        any other, the request rebuilt for its target.

        The caller's credentials — credential headers, URL userinfo, credential
        query parameters — go along as `CompiledTarget.takes_callers_credentials` says.
        """
        cands = run.cands
        if index == 0 and cands.direct:
            run.sent, run.sent_body = run.request, run.body
            return
        keep = target.takes_callers_credentials(cands.origin)
        body = run.body
        if body is not None and target.json_fields:
            body = merge_json(body, target.json_fields)
        run.sent = self._rebuilder.build(run.request, target, cands.rest, keep, body)
        run.sent_body = body

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

    def _origin(self, where: tuple[str, str, int | None], url: Any) -> str:
        """The origin key of a URL whose (scheme, host, port) is `where` (remembered)."""
        origin = self._origins.get(where)
        if origin is None:
            origin = remember(self._origins, where, origin_key(url.scheme, url.host, url.port))
        return origin

    def _own_origin(self, where: tuple[str, str, int | None], url: Any) -> Candidates:
        """An unrouted request: one candidate, its own origin (remembered)."""
        origin = self._origin(where, url)
        scheme, host, port = url.scheme, url.host, url.port
        shown = display_origin(scheme, host, port)
        target = CompiledTarget(shown, scheme, host, port, "", origin, shown)
        cands = Candidates.of(None, (target,), "", origin, True, self.config.failover)
        return remember(self._own, where, cands)

    def _streamed_body(self, request: Any) -> bytes | None:
        """The body of a request whose content is not in memory yet, when it can be replayed."""
        if isinstance(request.stream, (self.flavour.multipart, self._byte_stream)):
            # in-memory parts, or bytes passed as a stream (a followed redirect's body)
            return request.read()  # type: ignore[no-any-return]
        return None
