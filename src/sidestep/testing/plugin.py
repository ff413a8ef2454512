"""The pytest plugin of `sidestep.testing`, loaded by installing sidestep (entry point
``sidestep`` in ``pytest11``).

- The fixture ``sidestep_faults`` gives a test a `FaultPlan` that is under every
  sidestep transport of the process, those built during the test included, and
  closes every circuit before the test and after it.
- The markers ``sidestep_down(target, status=503)`` and
  ``sidestep_fault(fault, **settings)`` add rules to that plan for the whole
  test (a test that carries one gets the fixture without asking for it). Their
  routes and targets are checked once the test's fixtures are set up: a name no
  sidestep transport alive then has errors the test (none alive: not checked).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

import pytest

from .._settings.faults import FaultRule
from . import FaultPlan, _rule, reset_circuits, track

__all__ = ["pytest_configure", "pytest_runtest_setup", "sidestep_faults"]

_MARKERS = ("sidestep_down", "sidestep_fault")
# The plan of a test under `sidestep_faults`, and its markers' rules (checked after setup).
_MARKED = pytest.StashKey[tuple[FaultPlan, list[tuple[pytest.Mark, FaultRule]]]]()


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
    marked = [(m, _marker_rule(m)) for m in request.node.iter_markers() if m.name in _MARKERS]
    for _, rule in marked:
        plan.add(rule)  # under no transport yet: checked once the test's fixtures are set up
    reset_circuits()
    plan.everywhere()
    request.node.stash[_MARKED] = plan, marked
    try:
        yield plan
    finally:
        del request.node.stash[_MARKED]
        plan.remove()
        reset_circuits()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    """Once a test's fixtures are set up (its transports built), error the test if one of
    its markers names a route or target that no sidestep transport alive has."""
    yield
    plan, marked = item.stash.get(_MARKED, (None, []))
    for marker, rule in marked:
        unknown = plan._unknown(rule) if plan is not None else None
        if unknown is not None:
            pytest.fail(f"{_written(marker)}: {unknown}", pytrace=False)


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


def _written(marker: pytest.Mark) -> str:
    """The marker as a test writes it: ``@pytest.mark.sidestep_down('primray')``."""
    given = [repr(a) for a in marker.args] + [f"{k}={v!r}" for k, v in marker.kwargs.items()]
    return f"@pytest.mark.{marker.name}({', '.join(given)})"
