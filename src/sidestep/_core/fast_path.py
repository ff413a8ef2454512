"""The fast path: a request decided without a generator, and a whole success settled.

`FastPath.decide` admits a request's candidates with no generator made, and
lets the shell send a request itself when its candidate is healthy and
closed (`Ready`); `settle` takes a success whose body is in memory already.
Anything else goes on in `Core.handle`, from where the decision stopped.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from operator import attrgetter, itemgetter
from typing import Any

from .._state.protocol import Admission, Ticket
from ..logging import listening
from .candidates import Candidacy
from .endings import Endings
from .routes import Candidates, CompiledTarget
from .run import Ready, Run
from .spreading import Spreading, answered, landed
from .verdicts import Verdicts

__all__ = ["FastPath", "key_parts"]

# A request's (scheme, host, port, path), from the parsed URL both flavours keep (its
# `_uri_reference`, a tuple): by position, in one call, where a sample shows the fields
# in that order; else by name. The path is still percent-encoded, as it goes on the
# wire, and empty for a URL with none (`_match` takes it as "/").
_BY_POSITION = itemgetter(0, 2, 3, 4)
_BY_NAME = attrgetter("scheme", "host", "port", "path")


@functools.cache
def key_parts(module: Any) -> Callable[[Any], tuple[Any, ...]]:
    try:
        sample = module.URL("http://h.example:1/p")._uri_reference
        if _BY_POSITION(sample) == ("http", "h.example", 1, "/p"):
            return _BY_POSITION
    except Exception:  # noqa: S110 - not the tuple this was written for: by name
        pass
    return _BY_NAME


class FastPath(Candidacy, Endings, Spreading, Verdicts):
    """A request decided without a generator, and a whole success settled."""

    # Set by `Core.__init__`.
    _fast_path: bool
    _key_parts: Callable[[Any], tuple[Any, ...]]
    _healthy: Callable[[str], int | None]
    _origin_refused: Callable[[str, Any, float], Admission | None]
    _memory: Any
    _quick: bool

    def decide(self, request: Any) -> Run | Ready:
        """The fast decision: `Ready` when the shell may send a request itself, else a `Run`.

        A request that goes as it is to its first candidate (`Candidates.lane`),
        healthy and closed, with its body in memory, is ready with no run made
        at all. Otherwise the
        request's candidates are admitted without a generator: those refused
        are skipped as `handle` skips them, and the first one admitted stops
        the decision, its admission kept in the run for the rest of the
        request (never taken twice). That run is ready too when its candidate
        is healthy and closed — no probe, no transition, nothing only
        observed, no deadline to keep. The shell sends a ready request and
        hands the response to `settle`; any other run, as any result `settle`
        does not take, goes on in `handle`, from where the decision stopped.
        While anyone listens to DEBUG events, the decision stops before the
        first candidate: `handle` emits the request's events around all of it.
        """
        url = request.url
        try:
            # The parsed parts (`key_parts`): far cheaper per request than the public
            # properties, which decode on each access.
            key = self._key_parts(url._uri_reference)
        except AttributeError:
            key = (url.scheme, url.host, url.port, url.raw_path.decode("ascii").partition("?")[0])
        cands = self._matched.get(key)  # a look-up per (scheme, host, port, path)
        if cands is None:
            cands = self._match(key, url)
        if cands.variants is not None:  # a pooled route: this request's own order
            cands = self._spread(cands, request)
        if self._blocking or not self._fast_path or self.injecting or listening():
            # Every admission is an effect, or someone listens for the request's
            # own events, which start before any admission.
            run = self._start(request, cands)
            if self._blocking and cands.members is not None:
                # Counted in flight on the member it was picked for from now, not from
                # its attempt: requests picked while its admission is awaited see it
                # (`landed` ends it, with or without an attempt).
                run.aloft = cands.members[0]
                run.aloft.hold(request)
            return run
        lane = cands.lane
        unhealthy = None  # the lane's origin, when it was found not healthy
        try:
            content = request._content
        except AttributeError:  # a body still to stream
            content = None
        if lane is not None and self._quick and content is not None:
            # Its body in memory already (none, or bytes): a run made after sending sees
            # the body `_start` would have seen before. One still to stream is read ahead
            # or not by `_start`, before it goes: sending may use it up (a generator, a
            # file part read once) or put it in memory (a transport that reads it).
            memory = self._memory
            seq = memory._seq if not memory._kept else self._healthy(lane)
            if seq is not None:
                # Admitted as the store would admit it (nothing kept for the origin): its
                # run and ticket are made only if the request leaves the fast path.
                clock = self.clock  # (an attribute read, then called: cheaper than a method's)
                if cands.members is not None:
                    cands.members[0].took_off(request)  # (`_revive` knows it from `cands`)
                return request, cands, seq, clock(), self.closes
            unhealthy = lane
        run = self._start(request, cands)
        if run.deadline is not None:
            return run  # a deadline to check before each admission
        healthy = self._healthy
        quick = self._quick and cands.plain
        targets = cands.targets
        others = cands.others
        try:
            for index, target in enumerate(targets):
                if index and index in others and self._kept_out(run, target):
                    continue  # the request names state kept by its own target's provider
                if quick:
                    # (a lane's first candidate found not healthy above is not asked twice)
                    seq = None if unhealthy is target.origin else healthy(target.origin)
                    if seq is not None:
                        if index or not cands.direct:
                            self._candidate(run, index, target)
                        run.index, run.seq, run.ready = index, seq, True
                        if cands.members is not None:  # (`took_off`, with nothing held)
                            run.aloft = cands.members[index]
                            run.aloft.took_off(request)
                        run.sent_at = self.clock()
                        return run.sent, run, seq, run.sent_at, self.closes
                    now = self.clock()
                    refused = self._origin_refused(target.origin, self.breaker, now)
                    if refused is not None:
                        # refused as the store would refuse it: no request rebuilt, no key made
                        self._refused(run, target, refused, now)
                        continue
                self._candidate(run, index, target)
                facts = self._scope_facts(run, target)
                now = self.clock()
                admission = self.store.admit(facts, self.breaker, now)
                if admission.ticket is None:
                    self._refused(run, target, admission, now)
                    continue
                run.index, run.admission = index, admission
                return run
        except BaseException:
            landed(run)  # (the member it was picked for holds it no longer)
            raise
        run.index = len(targets)  # every candidate refused: `handle` ends it
        return run

    def settle(self, ready: Ready, response: Any) -> Any:
        """The fast verdict on a `Ready` request's response: the answer, or None for `resume`.

        Taken only when the verdict is a success that is whole already (a body
        in memory): recorded, attributed, handed over. Anything else — a
        status the classifier must judge, a body still to peek at — is left
        untouched for `resume`.
        """
        if response.status_code >= 400 or not isinstance(response.stream, self._byte_stream):
            return None
        run = ready[1]
        if isinstance(run, Candidates):  # sent as it was, to its first candidate
            if not self._failing and (
                not self._memory._kept or self._healthy(run.targets[0].origin) is not None
            ):
                if run.members is not None:  # its attempt on a pool member is over
                    first, now = run.members[0], self.clock()
                    first.landed(ready[0])
                    answered(run, first, now - ready[3], response.headers, now)
                # nothing kept for its origin now, as at its admission: nothing to record
                response.extensions["sidestep"] = run.about[0].copy()
                return response
            run = self._revive(ready)  # something to reset, or kept since
        run.attempts = run.tried = 1
        index = run.index
        target = run.cands.targets[index]
        member = run.aloft
        if member is not None:  # its attempt on a pool member is over (`landed`, inline)
            run.aloft = None
            member.landed(run.request)
            now = self.clock()
            answered(run.cands, member, now - run.sent_at, response.headers, now)
        if self._failing or self._healthy(target.origin) is None:
            # something to reset, or kept since: recorded as the general path records it
            try:
                self._succeeded(self._pending(run, target), target, run)
            except BaseException:
                response.close()  # in memory: closing is sync for both colours
                raise
        return self._attribute(response, run, target, index)

    def _revive(self, ready: Ready) -> Run:
        """The run of a request `decide` let go with no run: as it would have made it
        (its body was in memory before it was sent, and is the same now)."""
        request, cands, seq, sent_at, _ = ready
        assert isinstance(cands, Candidates)
        run = self._start(request, cands)
        run.seq, run.ready, run.sent_at = seq, True, sent_at
        if cands.members is not None:
            run.aloft = cands.members[0]  # counted in flight by `decide`
        return run

    def _pending(self, run: Run, target: CompiledTarget) -> Ticket:
        """The ticket of a `ready` run, made now as the store made it then (once)."""
        run.ready = False
        return Ticket(self._scope_facts(run, target), run.seq)
