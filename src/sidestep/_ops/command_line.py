"""What the operator's commands share: the `-c FILE` option, and how they fail.

A usage error (no configuration, an invalid one, a wrong option) exits 2, a
failure to get an answer exits 1; either way one line on stderr says why,
after the command's name.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["FAILED", "USAGE", "config_option", "fail"]

USAGE = 2
FAILED = 1


def config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c",
        "--config",
        metavar="FILE",
        help="the configuration file (default: the SIDESTEP_CONFIG environment variable)",
    )


def fail(name: str, message: str, status: int) -> int:
    print(f"{name}: {message}", file=sys.stderr)
    return status
