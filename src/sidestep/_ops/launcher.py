"""`sidestep run`: run a command with sidestep installed in every Python process it starts.

The launcher validates the configuration once, then starts the command with
the package's `_ops/boot` directory first on ``PYTHONPATH``: its `sitecustomize`
calls `install()` as each interpreter starts, reading the file named by
``SIDESTEP_CONFIG`` (with no file, the defaults: per-host breaking, no
routes). The command's exit status becomes the launcher's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType

from .._common.errors import ConfigError
from .._settings.config import load_config
from .._settings.values import SidestepConfigWarning

__all__ = ["BOOT_DIR", "child_environment", "run"]

BOOT_DIR = Path(__file__).with_name("boot")
CONFIG_VARIABLE = "SIDESTEP_CONFIG"
# Signals a terminal sends to the whole foreground group reach the child directly;
# these are the ones a supervisor sends to the launcher alone, so they are passed on.
_FORWARDED = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, name)
)
_USAGE = 2
_CANNOT_EXECUTE = 126
_NOT_FOUND = 127


def run(command: Sequence[str], config_path: str | None = None) -> int:
    """Run `command` under `install()`; its exit status (128+n when signal n ended it)."""
    path = config_path or os.environ.get(CONFIG_VARIABLE)
    if not command:
        return _fail("no command to run: sidestep run [-c FILE] -- CMD ...", _USAGE)
    if path:
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", SidestepConfigWarning)
                load_config(path)
        except ConfigError as exc:
            return _fail(str(exc), _USAGE)
        except Exception as exc:  # the message of an unexpected error is not ours to repeat
            return _fail(f"{path}: cannot load the configuration ({type(exc).__name__})", _USAGE)
        for warning in caught:
            print(f"sidestep run: warning: {warning.message}", file=sys.stderr)
    env = child_environment(os.environ, os.path.abspath(path) if path else None)
    try:
        child = subprocess.Popen(list(command), env=env)  # noqa: S603  # the user's own command
    except FileNotFoundError:
        return _fail(f"command not found: {command[0]}", _NOT_FOUND)
    except PermissionError:
        return _fail(f"permission denied: {command[0]}", _CANNOT_EXECUTE)
    except OSError as exc:
        return _fail(
            f"cannot run {command[0]}: {exc.strerror or type(exc).__name__}", _CANNOT_EXECUTE
        )
    # only now: an ignored SIGINT set before the child started would be inherited by it
    with _forwarding(child):
        status = child.wait()
    return 128 - status if status < 0 else status


def child_environment(environ: Mapping[str, str], config_path: str | None) -> dict[str, str]:
    """`environ` with the boot directory first on ``PYTHONPATH`` and the configuration named.

    With no configuration file, ``SIDESTEP_CONFIG`` is left out: the defaults apply.
    """
    env = dict(environ)
    if config_path:
        env[CONFIG_VARIABLE] = config_path
    else:
        env.pop(CONFIG_VARIABLE, None)
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{BOOT_DIR}{os.pathsep}{existing}" if existing else str(BOOT_DIR)
    return env


@contextlib.contextmanager
def _forwarding(child: subprocess.Popen[bytes]) -> Iterator[None]:
    """Pass supervisor signals on to the child; leave Ctrl-C to it (the terminal sent it one)."""

    def forward(signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in _FORWARDED}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _fail(message: str, status: int) -> int:
    print(f"sidestep run: {message}", file=sys.stderr)
    return status
