"""OpenTelemetry metrics and traces from sidestep's events (the ``sidestep[otel]`` extra).

Built on ``opentelemetry-api`` alone, as OpenTelemetry asks of libraries:
the application's SDK (or none) decides where anything goes. The meter and
the tracer are named ``sidestep``, with sidestep's version.

- Metrics: the instruments of `sidestep.metrics` — ``sidestep.requests``,
  ``sidestep.attempts``, ``sidestep.attempt.duration`` (seconds),
  ``sidestep.failovers``, ``sidestep.candidates.skipped``,
  ``sidestep.circuit.transitions``, ``sidestep.probes.admitted`` and the
  up-down counters ``sidestep.suspended`` and ``sidestep.inflight`` — with
  the same label rules, as attributes.
- Traces (`sidestep.metrics._traces`): a span ``sidestep <route>`` per
  routed request, a child span per attempt, current while the inner
  transport sends (so an HTTP client instrumentation's spans nest under
  it), and skips, failovers, probes and circuit transitions as span events.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from opentelemetry import metrics, trace

from .._common.version import __version__
from ..logging import Observer, add_observer, remove_observer
from ._labels import INSTRUMENTS, Instrument, Measures
from ._traces import Spans

__all__ = ["disable", "enable"]

_lock = threading.Lock()
_active: tuple[Observer, ...] = ()


class _Meters:
    """The observer for metrics: each event's measurements, into the meter's instruments."""

    def __init__(self, meter: metrics.Meter) -> None:
        self._measures = Measures()
        self._instruments = {i: _instrument(meter, i) for i in INSTRUMENTS}
        self._attributes: dict[tuple[Instrument, tuple[str, ...]], dict[str, str]] = {}

    def __call__(self, event: str, fields: Mapping[str, Any], /) -> None:
        for instrument, labels, amount in self._measures(event, fields):
            attributes = self._attributes.get((instrument, labels))
            if attributes is None:  # label values are bounded: so is this memory
                attributes = dict(zip(instrument.labels, labels, strict=True))
                self._attributes[(instrument, labels)] = attributes
            if instrument.kind == "histogram":
                self._instruments[instrument].record(amount, attributes)
            else:
                self._instruments[instrument].add(amount, attributes)


def _instrument(meter: metrics.Meter, instrument: Instrument) -> Any:
    name, unit, doc = instrument.otel, instrument.unit, instrument.description
    if instrument.kind == "counter":
        return meter.create_counter(name, unit=unit, description=doc)
    if instrument.kind == "histogram":
        return meter.create_histogram(name, unit=unit, description=doc)
    return meter.create_up_down_counter(name, unit=unit, description=doc)


def _version() -> str:
    return __version__


def enable(
    meter_provider: metrics.MeterProvider | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    *,
    metrics_on: bool = True,
    traces_on: bool = True,
) -> None:
    """Report sidestep's metrics and traces through OpenTelemetry.

    Args:
        meter_provider: where the metrics go; None: the global one
            (``opentelemetry.metrics.set_meter_provider``).
        tracer_provider: where the spans go; None: the global one.
        metrics_on: report the metrics.
        traces_on: report the spans.

    Calling it while enabled does nothing (`disable()` first to change providers).
    """
    global _active
    with _lock:
        if _active:
            return
        observers: list[Observer] = []
        if metrics_on:
            meter = metrics.get_meter("sidestep", _version(), meter_provider=meter_provider)
            observers.append(_Meters(meter))
        if traces_on:
            tracer = trace.get_tracer("sidestep", _version(), tracer_provider=tracer_provider)
            observers.append(Spans(tracer))
        for observer in observers:
            add_observer(observer)
        _active = tuple(observers)


def disable() -> None:
    """Stop reporting metrics and spans.

    A request in flight still ends the spans it opened, and detaches their
    context, before the tracer is let go.
    """
    global _active
    with _lock:
        observers, _active = _active, ()
    for observer in observers:
        if isinstance(observer, Spans):
            observer.close()
        else:
            remove_observer(observer)
