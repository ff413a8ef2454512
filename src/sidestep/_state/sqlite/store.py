"""Circuit state shared by every process on one host through one file: `SqliteStore`.

The store is a `MemoryStore` run on a view of the file (``view``).
An operation that changes nothing — a request to a healthy origin, one
refused by an open scope, a verdict that leaves every scope as it is — is
decided from the view, with no statement. One that changes a scope runs
`MemoryStore`'s own step (and `circuit`'s state machine) inside one write
transaction, which writes the rows of the scopes it touched. At most every
``refresh`` seconds the store asks whether another process wrote, and reads
what it wrote; under an event loop a worker thread does, every ``refresh``
while admissions use the view (``loop``), never the loop.

Probe slots are leases with an end in wall-clock time, so a process that
dies holding a probe frees it when its lease ends; windows follow the wall
clock too, so a suspension survives a restart of every process (windows
long past are dropped when a store opens the file). A file that fails
serves from memory until a write to it succeeds again (``failopen``).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import anyio.to_thread

from ..._common.scopes import ScopeFacts, ScopeKey
from ..failopen import FailOpen, LocalTicket
from ..kept import Origin
from ..memory import DEFAULT_MAX_SCOPES
from ..offset import ClockOffset
from ..protocol import Admission, Refusal, ScopeStatus, Ticket, Transition
from ..statuses import status_of
from .loop import Worker, admit_in_thread
from .transaction import DEFAULT_PROBE_LEASE
from .view import UNAVAILABLE, FileView

if TYPE_CHECKING:
    from ..._answers.classify import Verdict
    from ..._settings.policies import BreakerPolicy, Suspensions

__all__ = ["SqliteStore"]

DEFAULT_TIMEOUT = 0.1
DEFAULT_REFRESH = 0.01
DEFAULT_TTL = 3600.0
DEFAULT_RETRY_INTERVAL = 1.0
# A verdict on a ticket the file issued can only go to the file; an operator's
# clear must reach it too. Both are tried even while the file is deemed away.
_ALWAYS_TRIED = frozenset({"record", "release", "clear"})


class SqliteStore(FileView):
    """Circuit state in a SQLite file, shared by every process on the host that opens it.

    Args:
        path: the file (created with its tables if missing, readable by its owner only).
        fingerprint_key: the key for credential fingerprints; None takes the
            one kept in the file (made by the first store to open it), so every
            process using the file shares credential scopes.
        probe_lease: seconds a half-open probe holds its slot when its request
            has no bounded time to first byte (default 60); otherwise the
            transport passes that time. A process that dies holding a probe
            frees it when the lease ends.
        timeout: seconds an operation may wait for another process's write
            before the file is deemed away.
        refresh: ask at most this often whether another process changed the
            file (0: on every request). A transition reaches every process
            within this time.
        ttl: seconds an open scope is kept past the end of its window by a
            store opening the file: a restart forgets windows long past.
        max_scopes: the most scopes kept; past it, as in `MemoryStore`, unrouted
            traffic's oldest closed (else oldest) scope is forgotten, and one a
            routed request recorded a result on only for another route's.
        retry_interval: while the file is away, try it again at most this often.

    A file that cannot be opened or written, stays locked past ``timeout``,
    or is not a database, never fails a request: the store serves from a
    local `MemoryStore`, emits one ``store.unavailable`` warning, and goes
    back to the file (``store.recovered``) once a write to it succeeds. It
    needs a local file system (SQLite's WAL mode shares memory between
    processes).

    Example:
        >>> store = sidestep.SqliteStore("/var/tmp/sidestep.db")
        >>> client = httpx.Client(transport=sidestep.FailoverTransport(config, store=store))
    """

    blocking = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fingerprint_key: bytes | str | None = None,
        probe_lease: float | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        refresh: float = DEFAULT_REFRESH,
        ttl: float = DEFAULT_TTL,
        max_scopes: int = DEFAULT_MAX_SCOPES,
        retry_interval: float = DEFAULT_RETRY_INTERVAL,
    ) -> None:
        for name, value in (("timeout", timeout), ("probe_lease", probe_lease)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive")
        if refresh < 0 or retry_interval < 0 or ttl < 0:
            raise ValueError("refresh, ttl and retry_interval must not be negative")
        # Absolute: a process that changes its directory later still finds the same file.
        where = os.path.abspath(os.fspath(path))
        failopen = FailOpen(
            "sqlite",
            os.path.basename(where),  # the file's name only: no directory in events
            max_scopes=max_scopes,
            retry_interval=retry_interval,
            claim=timeout * 4,
            always=_ALWAYS_TRIED,
            repeat=False,
        )
        super().__init__(
            where,
            fingerprint_key=fingerprint_key,
            timeout=timeout,
            refresh=refresh,
            ttl=ttl,
            max_scopes=max_scopes,
            failopen=failopen,
        )
        self._default_lease = probe_lease or DEFAULT_PROBE_LEASE
        self._offset = ClockOffset()  # the wall clock less the caller's, for listings
        self._worker = Worker(self)
        try:
            self._connection()
        except UNAVAILABLE as exc:
            self._lost(exc)
            self._failopen.unavailable("open", exc)

    @property
    def available(self) -> bool:
        """False while the shared state is deemed away and a local stand-in serves."""
        return not self._failopen.down

    def __repr__(self) -> str:
        return f"SqliteStore({self._failopen.where!r}, scopes={len(self._state.entries)})"

    @property
    def fallbacks(self) -> int:
        """Operations that failed on the file and were served locally (or dropped)."""
        return self._failopen.fallbacks

    def __len__(self) -> int:
        """The scopes kept in the file (the local fallback's while the file is away)."""
        if self._failopen.down or not self._poll(wait=True):
            return len(self._failopen.fallback)
        return len(self._state.entries)

    def close(self) -> None:
        """Close the file (used again, the store reopens it)."""
        self._worker.stop()
        self._worker = Worker(self)
        super().close()

    # -- the protocol ------------------------------------------------------------------

    def admit(
        self, facts: ScopeFacts, policy: BreakerPolicy, now: float, lease: float | None = None
    ) -> Admission:
        fo = self._failopen
        if fo.down and not self._recover("admit"):
            return fo.admit(facts, policy, now)
        due = self._change < 0 or time.monotonic() >= self._next_poll
        if due and not self._poll(wait=self._change < 0):  # with no view, every thread waits
            return fo.admit(facts, policy, now)
        origin = self._state.origins.get(facts.origin)
        if origin is None or not origin.unhealthy:
            return Admission(Ticket(facts, self._seq))  # nothing read, nothing written
        wall = self._wall(now)
        admission = self._from_view(origin, facts, policy, wall, now)
        if admission is not None:
            return admission
        try:
            with self._tx:
                self._tx.lease = lease or self._default_lease
                admission = self._admit(facts, facts.keys(), policy, wall)
        except UNAVAILABLE as exc:
            self._lost(exc)
            fo.unavailable("admit", exc)
            return fo.admit(facts, policy, now)
        return _on_clock(admission, wall - now)

    def admit_current(
        self, facts: ScopeFacts, policy: BreakerPolicy, now: float, lease: float | None = None
    ) -> Admission:
        """`admit` on a view brought up to date first, waiting for a catch-up another thread
        has under way: for an admission whose view may be older than `refresh` (an async
        one after the worker slept, in a worker thread)."""
        if not self._failopen.down:
            self._poll(wait=True)  # a failure leaves the store down: `admit` serves that
        return self.admit(facts, policy, now, lease)

    def _from_view(
        self, origin: Origin, facts: ScopeFacts, policy: BreakerPolicy, wall: float, now: float
    ) -> Admission | None:
        """Admission to an origin the view keeps scopes of, when it changes none of them,
        on the caller's clock (`now`; `wall`: the view's); None when the file must be written."""
        # The origin's own refusal is made on the caller's clock once, and shared.
        refused = self._refused(origin, facts.origin, policy, wall, wall - now)
        if refused is not None:
            return refused
        keys = facts.keys()
        if self._ends:
            at = time.time()
            if any(0.0 < self._ends.get(key, 0.0) <= at for key in keys):
                return None  # a probe's lease ended: its slot is the file's to free
        admission = self._look(facts, keys, policy, wall, change=False)
        return None if admission is None else _on_clock(admission, wall - now)

    def record(
        self,
        ticket: Ticket,
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        now: float,
    ) -> tuple[Transition, ...]:
        if isinstance(ticket, LocalTicket):
            return ticket.store.record(ticket, verdict, policy, suspensions, now)
        wall, keys = self._to_write(ticket, verdict, policy, suspensions, now)
        if keys is None:
            return ()
        return self._write(ticket, keys, verdict, policy, suspensions, (wall, now))

    def _to_write(
        self,
        ticket: Ticket,
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        now: float,
    ) -> tuple[float, tuple[ScopeKey, ...] | None]:
        """The wall clock's now, and the scopes a verdict must be written to (None when,
        by the view, it changes none)."""
        keys = self._verdict_keys(ticket, verdict)
        if keys is None:
            return now, None  # the healthy path: no clock read
        wall = self._wall(now)
        if self._changes_nothing(ticket, keys, verdict, policy, suspensions, wall):
            return wall, None
        return wall, keys

    def _write(
        self,
        ticket: Ticket,
        keys: tuple[ScopeKey, ...],
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        clocks: tuple[float, float],
    ) -> tuple[Transition, ...]:
        """Record in the file (`clocks`: the wall clock's now, and the caller's); a file
        that fails has the local store that stands in for it count the verdict."""
        wall, now = clocks
        try:
            with self._tx:
                return self._record(ticket, keys, verdict, policy, suspensions, wall)
        except UNAVAILABLE as exc:
            self._lost(exc)
            self._failopen.unavailable("record", exc)
        # The file's own ticket cannot go to the local store: an admission there stands in
        # for it, so that what the file missed counts toward opening the scope meanwhile.
        local = self._failopen.admit(ticket.facts, policy, now).ticket
        if local is None:
            return ()
        return self.record(local, verdict, policy, suspensions, now)

    def release(self, ticket: Ticket) -> None:
        if isinstance(ticket, LocalTicket):
            return ticket.store.release(ticket)
        try:
            super().release(ticket)
        except UNAVAILABLE as exc:
            self._lost(exc)
            self._failopen.unavailable("release", exc)  # its lease frees the slot in time

    def snapshot(self, now: float) -> list[ScopeStatus]:
        fo = self._failopen
        if fo.down and not self._recover("snapshot"):
            return fo.fallback.snapshot(now)
        if not self._poll(wait=True):
            return fo.fallback.snapshot(now)
        # the file's instants are on the wall clock: moved to the caller's by an offset
        # kept steady, so an unchanged scope lists at the same instants every time
        shift = self._offset(self._wall(now) - now)
        with self._tx.mutex:
            items = list(self._state.entries.items())
        statuses = []
        for key, c in items:
            status = status_of(key, c)
            opened = status.opened_at
            statuses.append(
                replace(
                    status,
                    retry_at=c.retry_at - shift,
                    opened_at=None if opened is None else opened - shift,
                )
            )
        return statuses

    def clear(self, scope_id: str) -> bool:
        local = self._failopen.fallback.clear(scope_id)  # the local store may hold it too
        try:
            if not self._failopen.down:
                # the view brought up to date first: its scope is found before the write
                self._poll(wait=True)
            return super().clear(scope_id) or local
        except UNAVAILABLE as exc:
            self._lost(exc)
            self._failopen.unavailable("clear", exc)
            return local

    # -- async twins: the view inline, the file in worker threads ----------------------------

    async def admit_async(
        self, facts: ScopeFacts, policy: BreakerPolicy, now: float, lease: float | None = None
    ) -> Admission:
        fo = self._failopen
        if fo.down:
            if not fo.due():
                return fo.admit(facts, policy, now)  # the file is away: memory, nothing waits
        elif self._change >= 0 and self._worker.use():
            # The worker keeps the view up to date while admissions use it; the loop only
            # says so (no clock read, no wake-up, no lock), and reads the view.
            origin = self._state.origins.get(facts.origin)
            if origin is None or not origin.unhealthy:
                return Admission(Ticket(facts, self._seq))  # nothing read, nothing written
            wall = now if self._caller_clock else time.time()
            admission = self._from_view(origin, facts, policy, wall, now)
            if admission is not None:
                return admission
        # No view yet, no worker to keep it, or one that slept and may hold an old view:
        # the file itself, in a worker thread (a worker is started there, not on the loop).
        return await admit_in_thread(self, self._worker, facts, policy, now, lease)

    async def record_async(
        self,
        ticket: Ticket,
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        now: float,
    ) -> tuple[Transition, ...]:
        if isinstance(ticket, LocalTicket):
            return ticket.store.record(ticket, verdict, policy, suspensions, now)
        wall, keys = self._to_write(ticket, verdict, policy, suspensions, now)
        if keys is None:
            return ()  # decided from the view: nothing to write
        return await anyio.to_thread.run_sync(
            self._write, ticket, keys, verdict, policy, suspensions, (wall, now)
        )

    async def release_async(self, ticket: Ticket) -> None:
        if not ticket.probes or isinstance(ticket, LocalTicket):
            return self.release(ticket)  # writes nothing
        await anyio.to_thread.run_sync(self.release, ticket)

    async def snapshot_async(self, now: float) -> list[ScopeStatus]:
        return await anyio.to_thread.run_sync(self.snapshot, now)

    async def clear_async(self, scope_id: str) -> bool:
        return await anyio.to_thread.run_sync(self.clear, scope_id)

    # -- the file ------------------------------------------------------------------------

    def _recover(self, op: str) -> bool:
        """While the file is away: may this caller try it now? Then a write proves it works."""
        if not self._failopen.usable(op):
            return False
        try:
            with self._tx:
                self._tx.heartbeat = True
        except UNAVAILABLE as exc:
            self._lost(exc)
            self._failopen.unavailable(op, exc)
            return False
        return True

    def _forked(self, *, idle: bool) -> None:
        super()._forked(idle=idle)
        self._worker = Worker(self)  # the parent's thread is not in this process


def _on_clock(admission: Admission, offset: float) -> Admission:
    """An admission with its refusal's end moved to the caller's clock, `offset` behind the
    wall clock the file keeps windows on."""
    refusal = admission.refusal
    if refusal is None or offset == 0.0:
        return admission
    at = refusal.retry_at - offset
    moved = Refusal(refusal.scope, refusal.state, refusal.reason, at)
    return Admission(admission.ticket, moved, admission.transitions)
