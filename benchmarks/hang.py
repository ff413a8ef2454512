"""Scenario 4, hang: the dead target accepts connections and never answers.

The client timeout is 0.5 s. A breaker cannot know before the first timeouts
come back, so the first requests wait; the question is what happens after.
Reported per contender: calls that reached the dead target, caller-visible
errors, p50/p99, and how many requests sent after the circuit opened still
waited out the timeout (the half-open probes must; nothing else should).
"""

from __future__ import annotations

import _bench as b
from _bench import Load, Mode, Row, Sample

SCENARIO = "hang"


def run(quick: bool) -> list[Row]:
    timeout = 0.1 if quick else 0.5
    cooldown = 0.1 if quick else 1.0
    load = Load(requests=30, rate=200, inflight=64, rounds=1) if quick else Load(240, 60, 128, 3)
    samples, absent = b.failure_rounds(
        Mode.STALLED, load, timeout=timeout, cooldown=cooldown, max_cooldown=4 * cooldown
    )

    def waited(s: Sample) -> float:
        opened = b.opened_at(s, timeout)
        return sum(lat >= 0.9 * timeout for lat in b.after(s, opened))

    table = b.summarise(
        samples,
        {**b.outcome_metrics(), "waited for the timeout once open": waited},
    )
    rows = b.matrix(
        SCENARIO, table, {**b.OUTCOME_UNITS, "waited for the timeout once open": "requests"}
    )
    rows += b.absent_rows(SCENARIO, absent)
    ours = samples["sidestep"]
    probes = b.median(len(s.half_opened) for s in ours) * b.PROBES
    waits = table["sidestep"]["waited for the timeout once open"]
    errors = max(s.tally.errors for s in ours)
    return [
        *rows,
        b.verdict(
            SCENARIO,
            "once open, no request waits for the dead target's timeout (probes aside)",
            waits,
            "requests",
            waits <= probes,
            f"{probes:g} half-open probes; naive: "
            f"{table['naive']['waited for the timeout once open']:g} requests waited",
        ),
        b.no_errors(SCENARIO, errors, len(ours), load.requests),
    ]
