"""How far another clock is from the caller's, kept steady between listings (`ClockOffset`).

A shared store keeps its windows on a clock of its own (the wall clock of a SQLite
file, a Redis server's ``TIME``); a listing puts them on the caller's clock by the
difference between the two. Measured afresh on each listing, that difference moves
with the time between the caller reading its clock and the other clock being read (a
round trip, a thread's turn): an unchanged scope would list at a slightly different
instant each time, and an admin listing's tag, which follows its instants to the
second, would change with nothing changed. Pure: the caller measures.
"""

from __future__ import annotations

__all__ = ["DRIFT", "ClockOffset"]

# How far a measure may stray from the offset kept before it is kept instead: more
# than a loaded machine's delay between two readings of a clock, less than a listing
# can show (whole seconds).
DRIFT = 1.0


class ClockOffset:
    """The other clock less the caller's, as first measured, until a measure strays."""

    __slots__ = ("kept",)

    def __init__(self) -> None:
        self.kept: float | None = None

    def __call__(self, measured: float) -> float:
        """The offset to use, given one just `measured`: the kept one while `measured` is
        within `DRIFT` of it; else `measured`, kept from now on (the clocks drifted
        apart, one was stepped, or this reading came from another server)."""
        kept = self.kept
        if kept is None or abs(measured - kept) > DRIFT:
            self.kept = kept = measured
        return kept
