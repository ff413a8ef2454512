"""Prometheus metrics from sidestep's events (the ``sidestep[prometheus]`` extra).

`enable()` registers the instruments of `sidestep.metrics` in a
`prometheus_client` registry and subscribes them to sidestep's events; the
application serves the registry as it already does (``make_asgi_app()``,
``make_wsgi_app()``, ``start_http_server``). Every instrument is updated
by an event as it happens — the gauges too, with no callback collector —
so ``prometheus_client``'s multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``,
gunicorn workers) adds up every worker's series. The gauges are ``livesum``
there: `sidestep_suspended`, the scopes each live worker has seen suspended
and not yet seen let go (closed, cleared, forgotten by the store, or missing
from a listing of it); `sidestep_inflight`, the attempts each live worker has
in flight on pool members.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from ..logging import add_observer, remove_observer
from ._labels import INSTRUMENTS, Instrument, Measures

__all__ = ["DURATION_BUCKETS", "disable", "enable"]

#: Buckets of `sidestep_attempt_duration_seconds`: LLM calls can take a minute to a first byte.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

_lock = threading.Lock()
_active: _Exporter | None = None


class _Exporter:
    """The observer: each event's measurements, into the registry's instruments."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._measures = Measures()
        self._metrics: dict[Instrument, Any] = {i: _instrument(i, registry) for i in INSTRUMENTS}
        self._children: dict[tuple[Instrument, tuple[str, ...]], Any] = {}

    def __call__(self, event: str, fields: Mapping[str, Any], /) -> None:
        for instrument, labels, amount in self._measures(event, fields):
            child = self._children.get((instrument, labels))
            if child is None:  # label values are bounded: so is this memory
                child = self._metrics[instrument].labels(*labels)
                self._children[(instrument, labels)] = child
            if instrument.kind == "histogram":
                child.observe(amount)
            else:
                child.inc(amount)

    def unregister(self) -> None:
        for metric in self._metrics.values():
            self.registry.unregister(metric)


def _instrument(instrument: Instrument, registry: CollectorRegistry) -> Any:
    name, doc, labels = instrument.prometheus, instrument.description, instrument.labels
    if instrument.kind == "counter":
        return Counter(name, doc, labels, registry=registry)
    if instrument.kind == "histogram":
        return Histogram(name, doc, labels, registry=registry, buckets=DURATION_BUCKETS)
    return Gauge(name, doc, labels, registry=registry, multiprocess_mode="livesum")


def enable(registry: CollectorRegistry | None = None) -> None:
    """Report sidestep's metrics into `registry` (default: ``prometheus_client.REGISTRY``).

    Calling it again with the same registry does nothing.

    Raises:
        ValueError: metrics are enabled already, into another registry
            (`disable()` first).
    """
    global _active
    target = REGISTRY if registry is None else registry
    with _lock:
        if _active is not None:
            if _active.registry is target:
                return
            raise ValueError("sidestep's Prometheus metrics are enabled already, elsewhere")
        exporter = _Exporter(target)
        add_observer(exporter)
        _active = exporter


def disable() -> None:
    """Stop reporting, and take sidestep's instruments out of their registry."""
    global _active
    with _lock:
        exporter, _active = _active, None
    if exporter is not None:
        remove_observer(exporter)
        exporter.unregister()
