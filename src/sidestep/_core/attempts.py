"""The failover loop, sans I/O, shared by every transport.

`Core.handle` is a generator: it decides, and yields an *effect* (`_effects`)
whenever I/O is needed, then takes the result (or the exception) back. The
sync and async shells in `_transport.py` only perform effects, so both
flavours and both colours of transport share every decision. The loop is
here; what it works out per candidate (`_candidates`), per result
(`_verdicts`), at a response's commit point (`_commit`) and at the end
(`_endings`) is in the parts `Core` is made of.
"""

from __future__ import annotations

import functools
import math
import threading
import time
import weakref
from collections.abc import Callable, Generator, Mapping
from dataclasses import replace
from operator import attrgetter, itemgetter
from typing import Any

from .._answers import classify as c11n
from .._answers.classify import BODY_PREFIX_LIMIT, Kind
from .._answers.encodings import decoded_head
from .._settings.config import Config, as_config
from .._state.build import build_store
from .._state.memory import MemoryStore
from .._state.protocol import Admission, StateStore, Ticket
from ..logging import emit, listening
from ..metrics import enable_configured
from .candidates import Candidacy
from .commit import Committing
from .effects import Call, Clock, Close, Read, Send, Sleep
from .endings import Endings
from .flavour import Flavour
from .rebuild import Rebuilder, with_extensions
from .routes import Candidates, CompiledTarget, Router
from .run import SUCCESS, Outcome, Ready, Run
from .streaming import asks_to_stream, is_event_stream
from .watch import Watching

__all__ = ["Core"]

_TIMEOUT_KEYS = ("connect", "read", "write", "pool")
# Seconds past its deadline a sync attempt's headers may still come (the async shells give
# the transport's own typed timeouts as long to fire first).
_LATE = 0.1
_LATE_HEADERS = "sidestep: the answer's headers came after the attempt's deadline"
# The least read timeout set for a body: a socket's timeout of 0 does not wait at all, and
# fails as a read error rather than a timeout.
_LEAST_READ = 0.001
# A request's (scheme, host, port, path), from the parsed URL both flavours keep (its
# `_uri_reference`, a tuple): by position, in one call, where a sample shows the fields
# in that order; else by name. The path is still percent-encoded, as it goes on the
# wire, and empty for a URL with none (`_match` takes it as "/").
_BY_POSITION = itemgetter(0, 2, 3, 4)
_BY_NAME = attrgetter("scheme", "host", "port", "path")


@functools.cache
def _key_parts(module: Any) -> Callable[[Any], tuple[Any, ...]]:
    try:
        sample = module.URL("http://h.example:1/p")._uri_reference
        if _BY_POSITION(sample) == ("http", "h.example", 1, "/p"):
            return _BY_POSITION
    except Exception:  # noqa: S110 - not the tuple this was written for: by name
        pass
    return _BY_NAME


def _never(*args: Any) -> Any:
    return None  # not through a proxy; no look at an origin without admitting


# Per store: the unrouted origins' endpoints that failed since the origin last answered
# well (see `Verdicts._unrouted`), shared by every core over that store.
_FAILING: weakref.WeakKeyDictionary[Any, dict[str, set[str]]] = weakref.WeakKeyDictionary()
_FAILING_LOCK = threading.Lock()


def _failing_for(store: Any) -> dict[str, set[str]]:
    """The failing endpoints' memory of the cores over `store` (a core's own if the store
    cannot be weakly referenced)."""
    with _FAILING_LOCK:
        try:
            return _FAILING.setdefault(store, {})
        except TypeError:
            return {}


class Core(Candidacy, Committing, Endings, Watching):
    """Everything a transport decides, for one configuration, store and clock."""

    def __init__(
        self,
        config: Config | Mapping[str, Any] | None,
        *,
        store: StateStore | None,
        clock: Clock | None,
        flavour: Flavour,
        exact_deadlines: bool,
    ) -> None:
        # False sends every request down the general path (`handle`) from its start: for
        # the tests that prove both paths alike. (Read per request, so an attribute of the
        # instance: one of the class is looked up the slow way on every read.)
        self._fast_path = True
        self.config = as_config(config)
        self.router = Router(self.config)
        self.store: StateStore = store if store is not None else build_store(self.config.store)
        self.clock: Clock = clock or time.monotonic
        self.flavour = flavour
        self._key_parts = _key_parts(flavour.module)
        self.breaker = self.config.breaker
        self.suspensions = self.config.suspensions
        self.classifier: c11n.Classifier = self.config.classifier or c11n.classify
        self._custom_classifier = self.config.classifier is not None
        # Shells that cannot bound a blocking read from outside (sync) shrink the
        # read timeout to the first-byte limit instead; httpcore fixes a body's
        # read timeout when the body starts, so there it bounds each later read too.
        self._exact = exact_deadlines
        self._blocking = self.store.blocking
        self._byte_stream = flavour.ByteStream
        self._write_timeout: type[BaseException] = flavour.module.WriteTimeout
        self._fingerprint = self.store.fingerprint
        # The store's lock-free look at an origin, for the fast path (`decide`):
        # only a MemoryStore's, since only its admission is known to be that look.
        self._healthy: Callable[[str], int | None] = _never
        self._origin_refused: Callable[[str, Any, float], Admission | None] = _never
        # and that store itself: while it keeps no scope at all (`_kept` empty), every
        # origin is healthy, known without a call.
        self._memory: Any = None
        if type(self.store) is MemoryStore:
            self._healthy = self.store.healthy
            self._origin_refused = self.store.refused
            self._memory = self.store
        # A replacement classifier judges every answer, a 2xx included: no fast verdict.
        self._quick = self._healthy is not _never and not self._custom_classifier
        # Whether an attempt to this URL goes through a proxy: set by the shell,
        # which knows its inner transports. A proxy that fails is not the upstream.
        self.via_proxy: Callable[[Any], bool] = _never
        # Set by install(), which breaks circuits for the network only: an error a test's
        # mock raised (respx, below the HTTP transport) then counts for nothing.
        self.only_the_network = False
        # When the shell's transport was last closed, on this clock, and how many times it
        # was: a request in flight then (its latest attempt sent before) sends nothing more
        # through it. The count tells a close from a send the clock cannot order.
        self.closed_at = -math.inf
        self.closes = 0
        # Unrouted origins: the endpoints that failed since the origin last answered well,
        # one memory for every transport over the same store (every client install() wraps).
        self._failing: dict[str, set[str]] = _failing_for(self.store)
        # Routes whose all-suspended episode was logged at WARNING already.
        self._quiet: dict[str | None, tuple[Any, ...]] = {}
        self._origins: dict[tuple[str, str, int | None], str] = {}
        self._own: dict[tuple[str, str, int | None], Candidates] = {}
        self._matched: dict[tuple[str, str, int | None, str], Candidates] = {}
        self._rebuilder = Rebuilder()
        if self.config.observability.enabled:
            enable_configured(self.config.observability)

    def __repr__(self) -> str:
        return f"Core(routes={list(self.router.routes)!r}, store={self.store!r})"

    def closing(self) -> None:
        """The shell's transport is being closed: a request in flight now sends no more."""
        self.closed_at = self.clock()
        self.closes += 1

    # -- the loop ------------------------------------------------------------------

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
            # The parsed parts (`_key_parts`): far cheaper per request than the public
            # properties, which decode on each access.
            key = self._key_parts(url._uri_reference)
        except AttributeError:
            key = (url.scheme, url.host, url.port, url.raw_path.decode("ascii").partition("?")[0])
        cands = self._matched.get(key)  # a look-up per (scheme, host, port, path)
        if cands is None:
            cands = self._match(key, url)
        if self._blocking or not self._fast_path or listening():
            # Every admission is an effect, or someone listens for the request's
            # own events, which start before any admission.
            return self._start(request, cands)
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
                return request, cands, seq, clock(), self.closes
            unhealthy = lane
        run = self._start(request, cands)
        if run.deadline is not None:
            return run  # a deadline to check before each admission
        healthy = self._healthy
        quick = self._quick and cands.plain
        targets = cands.targets
        others = cands.others
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
                # nothing kept for its origin now, as at its admission: nothing to record
                response.extensions["sidestep"] = run.about[0].copy()
                return response
            run = self._revive(ready)  # something to reset, or kept since
        run.attempts = run.tried = 1
        index = run.index
        target = run.cands.targets[index]
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
        return run

    def _pending(self, run: Run, target: CompiledTarget) -> Ticket:
        """The ticket of a `ready` run, made now as the store made it then (once)."""
        run.ready = False
        return Ticket(self._scope_facts(run, target), run.seq)

    def resume(self, ready: Ready, received: Any) -> Generator[Any, Any, Any]:
        """`handle` for a `Ready` request the shell sent: `received` is its response,
        or the exception sending raised, taken as the first attempt's."""
        run = ready[1]
        if isinstance(run, Candidates):
            run = self._revive(ready)
        run.received = received
        # the closes up to its send: one while it was in flight (the answer coming
        # whole, or an error with nothing of the close in its chain) is told by the
        # count as by the clock, also by a clock that read the same at both
        run.closes_seen = ready[4]
        return self.handle(run.request, run)

    def handle(self, request: Any, run: Run) -> Generator[Any, Any, Any]:
        """Drive one request to its response (or error), yielding effects for the shell.

        Each candidate in order: admission, rewrite, attempts, verdict; between
        the request's and its attempts' events (`_watch`) when someone listens.
        The `run` from `decide` goes on from the candidate the decision stopped at.
        """
        return self._watched(run) if listening() else self._loop(run)

    def _loop(self, run: Run) -> Generator[Any, Any, Any]:
        try:
            targets = run.cands.targets
            for index in range(run.index, len(targets)):
                target = targets[index]
                admission = run.admission
                if admission is not None:
                    run.admission = None  # admitted by `decide` already: never twice
                elif run.ready:
                    admission = Admission(self._pending(run, target))
                else:
                    if run.attempts >= run.policy.max_total_attempts or (
                        run.deadline is not None and self.clock() >= run.deadline
                    ):
                        break
                    if run.body is None and run.tried:
                        break  # a one-shot body was sent once already; it cannot be replayed
                    if index in run.cands.others and self._kept_out(run, target):
                        continue  # the request names state kept by its own target's provider
                    self._candidate(run, index, target)
                    facts = self._scope_facts(run, target)
                    now = self.clock()
                    if self._blocking:
                        lease = self._lease(run, run.sent)
                        admission = yield Call("admit", (facts, self.breaker, now, lease))
                    else:
                        admission = self.store.admit(facts, self.breaker, now)
                    if admission.ticket is None:
                        self._refused(run, target, admission, now)
                        continue
                sent = run.sent
                ticket = admission.ticket
                assert ticket is not None  # a refused candidate was skipped above
                if ticket.probes and run.watched:
                    self._admitted(run, target, ticket)
                outcome: Outcome | None = None
                try:
                    if admission.transitions:
                        self._announce(admission.transitions, target, run)
                    if admission.refusal is not None:
                        self._observe_skip(run, target, admission)
                    if run.last is not None:
                        if self._closed_since(run):
                            # closed while this candidate was admitted: it is sent nothing,
                            # and the request ends with its last failure, as it came
                            yield from self._let_go(ticket)
                            break
                        last, run.last = run.last, None
                        yield from self._discard(last)
                        emit(
                            "failover",
                            route=run.route_name,
                            target=target.name,
                            previous=run.last_target.name if run.last_target else None,
                        )
                    if run.policy.max_attempts_per_target == 1:
                        run.attempts += 1
                        attempt = self._watched_attempt if run.watched else self._attempt
                        outcome = yield from attempt(run, target, sent, ticket)
                    else:
                        outcome = yield from self._try_target(run, target, sent, ticket)
                    run.tried += 1
                    if run.cands.route is not None and run.cands.route.avoid_rate_limits:
                        outcome = self._avoid_rate_limit(outcome)
                    if outcome.deferred:
                        pass  # the body's end, or its failure, will be the verdict
                    elif outcome.verdict is SUCCESS and not self._blocking:
                        self._succeeded(ticket, target, run)
                    else:
                        yield from self._record(ticket, outcome.verdict, target, run)
                except BaseException:
                    # Whatever broke (a cancellation, the store, a logger), the probe slot
                    # comes back and a response that will not be handed over is closed.
                    if outcome is not None:
                        yield from self._discard(outcome.result)
                    yield from self._let_go(ticket)
                    raise
                if outcome.committed:
                    return self._attribute(outcome.result, run, target, index)
                if not outcome.verdict.failover:
                    return self._final(outcome.result, run, target, index)
                run.last, run.last_target = outcome.result, target
                if self._closed_since(run):
                    break  # closed meanwhile: no other candidate; its last failure ends it
            if run.last is not None and run.last_target is not None:
                index = run.cands.targets.index(run.last_target)
                last, run.last = run.last, None  # handed over: no longer ours to close
                return self._final(last, run, run.last_target, index)
            if run.tried == 0 and run.skipped:
                return self._all_suspended(run)
            raise self.flavour.timeout_error("sidestep: total_timeout ran out before any attempt")

        except BaseException:
            # Cancelled, or failed, while a failing response was held for the end.
            if run.last is not None and not isinstance(run.last, BaseException):
                last, run.last = run.last, None
                yield Close(last)
            raise

    def _try_target(
        self, run: Run, target: CompiledTarget, request: Any, ticket: Ticket
    ) -> Generator[Any, Any, Outcome]:
        """Up to `max_attempts_per_target` attempts on one target; the last outcome."""
        policy = run.policy
        outcome: Outcome | None = None
        for n in range(policy.max_attempts_per_target):
            if outcome is not None:
                closes = self.closes  # a close from now on cuts the wait short (`Sleep`)
                if run.body is None or self._closed_since(run):
                    break  # a one-shot body cannot be sent again; a closed transport sends none
                wait = self._retry_wait(outcome.verdict, policy, n, run)
                if wait is None:
                    break
                yield from self._discard(outcome.result)
                if wait > 0:
                    yield Sleep(wait, closes)
                if self._closed_since(run):
                    # closed while it waited, its failure let go already: it ends as a
                    # request in flight on a closed client does (the failure still counts)
                    return Outcome(outcome.verdict, self._closed_error(request))
            run.attempts += 1
            attempt = self._watched_attempt if run.watched else self._attempt
            failed, outcome = outcome, (yield from attempt(run, target, request, ticket))
            if failed is not None and outcome.verdict is c11n.CLOSED_LOCALLY:
                # closed under the retry, or as it was about to go: the failure before it
                # was real, and counts, as when the close comes during the wait
                return Outcome(failed.verdict, outcome.result)
            if outcome.committed or not self._retryable(outcome.verdict):
                return outcome
            if run.attempts >= policy.max_total_attempts or self._expired(run):
                break
        assert outcome is not None  # max_attempts_per_target >= 1 is validated
        return outcome

    def _attempt(
        self, run: Run, target: CompiledTarget, request: Any, ticket: Ticket
    ) -> Generator[Any, Any, Outcome]:
        """One upstream call: send, then read as far as the verdict needs."""
        deadline = run.deadline
        policy = run.policy
        first_byte = policy.first_byte_timeout
        stall = policy.stall_timeout
        received, run.received = run.received, None
        if received is None and run.attempts > 1 and self._closed_since(run):
            # closed since the previous attempt (another thread may close a sync client
            # at any moment): nothing more goes through it, as if closed under this one
            return Outcome(c11n.CLOSED_LOCALLY, self._closed_error(request))
        now = self.clock()
        if received is None:
            run.sent_at = now  # else `decide` set it, before the shell sent the request
            run.closes_seen = self.closes
        # how long this attempt may wait for its first body byte (None: the caller's timeouts)
        limit = policy.response_timeout if first_byte is None else self._wait_limit(run)
        caller_read = None
        if deadline is not None or first_byte is not None or limit is not None or stall is not None:
            # this attempt's own timeouts, on a copy: the request it was given (the
            # caller's, or the one kept for the next attempt) keeps its own
            caller_read = (request.extensions.get("timeout") or {}).get("read")
            extensions = dict(request.extensions)
            extensions["timeout"] = self._timeouts(request, run, limit, now)
            request = with_extensions(request, extensions)
        fb_deadline = deadline
        if limit is not None:
            fb_deadline = now + limit if deadline is None else min(deadline, now + limit)
        try:
            if received is None:
                response = yield Send(request, fb_deadline)
            elif isinstance(received, BaseException):
                raise received  # what sending raised in the shell, as if raised here
            else:
                response = received
        except Exception as exc:
            return Outcome(self._classify_error(request, exc, run), exc)
        if fb_deadline is not None and not self._exact and self.clock() > fb_deadline + _LATE:
            # A sync shell bounds the wait for the headers by the read timeout, which
            # httpcore arms again for each interim (1xx) response, and separately from
            # the connect and the write: headers that came after the deadline are an
            # answer the async shells would have cut short, and fail as it would.
            yield Close(response)
            late = self.flavour.read_timeout(_LATE_HEADERS, request=request)
            return Outcome(self._classify_error(request, late, run), late)
        status = response.status_code
        if status < 400 and not self._custom_classifier:
            verdict = SUCCESS
        else:
            body = b""
            stalled: BaseException | None = None
            if c11n.needs_body(status) and not run.endpoint:  # an unrouted answer is as it is
                if stall is not None and not self._exact:
                    self._shrink_read(request, stall)  # each socket read of the error body
                try:
                    head, _ = yield Read(
                        response,
                        request,
                        BODY_PREFIX_LIMIT,
                        fb_deadline,
                        stall=stall,
                        end_by=deadline,
                    )
                    encoding = response.headers.get("content-encoding")
                    body = decoded_head(head, encoding, BODY_PREFIX_LIMIT)
                except Exception as exc:
                    yield Close(response)
                    if not self.flavour.is_timeout(exc) or self._closed_since(run):
                        return Outcome(self._classify_error(request, exc, run), exc)
                    stalled = exc  # judged by its status and headers alone (below)
                except BaseException:
                    yield Close(response)  # cancelled mid-read: the connection must not leak
                    raise
            verdict = self._judge(run, request, ticket, status, response.headers, body)
            if stalled is not None:
                # An error body that did not come in time: the verdict is still its
                # status's (a 429 is a rate limit, a 403 without its explanation a 403),
                # and the target, which kept the request waiting, is not asked again.
                if verdict.kind is not Kind.SUCCESS:
                    verdict = replace(verdict, timeout=True)
                return Outcome(verdict, stalled)
        if verdict.kind is not Kind.SUCCESS:
            return Outcome(verdict, response)
        if isinstance(response.stream, self._byte_stream) or status < 200:
            # the body is here already; or a 101 hands its connection to the caller
            return Outcome(SUCCESS, response, committed=True)
        if first_byte is not None and not run.streams and is_event_stream(response.headers):
            # A stream the request did not ask for: its first byte within what is left of
            # the first-byte limit, counted from the send.
            unasked = now + first_byte
            fb_deadline = unasked if fb_deadline is None else min(fb_deadline, unasked)
            if stall is None and not self._exact:
                self._shrink_read(request, max(_LEAST_READ, fb_deadline - self.clock()))
        if stall is not None and not self._exact:
            self._stall_reads(request, run, stall, caller_read)
        return (yield from self._commit(run, target, request, ticket, response, fb_deadline))

    # -- helpers -------------------------------------------------------------------------

    def _discard(self, result: Any) -> Generator[Any, Any, None]:
        if not isinstance(result, BaseException):
            yield Close(result)

    def _closed_error(self, request: Any) -> BaseException:
        """What a request the closing of its transport kept from a retry or the next candidate
        ends with."""
        error: BaseException = self.flavour.read_error(
            "sidestep: the transport was closed while the request waited to be sent again",
            request=request,
        )
        return error

    def _expired(self, run: Run) -> bool:
        return run.deadline is not None and self.clock() >= run.deadline

    def _lease(self, run: Run, request: Any) -> float | None:
        """How long a probe on a shared store may hold its slot: its time to first byte.

        A probe's verdict is recorded at the commit point, so the lease covers
        the attempts on one target up to their first byte, with their waits;
        None (the store's default) when some timeout is unbounded. The wait for
        the first byte is the attempt's own limit (`_wait_limit`): a request
        that does not stream is not bounded by first_byte_timeout, and neither
        is its lease.
        """
        if run.deadline is not None:
            return max(0.0, run.deadline - self.clock())
        timeouts = request.extensions.get("timeout") or {}
        policy = run.policy
        limit = policy.response_timeout
        if policy.first_byte_timeout is not None:
            limit = self._wait_limit(run)
        phases: list[float | None] = [timeouts.get(k) for k in ("pool", "connect", "write")]
        phases.append(limit if limit is not None else timeouts.get("read"))
        per_attempt = 0.0
        for phase in phases:
            if phase is None:
                return None
            per_attempt += phase
        attempts = run.policy.max_attempts_per_target
        return per_attempt * attempts + run.policy.max_retry_wait * (attempts - 1)

    def _wait_limit(self, run: Run) -> float | None:
        """How long an attempt of `run` may wait for its first body byte: first_byte_timeout
        when the request asks to stream (`asks_to_stream`, asked once per request), and
        response_timeout for any answer, the shorter when both apply; None for neither."""
        policy = run.policy
        response = policy.response_timeout
        first_byte = policy.first_byte_timeout
        streams = run.streams
        if streams is None:
            streams = run.streams = asks_to_stream(run.request.headers, run.body)
        if not streams or first_byte is None:
            return response
        return first_byte if response is None else min(first_byte, response)

    def _timeouts(
        self, request: Any, run: Run, limit: float | None, now: float
    ) -> dict[str, float | None]:
        """The attempt's timeouts, shrunk to the total limit and its wait for a first byte.

        Shrinking connect, write and pool lets the transport raise its own typed
        error (nothing sent, or a local pool wait) rather than a generic deadline.
        """
        timeouts: dict[str, float | None] = dict(request.extensions.get("timeout") or {})
        left = max(0.0, run.deadline - now) if run.deadline is not None else None
        for key in _TIMEOUT_KEYS:
            bound = left
            if limit is not None and (key != "read" or not self._exact):
                bound = limit if bound is None else min(bound, limit)
            if bound is not None:
                value = timeouts.get(key)
                timeouts[key] = bound if value is None else min(value, bound)
        return timeouts

    @staticmethod
    def _shrink_read(request: Any, bound: float) -> None:
        """Bound each socket read of the body of the attempt's `request` by `bound` (for
        the sync shells, which cannot cut a wait from outside: httpcore takes the read
        timeout when the body starts and applies it to every read of it)."""
        timeouts = request.extensions.get("timeout")
        if isinstance(timeouts, dict):
            read = timeouts.get("read")
            timeouts["read"] = bound if read is None else min(read, bound)
