"""Scenario 3, sustained outage: one of two targets answers 503 for the whole run.

Every contender sends the same open-loop load at a dead primary and a
healthy backup. Reported per contender (medians over interleaved rounds):
calls that reached the dead target, errors the caller saw, p50/p99 latency,
and p99 of the requests sent once the circuit was open, against a plain
client talking to the healthy target alone.
"""

from __future__ import annotations

import _bench as b
from _bench import BASELINE, Load, Mode, Row, Sample

SCENARIO = "outage"


def run(quick: bool) -> list[Row]:
    load = Load(requests=40, rate=400, inflight=32, rounds=1) if quick else Load(240, 60, 64, 3)
    cooldown = 0.1 if quick else 1.0
    samples, absent = b.failure_rounds(
        Mode.UNAVAILABLE, load, timeout=2.0, cooldown=cooldown, max_cooldown=4 * cooldown
    )
    table = b.summarise(
        samples,
        {
            **b.outcome_metrics(),
            "p99 once open": lambda s: b.ms(b.percentile(b.after(s, b.opened_at(s)), 0.99)),
        },
    )
    rows = b.matrix(SCENARIO, table, {**b.OUTCOME_UNITS, "p99 once open": "ms"})
    rows += b.absent_rows(SCENARIO, absent)
    return rows + verdicts(samples, table, load)


def verdicts(
    samples: dict[str, list[Sample]], table: dict[str, dict[str, float]], load: Load
) -> list[Row]:
    ours = samples["sidestep"]
    windows = b.median(len(s.opened) for s in ours)
    budget = b.THRESHOLD + b.PROBES * windows
    dead = table["sidestep"]["dead calls"]
    errors = max(s.tally.errors for s in ours)
    baseline = table[BASELINE]["p99"]
    slower = b.ratio(table["sidestep"]["p99 once open"], baseline)
    return [
        b.verdict(
            SCENARIO,
            "calls reaching the dead target <= threshold + probes per open window",
            dead,
            "calls",
            dead <= budget,
            f"budget {budget:g} ({windows:g} open windows); "
            f"naive sent {table['naive']['dead calls']:g}",
        ),
        b.no_errors(SCENARIO, errors, len(ours), load.requests),
        b.verdict(
            SCENARIO,
            "p99 once open <= 1.2x the healthy baseline",
            slower,
            "x",
            slower <= 1.2,
            f"{table['sidestep']['p99 once open']:.2f} ms vs {baseline:.2f} ms",
        ),
    ]
