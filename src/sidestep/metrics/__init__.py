"""Metrics and traces from sidestep's events: Prometheus and OpenTelemetry.

Every exporter here is an observer of the events `sidestep.logging.emit`
reports (`add_observer`): nothing is counted beside them. Each turns an event
into measurements by the same label rules (`_labels.Measures`), so
Prometheus and OpenTelemetry always agree.

- `sidestep.metrics.prometheus.enable(registry=None)` (``sidestep[prometheus]``);
- `sidestep.metrics.otel.enable(meter_provider=None, tracer_provider=None)`
  (``sidestep[otel]``): the same instruments as OpenTelemetry metrics, and a
  span per routed request with a child span per attempt.

The configuration's ``observability: {prometheus: true, otel: true}`` enables
them for every transport built from it (`enable_configured`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._settings.observability import Observability

__all__ = ["enable_configured"]


def enable_configured(settings: Observability) -> None:
    """Enable what `settings` asks for, with the global registry and providers (idempotent).

    What the application enabled already, into a registry or providers of its
    own, stays as it is.
    """
    if settings.prometheus:
        from . import prometheus

        if prometheus._active is None:
            prometheus.enable()
    if settings.otel:
        from . import otel

        otel.enable()
