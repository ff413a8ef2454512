"""The start-up hook of `sidestep run`: install sidestep in each Python process the command starts.

`sidestep run` puts this directory first on ``PYTHONPATH``, so Python's `site`
imports this module as `sitecustomize` at start-up. It first runs the
`sitecustomize` it shadows, if there is one, then calls `sidestep.install()`
with the file named by ``SIDESTEP_CONFIG``, or with the defaults when none is
named. It never stops the program: if sidestep cannot be installed, one line
on stderr says why and the program runs without it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _run_shadowed() -> None:
    here = os.path.dirname(os.path.realpath(__file__))
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec(__name__, rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[__name__] = module  # `import sitecustomize` elsewhere finds the program's own
    spec.loader.exec_module(module)


def _install() -> None:
    try:
        path = os.environ.get("SIDESTEP_CONFIG")
        import warnings  # inside the guard: nothing here may stop the program it starts

        from sidestep._settings.config import load_config
        from sidestep._settings.values import SidestepConfigWarning
        from sidestep._shells.adopt import install

        if not path:
            install()  # no file named: the defaults (per-host breaking, no routes)
            return
        with warnings.catch_warnings():
            # `sidestep run` showed them once already; every interpreter would repeat them
            warnings.simplefilter("ignore", SidestepConfigWarning)
            install(load_config(path))
    except Exception as exc:  # the program runs on without sidestep, but says so
        sys.stderr.write(f"sidestep: not active in this process: {_reason(exc)}\n")


def _reason(exc: Exception) -> str:
    if isinstance(exc, ImportError):
        return f"cannot import {exc.name or 'a module'}"
    errors = sys.modules.get("sidestep._common.errors")
    if errors and isinstance(exc, errors.ConfigError):
        # ConfigError messages name a file, a key path and a reason, never a value
        return " ".join(str(exc).split())
    return type(exc).__name__  # any other message is not ours to repeat


try:
    _run_shadowed()
finally:
    _install()
