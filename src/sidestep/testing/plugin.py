"""The pytest plugin of `sidestep.testing`, loaded by installing sidestep (entry point
``sidestep`` in ``pytest11``).

- The fixture ``sidestep_faults`` gives a test a `FaultPlan` that is under every
  sidestep transport of the process, those built during the test included, and
  closes every circuit before the test and after it.
- The markers ``sidestep_down(target, status=503)`` and
  ``sidestep_fault(fault, **settings)`` add rules to that plan for the whole
  test (a test that carries one gets the fixture without asking for it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .._settings.faults import FaultRule
from . import FaultPlan, _rule, reset_circuits, track

__all__ = ["pytest_configure", "sidestep_faults"]

_MARKERS = ("sidestep_down", "sidestep_fault")


def pytest_configure(config: pytest.Config) -> None:
    track()  # every sidestep transport built from here on, for the fixture to find
    config.addinivalue_line(
        "markers",
        "sidestep_down(target, status=503): the target answers this status for the whole "
        "test, never called (sidestep.testing)",
    )
    config.addinivalue_line(
        "markers",
        "sidestep_fault(fault, **settings): a fault rule for the whole test, e.g. "
        "sidestep_fault('timeout', target='primary', times=2) (sidestep.testing)",
    )


@pytest.fixture
def sidestep_faults(request: pytest.FixtureRequest) -> Iterator[FaultPlan]:
    """A fault plan under every sidestep transport of the process for this test, with the
    rules of the test's ``sidestep_down`` and ``sidestep_fault`` markers; every circuit is
    closed before the test and after it."""
    plan = FaultPlan(seed=0)
    for marker in request.node.iter_markers():
        if marker.name in _MARKERS:
            plan.add(_marker_rule(marker))
    reset_circuits()
    plan.everywhere()
    try:
        yield plan
    finally:
        plan.remove()
        reset_circuits()


@pytest.fixture(autouse=True)
def _sidestep_markers(request: pytest.FixtureRequest) -> None:
    """A test marked ``sidestep_down`` or ``sidestep_fault`` runs under `sidestep_faults`."""
    if any(request.node.get_closest_marker(name) for name in _MARKERS):
        request.getfixturevalue("sidestep_faults")


def _marker_rule(marker: pytest.Mark) -> FaultRule:
    settings: dict[str, Any] = dict(marker.kwargs)
    if len(marker.args) != 1:
        what = "the target's name" if marker.name == "sidestep_down" else "the fault"
        raise pytest.UsageError(f"@pytest.mark.{marker.name} takes one argument: {what}")
    if marker.name == "sidestep_down":
        status = settings.pop("status", 503)
        if settings:
            raise pytest.UsageError("@pytest.mark.sidestep_down takes only status= besides")
        return _rule({"fault": "status", "status": status, "target": marker.args[0]})
    return _rule({"fault": marker.args[0], **settings})
