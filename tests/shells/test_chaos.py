"""The `chaos:` section: faults in every transport built from the configuration, for staging."""

from __future__ import annotations

import random
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

import sidestep
from children import PYTHON, environment
from drivers import MakeDriver, route
from sidestep._settings.faults import ALLOW_CHAOS
from upstream import Upstream


def chaotic(a: Upstream, b: Upstream, *faults: dict[str, Any], seed: int = 5) -> dict[str, Any]:
    config = route(
        ("primary", a.url + "/v1"), ("backup", b.url + "/v1"), breaker={"failure_threshold": 50}
    )
    config["chaos"] = {"seed": seed, "faults": list(faults)}
    return config


def test_chaos_injects_at_its_seeded_rate(
    make: MakeDriver, a: Upstream, b: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With SIDESTEP_ALLOW_CHAOS=1 a transport built from a chaos configuration fails the primary exactly where the section's seeded draws fall under its rate, and the backup answers those requests."""
    monkeypatch.setenv(ALLOW_CHAOS, "1")
    rule = {"fault": "status", "status": 503, "target": "primary", "rate": 0.5}
    d = make(chaotic(a, b, rule, seed=11))
    draws = random.Random(11)
    expected = ["b" if draws.random() < 0.5 else "a" for _ in range(12)]
    assert [d.get(a.url + "/v1/x").text for _ in range(12)] == expected
    assert {"a", "b"} <= set(expected)  # (the seed draws both)


def test_without_the_variable_no_transport_is_built(
    a: Upstream, b: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chaos configuration given as a mapping is refused with a ConfigError that says why, and install() refuses it too."""
    monkeypatch.delenv(ALLOW_CHAOS, raising=False)
    config = chaotic(a, b, {"fault": "connect_error"})
    with pytest.raises(sidestep.ConfigError, match="SIDESTEP_ALLOW_CHAOS=1"):
        sidestep.FailoverTransport(config)
    with pytest.raises(sidestep.ConfigError, match="SIDESTEP_ALLOW_CHAOS=1"):
        sidestep.install(config)


def test_install_puts_chaos_under_every_client(
    a: Upstream, b: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under install() every client created gets the section's faults: the primary's refused connections fail over to the backup."""
    monkeypatch.setenv(ALLOW_CHAOS, "1")
    sidestep.install(chaotic(a, b, {"fault": "connect_error", "target": "primary"}))
    try:
        with httpx.Client() as client:
            assert client.get(a.url + "/v1/x").text == "b"
    finally:
        sidestep.uninstall()
    assert a.calls == 0


def test_sidestep_run_with_chaos(a: Upstream, b: Upstream, tmp_path: Path) -> None:
    """`sidestep run -c FILE` with chaos injects into a program that never imports sidestep when the variable is set, and refuses to start it otherwise."""
    config = tmp_path / "sidestep.yaml"
    config.write_text(
        textwrap.dedent(f"""\
            routes:
              - name: chat
                targets:
                  - {{name: primary, url: "{a.url}/v1"}}
                  - {{name: backup, url: "{b.url}/v1"}}
            chaos:
              faults:
                - {{fault: status, status: 500, target: primary}}
            """)
    )
    program = f"import httpx; print(httpx.get('{a.url}/v1/x').text)"
    command = [PYTHON, "-m", "sidestep._ops.cli", "run", "-c", str(config), "--", PYTHON, "-c"]

    def run(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: S603  # our own interpreter and program
            [*command, program],
            env=environment(**extra),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    allowed = run(SIDESTEP_ALLOW_CHAOS="1")
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.stdout.strip() == "b"
    refused = run(SIDESTEP_ALLOW_CHAOS="0")
    assert refused.returncode != 0
    assert "SIDESTEP_ALLOW_CHAOS=1" in refused.stderr
    assert a.calls == 0 and b.calls == 1
