"""The demo's run: the same paced load through plain httpx, then through sidestep.

`main` starts the four local upstreams, runs each client's phase while the
view shows its progress, stops the upstreams, and hands back the figures
both clients are compared by (a summary `view.summary` or `--json` prints).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from .. import logging as events
from .._shells.transport import AsyncFailoverTransport
from .demo_load import Call, Phase, Tally, drive, naive, through
from .demo_upstream import LocalUpstream, Mode
from .demo_view import View

__all__ = ["Settings", "main", "run_phase"]

_PATH = "/v1/items"
_COOLDOWN = 1.0  # seconds: short, so the flapping target's recovery is seen within the run
_MAX_COOLDOWN = 4.0
_HEALTHY_DELAY = 0.002  # seconds a healthy upstream takes to answer, as a real one would
_FRAME = 0.1  # seconds between redraws of the live table


@dataclass(frozen=True, slots=True)
class Settings:
    requests: int
    concurrency: int
    rate: float
    timeout: float
    flap_down: float
    attempts: int


def _upstreams() -> list[LocalUpstream]:
    return [
        LocalUpstream("broken", Mode.UNAVAILABLE),
        LocalUpstream("stalled", Mode.STALLED),
        LocalUpstream("flapping", Mode.FLAPPING, delay=_HEALTHY_DELAY),
        LocalUpstream("healthy", Mode.HEALTHY, delay=_HEALTHY_DELAY),
    ]


def _config(upstreams: list[LocalUpstream], attempts: int) -> dict[str, Any]:
    return {
        "breaker": {
            "failure_threshold": 3,
            "cooldown": _COOLDOWN,
            "max_cooldown": _MAX_COOLDOWN,
            "half_open_probes": 1,
        },
        "failover": {"max_total_attempts": attempts},
        "routes": [
            {
                "name": "demo",
                "targets": [{"name": u.name, "url": u.url + "/v1"} for u in upstreams],
            }
        ],
    }


def _wasted(upstreams: list[LocalUpstream]) -> int:
    """Upstream calls that could not have helped: every call that reached a target while down."""
    return sum(u.calls_while_down for u in upstreams)


async def run_phase(
    phase: Phase,
    call: Call,
    upstreams: list[LocalUpstream],
    view: View,
    *,
    concurrency: int,
    rate: float,
    down_for: float = 0.0,
) -> None:
    """One client's paced load (`drive`), shown as it goes; the upstreams' counts reset
    first (a flapping one down for `down_for` seconds)."""
    for upstream in upstreams:
        upstream.reset(down_for=down_for)
    load = asyncio.ensure_future(drive(call, phase.tally, concurrency=concurrency, rate=rate))
    try:
        while not load.done():
            _observe(phase, upstreams)
            view.show(phase, upstreams)
            await asyncio.wait({load}, timeout=_FRAME)
        await load
    finally:
        if not load.done():
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load
    _observe(phase, upstreams)
    view.show(phase, upstreams, final=True)


def _observe(phase: Phase, upstreams: list[LocalUpstream]) -> None:
    phase.calls = {u.name: u.calls for u in upstreams}
    phase.wasted = _wasted(upstreams)


async def main(settings: Settings, view: View) -> dict[str, Any]:
    upstreams = _upstreams()
    timeout = httpx.Timeout(settings.timeout)
    limits = httpx.Limits(max_connections=settings.concurrency * len(upstreams))
    plain = Phase("plain httpx, naive failover", Tally(settings.requests))
    guarded = Phase("sidestep", Tally(settings.requests))

    def count(event: str, fields: Mapping[str, Any], /) -> None:
        target = fields.get("target")
        if not isinstance(target, str):
            return
        if event == "circuit.half_open":
            guarded.probes[target] = guarded.probes.get(target, 0) + 1
        elif event == "candidate.skipped":
            guarded.skipped[target] = guarded.skipped.get(target, 0) + 1

    try:
        for upstream in upstreams:
            await upstream.start()
        view.started(upstreams, settings.attempts)
        urls = [u.url + _PATH for u in upstreams]  # the ports are known once started
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            call = naive(client, urls[: settings.attempts])
            await run_phase(plain, call, upstreams, view, **_pace(settings))
        transport = AsyncFailoverTransport(
            _config(upstreams, settings.attempts), transport=httpx.AsyncHTTPTransport(limits=limits)
        )
        guarded.transport = transport
        events.add_observer(count)
        try:
            async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:
                call = through(client, urls[0])
                await run_phase(guarded, call, upstreams, view, **_pace(settings))
        finally:
            events.remove_observer(count)
    finally:
        for upstream in upstreams:
            await upstream.stop()
    return _summary(settings, plain, guarded)


def _pace(settings: Settings) -> dict[str, Any]:
    return {
        "concurrency": settings.concurrency,
        "rate": settings.rate,
        "down_for": settings.flap_down,
    }


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _figures(phase: Phase) -> dict[str, Any]:
    tally = phase.tally
    end = tally.finished if tally.finished is not None else tally.started
    return {
        "requests": tally.done,
        "errors": tally.errors,
        "wasted_calls": phase.wasted,
        "p50_ms": round(_percentile(tally.latencies, 0.50) * 1000, 1),
        "p99_ms": round(_percentile(tally.latencies, 0.99) * 1000, 1),
        "wall_s": round(end - tally.started, 2),
        "upstream_calls": dict(phase.calls),
    }


def _summary(settings: Settings, naive: Phase, guarded: Phase) -> dict[str, Any]:
    return {
        "requests": settings.requests,
        "concurrency": settings.concurrency,
        "timeout_s": settings.timeout,
        "attempts": settings.attempts,
        "naive": _figures(naive),
        "sidestep": {**_figures(guarded), "probes": dict(guarded.probes)},
    }
