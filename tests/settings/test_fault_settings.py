"""The `chaos:` section and fault plan files: refused unless allowed, every rule checked."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import sidestep
from sidestep._settings.config import load_plan
from sidestep._settings.faults import ALLOW_CHAOS

CHAOS = textwrap.dedent("""\
    routes:
      - name: chat
        targets:
          - {name: primary, url: "https://primary.example/v1"}
          - {name: backup, url: "https://backup.example/v1"}
    chaos:
      seed: 7
      faults:
        - {fault: status, status: 503, target: primary, rate: 0.25}
        - {fault: timeout, route: chat, target: backup, for: 5m, count: true}
    """)


def write(tmp_path: Path, text: str, name: str = "sidestep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_chaos_is_refused_without_the_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file with `chaos:` fails to load, naming the file, the key and the variable that would allow it, unless SIDESTEP_ALLOW_CHAOS is exactly 1."""
    path = write(tmp_path, CHAOS)
    for value in (None, "0", "true", ""):
        if value is None:
            monkeypatch.delenv(ALLOW_CHAOS, raising=False)
        else:
            monkeypatch.setenv(ALLOW_CHAOS, value)
        with pytest.raises(sidestep.ConfigError) as caught:
            sidestep.load_config(path)
        message = str(caught.value)
        assert message.startswith(f"{path}: chaos: ")
        assert "SIDESTEP_ALLOW_CHAOS=1" in message and "production" in message


def test_chaos_loads_when_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With SIDESTEP_ALLOW_CHAOS=1 the section loads: its seed and rules in order, durations read as seconds."""
    monkeypatch.setenv(ALLOW_CHAOS, "1")
    config = sidestep.load_config(write(tmp_path, CHAOS))
    assert config.chaos is not None and config.chaos.seed == 7
    first, second = config.chaos.faults
    assert (first.fault, first.status, first.target, first.rate) == ("status", 503, "primary", 0.25)
    assert (second.fault, second.duration, second.count) == ("timeout", 300.0, True)


def test_no_chaos_needs_no_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """A configuration without `chaos:` loads whatever the variable says, and has no chaos."""
    monkeypatch.delenv(ALLOW_CHAOS, raising=False)
    assert sidestep.Config().chaos is None


@pytest.mark.parametrize(
    ("rule", "reason"),
    [
        ("{fault: status}", "needs a status"),
        ("{fault: status, status: 200}", "greater than or equal to 400"),
        ("{fault: timeout, status: 503}", "takes no status"),
        ("{fault: connect_error, after_bytes: 3}", "takes no after_bytes"),
        ("{fault: status, status: 503, rate: 0}", "greater than 0"),
        ("{fault: status, status: 503, times: true}", "not true or false"),
        ("{fault: status, status: 503, target: nowhere}", "no target 'nowhere'"),
        ("{fault: status, status: 503, route: other}", "no route 'other'"),
        ("{fault: status, status: 503, route: chat, target: ghost}", "in route 'chat'"),
        ("{fault: explode}", "must be 'status'"),
        ("{fault: timeout, colour: red}", "unknown key"),
    ],
)
def test_invalid_rules_are_refused_with_the_reason(
    rule: str, reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each invalid rule fails to load with a ConfigError that says what is wrong with it."""
    monkeypatch.setenv(ALLOW_CHAOS, "1")
    text = CHAOS.split("chaos:")[0] + f"chaos:\n  faults:\n    - {rule}\n"
    with pytest.raises(sidestep.ConfigError, match="chaos") as caught:
        sidestep.load_config(write(tmp_path, text))
    assert reason in str(caught.value)


def test_a_plan_file_is_the_chaos_section_on_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan file holds `seed:` and `faults:` and loads with no variable set; an empty list of faults is refused."""
    monkeypatch.delenv(ALLOW_CHAOS, raising=False)
    plan = load_plan(
        write(tmp_path, "seed: 3\nfaults:\n  - {fault: cut_stream, after_bytes: 10}\n")
    )
    assert plan.seed == 3 and plan.faults[0].after_bytes == 10
    with pytest.raises(sidestep.ConfigError, match="faults"):
        load_plan(write(tmp_path, "faults: []\n", "empty.yaml"))
