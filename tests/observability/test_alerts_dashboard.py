"""The shipped Prometheus alert rules and Grafana dashboard: valid, and about metrics that exist."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidestep.metrics._labels import INSTRUMENTS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ALERTS = EXAMPLES / "prometheus" / "alerts.yml"
DASHBOARD = EXAMPLES / "grafana" / "sidestep.json"

# Every series name sidestep exposes, with the labels of each.
SERIES: dict[str, set[str]] = {}
for _instrument in INSTRUMENTS:
    _suffixes = ("_bucket", "_sum", "_count") if _instrument.kind == "histogram" else ("",)
    for _suffix in _suffixes:
        SERIES[_instrument.exposed + _suffix] = {*_instrument.labels, "le"}
_METRIC = re.compile(r"\bsidestep_[a-z_]+\b")
_LABELS = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)|[{,]\s*([a-z_]+)\s*(?:=~|!=|!~|=)")


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: install Debian's prometheus package", pytrace=False)
    return found


def check_expression(expr: str) -> None:
    """Each metric in `expr` exists, and each label it names belongs to those metrics."""
    metrics = set(_METRIC.findall(expr))
    assert metrics, expr
    unknown = metrics - SERIES.keys()
    assert not unknown, f"{expr}: no such metric {sorted(unknown)}"
    allowed = set().union(*(SERIES[m] for m in metrics))
    for group, label in _LABELS.findall(expr):
        names = [n.strip() for n in group.split(",")] if group else [label]
        for name in filter(None, names):
            assert name in allowed, f"{expr}: {name!r} is no label of {sorted(metrics)}"


def test_promtool_accepts_the_alert_rules() -> None:
    """`promtool check rules` finds the four rules valid."""
    result = subprocess.run(  # noqa: S603 -- a fixed command line
        [promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 rules found" in result.stdout


def test_the_alerts_fire_when_they_should() -> None:
    """`promtool test rules` runs the rules' unit tests: each alert fires on its series, and stops when they recover."""
    result = subprocess.run(  # noqa: S603 -- a fixed command line
        [promtool(), "test", "rules", "alerts_test.yml"],
        cwd=ALERTS.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alert_rules_name_existing_metrics_and_labels() -> None:
    """Every alert expression is about sidestep's metrics and their labels, and the issue's four alerts are there."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert {rule["alert"] for rule in rules} == {
        "SidestepCredentialUnusable",
        "SidestepQuotaExhausted",
        "SidestepAllCandidatesSuspended",
        "SidestepCircuitOpenTooLong",
    }
    for rule in rules:
        check_expression(rule["expr"])


def expressions(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)


def test_the_dashboard_parses_and_queries_existing_metrics() -> None:
    """The Grafana dashboard is JSON with panels whose every query uses sidestep's metrics and their labels only, and every instrument is drawn."""
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["panels"] and dashboard["uid"] == "sidestep"
    queries = list(expressions(dashboard["panels"]))
    for expr in queries:
        check_expression(expr)
    drawn = {m for expr in queries for m in _METRIC.findall(expr)}
    for instrument in INSTRUMENTS:
        assert any(name.startswith(instrument.exposed) for name in drawn), instrument.exposed


def test_the_checks_catch_a_wrong_metric_or_label() -> None:
    """The expression check refuses a metric sidestep does not have, and a label its metric lacks."""
    with pytest.raises(AssertionError, match="no such metric"):
        check_expression("rate(sidestep_nothing_total[5m])")
    with pytest.raises(AssertionError, match="no label"):
        check_expression('sum by (path) (sidestep_requests_total{route="chat"})')
