"""Scenario 8, recovery: a primary down for 10 minutes, then healthy; how soon is it used again?

Simulated time: sidestep runs on a fake clock that the driver moves on, one
request every 4 s, through a real client and real upstreams on 127.0.0.1
whose answers follow the same clock (the primary answers 503 while down).
Two outages: a quick one (the 503 comes at once, as a refused connection
would) and a slow one (each failure costs its caller 10 simulated seconds, as
a `first_byte_timeout: 10s` would; the upstream moves the clock on before it
answers). Recovery is placed at several phases of the probe schedule (600 s
plus a few seconds), and each setting runs once per phase.

Reported per breaker setting (all with the LLM breaker of docs/sdks.md,
``failure_threshold: 3, cooldown: 30s``): probes that reached the dead
primary after its circuit opened, the caller time they cost, and the seconds
from recovery to the first request the primary served (median and worst over
the phases). The settings:

- ``sidestep``: the defaults (a quick failed probe reopens for ``cooldown``;
  one slower than ``slow_failure: 1s`` doubles the window, up to 10 min);
- ``every probe doubles``: ``slow_failure: 0``, the rule before it existed;
- ``lower cap, 2m``: every probe doubles, up to ``max_cooldown: 2m``;
- ``fixed 30s``: ``max_cooldown: 30s``, a fixed-cooldown breaker such as
  pybreaker's (peers cannot run on a fake clock, so sidestep stands in).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

import _bench as b
import sidestep
from _bench import Row

SCENARIO = "recovery"
OUTAGE = 600.0  # ten simulated minutes
EVERY = 4.0  # seconds between requests
COOLDOWN = 30.0
SLOW_COST = 10.0  # what one slow failure costs its caller
SETTINGS: dict[str, dict[str, Any]] = {
    "sidestep": {},
    "every probe doubles": {"slow_failure": 0},
    "lower cap, 2m": {"slow_failure": 0, "max_cooldown": 120},
    "fixed 30s": {"max_cooldown": COOLDOWN},
}
OUTAGES = {"quick": 0.0, "slow": SLOW_COST}


class Clock:
    """Simulated monotonic seconds, moved on by the driver and by a slow upstream."""

    def __init__(self) -> None:
        self._now = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


@dataclass
class Primary:
    """Down until `recovered_at`; each failure costs `cost` simulated seconds."""

    clock: Clock
    recovered_at: float = 0.0
    cost: float = 0.0
    down_calls: list[float] = field(default_factory=list)
    first_up: float | None = None

    def status(self) -> int:
        now = self.clock()
        if now < self.recovered_at:
            self.down_calls.append(now)
            self.clock.advance(self.cost)
            return 503
        if self.first_up is None:
            self.first_up = now
        return 200


@contextmanager
def serving(answer: Any) -> Iterator[str]:
    """An HTTP/1.1 server on 127.0.0.1 answering each request with `answer()`'s status."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            status = answer()
            body = b'{"ok":true}' if status == 200 else b'{"error":"unavailable"}'
            reason = "OK" if status == 200 else "Service Unavailable"
            self.wfile.write(
                f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )

        def log_message(self, *args: Any) -> None:
            pass  # a benchmark's upstream keeps quiet

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, *args: Any) -> None:
            pass  # a client that closed its pooled connection at the end of a run

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@dataclass
class Result:
    probes: int
    lost: float  # caller seconds spent on those probes
    lag: float  # seconds from recovery to the primary's first answer


def once(primary_url: str, backup_url: str, primary: Primary, breaker: dict[str, Any]) -> Result:
    """Drive one outage to the primary's first answer after recovery."""
    clock = primary.clock
    config = {
        "breaker": {"failure_threshold": b.THRESHOLD, "cooldown": COOLDOWN, **breaker},
        "routes": [
            {
                "name": "bench",
                "targets": [
                    {"name": "primary", "url": primary_url},
                    {"name": "backup", "url": backup_url},
                ],
            }
        ],
    }
    transport = sidestep.FailoverTransport(config, clock=clock)
    with httpx.Client(transport=transport, timeout=5.0) as client:
        while primary.first_up is None:
            began = clock()
            response = client.get(primary_url + "/items")
            if response.status_code != 200:
                raise RuntimeError(f"the fallback did not answer: {response.status_code}")
            clock.advance(max(0.0, began + EVERY - clock()))
            if clock() > primary.recovered_at + 2 * OUTAGE:
                raise RuntimeError("the primary was never used again")
    probes = len(primary.down_calls) - b.THRESHOLD
    return Result(probes, probes * primary.cost, primary.first_up - primary.recovered_at)


def run(quick: bool) -> list[Row]:
    phases = [0.0] if quick else [i * 4.5 for i in range(8)]  # recovery at 600 s + 0 … 31.5 s
    results: dict[tuple[str, str], list[Result]] = {}
    with b.quiet_logs(), serving(lambda: 200) as backup:
        for phase in phases:
            for outage, cost in OUTAGES.items():
                for name, breaker in SETTINGS.items():
                    clock = Clock()
                    primary = Primary(clock, clock() + OUTAGE + phase, cost)
                    with serving(primary.status) as url:
                        result = once(url, backup, primary, breaker)
                    results.setdefault((name, outage), []).append(result)

    table: dict[str, dict[str, float]] = {}
    for (name, outage), rs in results.items():
        subject = f"{name}, {outage} outage"
        table[subject] = {
            "probes while down": b.median(r.probes for r in rs),
            "caller time lost to probes": b.median(r.lost for r in rs),
            "primary back after (median)": b.median(r.lag for r in rs),
            "primary back after (worst)": max(r.lag for r in rs),
        }
    units = {
        "probes while down": "calls",
        "caller time lost to probes": "s",
        "primary back after (median)": "s",
        "primary back after (worst)": "s",
    }
    ours_quick = table["sidestep, quick outage"]
    ours_slow = table["sidestep, slow outage"]
    before_slow = table["every probe doubles, slow outage"]
    worst = ours_quick["primary back after (worst)"]
    return [
        *b.matrix(SCENARIO, table, units),
        b.verdict(
            SCENARIO,
            "after 10 min of quick failures, the primary is back within one cooldown "
            "(plus the wait for the next request)",
            worst,
            "s",
            worst <= COOLDOWN + EVERY,
            f"cooldown {COOLDOWN:g} s, one request every {EVERY:g} s, {len(phases)} phases",
        ),
        b.verdict(
            SCENARIO,
            "slow failures are probed no more often than when every probe doubled",
            ours_slow["probes while down"],
            "calls",
            ours_slow["probes while down"] <= before_slow["probes while down"],
            f"every probe doubles: {before_slow['probes while down']:g} calls; "
            f"each costs {SLOW_COST:g} s",
        ),
    ]
