"""`sidestep demo --plan FILE`: a fault plan played against a configuration, locally.

Each target of the configuration (``-c FILE``; a route ``demo`` of ``primary``
then ``backup`` without one) gets a healthy upstream of its own on 127.0.0.1,
at the target's path; the plan's faults are put between sidestep and those
upstreams, and a paced load goes through the routes. The circuits, failovers
and faults are shown as they happen, with a summary at the end: the user
watches their own breaker and failover settings handle the outage the plan
describes. Nothing leaves the machine: the configuration's store, chaos and
metrics settings are left out (its ``chaos:`` section before the file is
validated, so it needs no ``SIDESTEP_ALLOW_CHAOS`` and injects nothing).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from .. import logging as events
from .._common.errors import ConfigError
from .._core.faults import Injector
from .._settings.config import (
    Config,
    as_config,
    load_config_without_chaos,
    load_plan,
    unknown_names,
)
from .._settings.faults import FaultPlanFile
from .._settings.observability import Observability
from .._settings.stores import StoreSettings
from .._shells.faults import put_under
from .._shells.transport import AsyncFailoverTransport
from .demo_load import Phase, Tally, through
from .demo_run import run_phase
from .demo_upstream import LocalUpstream, Mode
from .demo_view import View

__all__ = ["Loaded", "PlanSettings", "demo_config", "load", "local_config", "play"]

_PATH = "/demo"  # what each request asks for, under its route's first target
_HEALTHY_DELAY = 0.002  # seconds an upstream takes to answer, as a real one would
DEMO = {
    "routes": [
        {
            "name": "demo",
            "targets": [
                {"name": "primary", "url": "http://primary.invalid/v1"},
                {"name": "backup", "url": "http://backup.invalid/v1"},
            ],
        }
    ]
}


@dataclass(frozen=True, slots=True)
class PlanSettings:
    plan: str
    config: str | None
    requests: int
    concurrency: int
    rate: float
    timeout: float


@dataclass(frozen=True, slots=True)
class Loaded:
    """What the demo plays: the configuration (its ``chaos:`` left out), the plan, and
    whether the configuration file had a ``chaos:`` section (which the demo does not use)."""

    config: Config
    plan: FaultPlanFile
    chaos_left_out: bool = False


def demo_config() -> Config:
    """The configuration a plan plays against without ``-c``: ``demo``: primary, backup."""
    return as_config(DEMO)


def local_config(config: Config, upstreams: Mapping[tuple[str, str], LocalUpstream]) -> Config:
    """`config` with each target's URL moved to its local upstream (same path), in memory,
    without chaos and without metrics."""
    routes = []
    for route in config.routes:
        targets = []
        for target in route.targets:
            path = urlsplit(target.url).path.rstrip("/")
            url = upstreams[(route.name, target.name)].url + path
            targets.append(target.model_copy(update={"url": url}))
        routes.append(route.model_copy(update={"targets": targets}))
    update = {
        "routes": routes,
        "store": StoreSettings(),
        "chaos": None,
        "observability": Observability(),
    }
    return config.model_copy(update=update)


def load(settings: PlanSettings) -> Loaded:
    """The configuration and the plan, the plan's names checked against its routes. The
    configuration file's ``chaos:`` section is left out before it is validated: the demo
    injects the plan's faults only, and needs no ``SIDESTEP_ALLOW_CHAOS``.

    Raises:
        ConfigError: either file is unreadable or invalid, or the plan names a route
            or target the configuration does not have.
    """
    if settings.config:
        config, chaos_left_out = load_config_without_chaos(settings.config)
    else:
        config, chaos_left_out = demo_config(), False
    if not config.routes:
        raise _config_error(settings.config or "the demo", "the configuration has no routes")
    plan = load_plan(settings.plan)
    try:
        unknown_names(plan, config.routes, "faults")
    except ValueError as exc:
        raise _config_error(settings.plan, str(exc)) from None
    return Loaded(config, plan, chaos_left_out)


def _config_error(source: str, reason: str) -> Exception:
    return ConfigError(f"{source}: {reason}")


async def play(
    settings: PlanSettings, config: Config, plan: FaultPlanFile, view: View
) -> dict[str, Any]:
    """Start the upstreams, play the plan under the load, stop them; the summary's figures."""
    upstreams = {
        (route.name, target.name): LocalUpstream(
            target.name, Mode.HEALTHY, delay=_HEALTHY_DELAY, behaviour=_behaviour(plan, target.name)
        )
        for route in config.routes
        for target in route.targets
    }
    shown = list({u.name: u for u in upstreams.values()}.values())
    phase = Phase("sidestep under the plan", Tally(settings.requests))
    counts: dict[str, dict[str, int]] = {"faults": {}, "answered": {}, "openings": {}}
    failovers = [0]

    def count(event: str, fields: Mapping[str, Any], /) -> None:
        target = fields.get("target")
        if not isinstance(target, str):
            return
        if event == "fault.injected":
            _bump(counts["faults"], target)
        elif event == "circuit.opened":
            _bump(counts["openings"], target)
        elif event == "failover":
            failovers[0] += 1
        elif event == "candidate.skipped":
            _bump(phase.skipped, target)
        elif event == "circuit.half_open":
            _bump(phase.probes, target)

    try:
        for upstream in upstreams.values():
            await upstream.start()
        local = local_config(config, upstreams)
        limits = httpx.Limits(max_connections=settings.concurrency * len(upstreams))
        transport = AsyncFailoverTransport(local, transport=httpx.AsyncHTTPTransport(limits=limits))
        injector = Injector()
        loop = asyncio.get_running_loop()
        injector.add_all(plan.faults, loop.time())
        draw = random.Random(plan.seed).random  # noqa: S311  # a demo's faults, not cryptography
        put_under(transport, injector, loop.time, draw)
        phase.transport = transport
        view.started(shown, local.failover.max_total_attempts)
        urls = [route.targets[0].url + _PATH for route in local.routes]
        events.add_observer(count)
        try:
            async with httpx.AsyncClient(
                transport=transport, timeout=httpx.Timeout(settings.timeout)
            ) as client:
                calls = [through(client, url) for url in urls]
                turn = [0]

                async def call() -> bool:  # the routes in turn
                    turn[0] += 1
                    return await calls[turn[0] % len(calls)]()

                pace = settings.concurrency, settings.rate
                await run_phase(phase, call, shown, view, concurrency=pace[0], rate=pace[1])
        finally:
            events.remove_observer(count)
    finally:
        for upstream in upstreams.values():
            await upstream.stop()
    tally = phase.tally
    return {
        "requests": tally.done,
        "errors": tally.errors,
        "failovers": failovers[0],
        "faults_injected": counts["faults"],
        "circuit_openings": counts["openings"],
        "upstream_calls": dict(phase.calls),
        "skipped": dict(phase.skipped),
    }


def _bump(counter: dict[str, int], key: str) -> None:
    counter[key] = counter.get(key, 0) + 1


def _behaviour(plan: FaultPlanFile, target: str) -> str:
    """What the view says of a target: healthy, and the plan's faults for it."""
    faults = [r.label for r in plan.faults if r.target in (None, target)]
    return "healthy" + (f" + {', '.join(dict.fromkeys(faults))}" if faults else "")
