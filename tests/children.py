"""What a test's child processes run with: the sidestep under test and the tests' helper
modules on ``PYTHONPATH`` (and any folder a test adds), without the proxy variables or
``SIDESTEP_CONFIG`` of the process running the tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import sidestep

__all__ = ["PYTHON", "SRC", "TESTS", "environment"]

SRC = Path(sidestep.__file__).parent.parent  # where the sidestep under test lives
TESTS = Path(__file__).parent  # the tests' helper modules
PYTHON = sys.executable
_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


def environment(*paths: Path, **extra: str) -> dict[str, str]:
    """This process's environment for a child, with `paths` also on ``PYTHONPATH``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "SIDESTEP_CONFIG" and k.upper() not in _PROXY_VARIABLES
    }
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (SRC, TESTS, *paths))
    return {**env, **extra}
