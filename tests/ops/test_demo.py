"""`sidestep demo`: it runs, reports, beats the naive client, and stops cleanly on Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from upstream import IN_TIME

SRC = Path(__file__).resolve().parents[2] / "src"
# Small counts and short timeouts: the whole demo in a couple of seconds.
SMALL = [
    "--requests",
    "40",
    "--concurrency",
    "8",
    "--rate",
    "100",
    "--timeout",
    "0.2",
    "--flap-down",
    "1.0",
]
# The demo as a terminal starts it: Ctrl-C interrupts it even when this test run was
# started in the background, where the shell had it inherit SIGINT ignored.
LAUNCH = (
    "import signal\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "import argparse, sys\n"
    "from sidestep._ops import demo as _demo\n"
    "parser = argparse.ArgumentParser()\n"
    "_demo.add_arguments(parser)\n"
    "sys.exit(_demo.run(parser.parse_args(sys.argv[1:])))\n"
)


def _demo(*args: str, **popen: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(  # noqa: S603 - our own interpreter, our own code
        [sys.executable, "-c", LAUNCH, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,  # type: ignore[call-overload]
    )


# The comparison holds however busy the machine: the flapping target stays down for the
# whole run, so each naive request fails on its three calls, one of them waiting out the
# stalled target; the client's timeout is one the healthy target always meets, so that
# sidestep's circuits open only on the three targets that are down, and most of its
# requests (all but the first eight and a probe or two of the stalled target) skip them.
COMPARED = [
    "--requests",
    "40",
    "--concurrency",
    "8",
    "--rate",
    "100",
    "--timeout",
    str(IN_TIME),
    "--flap-down",
    "600",
]


def test_json_summary_shows_sidestep_wasting_less_and_failing_less() -> None:
    """With --json the demo exits 0 and prints both clients' figures; with the flapping target down all along, sidestep wastes fewer upstream calls, shows the caller fewer errors and answers its median request sooner."""
    process = _demo("--json", *COMPARED)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    result = json.loads(out)
    figures = {
        "requests",
        "errors",
        "wasted_calls",
        "p50_ms",
        "p99_ms",
        "wall_s",
        "upstream_calls",
    }
    assert figures <= set(result["naive"]) and figures <= set(result["sidestep"])
    assert set(result["naive"]["upstream_calls"]) == {"broken", "stalled", "flapping", "healthy"}
    naive, ours = result["naive"], result["sidestep"]
    assert naive["requests"] == ours["requests"] == 40
    assert ours["wasted_calls"] < naive["wasted_calls"]
    assert ours["errors"] < naive["errors"]
    assert ours["p50_ms"] < naive["p50_ms"]


def test_ctrl_c_exits_130_promptly_and_closes_the_upstreams() -> None:
    """SIGINT during a run ends the demo with status 130, long before its 2,000 requests could have run, and its upstream ports no longer accept connections."""
    ports: list[int] = []
    # its pipes closed and the process waited for, however the test ends
    with _demo(*SMALL, "--requests", "2000", start_new_session=True) as process:
        try:
            assert process.stdout is not None
            selector = selectors.DefaultSelector()
            selector.register(process.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + 60  # bounds a hang only
            progress = 0
            while progress < 2 and time.monotonic() < deadline:  # the upstreams up, the load on
                if not selector.select(timeout=0.5):
                    continue
                line = process.stdout.readline()
                if not line:
                    break
                if line.startswith("upstreams on 127.0.0.1"):
                    ports = [int(p) for p in re.findall(r":(\d+)", line)]
                progress += line.startswith("[")
            selector.close()
            assert len(ports) == 4 and progress == 2
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=15)  # each client's run takes 20 s at the least
        finally:
            process.kill()  # a no-op once it has ended
    assert process.returncode == 130
    assert "interrupted" in err
    for port in ports:
        with socket.socket() as probe:
            probe.settimeout(1)
            assert probe.connect_ex(("127.0.0.1", port)) != 0
