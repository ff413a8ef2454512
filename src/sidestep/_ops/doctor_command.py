"""The command `sidestep doctor`: `doctor`'s findings about a configuration, printed.

The file is read leniently (`doctor_load`), so that unset variables are a
finding rather than an error; with ``--online`` the configured Redis is
pinged, and nothing else is called. It exits 0; 1 with ``--strict`` when any
finding warns; 2 for an invalid configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, TextIO

from .._common.errors import ConfigError
from .._settings.config import Config
from .._settings.stores import plain_redis_url
from .command_line import USAGE, config_option, fail
from .doctor import diagnose
from .doctor_findings import WARN, Finding
from .doctor_load import load_leniently, store_url_unset

__all__ = ["add_doctor", "doctor"]


def add_doctor(commands: Any) -> None:
    doctor = commands.add_parser(
        "doctor",
        help="check a configuration without calling an upstream",
        description=(
            "Check a configuration: timeouts against budgets, targets a request can never"
            " reach, targets that are not redundant, overlapping routes, LLM settings,"
            " windows, unset variables, the store. Exit 0; 1 with --strict when any finding"
            " warns; 2 for an invalid configuration."
        ),
    )
    config_option(doctor)
    doctor.add_argument("--json", action="store_true", help="print JSON")
    doctor.add_argument("--strict", action="store_true", help="exit 1 when any finding warns")
    doctor.add_argument(
        "--online", action="store_true", help="ping the configured Redis (no upstream is called)"
    )
    doctor.add_argument(
        "cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command `run` will start"
    )


def doctor(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run `doctor`; 0, 1 with --strict when a finding warns, 2 for an invalid configuration."""
    out = out or sys.stdout
    path = args.config or os.environ.get("SIDESTEP_CONFIG")
    if not path:
        return fail("sidestep doctor", "no configuration: -c FILE (or SIDESTEP_CONFIG)", USAGE)
    try:
        config, unset, warned = load_leniently(path)
    except ConfigError as exc:
        return fail("sidestep doctor", str(exc), USAGE)
    command = list(args.cmd)
    if command[:1] == ["--"]:
        command = command[1:]
    ping = _pinger(config, unset) if args.online else None
    findings = [
        *(Finding(WARN, "config", message) for message in warned),
        *diagnose(config, unset=unset, command=command, ping=ping),
    ]
    if args.json:
        print(json.dumps({"findings": [f.as_dict() for f in findings]}, indent=2), file=out)
    else:
        for finding in findings:
            print(f"{finding.status:<7} {finding.check:<16} {finding.reason}", file=out)
            if finding.keys:
                print(f"{'':<24} keys: {', '.join(finding.keys)}", file=out)
        counts = {s: sum(f.status == s for f in findings) for s in ("ok", "warn", "unknown")}
        print(", ".join(f"{n} {s}" for s, n in counts.items()), file=out)
    warns = any(f.status == WARN for f in findings)
    return 1 if args.strict and warns else 0


def _pinger(config: Config, unset: list[str]) -> Any:
    if config.store.kind != "redis":
        return None

    def ping() -> bool | None:
        if store_url_unset(config, unset):
            return None  # its address is a stand-in: there is nothing to ask
        import redis  # the optional redis extra: only for a Redis store

        options = config.store.options
        try:
            client = redis.Redis.from_url(
                plain_redis_url(options.url)[0],  # type: ignore[attr-defined]  # one node of a cluster
                socket_timeout=2.0,
                socket_connect_timeout=2.0,
            )
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:  # any failure is "does not answer"; its message may quote the URL
            return False

    return ping
