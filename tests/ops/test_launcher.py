"""`sidestep run` in subprocesses: programs that never import sidestep get it from start-up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import sidestep
from children import PYTHON, SRC, TESTS, environment
from llm_upstream import SDKS, llm, unavailable
from sidestep._ops.cli import main
from upstream import Upstream

# what a child prints to show whether sidestep is under its clients
SHOW_TRANSPORTS = (
    "import httpx, httpx2; "
    "print(type(httpx.Client()._transport).__name__, type(httpx2.AsyncClient()._transport).__name__)"
)
WRAPPED = "FailoverTransport AsyncFailoverTransport"


def sidestep_run(
    *args: str, env: dict[str, str] | None = None, **kw: Any
) -> subprocess.CompletedProcess[str]:
    """Run ``sidestep run ARGS`` as the console script would, and wait for it."""
    return subprocess.run(  # noqa: S603  # the interpreter under test, fixed arguments
        [PYTHON, "-m", "sidestep._ops.cli", "run", *args],
        env=env or environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        **kw,
    )


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


Run = Callable[..., Done]


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> Run:
    """``sidestep run ARGS`` in this process (the command still runs in a child), with `environment()`."""

    def go(*args: str, **extra: str) -> Done:
        for name in list(os.environ):
            if name not in (env := environment(**extra)):
                monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        capfd.readouterr()
        code = main(["run", *args])
        out, err = capfd.readouterr()
        return Done(code, out, err)

    return go


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A valid configuration file with no routes."""
    path = tmp_path / "sidestep.yaml"
    path.write_text("breaker: {cooldown: 30s}\n")
    return path


@pytest.fixture(autouse=True)
def scripted(a: Upstream, b: Upstream) -> None:
    """The primary (the SDK's base URL) is down; the backup answers with its own key."""
    a.behaviour = unavailable
    b.behaviour = llm("b")


CHILD = """
import asyncio, json, sys
from llm_upstream import SDKS

sdk, root = SDKS[sys.argv[1]], sys.argv[2]
answers = []
for stream in (False, True):
    with sdk.client(root, is_async=False) as client:
        answers.append(sdk.ask(client, stream=stream))

    async def ask():
        async with sdk.client(root, is_async=True) as client:
            return await sdk.ask_async(client, stream=stream)

    answers.append(asyncio.run(ask()))
print(json.dumps(answers))
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SDKS))
def test_sidestep_run_fails_over_for_a_program_that_never_imports_sidestep(
    name: str, a: Upstream, b: Upstream, tmp_path: Path
) -> None:
    """An SDK script run under `sidestep run` gets the backup's answers, sync and async, JSON and streamed."""
    sdk = SDKS[name]
    config = tmp_path / "sidestep.yaml"
    config.write_text(
        textwrap.dedent(
            f"""
            breaker: {{failure_threshold: 2, cooldown: 30s}}
            routes:
              - name: llm
                targets:
                  - {{name: primary, url: "{a.url}/v1"}}
                  - name: backup
                    url: "{b.url}/v1"
                    headers: {{{sdk.key_header}: "{sdk.key_prefix}${{BACKUP_KEY}}"}}
            """
        )
    )
    script = tmp_path / "app.py"
    script.write_text(CHILD)
    done = sidestep_run(
        "-c",
        str(config),
        "--",
        PYTHON,
        str(script),
        name,
        a.url,
        env=environment(BACKUP_KEY="b-key"),
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == ["hello from b"] * 4
    # one store for the whole process: the primary's circuit opened after two 503s
    assert (a.calls, b.calls) == (2, 4)
    assert all(s.headers[sdk.key_header] == sdk.key("b-key")[sdk.key_header] for s in b.seen)


def test_the_child_gets_the_chosen_file_as_an_absolute_sidestep_config(
    run: Run, config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-c` with a relative path reaches the child as SIDESTEP_CONFIG, absolute, with sidestep installed."""
    show = f"import os; {SHOW_TRANSPORTS}; print(os.environ['SIDESTEP_CONFIG'])"
    monkeypatch.chdir(tmp_path)
    done = run("-c", config.name, "--", PYTHON, "-c", show)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [WRAPPED, str(config)]


def test_sidestep_config_names_the_file_when_c_is_absent(run: Run, config: Path) -> None:
    """Without -c, the file named by SIDESTEP_CONFIG is used (and no `--` is needed)."""
    done = run(PYTHON, "-c", SHOW_TRANSPORTS, SIDESTEP_CONFIG=str(config))
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, WRAPPED, "")


def test_no_configuration_runs_with_the_defaults(run: Run) -> None:
    """Neither -c nor SIDESTEP_CONFIG: the command runs with sidestep installed on its defaults, printing only its own output."""
    done = run("--", PYTHON, "-c", SHOW_TRANSPORTS)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, WRAPPED, "")
    done = run("--", PYTHON, "-c", "print(1)")
    assert (done.returncode, done.stdout, done.stderr) == (0, "1\n", "")


def test_an_invalid_configuration_exits_2_with_its_error_and_no_secret(
    run: Run, tmp_path: Path
) -> None:
    """An invalid file stops the launcher before the command runs: the ConfigError line, no traceback, no secret."""
    path = tmp_path / "bad.yaml"
    path.write_text(
        "breaker: {cooldown: -5}\n"
        "routes:\n"
        "  - name: llm\n"
        "    targets:\n"
        "      - {name: a, url: 'http://127.0.0.1:1/v1', headers: {authorization: 'Bearer sk-SECRET'}}\n"
    )
    marker = tmp_path / "ran"
    done = run("-c", str(path), "--", PYTHON, "-c", f"open({str(marker)!r}, 'w')")
    assert done.returncode == 2
    assert done.stderr.startswith("sidestep run: ")
    assert "breaker.cooldown" in done.stderr
    assert "sk-SECRET" not in done.stderr and "Traceback" not in done.stderr
    assert not marker.exists()


def test_configuration_warnings_are_shown_once_by_the_launcher(run: Run, tmp_path: Path) -> None:
    """A legal but surprising setting is reported by the launcher, not again by every child."""
    path = tmp_path / "sidestep.yaml"
    path.write_text("breaker: {failure_threshold: 1}\n")
    done = run("-c", str(path), "--", PYTHON, "-c", SHOW_TRANSPORTS)
    assert done.returncode == 0
    assert done.stdout.strip() == WRAPPED
    assert done.stderr.splitlines() == [
        "sidestep run: warning: breaker.failure_threshold is 1: "
        "a single transient failure opens a scope"
    ]


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("raise SystemExit(7)", 7),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 128 + signal.SIGKILL),
        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", 128 + signal.SIGTERM),
    ],
    ids=["exit-7", "sigkill", "sigterm"],
)
def test_the_childs_exit_status_passes_through(
    run: Run, config: Path, code: str, status: int
) -> None:
    """The launcher exits as the command did; a command ended by signal n gives 128+n."""
    assert run("-c", str(config), "--", PYTHON, "-c", code).returncode == status


def test_a_sigterm_to_the_launcher_reaches_the_child(config: Path) -> None:
    """A supervisor's SIGTERM to the launcher is passed on; the child's death by it is 128+15."""
    wait = "import sys, time; print('ready', flush=True); time.sleep(30)"
    launcher = subprocess.Popen(  # noqa: S603  # the interpreter under test, fixed arguments
        [PYTHON, "-m", "sidestep._ops.cli", "run", "-c", str(config), "--", PYTHON, "-c", wait],
        env=environment(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert launcher.stdout is not None
        assert launcher.stdout.readline() == "ready\n"
        launcher.terminate()
        assert launcher.wait(10) == 128 + signal.SIGTERM
    finally:
        launcher.kill()
        launcher.wait()
        assert launcher.stdout is not None
        launcher.stdout.close()


def test_a_missing_command_exits_127(run: Run, config: Path) -> None:
    """A command that does not exist: exit 127 and a message naming it, as a shell would."""
    done = run("-c", str(config), "--", "no-such-command-here")
    assert done.returncode == 127
    assert "command not found: no-such-command-here" in done.stderr


def test_the_sitecustomize_it_shadows_still_runs(run: Run, config: Path, tmp_path: Path) -> None:
    """A program's own sitecustomize runs too, and is what `import sitecustomize` finds afterwards."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED'] = 'ran'\n")
    show = f"import os, sitecustomize; {SHOW_TRANSPORTS}; print(os.environ['SHADOWED'], sitecustomize.__file__)"
    path = os.pathsep.join(map(str, (site, SRC, TESTS)))
    done = run("-c", str(config), "--", PYTHON, "-c", show, PYTHONPATH=path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [WRAPPED, f"ran {site / 'sitecustomize.py'}"]


def test_a_child_that_cannot_load_the_configuration_runs_unwrapped_after_one_line(
    run: Run, tmp_path: Path
) -> None:
    """If the child cannot load the file the launcher checked, it says so in one line and runs without sidestep."""
    path = tmp_path / "sidestep.yaml"
    path.write_text(
        "routes:\n"
        "  - name: llm\n"
        "    targets:\n"
        "      - {name: a, url: 'http://127.0.0.1:1/v1', headers: {x-api-key: '${KEY}'}}\n"
    )
    done = run(
        "-c",
        str(path),
        "--",
        "env",
        "-u",
        "KEY",
        PYTHON,
        "-c",
        SHOW_TRANSPORTS,
        KEY="sk-SECRET",
    )
    assert (done.returncode, done.stdout.strip()) == (0, "HTTPTransport AsyncHTTPTransport")
    assert done.stderr.splitlines() == [
        f"sidestep: not active in this process: {path}: routes[0].targets[0].headers.x-api-key "
        "(route 'llm', target 'a'): environment variable 'KEY' is not set"
    ]


def test_version_names_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    """`sidestep --version` prints the installed version and exits 0."""
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"sidestep {sidestep.__version__}\n"


def test_demo_without_its_module_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """When the demo module cannot be imported, `sidestep demo` says so and exits 2."""
    monkeypatch.delattr(sidestep._ops, "demo", raising=False)
    monkeypatch.setitem(sys.modules, "sidestep._ops.demo", None)
    assert main(["demo"]) == 2
    assert "sidestep demo: not available here" in capsys.readouterr().err


def test_run_without_a_command_is_a_usage_error(config: Path) -> None:
    """`sidestep run -c FILE` with nothing to run exits 2 with the usage line."""
    assert main(["run", "-c", str(config), "--"]) == 2
