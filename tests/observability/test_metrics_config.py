"""`observability:` in the configuration: metrics and traces with no code, and a clear error without the extra."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY, CollectorRegistry

import sidestep
from drivers import route
from sidestep.metrics import otel, prometheus
from upstream import Upstream


@pytest.fixture
def disabled() -> Iterator[None]:
    """Whatever a test enables through its configuration is disabled afterwards."""
    yield
    prometheus.disable()
    otel.disable()


def test_a_transport_built_from_the_configuration_reports_prometheus_metrics(
    a: Upstream, disabled: None
) -> None:
    """`observability: {prometheus: true}` puts sidestep's metrics in prometheus_client's default registry, counting the transport's requests."""
    config = route(("a", a.url + "/v1"), observability={"prometheus": True})
    with httpx.Client(transport=sidestep.FailoverTransport(config)) as client:
        assert client.get(a.url + "/v1/x").text == "a"
    labels = {"route": "chat", "outcome": "served"}
    assert REGISTRY.get_sample_value("sidestep_requests_total", labels) == 1


def test_install_enables_both_from_the_configuration(disabled: None) -> None:
    """`install()` with both switches on enables the Prometheus and OpenTelemetry exporters, once however many clients are made."""
    sidestep.install({"observability": {"prometheus": True, "otel": True}})
    try:
        with httpx.Client(), httpx.Client():
            pass
        assert prometheus._active is not None
        assert len(otel._active) == 2  # metrics and spans
    finally:
        sidestep.uninstall()


def test_the_configuration_keeps_metrics_the_application_enabled_in_its_own_registry(
    a: Upstream, disabled: None
) -> None:
    """With sidestep's Prometheus metrics enabled into the application's own registry, `install()` with `prometheus: true` still builds clients, and their requests count in that registry."""
    registry = CollectorRegistry()
    prometheus.enable(registry)
    sidestep.install(route(("a", a.url + "/v1"), observability={"prometheus": True}))
    try:
        with httpx.Client() as client:
            assert client.get(a.url + "/v1/x").text == "a"
    finally:
        sidestep.uninstall()
    labels = {"route": "chat", "outcome": "served"}
    assert registry.get_sample_value("sidestep_requests_total", labels) == 1
    assert REGISTRY.get_sample_value("sidestep_requests_total", labels) is None


def test_nothing_is_enabled_by_default(disabled: None) -> None:
    """A configuration without `observability` enables no exporter."""
    sidestep.FailoverTransport(route(("a", "https://a.example/v1")))
    assert prometheus._active is None and otel._active == ()


@pytest.mark.parametrize(
    ("switch", "module", "extra"),
    [
        ("prometheus", "prometheus_client", "sidestep[prometheus]"),
        ("otel", "opentelemetry", "sidestep[otel]"),
    ],
)
def test_a_switch_without_its_extra_is_a_configuration_error_naming_it(
    switch: str, module: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the exporter's package not installed, turning it on fails validation with the extra to install, before anything runs."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == module else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(
        sidestep.ConfigError, match=re.escape(f"observability.{switch}: ")
    ) as caught:
        sidestep.FailoverTransport({"observability": {switch: True}})
    assert f"pip install '{extra}'" in str(caught.value)
    off = sidestep.FailoverTransport({"observability": {switch: False}})
    assert off.config.observability.enabled is False
