"""`sidestep demo`: failover shown live against local upstreams, with nothing to set up.

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


def run(args: argparse.Namespace) -> int:
    """Run the demo; the exit status (0, 2 for bad arguments, 130 when interrupted)."""
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
    try:
        with quiet_logs():
            result = asyncio.run(main(settings, view))
    except KeyboardInterrupt:
        view.restore()
        print("\ninterrupted", file=sys.stderr)
        return 130
    view.restore()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        view.summary(result)
    return 0
