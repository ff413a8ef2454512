"""The benchmark suite cannot rot: a quick run of every scenario finishes with well-formed rows."""

from __future__ import annotations

import ast
import importlib
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
PEER_MODULES = (
    "aiobreaker",
    "circuitbreaker",
    "httpx_retries",
    "interlock",
    "purgatory",
    "pybreaker",
)


@pytest.fixture(scope="module")
def runner() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("run")
    finally:
        sys.path.remove(str(BENCHMARKS))


def _scenarios() -> list[str]:
    # the runner's own list, read without importing it: collection needs it before any fixture
    tree = ast.parse((BENCHMARKS / "run.py").read_text())
    names = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "SCENARIOS" for t in node.targets)
    )
    return [name for name in names if (BENCHMARKS / f"{name}.py").exists()]


def _check(rows: list[dict[str, object]], scenario: str) -> None:
    assert rows
    for row in rows:
        assert {"scenario", "metric", "value", "unit", "note"} <= set(row)
        assert row["scenario"] == scenario
        assert isinstance(row["metric"], str) and row["metric"]
        assert row.get("verdict", "pass") in {"pass", "fail"}, row
        value = row["value"]
        assert value is None or isinstance(value, (int, float, str)), row


@pytest.mark.parametrize("scenario", _scenarios())
def test_quick_run_gives_well_formed_rows(runner: ModuleType, scenario: str) -> None:
    """A quick run of the scenario finishes and every row has a scenario, a metric, a value, a unit and a note; verdicts are pass or fail."""
    rows = runner.run_scenario(scenario, quick=True)
    _check(rows, scenario)
    if scenario != "redis_store":  # which may say it could not reach a server
        assert any("verdict" in row for row in rows)
        numbers = [r["value"] for r in rows if isinstance(r["value"], float)]
        assert numbers and not all(math.isnan(v) for v in numbers)


def test_missing_peers_are_reported_not_fatal(
    runner: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no peer library importable, the overhead scenario still measures sidestep and lists each peer as skipped."""
    loaded = [m for m in sys.modules if m.split(".")[0] in PEER_MODULES]
    for name in {*PEER_MODULES, *loaded}:
        monkeypatch.setitem(sys.modules, name, None)  # makes `import name` fail
    rows = runner.run_scenario("overhead", quick=True)
    _check(rows, "overhead")
    skipped = {r["metric"] for r in rows if str(r["metric"]).endswith(": skipped")}
    assert skipped == {
        f"{peer}: skipped"
        for peer in (
            "interlock-cb",
            "aiobreaker",
            "purgatory",
            "pybreaker",
            "circuitbreaker",
            "httpx-retries",
        )
    }
    assert any(r["metric"] == "async sidestep, routed" for r in rows)


def test_overhead_reports_what_metrics_and_traces_add(runner: ModuleType) -> None:
    """The overhead scenario samples the routed transport with Prometheus and OpenTelemetry on, and reports what they add per request for both flavours; they are off again afterwards."""
    from sidestep.metrics import otel, prometheus

    rows = runner.run_scenario("overhead", quick=True)
    added = {r["metric"]: r["value"] for r in rows if "added by metrics+traces" in str(r["metric"])}
    assert set(added) == {"async: added by metrics+traces", "sync: added by metrics+traces"}
    assert all(isinstance(v, float) for v in added.values())
    assert prometheus._active is None and otel._active == ()


def test_runner_prints_a_table_for_one_scenario(
    runner: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run.py scale --quick` prints the command, the machine, the scenario's table and the targets, and exits 0."""
    assert runner.main(["scale", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "python benchmarks/run.py scale --quick" in out
    assert "cores" in out and "Python" in out
    assert "## scale" in out and "| bytes per scope" in out
    assert "## targets" in out and ("PASS" in out or "FAIL" in out)


def test_spread_without_litellm_says_so(
    runner: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With LiteLLM not importable, the spread scenario still measures sidestep and lists LiteLLM as skipped in each case it would have run in."""
    spread = importlib.import_module("spread")
    monkeypatch.setitem(sys.modules, "litellm", None)  # makes `import litellm` fail
    monkeypatch.setattr(spread, "CASES", (spread.weights,))  # one case is enough, and short
    rows = runner.run_scenario("spread", quick=True)
    _check(rows, "spread")
    skipped = [r for r in rows if r["metric"] == "weights: LiteLLM: skipped"]
    assert len(skipped) == 1 and "pip install" in str(skipped[0]["note"])
    assert not any("LiteLLM" in str(r.get("subject", "")) for r in rows)
    assert any(r.get("subject") == "weights: sidestep ranked route" for r in rows)
