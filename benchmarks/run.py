"""Run the benchmark scenarios and print their tables, ratios and verdicts.

    python benchmarks/run.py                 # every scenario
    python benchmarks/run.py overhead flap   # some of them
    python benchmarks/run.py --quick         # tiny counts: a smoke run, numbers meaningless

Peers come from ``pip install -r benchmarks/requirements.txt``; a peer that
is not installed is reported as skipped and the run goes on. The tables are
Markdown, ready to paste.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCENARIOS = (
    "overhead",
    "hotpath",
    "throughput",
    "outage",
    "hang",
    "flap",
    "recovery",
    "ratelimit",
    "scale",
    "redis_store",
    "sqlite_store",
    "first_token",
    "admin_listing",
    "spread",
    "hedge",
)
Row = dict[str, Any]


def available() -> list[str]:
    """The scenarios whose module is present (redis_store may not be)."""
    return [name for name in SCENARIOS if (HERE / f"{name}.py").exists()]


def run_scenario(name: str, quick: bool) -> list[Row]:
    """One scenario's rows; a scenario that cannot run gives one row saying why."""
    try:
        module = importlib.import_module(name)
        rows: list[Row] = module.run(quick)
    except Exception as exc:
        detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return [
            {
                "scenario": name,
                "metric": "could not run",
                "value": None,
                "unit": "",
                "note": detail,
                "verdict": "error",
            }
        ]
    return rows


def fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def markdown(header: list[str], lines: list[list[str]]) -> str:
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |"]
    out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    out += [
        "| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + " |"
        for line in lines
    ]
    return "\n".join(out)


def table(rows: list[Row]) -> str:
    """A scenario's measurements: a grid where rows carry a subject, a list otherwise."""
    parts = []
    grid = [r for r in rows if "subject" in r and "verdict" not in r]
    if grid:
        metrics = list(dict.fromkeys(r["metric"] for r in grid))
        units = {r["metric"]: r["unit"] for r in grid}
        subjects = list(dict.fromkeys(r["subject"] for r in grid))
        cells = {(r["subject"], r["metric"]): fmt(r["value"]) for r in grid}
        header = ["", *(f"{m} ({units[m]})" if units[m] else m for m in metrics)]
        lines = [[s, *(cells.get((s, m), "-") for m in metrics)] for s in subjects]
        parts.append(markdown(header, lines))
    flat = [r for r in rows if "subject" not in r and r.get("verdict") in (None, "error")]
    if flat:
        lines = [[r["metric"], fmt(r["value"]), r["unit"], r["note"]] for r in flat]
        parts.append(markdown(["metric", "value", "unit", "note"], lines))
    return "\n\n".join(parts)


def measured(row: Row) -> str:
    """A verdict's measure; a ratio to three decimals, so that one just past its limit
    (1.053x against 1.05x) does not read as the limit itself."""
    value = row["value"]
    if row["unit"] == "x" and isinstance(value, float) and not math.isnan(value):
        return f"{value:.3f} x"
    return f"{fmt(value)} {row['unit']}"


def verdicts(rows: list[Row]) -> str:
    lines = [
        [
            r["scenario"],
            r["metric"].removeprefix("target: "),
            measured(r),
            r["verdict"].upper(),
            r["note"],
        ]
        for r in rows
        if "verdict" in r
    ]
    return markdown(["scenario", "target", "measured", "verdict", "note"], lines) if lines else ""


def machine() -> str:
    return (
        f"{os.cpu_count()} cores, {platform.machine()}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scenarios", nargs="*", help=f"any of: {', '.join(available())}")
    parser.add_argument("--quick", action="store_true", help="tiny counts (a smoke run)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    names = args.scenarios or available()
    unknown = [n for n in names if n not in available()]
    if unknown:
        parser.error(f"unknown scenario: {', '.join(unknown)} (have: {', '.join(available())})")
    sys.path.insert(0, str(HERE))
    command = "python benchmarks/run.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    if not args.json:
        print(f"# sidestep benchmarks\n\n`{command}`, {datetime.date.today()}, {machine()}\n")
    every: list[Row] = []
    for name in names:
        started = time.perf_counter()
        rows = run_scenario(name, args.quick)
        every += rows
        if not args.json:
            elapsed = time.perf_counter() - started
            print(f"## {name} ({elapsed:.0f} s)\n\n{table(rows)}\n", flush=True)
    if args.json:
        print(json.dumps(every, indent=2, default=str))
    else:
        print(f"## targets\n\n{verdicts(every)}")
    crashed = any(r.get("verdict") == "error" for r in every)
    missed = any(r.get("verdict") == "fail" for r in every)
    return 1 if crashed or (args.strict and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
