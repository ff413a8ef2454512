"""The `sidestep` command: `run` (the launcher), `demo`, and the operator's
`suspensions`, `clear` (both in `operate`) and `doctor` (in `doctor_command`).

`demo` lives in its own module, imported only when it is asked for, so the
command works without it (and `run` does not pay for importing it); the
rest is imported with this module.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .._common.version import __version__
from .doctor_command import add_doctor, doctor
from .launcher import run as launch
from .operate import add_operations, operate

__all__ = ["main"]

_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run `sidestep` with `argv` (default: the process's arguments); return the exit status."""
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        return _demo(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "run":
        command = list(args.cmd)
        if command[:1] == ["--"]:
            command = command[1:]
        return launch(command, args.config)
    if args.command in ("suspensions", "clear"):
        return operate(args)
    if args.command == "doctor":
        return doctor(args)
    parser.print_help(sys.stderr)
    return _USAGE


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sidestep", description="Keep outbound HTTP calls working through upstream outages."
    )
    parser.add_argument("--version", action="version", version=f"sidestep {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = commands.add_parser(
        "run",
        help="run a command with sidestep under every httpx and httpx2 client it creates",
        description=(
            "Run CMD with sidestep.install() active from interpreter start-up in every "
            "Python process it starts. The configuration file is validated first."
        ),
    )
    run.add_argument(
        "-c",
        "--config",
        metavar="FILE",
        help="the configuration file (default: the SIDESTEP_CONFIG environment variable)",
    )
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    add_operations(commands)
    add_doctor(commands)
    # demo's own options are parsed by demo itself (see _demo)
    commands.add_parser("demo", help="watch failover live against local upstreams", add_help=False)
    return parser


def _demo(argv: list[str]) -> int:
    try:
        from . import demo as _demo  # only when asked for: `run` does not pay for it
    except ImportError as exc:
        missing = exc.name or "a module"
        print(f"sidestep demo: not available here (cannot import {missing})", file=sys.stderr)
        return _USAGE
    parser = argparse.ArgumentParser(
        prog="sidestep demo", description="Watch failover live against local upstreams."
    )
    _demo.add_arguments(parser)
    return int(_demo.run(parser.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
