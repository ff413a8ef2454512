"""What goes to the Lua script and what comes back: `RedisStore`'s operations as steps.

Each operation is a generator that yields a script call (`Call`) and gets
its reply back, so that the sync and the async shells drive the same steps
without copying a decision. `Calls` holds what every call carries (the
prefix, the key lifetime, the cap, the clock) and the origins this process
has seen unhealthy, whose admissions send their scope keys in the first
round trip. The values themselves are written and read back by `values`.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ..._answers.classify import Kind, Verdict
from ..._common.scopes import ScopeFacts, ScopeKey, ScopeKind
from ..circuit import State
from ..offset import ClockOffset
from ..protocol import Admission, Refusal, ScopeStatus, Ticket, Transition
from ..steps import verdict_keys
from .keys import anchor, origin_hash
from .values import forgotten, ms, scope_key, transitions, verdict_args

if TYPE_CHECKING:
    from ..._settings.policies import BreakerPolicy, Suspensions
    from .mirror import Mirror

__all__ = [
    "LIST_ORIGINS",
    "Call",
    "Calls",
    "RedisTicket",
    "Steps",
]

T = TypeVar("T")

# How the script answers an admission or a verdict.
_HEALTHY, _NEED_KEYS, _ADMITTED, _REFUSED = 0, 1, 2, 3
# Origins seen unhealthy are remembered so their admissions carry the scope keys
# in the first round trip; more than this and the memory starts afresh.
_MAX_HOT = 1024


@dataclass(frozen=True, slots=True)
class Call:
    """One run of the script: its arguments, the origin's anchor (the key that
    tells Redis Cluster which node runs it; none: any node), and for an
    admission that may take probe slots, the ``drop`` group that gives them
    back if its reply is lost.

    ``LIST_ORIGINS`` is no script call: it asks the store which origins hold
    keys, for the views that go origin by origin (its reply: their hashes).
    """

    args: list[str]
    drop: tuple[str, ...] = ()
    key: str = ""

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.key,) if self.key else ()


LIST_ORIGINS = Call([])


Steps = Generator[Call, Any, T]


class RedisTicket(Ticket):
    """A ticket Redis issued: its verdict goes to Redis."""

    __slots__ = ("token",)

    def __init__(
        self,
        facts: ScopeFacts,
        seq: int,
        generations: dict[ScopeKey, int] | None = None,
        probes: tuple[ScopeKey, ...] = (),
        *,
        shadow: bool = False,
        token: str = "",
    ) -> None:
        super().__init__(facts, seq, generations, probes, shadow)
        self.token = token  # names this admission's probe leases


class Calls:
    """The script calls of one store."""

    def __init__(
        self, prefix: str, ttl: float, max_scopes: int, lease: float, *, index: bool = True
    ) -> None:
        self.prefix = prefix
        # One Redis keeps a store-wide index (the cap over every scope, one-call views);
        # Redis Cluster has none: no key that every call touches.
        self.index = index
        self.ttl_ms = ms(ttl)
        self.max = str(max_scopes)
        self.lease_ms = ms(lease)
        # Windows follow the caller's `now` instead of the server's clock (a test hook).
        self.caller_clock = False
        self.hot: dict[str, None] = {}
        self.mirror: Mirror | None = None  # set by a store that keeps one
        # The server's clock less this process's, steady between listings: an unchanged
        # scope lists at the same instants (see `ClockOffset`).
        self.offset = ClockOffset()

    def admit(
        self,
        facts: ScopeFacts,
        policy: BreakerPolicy,
        now: float,
        lease: float | None,
        *,
        vouch: bool = True,
    ) -> Steps[Admission]:
        # An origin last seen healthy is asked about first without keys, so the
        # healthy path never parses a body or hashes a credential; one seen
        # unhealthy sends its keys at once. Either way: one round trip, unless
        # the origin changed since this process last looked.
        # The mirror vouches for what Redis holds, so not while Redis fails (`vouch`
        # False): the local fallback, which counts those failures, decides then.
        mirror = self.mirror
        if vouch and mirror is not None and mirror.healthy(facts.origin):
            return Admission(RedisTicket(facts, mirror.seq))  # no round trip
        lease_ms = self.lease_ms if lease is None else ms(lease)
        keys = facts.keys() if facts.origin in self.hot else ()
        token = _token(keys)
        reply = yield self._admit_call(facts, keys, token, lease_ms, policy, now)
        if reply[0] == _NEED_KEYS:
            keys = facts.keys()
            token = _token(keys)
            reply = yield self._admit_call(facts, keys, token, lease_ms, policy, now)
        status, seq, sick, gens, probes, refused, changes = reply
        self._note(facts.origin, sick, int(seq))
        if status == _HEALTHY:
            return Admission(RedisTicket(facts, int(seq)))
        refusal = None
        if refused:
            index, state, reason, retry_in = refused
            refusal = Refusal(keys[index - 1], State(state), reason or None, now + float(retry_in))
        if status == _REFUSED:
            return Admission(None, refusal)
        ticket = RedisTicket(
            facts,
            int(seq),
            {key: int(g) for key, g in zip(keys, gens, strict=True)},
            tuple(keys[i - 1] for i in probes),
            shadow=refusal is not None,
            token=token,
        )
        return Admission(ticket, refusal, transitions(keys, changes))

    def _admit_call(
        self,
        facts: ScopeFacts,
        keys: Sequence[ScopeKey],
        token: str,
        lease_ms: str,
        policy: BreakerPolicy,
        now: float,
    ) -> Call:
        sids = [key.scope_id for key in keys]
        oh = origin_hash(facts.origin)
        args = [
            *self.head("admit", now),
            oh,
            str(policy.half_open_probes),
            "1" if policy.enforce else "0",
            lease_ms,
            token,
            str(len(sids)),
            *sids,
        ]
        # With keys it may take probe slots: how to give them back if the reply is lost.
        drop = (oh, token, lease_ms, str(len(sids)), *sids) if sids else ()
        return Call(args, drop, anchor(self.prefix, oh))

    def record(
        self,
        ticket: RedisTicket,
        verdict: Verdict,
        policy: BreakerPolicy,
        suspensions: Suspensions,
        now: float,
    ) -> Steps[tuple[Transition, ...]]:
        if ticket.done:
            return ()
        ticket.done = True
        if ticket.shadow:
            return ()  # observe mode: enforcing would never have sent it
        origin = ticket.facts.origin
        keys: tuple[ScopeKey, ...]
        if verdict.kind is Kind.SUCCESS:
            if ticket.generations is None and not ticket.probes and origin not in self.hot:
                if self.mirror is not None and self.mirror.healthy(origin):
                    return ()  # the healthy path: no round trip
                reply = yield self._record_call(ticket, None, now)
                self._note(origin, reply[1], int(reply[3]))
                if reply[0] != _NEED_KEYS:
                    return ()  # the healthy path: nothing kept, nothing to reset
            keys = ticket.facts.keys()
        else:
            keys = verdict_keys(ticket.facts, verdict)
            if not keys and not ticket.probes:
                return ()
        call = self._record_call(ticket, keys, now)
        if keys:
            call.args.extend(verdict_args(verdict, policy, suspensions, ticket.facts.routed))
        sent = time.monotonic()  # before the script may forget a scope
        _, sick, changes, seq, dropped = yield call
        self._note(origin, sick, int(seq))
        return (*transitions(keys, changes), *forgotten(dropped, sent))

    def release(self, ticket: RedisTicket) -> Steps[None]:
        if ticket.done:
            return None
        ticket.done = True
        if ticket.probes:
            yield self._record_call(ticket, (), 0.0)
        return None

    def _record_call(
        self, ticket: RedisTicket, keys: Sequence[ScopeKey] | None, now: float
    ) -> Call:
        """The ticket's part of the record script's arguments; `keys` None asks whether
        the origin is unhealthy, no keys only releases probe slots."""
        gens = ticket.generations or {}
        oh = origin_hash(ticket.facts.origin)
        args = [
            *self.head("record", now),
            oh,
            str(ticket.seq),
            ticket.token,
            str(len(ticket.probes)),
        ]
        for key in ticket.probes:
            args += (key.scope_id, str(gens.get(key, 0)))
        if keys is None:
            return Call([*args, "-1"], key=anchor(self.prefix, oh))
        args.append(str(len(keys)))
        for key in keys:
            args += (
                key.scope_id,
                str(gens.get(key, 0)),
                key.kind.value,
                key.origin,
                key.credential,
                key.model or key.endpoint,  # one of them, by kind
            )
        return Call(args, key=anchor(self.prefix, oh))

    # -- the views: of the whole store at once, or origin by origin ---------------------

    def _rows(self, op: str, now: float) -> Generator[Call, Any, list[Any]]:
        """`op`'s replies from every part of the store: with the store-wide index
        one call, else one call per origin that holds keys."""
        if self.index:
            return [(yield Call([*self.head(op, now), ""]))]
        replies = []
        for oh in (yield LIST_ORIGINS):
            replies.append((yield Call([*self.head(op, now), oh], key=anchor(self.prefix, oh))))
        return replies

    def _scopes(self) -> Generator[Call, Any, list[Any]]:
        return [row for reply in (yield from self._rows("snapshot", 0.0)) for row in reply[1]]

    def snapshot(self, now: float) -> Steps[list[ScopeStatus]]:
        replies = yield from self._rows("snapshot", now)
        statuses = []
        for server_now, rows in replies:
            shift = self.offset(float(server_now) - now)
            for sid, kind, origin, credential, model, state, reason, failures, r, w, _ in rows:
                s = State(state)
                until = float(r) - shift
                closed = s is State.CLOSED
                # when the current window began; unknown while open until cleared
                opened = None if closed or math.isinf(until) else until - float(w)
                statuses.append(
                    ScopeStatus(
                        scope_id=sid,
                        scope=scope_key(ScopeKind(kind), origin, credential, model),
                        state=s,
                        reason=reason or None,
                        failures=int(failures),
                        retry_at=0.0 if closed else until,
                        opened_at=opened,
                    )
                )
        return statuses

    def count(self) -> Steps[int]:
        return sum(int(n) for n in (yield from self._rows("count", 0.0)))

    def clear(self, scope_id: str) -> Steps[bool]:
        for row in (yield from self._scopes()):
            if row[0] == scope_id:
                oh = row[-1]
                cleared = yield Call([*self.head("clear", 0.0), oh, scope_id], key=self.at(oh))
                return bool(cleared)
        return False

    def origins(self) -> Steps[tuple[int, dict[str, int]]]:
        """The mirror's snapshot: the server's clock on the sequence's scale, and the
        origins with unhealthy scopes, each with its sequence."""
        # Without the index, the call with no origin still reads a server's clock.
        floor, sick = 0, dict[str, int]()
        replies = yield from self._rows("origins", 0.0)
        if not self.index:
            replies.append((yield Call([*self.head("origins", 0.0), ""])))
        for clock, rows in replies:
            floor = max(floor, int(clock))
            sick.update((oh, int(seq)) for oh, seq in rows)
        return floor, sick

    def drop(self, group: tuple[str, ...]) -> Call:
        """The call that gives back a lost admission's probe slots (its `Call.drop`)."""
        return Call([*self.head("drop", 0.0), *group], key=self.at(group[0]))

    def at(self, oh: str) -> str:
        return anchor(self.prefix, oh)

    def head(self, op: str, now: float) -> list[str]:
        return [
            op,
            self.prefix,
            repr(now),
            "1" if self.caller_clock else "0",
            self.ttl_ms,
            self.max,
            "1" if self.index else "0",
        ]

    # -- small helpers ------------------------------------------------------------

    def _note(self, origin: str, unhealthy: Any, seq: int) -> None:
        """Remember whether `origin` has unhealthy scopes, for the next admission's shape
        (and the mirror's view, `seq` being the reply's step of the sequence)."""
        if self.mirror is not None:
            self.mirror.saw(origin, bool(int(unhealthy)), seq)
        if int(unhealthy):
            if origin not in self.hot:
                if len(self.hot) >= _MAX_HOT:
                    self.hot.clear()
                self.hot[origin] = None
        else:
            self.hot.pop(origin, None)


def _token(keys: Sequence[ScopeKey]) -> str:
    """A name for one admission's probe leases (none needed without keys).

    Random per admission, so processes forked from one parent never share one.
    """
    return secrets.token_hex(8) if keys else ""
