"""OpenTelemetry's SDK, in memory, for the tests that read sidestep's spans and metrics."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sidestep.metrics import otel


@dataclass
class Captured:
    tracer_provider: TracerProvider
    spans_exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    def spans(self) -> list[ReadableSpan]:
        return list(self.spans_exporter.get_finished_spans())

    def points(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        """Each data point of the metric `name`: (its attributes, the point)."""
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found += [(dict(p.attributes or {}), p) for p in metric.data.data_points]
        return found

    def value(self, name: str, **attributes: str) -> float:
        for attrs, point in self.points(name):
            if attrs == attributes:
                return float(point.value)
        return 0.0


@contextmanager
def captured() -> Iterator[Captured]:
    """sidestep's OpenTelemetry metrics and spans enabled into in-memory SDK providers."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    otel.enable(meter_provider, tracer_provider)
    try:
        yield Captured(tracer_provider, exporter, reader)
    finally:
        otel.disable()
        meter_provider.shutdown()
        tracer_provider.shutdown()
