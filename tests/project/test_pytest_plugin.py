"""The pytest plugin of sidestep.testing, run as a user's test suite runs it: in a pytest of
its own, on the example apps' tests, the fault-injection page's example, and a suite of
our own; declared as an entry point, and `sidestep.testing` usable without pytest."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from upstream import Respond, Upstream

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "sidestep.testing.plugin"
PAGE = ROOT / "docs" / "fault-injection.md"


def plugin_options() -> list[str]:
    """`-p` the plugin, unless this environment installed sidestep with its entry point
    (pytest loads it then, and refuses to register it twice)."""
    installed = importlib.metadata.entry_points(group="pytest11")
    return [] if any(ep.value == PLUGIN for ep in installed) else ["-p", PLUGIN]


def run_pytest(
    *args: str, cwd: Path, env: dict[str, str] | None = None, passes: bool = True
) -> str:
    """Run pytest in a process of its own (our interpreter, this checkout's sources); its
    output, after checking it passed (or, with `passes` False, that it failed)."""
    environ = {
        **os.environ,
        **(env or {}),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    done = subprocess.run(  # noqa: S603  # our own interpreter and our own tests
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_options(), *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert (done.returncode == 0) is passes, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def upstreams() -> Iterator[tuple[str, str]]:
    primary = Upstream(lambda seen: Respond(200, b"primary"), name="primary")
    backup = Upstream(lambda seen: Respond(200, b"backup"), name="backup")
    try:
        yield primary.url, backup.url
    finally:
        primary.close()
        backup.close()


def suite(tmp_path: Path, primary: str, backup: str, tests: str) -> dict[str, str]:
    """A user's project in `tmp_path`: its sidestep.yaml (route chat: primary, backup), an
    empty pytest configuration, and `tests`; the environment its tests read."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    targets = [{"name": "primary", "url": primary}, {"name": "backup", "url": backup}]
    config = {"routes": [{"name": "chat", "targets": targets}]}
    (tmp_path / "sidestep.yaml").write_text(json.dumps(config))  # (JSON is YAML)
    (tmp_path / "test_user.py").write_text(tests)
    return {"PRIMARY_URL": primary, "BACKUP_URL": backup}


def test_the_example_apps_prove_their_failover_under_the_plugin() -> None:
    """The FastAPI and Flask examples' tests pass through the real openai SDK: the backup answers while the primary is down, and every target down ends in 503 all_candidates_suspended."""
    out = run_pytest(
        "--rootdir",
        str(ROOT),
        "-c",
        os.devnull,
        "-q",
        "examples/fastapi_app/test_failover.py",
        "examples/flask_app/test_failover.py",
        cwd=ROOT,
    )
    assert re.search(r"\b5 passed\b", out), out


def test_the_pages_pytest_example_passes(upstreams: tuple[str, str], tmp_path: Path) -> None:
    """The pytest example of docs/fault-injection.md passes as written, against healthy upstreams."""
    (block,) = re.findall(r"^<!-- pytest -->\n```python\n(.*?)^```", PAGE.read_text(), re.M | re.S)
    env = suite(tmp_path, upstreams[0] + "/v1", upstreams[1] + "/v1", block)
    out = run_pytest("-q", "test_user.py", cwd=tmp_path, env=env)
    assert re.search(r"\b2 passed\b", out), out


MARKED = """
import os

import httpx
import pytest

import sidestep
from sidestep import testing

CONFIG = sidestep.load_config("sidestep.yaml")
# built before any test: the fixture finds it, puts its plan under it, resets its circuits
SHARED = sidestep.FailoverTransport(CONFIG)
URL = os.environ["PRIMARY_URL"] + "/models"


def served(transport=SHARED):
    with httpx.Client(transport=transport) as client:
        return client.get(URL).extensions["sidestep"]["target"]


@pytest.mark.sidestep_down("primary")
def test_a_marker_takes_the_primary_down_and_opens_it():
    assert [served() for _ in range(3)] == ["backup"] * 3
    assert [s.target for s in SHARED.suspensions()] == ["primary"]


def test_the_next_test_starts_with_every_circuit_closed(sidestep_faults):
    assert SHARED.suspensions() == []
    assert served() == "primary"


@pytest.mark.sidestep_fault("connect_error", target="primary", times=1)
def test_a_fault_marker_with_its_settings(sidestep_faults):
    assert [served(), served()] == ["backup", "primary"]
    assert [(f.target, f.fault) for f in sidestep_faults.injected] == [("primary", "connect_error")]


def test_without_the_fixture_nothing_is_injected():
    assert served(sidestep.FailoverTransport(CONFIG)) == "primary"


def test_install_and_a_client_made_during_the_test(sidestep_faults):
    sidestep_faults.inject(testing.status(503), target="primary")
    sidestep.install(CONFIG)
    try:
        with httpx.Client() as client:
            assert client.get(URL).extensions["sidestep"]["target"] == "backup"
    finally:
        sidestep.uninstall()
"""


def test_markers_the_fixture_and_resets_between_tests(
    upstreams: tuple[str, str], tmp_path: Path
) -> None:
    """Markers put rules under every transport (one built at import too) for their test only; the next test finds every circuit closed; a test without the fixture gets no fault; install()'s clients get the plan."""
    env = suite(tmp_path, upstreams[0] + "/v1", upstreams[1] + "/v1", MARKED)
    out = run_pytest("-q", "test_user.py", cwd=tmp_path, env=env)
    assert re.search(r"\b5 passed\b", out), out


def test_a_misused_marker_says_how_to_use_it(upstreams: tuple[str, str], tmp_path: Path) -> None:
    """A marker without its one argument, or with a rule's invalid setting, fails the test run with a message saying what it takes."""
    tests = textwrap.dedent("""\
        import pytest

        @pytest.mark.sidestep_down()
        def test_no_target():
            pass

        @pytest.mark.sidestep_fault("status", target="primary")
        def test_no_status():
            pass
        """)
    env = suite(tmp_path, upstreams[0], upstreams[1], tests)
    out = run_pytest("-q", "test_user.py", cwd=tmp_path, env=env, passes=False)
    assert "sidestep_down takes one argument: the target's name" in out
    assert "fault 'status' needs a status" in out


def test_the_plugin_is_an_entry_point_and_testing_needs_no_pytest() -> None:
    """pyproject.toml declares the plugin under pytest11, and importing sidestep.testing does not import pytest."""
    declared = re.search(
        r"^\[project\.entry-points\.pytest11\]\n(.*?)^$",
        (ROOT / "pyproject.toml").read_text(),
        re.M | re.S,
    )
    assert declared is not None and declared[1] == f'sidestep = "{PLUGIN}"\n'
    done = subprocess.run(  # our own interpreter
        [
            sys.executable,
            "-c",
            "import sys, sidestep.testing; assert 'pytest' not in sys.modules, 'pytest imported'",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


ANOTHER = """
import os

import httpx
import pytest

import sidestep
from sidestep import testing

URL = os.environ["PRIMARY_URL"] + "/models"
CONFIG = sidestep.load_config("sidestep.yaml")
# a transport of another configuration, alive for the whole run, as a module-level client is
ELSEWHERE = sidestep.FailoverTransport(
    {"routes": [{"name": "other", "targets": [{"name": "elsewhere", "url": os.environ["BACKUP_URL"]}]}]}
)


@pytest.fixture
def transport():
    return sidestep.FailoverTransport(CONFIG)


def served(transport):
    with httpx.Client(transport=transport) as client:
        return client.get(URL).extensions["sidestep"]["target"]


def test_a_rule_for_this_tests_transport(transport, sidestep_faults):
    sidestep_faults.inject(testing.timeout(), target="primary", times=3)
    assert [served(transport) for _ in range(3)] == ["backup"] * 3
    assert [f.target for f in sidestep_faults.injected] == ["primary"] * 3


@pytest.mark.sidestep_down("primary")
def test_a_marker_for_this_tests_transport(transport):
    assert served(transport) == "backup"


@pytest.mark.sidestep_down("primray")
def test_a_misspelt_marker(transport):
    raise AssertionError("the body ran")


def test_a_rule_no_transport_has(transport, sidestep_faults):
    with pytest.raises(sidestep.ConfigError, match="has a target 'ghost'"):
        sidestep_faults.inject(testing.timeout(), target="ghost")
"""

GARBAGE = """
import gc
import os

import httpx

import sidestep
from sidestep import testing

URL = os.environ["PRIMARY_URL"] + "/models"
OTHER = {"routes": [{"name": "other", "targets": [{"name": "elsewhere", "url": os.environ["BACKUP_URL"]}]}]}


def test_an_earlier_test_leaves_another_configurations_transport_uncollected():
    gc.disable()  # enabled again by the next test
    cycle = [sidestep.FailoverTransport(OTHER)]
    cycle.append(cycle)


def test_a_rule_added_before_the_tests_transport_is_built(sidestep_faults):
    try:
        sidestep_faults.inject(testing.status(503), target="primary", times=1)
        with httpx.Client(transport=sidestep.FailoverTransport(sidestep.load_config("sidestep.yaml"))) as client:
            assert client.get(URL).extensions["sidestep"]["target"] == "backup"
    finally:
        gc.enable()
"""


def test_names_are_checked_against_the_transports_alive_not_each_of_them(
    upstreams: tuple[str, str], tmp_path: Path
) -> None:
    """With a transport of another configuration alive all along, the fixture's plan takes a rule, and a marker, naming the test's own transport's target and injects it there; a marker naming a target no transport has errors its test before the body runs, the message naming the marker and the target; inject() refuses such a target too."""
    env = suite(tmp_path, upstreams[0] + "/v1", upstreams[1] + "/v1", ANOTHER)
    out = run_pytest("-q", "test_user.py", cwd=tmp_path, env=env, passes=False)
    assert re.search(r"\b3 passed, 1 error\b", out), out
    assert "ERROR at setup of test_a_misspelt_marker" in out
    assert re.search(r"^@pytest.mark.sidestep_down\('primray'\): .* a target 'primray'$", out, re.M)
    assert "the body ran" not in out


def test_uncollected_transports_of_another_configuration_refuse_nothing(
    upstreams: tuple[str, str], tmp_path: Path
) -> None:
    """A rule added before the test builds its transport is accepted even when an earlier test left a transport of another configuration uncollected (the garbage collector off): only transports still referenced count, and under none the names are not checked; the rule then injects into the transport the test builds."""
    env = suite(tmp_path, upstreams[0] + "/v1", upstreams[1] + "/v1", GARBAGE)
    out = run_pytest("-q", "test_user.py", cwd=tmp_path, env=env)
    assert re.search(r"\b2 passed\b", out), out
