"""Fixtures of the observability tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from sidestep.metrics import prometheus


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    """A fresh registry with sidestep's metrics enabled in it (disabled afterwards)."""
    registry = CollectorRegistry()
    prometheus.enable(registry)
    yield registry
    prometheus.disable()
