"""Which fault, if any, an attempt gets: a fault plan's decision, sans I/O.

An `Injector` holds a plan's rules (`_settings.faults.FaultRule`) in order,
with what each has spent, and picks the first that applies to an attempt
(`pick`): its route and target as the loop sent it (`ATTEMPT`, an extension
of the attempt's request that the layer takes off: a URL may be several
targets'), the time and the random draw handed in. The shell under the transport
(`_shells.faults`) performs what was picked, and marks what it made
(`mark`), so the loop can tell an injected result from the upstream's own
(`injected`): one the plan does not count is recorded against no circuit.
Nothing here sleeps, reads a clock or draws a number of its own.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._settings.faults import FaultRule
from ..logging import emit

__all__ = ["ATTEMPT", "FAULT_KEY", "Injection", "Injector", "injected", "made_answer", "mark"]

ATTEMPT = "sidestep.attempt"
"""The extension of an attempt's request that names its (route, target), set only while
a fault plan is under the transport; the plan's layer takes it off before sending."""

FAULT_KEY = "sidestep.fault"
"""Where an injected result carries its `Injection`: a response's extensions key, and
the attribute of an exception (the same name)."""
_ATTRIBUTE = "sidestep_fault"

_JSON = ("content-type", "application/json")
_MESSAGE = "sidestep injected this fault"


@dataclass(frozen=True, slots=True)
class Injection:
    """One fault picked for one attempt, and whom it was picked for."""

    rule: FaultRule
    route: str | None
    target: str | None

    @property
    def fault(self) -> str:
        return self.rule.fault

    @property
    def sends(self) -> bool:
        """Whether the attempt still goes to the upstream (the fault spoils its answer)."""
        return self.rule.fault in ("cut_stream", "stalled_stream")

    def counted(self, local: bool) -> bool:
        """Whether the result counts against the target's circuit: as the rule says, else
        only in a store of this process (`local`)."""
        return local if self.rule.count is None else self.rule.count


class Injector:
    """A plan's rules, in order, with when each was added and how often it has fired."""

    __slots__ = ("_lock", "_rules", "history")

    def __init__(self, *, keep: bool = False) -> None:
        self._lock = threading.Lock()
        self._rules: list[list[Any]] = []  # [rule, added at, fired]
        # every injection picked, in order, when kept (a test plan's; never chaos's)
        self.history: list[Injection] | None = [] if keep else None

    def __repr__(self) -> str:
        return f"Injector(rules={len(self._rules)})"

    def add(self, rule: FaultRule, now: float) -> None:
        """Add `rule` after the others; its `for` window starts at `now`."""
        with self._lock:
            self._rules.append([rule, now, 0])

    def add_all(self, rules: Sequence[FaultRule], now: float) -> None:
        for rule in rules:
            self.add(rule, now)

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    @property
    def rules(self) -> tuple[FaultRule, ...]:
        with self._lock:
            return tuple(entry[0] for entry in self._rules)

    def pick(
        self, where: tuple[str, str] | None, now: float, draw: Callable[[], float]
    ) -> Injection | None:
        """The fault for an attempt on `where` (its route and target, as the loop sent it;
        None: unrouted) at `now`, or None.

        The first rule that selects the attempt's route and target, is within
        its `for` window and has `times` left, and whose `rate` the draw falls
        under, fires (a draw is taken only for a rule with a rate). Told as a
        ``fault.injected`` event.
        """
        if where is None:
            return None  # unrouted: no plan applies
        route, target = where
        chosen: Injection | None = None
        with self._lock:
            for entry in self._rules:
                rule, added, fired = entry
                if (rule.route is not None and rule.route != route) or (
                    rule.target is not None and rule.target != target
                ):
                    continue
                if rule.duration is not None and now - added >= rule.duration:
                    continue
                if rule.times is not None and fired >= rule.times:
                    continue
                if rule.rate is not None and draw() >= rule.rate:
                    continue
                entry[2] = fired + 1
                chosen = Injection(rule, route, target)
                if self.history is not None:
                    self.history.append(chosen)
                break
        if chosen is not None:
            emit("fault.injected", route=route, target=target, fault=chosen.rule.label)
        return chosen


def mark(result: Any, injection: Injection) -> Any:
    """Mark `result` (a response or an exception) as made by `injection`; return it."""
    if isinstance(result, BaseException):
        setattr(result, _ATTRIBUTE, injection)
    else:
        result.extensions[FAULT_KEY] = injection
    return result


def injected(result: Any) -> Injection | None:
    """The injection that made `result` (a response or an exception), if one did."""
    if isinstance(result, BaseException):
        found = getattr(result, _ATTRIBUTE, None)
    else:
        extensions = getattr(result, "extensions", None)
        found = extensions.get(FAULT_KEY) if isinstance(extensions, dict) else None
    return found if isinstance(found, Injection) else None


def made_answer(injection: Injection) -> tuple[int, list[tuple[str, str]], bytes]:
    """The status, headers and body of an answer a fault makes up (no upstream called):
    an error status, a malformed 200 body, or a 200 event stream opening with an error."""
    rule = injection.rule
    if rule.fault == "status":
        status = rule.status or 503
        headers = [_JSON]
        if rule.retry_after is not None:
            headers.append(("retry-after", str(math.ceil(rule.retry_after))))
            headers.append(("retry-after-ms", str(round(rule.retry_after * 1000))))
        kind = "rate_limit_error" if status == 429 else "injected_fault"
        body = f'{{"error": {{"type": "{kind}", "message": "{_MESSAGE}"}}}}'
        return status, headers, body.encode()
    if rule.fault == "malformed_body":
        return 200, [_JSON], b'{"id": "injected", "object": "chat.completion", "choices": [{"'
    # error_event: one error event, in a form each streaming dialect reads as its error
    error = f'{{"type": "error", "error": {{"type": "{rule.error}", "message": "{_MESSAGE}"}}}}'
    event = f"event: error\ndata: {error}\n\n".encode()
    return 200, [("content-type", "text/event-stream"), ("cache-control", "no-cache")], event
