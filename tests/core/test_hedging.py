"""Hedging's pure decisions: which requests may be hedged, the budget's token bucket, the
adaptive delay from recent times to first token, and which outcome ends a race."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from sidestep._answers import classify as c11n
from sidestep._answers.classify import Kind, Verdict
from sidestep._common.scopes import ScopeKind
from sidestep._core.hedging import (
    BURST,
    MIN_SAMPLES,
    SAMPLES,
    Allowance,
    FirstTokenTimes,
    HedgeBudget,
    Refused,
    ends_race,
    hedge_delay,
    may_hedge,
)
from sidestep._core.run import SUCCESS, Outcome
from sidestep._settings.routes import Hedge

SAFE: dict[str, Any] = {
    "retry_ambiguous": False,
    "replayable": True,
    "holds_state": False,
    "others": 1,
}


# --- which requests may be hedged -----------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "PUT", "DELETE", "get"])
def test_idempotent_methods_may_be_hedged(method: str) -> None:
    """An idempotent method may be sent twice, so it may be hedged."""
    assert may_hedge(method, {}, **SAFE) is None


def test_a_post_is_not_hedged_unless_safe_to_send_twice() -> None:
    """A POST is hedged only with an Idempotency-Key or retry_ambiguous: else it is unsafe."""
    assert may_hedge("POST", {}, **SAFE) is Refused.UNSAFE
    assert may_hedge("POST", {"idempotency-key": "   "}, **SAFE) is Refused.UNSAFE
    assert may_hedge("POST", {"idempotency-key": "k-1"}, **SAFE) is None
    assert may_hedge("POST", {}, **{**SAFE, "retry_ambiguous": True}) is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"others": 0}, Refused.NO_CANDIDATE),
        ({"replayable": False}, Refused.ONE_SHOT),
        ({"holds_state": True}, Refused.PROVIDER_STATE),
    ],
)
def test_requests_with_nowhere_to_go_twice_are_not_hedged(
    change: dict[str, Any], reason: Refused
) -> None:
    """No other candidate, a one-shot body, or state kept by its own provider: never hedged,
    even when sending twice would be safe."""
    given: dict[str, Any] = {**SAFE, "retry_ambiguous": True, **change}
    assert may_hedge("POST", {}, **given) is reason


# --- the budget -----------------------------------------------------------------------------


def test_the_bucket_starts_full_then_pays_one_hedge_per_one_over_ratio_requests() -> None:
    """With a 5% budget and a burst of 3, the first three hedges are paid for at once; the
    next one only by the twentieth request after them."""
    budget = HedgeBudget(0.05, burst=3)
    assert [budget.withdraw() for _ in range(4)] == [True, True, True, False]
    for _ in range(19):
        budget.deposit()
        assert not budget.withdraw()
    budget.deposit()
    assert budget.withdraw()
    assert not budget.withdraw()


def test_the_bucket_holds_at_most_its_burst() -> None:
    """However many requests went by without a hedge, at most `burst` hedges are paid for."""
    budget = HedgeBudget(0.5, burst=3)
    for _ in range(100):
        budget.deposit()
    assert [budget.withdraw() for _ in range(5)] == [True, True, True, False, False]


def test_a_refund_gives_back_a_hedge_not_sent() -> None:
    """A hedge taken and refunded (nothing to hedge to) can be taken again."""
    budget = HedgeBudget(1.0)
    budget.deposit()
    assert budget.withdraw()
    budget.refund()
    assert budget.withdraw()


@pytest.mark.parametrize("ratio", [0.0, -0.1, 1.5])
def test_a_budget_outside_its_range_is_refused(ratio: float) -> None:
    """A ratio not above 0 or above 1 is a programming error here (the settings refuse it)."""
    with pytest.raises(ValueError, match="ratio"):
        HedgeBudget(ratio)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_hedges_never_exceed_the_share_plus_the_burst(seed: int) -> None:
    """Over any mix of requests that want a hedge and requests that do not, the hedges paid
    for never exceed ratio x requests + burst, counted from any point on."""
    draw = random.Random(seed)
    ratio = 0.05
    budget = HedgeBudget(ratio)
    paid: list[int] = []  # hedges paid so far, after each request
    for _ in range(5000):
        budget.deposit()
        wants = draw.random() < 0.3
        hedged = wants and budget.withdraw()
        paid.append((paid[-1] if paid else 0) + hedged)
    for start in range(0, 5000, 250):
        for end in range(start + 250, 5001, 250):
            hedges = paid[end - 1] - (paid[start - 1] if start else 0)
            assert hedges <= ratio * (end - start) + BURST + 1e-9
    # and the share is used when asked for: close to 5% of all requests
    assert paid[-1] >= ratio * 5000 - 1


def test_the_bucket_is_exact_under_threads() -> None:
    """Many threads depositing and withdrawing at once take exactly as many hedges as paid."""
    budget = HedgeBudget(0.25, burst=1000)
    assert all(budget.withdraw() for _ in range(1000))  # the full bucket it starts with
    taken: list[bool] = []
    lock = threading.Lock()

    def work() -> None:
        mine = []
        for _ in range(400):
            budget.deposit()
            mine.append(budget.withdraw())
        with lock:
            taken.extend(mine)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    deposits = 8 * 400 * 0.25  # never more than the burst: none is cut off
    assert sum(taken) + budget.balance == pytest.approx(deposits)


# --- the delay ------------------------------------------------------------------------------


def test_a_fixed_delay_is_the_delay() -> None:
    """A route with a fixed delay waits that long, whatever the target's times."""
    times = FirstTokenTimes()
    for _ in range(50):
        times.add(0.1)
    assert hedge_delay(Hedge(delay=1.5), times) == 1.5


def test_an_adaptive_delay_is_the_percentile_of_recent_times() -> None:
    """The adaptive delay is the nearest-rank percentile of the target's recent times to first
    token: with 95 at 0.3 s and 5 at 8 s, the 95th percentile is 0.3 s and the 99th 8 s."""
    draw = random.Random(7)
    samples = [0.3] * 95 + [8.0] * 5
    draw.shuffle(samples)
    times = FirstTokenTimes()
    for s in samples:
        times.add(s)
    assert hedge_delay(Hedge(adaptive=0.95), times) == 0.3
    assert hedge_delay(Hedge(adaptive=0.99), times) == 8.0
    assert times.percentile(0.5) == 0.3


def test_a_fixed_delay_caps_an_adaptive_one() -> None:
    """With `delay` set too, the adaptive delay is never longer: a window of slow answers
    (8 s at the percentile) hedges after 1 s, not after 8; a shorter percentile is kept."""
    times = FirstTokenTimes()
    for s in [0.3] * 90 + [8.0] * 10:
        times.add(s)
    assert hedge_delay(Hedge(adaptive=0.95, delay=1), times) == 1.0
    assert hedge_delay(Hedge(adaptive=0.5, delay=1), times) == 0.3


def test_an_adaptive_delay_waits_for_enough_times() -> None:
    """Until enough times are known the adaptive delay is the fixed one, or no hedge at all."""
    times = FirstTokenTimes()
    for _ in range(MIN_SAMPLES - 1):
        times.add(0.2)
    assert hedge_delay(Hedge(adaptive=0.9), times) is None
    assert hedge_delay(Hedge(adaptive=0.9, delay=2), times) == 2.0
    assert hedge_delay(Hedge(adaptive=0.9), None) is None
    times.add(0.2)
    assert hedge_delay(Hedge(adaptive=0.9, delay=2), times) == 0.2


def test_only_recent_times_count() -> None:
    """The delay follows the target: the oldest times are forgotten past the last SAMPLES."""
    times = FirstTokenTimes()
    for _ in range(SAMPLES):
        times.add(5.0)
    for _ in range(SAMPLES):
        times.add(0.5)
    assert len(times) == SAMPLES
    assert times.percentile(0.99) == 0.5


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_impossible_times_are_left_out(bad: float) -> None:
    """A negative (a clock that ran backwards) or non-finite time is not a time to first token."""
    times = FirstTokenTimes()
    times.add(bad)
    assert len(times) == 0


# --- which outcome ends the race ------------------------------------------------------------


def test_a_committed_answer_ends_the_race() -> None:
    """An answer at its commit point wins the race."""
    assert ends_race(Outcome(SUCCESS, object(), committed=True))


def test_a_failure_that_fails_over_waits_for_the_other_attempt() -> None:
    """A 503 (or a refused connection) does not end the race: the other attempt may answer."""
    failed = Verdict(Kind.FAILURE, c11n.UNAVAILABLE, ScopeKind.MODEL, failover=True, status=503)
    assert not ends_race(Outcome(failed, object()))


def test_an_answer_the_request_ends_with_anywhere_ends_the_race() -> None:
    """A 400 that does not fail over ends the race: the other target would answer the same."""
    neutral = Verdict(Kind.NEUTRAL, None, None, failover=False, status=400)
    assert ends_race(Outcome(neutral, object()))


def test_an_allowance_is_spent_once_across_threads() -> None:
    """A race's allowance of attempts, taken from many threads at once, is given out exactly
    as many times as it holds."""
    allowance = Allowance(5)
    taken: list[bool] = []
    lock = threading.Lock()

    def take() -> None:
        got = [allowance.take() for _ in range(10)]
        with lock:
            taken.extend(got)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(taken) == 5
