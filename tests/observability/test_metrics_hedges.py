"""The hedges counter: `hedge.finished` counted by route and outcome, outcomes bounded."""

from __future__ import annotations

import pytest

from sidestep._common.outcomes import HEDGE_OUTCOMES
from sidestep.metrics._labels import HEDGES, INSTRUMENTS, OTHER, Measures


@pytest.mark.parametrize("outcome", HEDGE_OUTCOMES)
def test_each_hedge_outcome_is_counted_by_route(outcome: str) -> None:
    """Each outcome of `hedge.finished` adds one to sidestep_hedges under its route."""
    fields = {"route": "chat", "target": "a", "hedge": "b", "outcome": outcome}
    assert Measures()("hedge.finished", fields) == [(HEDGES, ("chat", outcome), 1)]


def test_an_unknown_outcome_is_other() -> None:
    """A word that is not a hedge outcome never becomes a label value of its own."""
    fields = {"route": "chat", "outcome": "https://secret.example/?key=1"}
    assert Measures()("hedge.finished", fields) == [(HEDGES, ("chat", OTHER), 1)]


def test_the_hedges_counter_is_an_instrument() -> None:
    """sidestep_hedges_total is exported by every exporter, labelled by route and outcome."""
    assert HEDGES in INSTRUMENTS
    assert (HEDGES.exposed, HEDGES.labels) == ("sidestep_hedges_total", ("route", "outcome"))
