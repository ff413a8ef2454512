"""`sidestep doctor`: deterministic findings about a configuration, without calling an upstream.

`diagnose` runs every check in a stable order: each route's (`doctor_routes`,
and `doctor_pools` for a pooled route), those across routes and of the global
settings (`doctor_global`), and the store's (`doctor_store`). Reasons name
routes, targets, keys and variable names, never a value: values may be
credentials. Only `--online` talks to anything, and only to the configured
Redis; the `store` check reads how many processes the command after ``--``
runs (`processes`), which may look for a ``gunicorn.conf.py`` in the working
directory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .._settings.config import Config
from .doctor_findings import Finding
from .doctor_global import failure_rate, overlaps, variables, windows
from .doctor_pools import pools
from .doctor_routes import budget, buffer, is_llm, llm, redundancy, timeouts
from .doctor_store import store

__all__ = ["diagnose"]


def diagnose(
    config: Config,
    *,
    unset: Sequence[str] = (),
    command: Sequence[str] = (),
    ping: Callable[[], bool | None] | None = None,
) -> list[Finding]:
    """Every finding about `config`, in a stable order.

    Args:
        unset: the ``${VAR}`` names the file uses that the environment lacks.
        command: the command `sidestep run` will start, when given (`--`).
        ping: with `--online`, asks the configured Redis for PING; None: offline.
    """
    findings: list[Finding] = []
    for index, route in enumerate(config.routes):
        at = f"routes[{index}]"
        policy = route.policy(config.failover)
        calls_llm = is_llm(route)
        findings += timeouts(route, at, policy)
        findings += budget(route, at, policy)
        findings += redundancy(route, at)
        findings += pools(route, at)
        if calls_llm:
            findings += llm(route, at, policy)
        findings += buffer(route, at, calls_llm)
    findings += overlaps(config)
    findings += windows(config)
    findings += failure_rate(config)
    findings += variables(unset)
    findings += store(config.store, command, ping)
    return findings
