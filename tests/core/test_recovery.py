"""Prompt recovery, rare probes: a long outage on a fake clock, against real upstreams on 127.0.0.1.

The primary's answer follows the fake clock (503 while down, 200 after), and a
slow failure is one during which the upstream moves the clock on before it
answers, as a timeout would have kept the caller waiting.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from drivers import Driver, FakeClock, route
from upstream import Hang, Respond, Seen, Upstream

OUTAGE = 600.0  # ten simulated minutes
EVERY = 4.0  # one request every 4 s, as in the report that asked for this
COOLDOWN = 30.0  # the recommended LLM breaker: failure_threshold 3, cooldown 30s
THRESHOLD = 3


@dataclass
class Primary:
    """A primary down for `OUTAGE` simulated seconds; each failure takes `cost` of them."""

    clock: FakeClock
    cost: float = 0.0
    start: float = field(init=False)
    down_calls: list[float] = field(default_factory=list)
    first_up: float | None = None

    def __post_init__(self) -> None:
        self.start = self.clock()

    @property
    def recovered_at(self) -> float:
        return self.start + OUTAGE

    def __call__(self, _: Seen) -> Respond:
        now = self.clock()
        if now < self.recovered_at:
            self.down_calls.append(now)
            self.clock.advance(self.cost)
            return Respond(503, "down")
        if self.first_up is None:
            self.first_up = now
        return Respond(body="a")


def drive(
    make: Callable[..., Driver], a: Upstream, b: Upstream, cost: float, **breaker: Any
) -> Primary:
    """One request every `EVERY` simulated seconds until the primary has served one."""
    clock = FakeClock()
    primary = Primary(clock, cost)
    a.behaviour = primary
    config = route(
        ("a", a.url + "/v1"),
        ("b", b.url + "/v1"),
        breaker={"failure_threshold": THRESHOLD, "cooldown": COOLDOWN, **breaker},
    )
    d = make(config, clock=clock)
    while primary.first_up is None:
        began = clock()
        r = d.get(a.url + "/v1/chat")
        assert r.status == 200  # the fallback answers while the primary is down
        clock.advance(max(0.0, began + EVERY - clock()))
        assert clock() < primary.start + 4 * OUTAGE, "the primary was never used again"
    return primary


def probes(primary: Primary) -> list[float]:
    """The calls that reached the primary while down once its circuit had opened."""
    return primary.down_calls[THRESHOLD:]


def test_quick_outage_of_ten_minutes_is_over_within_a_cooldown_of_recovery(
    make: Callable[..., Driver], a: Upstream, b: Upstream
) -> None:
    """Down (quick 503s) for 10 simulated minutes, the primary serves again within 30 s of recovering, probed once per cooldown meanwhile."""
    primary = drive(make, a, b, cost=0.0)
    assert primary.first_up is not None
    assert primary.first_up - primary.recovered_at <= COOLDOWN
    sent = probes(primary)
    assert all(later - earlier >= COOLDOWN for earlier, later in itertools.pairwise(sent))
    assert len(sent) == 18  # every 32 s (a 30 s window, then the next 4 s tick) from 40 s to 584 s


def test_slow_failed_probes_still_grow_the_window(
    make: Callable[..., Driver], a: Upstream, b: Upstream
) -> None:
    """Failures that each cost the caller 12 s are probed ever more rarely: the window doubles after each."""
    cost = 12.0
    primary = drive(make, a, b, cost=cost)
    sent = probes(primary)
    # a window starts when the failed probe's answer came, `cost` after it was sent
    windows = [later - earlier - cost for earlier, later in itertools.pairwise(sent)]
    assert len(sent) == 4  # the next window (480 s) ends after the outage
    for window, expected in zip(windows, (60, 120, 240), strict=True):
        assert expected <= window < expected + EVERY


def test_slow_failure_zero_grows_the_window_after_every_failed_probe(
    make: Callable[..., Driver], a: Upstream, b: Upstream
) -> None:
    """With slow_failure: 0 every failed probe counts as slow: quick 503s double the window as before."""
    primary = drive(make, a, b, cost=0.0, slow_failure=0)
    sent = probes(primary)
    assert len(sent) == 4  # at 40, 100, 220 and 460 s; the next, 480 s later, after recovery
    assert primary.first_up is not None
    assert primary.first_up - primary.recovered_at > COOLDOWN


def test_a_timed_out_probe_grows_the_window_however_short_its_timeout(
    make: Callable[..., Driver], a: Upstream, b: Upstream
) -> None:
    """A probe ended by a timeout is a slow failure even when the timeout was shorter than slow_failure: the window doubles."""
    clock = FakeClock()
    a.behaviour = lambda seen: Hang()
    config = route(
        ("a", a.url),
        ("b", b.url),
        breaker={"failure_threshold": 1, "cooldown": COOLDOWN, "slow_failure": 5},
        failover={"retry_ambiguous": True},
    )
    d = make(config, clock=clock, timeout=(5.0, 0.2, 5.0, 5.0))  # a 0.2 s read budget
    assert d.get(a.url + "/v1/x").text == "b"  # a times out, opens for the cooldown
    clock.advance(COOLDOWN + 1)
    assert d.get(a.url + "/v1/x").text == "b"  # the probe times out too
    (row,) = [s for s in d.transport.suspensions() if s.target == "a"]
    assert row.retry_in == pytest.approx(2 * COOLDOWN)  # grown, though the fake clock never moved
