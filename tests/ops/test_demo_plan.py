"""`sidestep demo --plan FILE`: a fault plan played against a configuration's routes, locally."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from upstream import IN_TIME

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "fault-injection.md"
# A short run: every request in well under a second, each answer well within its time.
QUICK = ["--requests", "40", "--rate", "200", "--timeout", str(IN_TIME)]


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("SIDESTEP_ALLOW_CHAOS", None)
    return subprocess.run(  # noqa: S603  # our own interpreter, our own command
        [sys.executable, "-m", "sidestep", "demo", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def figures(*args: str) -> dict[str, Any]:
    done = demo("--json", *args)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_pages_plan_against_the_demo_route(tmp_path: Path) -> None:
    """The plan on the fault-injection page plays against the route `demo`: the primary's injected 503s open its circuit once, it is never called and then skipped, and the backup answers the rest."""
    (block,) = re.findall(r"^<!-- plan -->\n```yaml\n(.*?)^```", PAGE.read_text(), re.M | re.S)
    plan = tmp_path / "plan.yaml"
    plan.write_text(block)
    result = figures("--plan", str(plan), "--concurrency", "4", *QUICK)
    assert result["requests"] == 40
    assert result["faults_injected"]["primary"] >= 3
    assert result["circuit_openings"].get("primary") == 1
    assert result["upstream_calls"]["primary"] == 0
    assert result["upstream_calls"]["backup"] > 0
    assert result["skipped"]["primary"] > 0


def test_a_users_configuration_plays_locally(tmp_path: Path) -> None:
    """With -c, the plan plays against the file's own routes and breaker, every target served on 127.0.0.1, and the file's store is never opened: one refused connection opens target `a` (failure_threshold 1), the request fails over to `b`, and no caller sees an error."""
    state = tmp_path / "never.db"
    config = tmp_path / "sidestep.yaml"
    config.write_text(
        textwrap.dedent(f"""\
            breaker: {{failure_threshold: 1, cooldown: 10m}}
            store: {{sqlite: {{path: "{state}"}}}}
            routes:
              - name: chat
                targets:
                  - {{name: a, url: "https://a.invalid/v1"}}
                  - {{name: b, url: "https://b.invalid/api/v1"}}
            """)
    )
    plan = tmp_path / "plan.yaml"
    plan.write_text("faults:\n  - {fault: connect_error, target: a, times: 2}\n")
    result = figures("--plan", str(plan), "-c", str(config), "--concurrency", "1", *QUICK)
    assert result["faults_injected"] == {"a": 1}
    assert result["circuit_openings"] == {"a": 1}
    assert (result["errors"], result["failovers"]) == (0, 1)
    assert result["upstream_calls"] == {"a": 0, "b": 40}
    assert not state.exists()


def test_refusals(tmp_path: Path) -> None:
    """A plan naming a target the configuration lacks, an invalid plan, and -c without --plan each exit 2 with the reason; nothing runs."""
    plan = tmp_path / "plan.yaml"
    plan.write_text("faults:\n  - {fault: timeout, target: ghost}\n")
    done = demo("--plan", str(plan))
    assert done.returncode == 2 and "no target 'ghost'" in done.stderr
    plan.write_text("faults:\n  - {fault: status}\n")
    done = demo("--plan", str(plan))
    assert done.returncode == 2 and "needs a status" in done.stderr
    done = demo("-c", str(plan))
    assert done.returncode == 2 and "goes with --plan" in done.stderr


def test_a_configurations_chaos_section_is_left_out(tmp_path: Path) -> None:
    """A -c file with a chaos: section plays without SIDESTEP_ALLOW_CHAOS (the demo runs without it in its environment), its chaos faults never injected nor even substituted (an unset ${VARIABLE} inside is no error), only the plan's; the demo says on stderr that the file's chaos section is not used, and --json's stdout stays the figures."""
    config = tmp_path / "staging.yaml"
    config.write_text(
        textwrap.dedent("""\
            routes:
              - name: chat
                targets:
                  - {name: a, url: "https://a.invalid/v1"}
                  - {name: b, url: "https://b.invalid/v1"}
            chaos:
              seed: 1
              faults:
                - {fault: status, status: 500, target: b}
                - {fault: timeout, target: "${SIDESTEP_TEST_NEVER_SET}"}
            """)
    )
    plan = tmp_path / "plan.yaml"
    plan.write_text("faults:\n  - {fault: connect_error, target: a, times: 1}\n")
    done = demo("--json", "--plan", str(plan), "-c", str(config), "--concurrency", "1", *QUICK)
    assert done.returncode == 0, done.stderr
    assert f"{config}: its chaos: section is not used by the demo" in done.stderr
    assert "SIDESTEP_ALLOW_CHAOS" not in done.stderr
    result = json.loads(done.stdout)
    assert result["faults_injected"] == {"a": 1}
    assert (result["errors"], result["failovers"]) == (0, 1)
    assert result["upstream_calls"] == {"a": 39, "b": 1}  # b, under chaos, would not be called
