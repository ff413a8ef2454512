"""The offset between a store's clock and the caller's, kept steady between listings."""

from __future__ import annotations

from sidestep._state.offset import DRIFT, ClockOffset


def test_the_first_measure_is_kept_until_one_strays_past_the_drift() -> None:
    """Measures within DRIFT of the kept offset give the kept one; a measure further off (either way) is kept from then on, and later measures near it give it."""
    offset = ClockOffset()
    assert offset(100.0) == 100.0
    assert offset(100.0 + DRIFT * 0.9) == 100.0
    assert offset(100.0 - DRIFT * 0.9) == 100.0
    assert offset(100.0 + DRIFT * 1.5) == 100.0 + DRIFT * 1.5
    assert offset(100.0 + DRIFT * 1.2) == 100.0 + DRIFT * 1.5
    assert offset(90.0) == 90.0
