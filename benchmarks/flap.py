"""Scenario 5, flap: the primary is down (503) for a few seconds, then healthy again.

Reported per contender: calls that reached it while it was down, how many of
those came after the circuit had opened (probes, or for plain httpx simply
more traffic), how soon after its recovery the primary served traffic again,
and caller-visible errors. A breaker trades the first figures against the
recovery lag: the longer it waits before probing, the fewer wasted calls.
"""

from __future__ import annotations

import math

import _bench as b
from _bench import Load, Mode, Row, Sample

SCENARIO = "flap"


def run(quick: bool) -> list[Row]:
    down = 0.2 if quick else 3.0
    cooldown = 0.1 if quick else 0.5
    max_cooldown = 4 * cooldown
    rate = 200.0 if quick else 60.0
    requests = int(rate * (down + (0.2 if quick else 2.0)))
    load = Load(requests=requests, rate=rate, inflight=64, rounds=1 if quick else 3)
    samples, absent = b.failure_rounds(
        Mode.FLAPPING,
        load,
        timeout=2.0,
        cooldown=cooldown,
        max_cooldown=max_cooldown,
        down_for=down,
    )

    def probes(s: Sample) -> float:
        opened = b.opened_at(s)
        return sum(t > opened for t in s.dead["down_call_times"])

    def lag(s: Sample) -> float:
        back = s.dead["first_up_answer"]
        return b.ms(back - s.dead["down_until"]) if back is not None else math.nan

    table = b.summarise(
        samples,
        {
            "calls while down": lambda s: s.dead["calls_while_down"],
            "of which after opening": probes,
            "traffic back after": lag,
            "errors": lambda s: s.tally.errors,
        },
    )
    del table[b.BASELINE]  # the baseline never sees the primary
    units = {
        "calls while down": "calls",
        "of which after opening": "calls",
        "traffic back after": "ms",
        "errors": "requests",
    }
    rows = b.matrix(SCENARIO, table, units) + b.absent_rows(SCENARIO, absent)
    ours = samples["sidestep"]
    windows = b.median(len(s.opened) for s in ours)
    budget = b.THRESHOLD + b.PROBES * windows
    wasted = table["sidestep"]["calls while down"]
    back = table["sidestep"]["traffic back after"]
    return [
        *rows,
        b.verdict(
            SCENARIO,
            "calls reaching it while down <= threshold + probes per open window",
            wasted,
            "calls",
            wasted <= budget,
            f"budget {budget:g} ({windows:g} open windows)",
        ),
        b.verdict(
            SCENARIO,
            "traffic returns within one max_cooldown of recovery",
            back,
            "ms",
            back <= max_cooldown * 1000,
            f"max_cooldown {max_cooldown * 1000:g} ms (cooldown {cooldown * 1000:g} ms)",
        ),
    ]
