"""Prove failover: fault plans that make chosen targets fail, in tests and in staging.

A `FaultPlan` holds rules — a fault (`status`, `timeout`, `connect_error`,
`malformed_body`, `cut_stream`, `stalled_stream`, `error_event`), the targets
and routes it applies to, and when (`times`, `duration`, `rate`) — and is put
under sidestep transports: those given to `apply` (a transport, or a client
`wrap()` or `install()` put sidestep under), and, with `everywhere`, every one
the process builds while the plan is on. The plan sits between each transport
and the network, so routes, circuits, stores, events and metrics all run for
real. Importable without pytest; the pytest plugin is `sidestep.testing.plugin`.

Example:
    >>> plan = FaultPlan(seed=0).inject(status(503), target="primary", times=3)
    >>> with plan.apply(transport):
    ...     client.get(url)  # the primary answers 503: the backup answers instead
"""

from __future__ import annotations

import gc
import random
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from pydantic import ValidationError

from .._common.errors import ConfigError
from .._core.faults import Injection, Injector
from .._settings.config import load_plan, unknown_names
from .._settings.faults import FaultPlanFile, FaultRule
from .._shells import faults as _layer
from .._shells.shell import Shell

__all__ = [
    "Fault",
    "FaultPlan",
    "Injected",
    "connect_error",
    "cut_stream",
    "error_event",
    "malformed_body",
    "reset_circuits",
    "stalled_stream",
    "status",
    "timeout",
    "track",
    "tracked",
]


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault and its settings, as `FaultPlan.inject` takes it (made by the functions below)."""

    kind: str
    settings: Mapping[str, Any] = field(default_factory=dict)


def status(code: int, *, retry_after: float | None = None) -> Fault:
    """The target answers `code` (400 to 599) without being called; `retry_after` (seconds)
    adds ``Retry-After`` and ``retry-after-ms``, as a 429 or a 503 may carry them."""
    settings: dict[str, Any] = {"status": code}
    if retry_after is not None:
        settings["retry_after"] = retry_after
    return Fault("status", settings)


def timeout(*, delay: float = 0.0) -> Fault:
    """The request was sent and no answer came in time: a read timeout, raised after
    `delay` seconds (at once by default). Ambiguous: it fails over for idempotent
    requests, those with an ``Idempotency-Key``, or with ``retry_ambiguous``."""
    return Fault("timeout", {"delay": delay} if delay else {})


def connect_error() -> Fault:
    """The target cannot be reached: a connection failure, nothing sent."""
    return Fault("connect_error")


def malformed_body() -> Fault:
    """The target answers 200 with a JSON body cut short (which `commit: complete` checks)."""
    return Fault("malformed_body")


def cut_stream(*, after_bytes: int = 0) -> Fault:
    """The target is called, and its body is cut after `after_bytes` bytes (0: before the
    first, so the request still fails over; later, the caller sees the cut)."""
    return Fault("cut_stream", {"after_bytes": after_bytes} if after_bytes else {})


def stalled_stream(*, after_bytes: int = 0) -> Fault:
    """The target is called, and its body goes silent after `after_bytes` bytes until the
    attempt's read timeout (or the route's stall or first-byte limit) ends it."""
    return Fault("stalled_stream", {"after_bytes": after_bytes} if after_bytes else {})


def error_event(error: str = "overloaded_error") -> Fault:
    """The target answers 200 with an event stream whose first event is an error of type
    `error` (``overloaded_error`` is judged as a 529, ``rate_limit_error`` as a 429)."""
    return Fault("error_event", {"error": error})


@dataclass(frozen=True, slots=True)
class Injected:
    """One fault a plan injected: the route, the target and the fault (`FaultRule.label`)."""

    route: str | None
    target: str | None
    fault: str


# -- the transports the process builds ------------------------------------------------------

_tracked: weakref.WeakSet[Shell] = weakref.WeakSet()
_tracking_lock = threading.Lock()


def _track(shell: Shell) -> None:
    with _tracking_lock:
        _tracked.add(shell)


def track() -> None:
    """Keep (weakly) every sidestep transport built from now on, for `tracked`,
    `reset_circuits` and `FaultPlan.everywhere` (the pytest plugin calls it at start-up)."""
    with _tracking_lock:
        if _track not in _layer.BUILT:
            _layer.BUILT.append(_track)


def tracked() -> list[Shell]:
    """The sidestep transports built since `track()` that are still alive."""
    with _tracking_lock:
        return list(_tracked)


def reset_circuits(*transports: Any) -> int:
    """Close every open or half-open scope of `transports` (default: every `tracked` one);
    the number cleared. Each clear is told as ``suspension.cleared``, as any clear is."""
    shells = _shells_of(transports) if transports else tracked()
    cleared = 0
    for shell in shells:
        for suspension in shell.suspensions():
            cleared += shell.clear(suspension.scope_id)
    return cleared


# -- the plan -------------------------------------------------------------------------------


class FaultPlan:
    """Rules of faults, put under sidestep transports (`apply`, `everywhere`).

    Rules are tried in the order they were added; the first that applies to an
    attempt injects its fault. A rule's `duration` counts from when it was
    added, on the plan's `clock`; its `rate` draws from the plan's random
    numbers, seeded by `seed`, so a run is the same every time. `injected`
    lists what was injected while the plan was on. A plan is a context
    manager: leaving it takes it off every transport (`remove`).
    """

    def __init__(self, *, seed: int | None = 0, clock: Callable[[], float] | None = None) -> None:
        self._injector = Injector(keep=True)
        self._clock: Callable[[], float] = clock or time.monotonic
        self._draw = random.Random(seed).random  # noqa: S311  # faults, not cryptography
        self._lock = threading.Lock()
        self._shells: weakref.WeakSet[Shell] = weakref.WeakSet()

    def __repr__(self) -> str:
        return f"FaultPlan(rules={len(self._injector.rules)}, transports={len(self._shells)})"

    @classmethod
    def from_file(cls, path: Any, *, clock: Callable[[], float] | None = None) -> FaultPlan:
        """A plan from a YAML file of ``seed:`` and ``faults:`` (the rules of `chaos:`).

        Raises:
            ConfigError: the file cannot be read or holds an invalid rule.
        """
        return cls.from_document(load_plan(path), clock=clock)

    @classmethod
    def from_document(
        cls, document: FaultPlanFile, *, clock: Callable[[], float] | None = None
    ) -> FaultPlan:
        plan = cls(seed=document.seed, clock=clock)
        for rule in document.faults:
            plan.add(rule)
        return plan

    @property
    def rules(self) -> tuple[FaultRule, ...]:
        return self._injector.rules

    @property
    def injected(self) -> list[Injected]:
        """Every fault the plan injected so far, in order."""
        history: list[Injection] = self._injector.history or []
        return [Injected(i.route, i.target, i.rule.label) for i in list(history)]

    def inject(
        self,
        fault: Fault,
        *,
        target: str | None = None,
        route: str | None = None,
        times: int | None = None,
        duration: float | None = None,
        rate: float | None = None,
        count: bool | None = None,
    ) -> FaultPlan:
        """Add a rule: `fault` for the attempts on `target` (of `route`), the first `times`
        of them, for `duration` seconds from now, at `rate` (0 to 1); `count` says whether
        it counts against the target's circuit (left out: in a store of this process, yes).
        Returns the plan, so rules can be chained.

        A rule's `route` and `target` need only be known to one of the transports the
        plan is under (after `everywhere`, one of those alive); they are not checked while
        the plan is under none.

        Raises:
            ConfigError: an invalid setting (the message names it), or a route or target
                that none of the transports the plan is under has.
        """
        given = {
            "target": target,
            "route": route,
            "times": times,
            "for": duration,
            "rate": rate,
            "count": count,
        }
        document = {
            "fault": fault.kind,
            **fault.settings,
            **{key: value for key, value in given.items() if value is not None},
        }
        return self.add(_rule(document))

    def add(self, rule: FaultRule) -> FaultPlan:
        """Add a rule made already (from a file, or `FaultRule.model_validate`).

        Raises:
            ConfigError: the rule names a route or target that none of the transports the
                plan is under has (under none yet, nothing is checked).
        """
        unknown = self._unknown(rule)
        if unknown is not None:
            raise ConfigError(f"fault plan rule: {unknown}")
        self._injector.add(rule, self._clock())
        return self

    def clear(self) -> None:
        """Drop every rule (the plan stays where it was applied, injecting nothing)."""
        self._injector.clear()

    def apply(self, *transports: Any) -> FaultPlan:
        """Put the plan under each of `transports`: a sidestep transport, or an httpx or
        httpx2 client with sidestep under it (`wrap()`, `install()`; every mount too).

        Raises:
            TypeError: one of them has no sidestep transport.
            ConfigError: a rule names a route or target that the configuration of one of
                `transports` does not have (each is checked on its own).
        """
        shells = _shells_of(transports)
        for shell in shells:
            for rule in self._injector.rules:
                _check_names(rule, shell)
        for shell in shells:
            self._put(shell)
        return self

    def everywhere(self) -> FaultPlan:
        """Put the plan under every sidestep transport `tracked` now, and every one built
        until it is removed (`install()`'s clients and `sidestep run`'s included). A rule
        added from then on needs its route and target known to one of those alive when it
        is added; the rules the plan has already are not checked again."""
        track()
        with self._lock:
            if self._on_built not in _layer.BUILT:
                _layer.BUILT.append(self._on_built)
        for shell in tracked():
            self._put(shell)
        return self

    def remove(self) -> None:
        """Take the plan off every transport it is under; stop putting it under new ones."""
        with self._lock:
            if self._on_built in _layer.BUILT:
                _layer.BUILT.remove(self._on_built)
            shells, self._shells = list(self._shells), weakref.WeakSet()
        for shell in shells:
            _layer.take_out(shell, self._injector)

    def reset_circuits(self) -> int:
        """Close every open or half-open scope of the transports the plan is under."""
        with self._lock:
            shells = list(self._shells)
        return reset_circuits(*shells)

    def __enter__(self) -> FaultPlan:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.remove()

    def _unknown(self, rule: FaultRule) -> str | None:
        """Why no transport the plan is under knows `rule`'s route or target; None when one
        of them does, or when the plan is under none (its names cannot be checked yet).
        Transports no longer referenced but not collected yet do not count: a rule is
        never refused for the configuration of an earlier test's garbage."""
        with self._lock:
            known = not self._shells or any(_knows(shell, rule) for shell in self._shells)
        if known:
            return None
        gc.collect()  # a refusal must not depend on when garbage was last collected
        with self._lock:
            shells = list(self._shells)
        if not shells:
            return None
        if len(shells) == 1:
            return _problem(shells[0], rule)
        return f"none of the {len(shells)} sidestep transports the plan is under has {_named(rule)}"

    def _on_built(self, shell: Shell) -> None:
        self._put(shell)

    def _put(self, shell: Shell) -> None:
        with self._lock:
            if shell in self._shells:
                return
            self._shells.add(shell)
        _layer.put_under(shell, self._injector, self._clock, self._draw)


def _rule(document: dict[str, Any]) -> FaultRule:
    try:
        return FaultRule.model_validate(document)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'the rule'}: "
            + e["msg"].removeprefix("Value error, ")
            for e in exc.errors(include_input=False, include_url=False)
        )
        raise ConfigError(f"fault plan: {problems}") from None


def _check_names(rule: FaultRule, shell: Shell) -> None:
    problem = _problem(shell, rule)
    if problem is not None:
        raise ConfigError(f"fault plan rule: {problem}")


def _problem(shell: Shell, rule: FaultRule) -> str | None:
    """Why `shell`'s configuration does not have `rule`'s route or target; None if it does."""
    try:
        unknown_names(FaultPlanFile(faults=[rule]), shell.config.routes, "rule")
    except ValueError as exc:
        return str(exc).removeprefix("rule[0]: ")
    return None


def _knows(shell: Shell, rule: FaultRule) -> bool:
    return _problem(shell, rule) is None


def _named(rule: FaultRule) -> str:
    """The route or target a rule names, as a refusal says it: ``a target 'x' in route 'y'``."""
    if rule.target is None:
        return f"a route {rule.route!r}"
    within = f" in route {rule.route!r}" if rule.route is not None else ""
    return f"a target {rule.target!r}{within}"


def _shells_of(transports: tuple[Any, ...]) -> list[Shell]:
    """The sidestep transports of `transports`: each one, or each of a client's slots."""
    shells: list[Shell] = []
    for transport in transports:
        if isinstance(transport, Shell):
            shells.append(transport)
            continue
        slots = [getattr(transport, "_transport", None)]
        slots += list((getattr(transport, "_mounts", None) or {}).values())
        found = [slot for slot in slots if isinstance(slot, Shell)]
        if not found:
            raise TypeError(
                f"{type(transport).__name__} has no sidestep transport: give a sidestep "
                "transport, or a client that wrap() or install() put sidestep under"
            )
        shells.extend(found)
    return shells
