"""The failover loop, sans I/O, shared by every transport.

`Core.handle` is a generator: it decides, and yields an *effect* (`effects`)
whenever I/O is needed, then takes the result (or the exception) back. The
sync and async shells (`_shells/sync_shell.py`, `async_shell.py`) only perform effects, so both
flavours and both colours of transport share every decision. The loop is
here; the fast decision (`fast_path`), the attempts on one candidate
(`attempts`), and what it works out per candidate (`candidates`), per result
(`verdicts`), at a response's commit point (`commit`) and at the end
(`endings`) are in the parts `Core` is made of.
"""

from __future__ import annotations

import math
import random
import threading
import time
import weakref
from collections.abc import Callable, Generator, Mapping
from typing import Any

from .._answers import classify as c11n
from .._settings.config import Config, as_config
from .._state.build import build_store
from .._state.memory import MemoryStore
from .._state.protocol import Admission, StateStore
from ..logging import emit, listening
from ..metrics import enable_configured
from .effects import Clock, Close
from .fast_path import FastPath, key_parts
from .flavour import Flavour
from .hedged import Hedged
from .rebuild import Rebuilder
from .routes import Candidates, Router
from .run import Outcome, Ready, Run
from .spreading import landed
from .watch import Watching

__all__ = ["Core"]


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


class Core(FastPath, Hedged, Watching):
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
        self.clock: Clock = clock or time.monotonic
        self.router = Router(self.config, self.clock)
        self.store: StateStore = store if store is not None else build_store(self.config.store)
        self.flavour = flavour
        self._key_parts = key_parts(flavour.module)
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
        self._random = random.random  # what pools draw their orders from
        # Set by the shell when a fault plan is put under its transport (`faults`).
        self.injecting = False
        if self.config.observability.enabled:
            enable_configured(self.config.observability)

    def __repr__(self) -> str:
        return f"Core(routes={list(self.router.routes)!r}, store={self.store!r})"

    def closing(self) -> None:
        """The shell's transport is being closed: a request in flight now sends no more."""
        self.closed_at = self.clock()
        self.closes += 1

    # -- the loop ------------------------------------------------------------------

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
        the request's and its attempts' events (`watch`) when someone listens.
        The `run` from `decide` goes on from the candidate the decision stopped at.
        """
        return self._watched(run) if listening() else self._loop(run)

    def _loop(self, run: Run) -> Generator[Any, Any, Any]:
        try:
            targets = run.cands.targets
            route = run.cands.route
            hedged = route is not None and route.hedging is not None
            for index in range(run.index, len(targets)):
                if index <= run.passed:
                    continue  # reached by a hedge already (`hedged`)
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
                    admission = yield from self._admission(run, index, target)
                    if admission.ticket is None:
                        continue
                sent = run.sent
                ticket = admission.ticket
                assert ticket is not None  # a refused candidate was skipped above
                if ticket.probes and run.watched:
                    self._admitted(run, target, ticket)
                outcome: Outcome | None = None
                raced = False
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
                    plan = self._hedge_plan(run, index) if hedged else None
                    if plan is not None:
                        raced = True  # each branch settles its own admission
                        outcome, target, index = yield from self._raced(
                            run, index, target, sent, ticket, plan
                        )
                    else:
                        outcome = yield from self._judged_attempt(run, target, sent, ticket)
                except BaseException:
                    # Whatever broke (a cancellation, the store, a logger), the probe slot
                    # comes back and a response that will not be handed over is closed.
                    if outcome is not None:
                        yield from self._discard(outcome.result)
                    if not raced:
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
            landed(run)  # an attempt counted in flight never outlives its request
            # Cancelled, or failed, while a failing response was held for the end.
            if run.last is not None and not isinstance(run.last, BaseException):
                last, run.last = run.last, None
                yield Close(last)
            raise
        finally:
            landed(run)  # nor does the member it was picked for, held with no attempt
