"""`sidestep demo`: failover shown live against local upstreams, with nothing to set up.

With ``--plan FILE`` (and ``-c CONFIG``), a fault plan plays against the
configuration's own routes instead, each target a local upstream (`demo_plan`).

Four HTTP upstreams start inside this process on 127.0.0.1 — one healthy,
one answering 503, one that accepts and never answers, one that is down for
a few seconds and then comes back — and the same paced load goes through two
clients in turn: plain httpx with naive per-request failover, then sidestep.
Progress and each target's circuit are shown while it runs, and a summary
side by side at the end. This module is the command: its options and its
exit status; the upstreams, the load, the run and the view are modules of
their own (`demo_upstream`, `demo_load`, `demo_run`, `demo_view`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from .._common.errors import ConfigError
from .demo_plan import PlanSettings, load, play
from .demo_run import Settings, main
from .demo_view import View, quiet_logs

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to `parser` (the `sidestep demo` subcommand)."""
    parser.add_argument("--requests", type=int, default=300, help="requests per client")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight at once")
    parser.add_argument("--rate", type=float, default=60.0, help="requests started per second")
    parser.add_argument(
        "--timeout", type=float, default=0.5, help="client timeout in seconds (the stalled target)"
    )
    parser.add_argument(
        "--flap-down", type=float, default=3.0, help="seconds the flapping target stays down"
    )
    parser.add_argument(
        "--attempts",
        type=int,
        default=3,
        help="upstream calls one request may make, over all targets (both clients)",
    )
    parser.add_argument("--json", action="store_true", help="print only a JSON summary")
    parser.add_argument(
        "--plan",
        metavar="FILE",
        help="play this fault plan (seed:, faults:) against the routes of -c FILE instead, "
        "each target a local healthy upstream",
    )
    parser.add_argument(
        "-c",
        "--config",
        metavar="FILE",
        help="with --plan: the configuration whose routes the plan plays against "
        "(default: a route 'demo' of targets 'primary' and 'backup')",
    )


def run(args: argparse.Namespace) -> int:
    """Run the demo; the exit status (0, 2 for bad arguments, 130 when interrupted)."""
    if args.plan is not None:
        return _play(args)
    if args.config is not None:
        print("sidestep demo: -c/--config goes with --plan", file=sys.stderr)
        return 2
    settings = Settings(
        requests=args.requests,
        concurrency=args.concurrency,
        rate=args.rate,
        timeout=args.timeout,
        flap_down=args.flap_down,
        attempts=args.attempts,
    )
    if (
        min(settings.requests, settings.concurrency, settings.attempts) < 1
        or min(settings.rate, settings.timeout) <= 0
    ):
        print("sidestep demo: counts, rate and timeout must be positive", file=sys.stderr)
        return 2
    view = View(sys.stdout, quiet=args.json)
    return _shown(view, lambda: main(settings, view), view.summary if not args.json else None)


def _shown(
    view: View,
    run: Callable[[], Coroutine[Any, Any, dict[str, Any]]],
    summary: Callable[[dict[str, Any]], None] | None,
) -> int:
    """Run the demo's coroutine, its logs kept quiet; then its summary, or its figures as
    JSON (no `summary`). The exit status: 0, or 130 when interrupted."""
    try:
        with quiet_logs():
            result = asyncio.run(run())
    except KeyboardInterrupt:
        view.restore()
        print("\ninterrupted", file=sys.stderr)
        return 130
    view.restore()
    if summary is None:
        print(json.dumps(result, indent=2))
    else:
        summary(result)
    return 0


def _play(args: argparse.Namespace) -> int:
    """`--plan FILE`: the plan against the configuration's routes, each target local."""
    settings = PlanSettings(
        plan=args.plan,
        config=args.config,
        requests=args.requests,
        concurrency=args.concurrency,
        rate=args.rate,
        timeout=args.timeout,
    )
    counts = min(settings.requests, settings.concurrency)
    if counts < 1 or min(settings.rate, settings.timeout) <= 0:
        print("sidestep demo: counts, rate and timeout must be positive", file=sys.stderr)
        return 2
    try:
        loaded = load(settings)
    except ConfigError as exc:
        print(f"sidestep demo: {exc}", file=sys.stderr)
        return 2
    if loaded.chaos_left_out:  # on stderr: --json keeps stdout to the figures
        print(
            f"sidestep demo: {settings.config}: its chaos: section is not used by the demo "
            "(only the plan's faults are injected)",
            file=sys.stderr,
        )
    view = View(sys.stdout, quiet=args.json)
    summary = _plan_summary if not args.json else None
    return _shown(view, lambda: play(settings, loaded.config, loaded.plan, view), summary)


def _plan_summary(result: dict[str, Any]) -> None:
    rows = [
        ("requests", result["requests"]),
        ("errors seen by the caller", result["errors"]),
        ("failovers", result["failovers"]),
        ("faults injected", _by_target(result["faults_injected"])),
        ("circuit openings", _by_target(result["circuit_openings"])),
        ("calls skipped (circuit open)", _by_target(result["skipped"])),
        ("upstream calls", _by_target(result["upstream_calls"])),
    ]
    print()
    for label, value in rows:
        print(f"{label:<30}{value}")


def _by_target(counts: object) -> str:
    if not isinstance(counts, dict) or not counts:
        return "none"
    return ", ".join(f"{target} {n}" for target, n in counts.items())
