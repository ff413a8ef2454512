"""What the person running `sidestep demo` sees.

A live table of each target's calls and circuit, redrawn in place on a
terminal, plain progress lines otherwise (or nothing, with --json); both
clients' figures side by side at the end. `quiet_logs` keeps sidestep's own
log events out of the way meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any, TextIO

from .demo_load import Phase
from .demo_upstream import LocalUpstream

__all__ = ["View", "quiet_logs"]

_LINE_EVERY = 1.0  # seconds between progress lines when the output is not a terminal
_HIDE_CURSOR, _SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"
_BOLD, _DIM, _RESET = "\x1b[1m", "\x1b[2m", "\x1b[0m"
_COLOURS = {"closed": "\x1b[32m", "open": "\x1b[31m", "half_open": "\x1b[33m"}


class View:
    """Live progress: a table redrawn in place on a terminal, plain lines otherwise, or nothing."""

    def __init__(self, out: TextIO, *, quiet: bool) -> None:
        self._out = out
        self._quiet = quiet
        self._live = not quiet and out.isatty()
        self._drawn = 0
        self._last_line = 0.0
        # Box-drawing characters only where the output can encode them.
        utf8 = (getattr(out, "encoding", None) or "").lower().replace("-", "") == "utf8"
        self._glyphs = ("█", "·", " → ") if utf8 else ("#", ".", " -> ")

    def started(self, upstreams: list[LocalUpstream], attempts: int) -> None:
        if self._quiet:
            return
        if self._live:
            self._out.write(_HIDE_CURSOR)
        listing = ", ".join(f"{u.name} :{u.port}" for u in upstreams)
        order = self._glyphs[2].join(u.name for u in upstreams)
        self._out.write(
            f"upstreams on 127.0.0.1: {listing}\n"
            f"each request tries {order}, making {attempts} upstream calls at most\n"
        )
        self._out.flush()

    def show(self, phase: Phase, upstreams: list[LocalUpstream], *, final: bool = False) -> None:
        if self._quiet:
            return
        if self._live:
            self._redraw(self._table(phase, upstreams), final=final)
            return
        now = time.monotonic()
        if final or now - self._last_line >= _LINE_EVERY:
            self._last_line = now
            self._out.write(self._line(phase, upstreams) + "\n")
            self._out.flush()

    def restore(self) -> None:
        if self._live:
            self._out.write(_SHOW_CURSOR)
            self._out.flush()

    def summary(self, result: dict[str, Any]) -> None:
        rows = [
            ("requests", "requests", "{}"),
            ("errors seen by the caller", "errors", "{}"),
            ("upstream calls wasted on dead targets", "wasted_calls", "{}"),
            ("p50 latency", "p50_ms", "{} ms"),
            ("p99 latency", "p99_ms", "{} ms"),
            ("wall time", "wall_s", "{} s"),
        ]
        bold, reset = (_BOLD, _RESET) if self._live else ("", "")
        lines = [f"\n{bold}{'':<38}{'naive httpx':>14}{'sidestep':>12}{reset}"]
        for label, key, unit in rows:
            naive = unit.format(result["naive"][key])
            guarded = unit.format(result["sidestep"][key])
            lines.append(f"{label:<38}{naive:>14}{guarded:>12}")
        self._out.write("\n".join(lines) + "\n")
        self._out.flush()

    def _line(self, phase: Phase, upstreams: list[LocalUpstream]) -> str:
        tally = phase.tally
        states = " ".join(f"{u.name}={_state(phase, u.name)[0]}" for u in upstreams)
        return (
            f"[{phase.label}] {tally.done}/{tally.total} done, {tally.errors} errors, "
            f"{phase.wasted} wasted calls | {states}"
        )

    def _table(self, phase: Phase, upstreams: list[LocalUpstream]) -> list[str]:
        tally = phase.tally
        width = 30
        filled = width * tally.done // max(1, tally.total)
        bar = self._glyphs[0] * filled + self._glyphs[1] * (width - filled)
        lines = [
            f"{_BOLD}{phase.label}{_RESET}",
            f"  {bar} {tally.done}/{tally.total}   errors {tally.errors}   "
            f"wasted calls {phase.wasted}",
            f"  {_DIM}{'target':<10}{'behaviour':<28}{'calls':>7}{'skipped':>9}{'probes':>8}"
            f"  circuit{_RESET}",
        ]
        for u in upstreams:
            state, detail = _state(phase, u.name)
            colour = _COLOURS.get(state, "")
            shown = f"{colour}{state}{_RESET}{detail}" if colour else state
            lines.append(
                f"  {u.name:<10}{u.behaviour:<28}{u.calls:>7}"
                f"{phase.skipped.get(u.name, 0):>9}{phase.probes.get(u.name, 0):>8}  {shown}"
            )
        return lines

    def _redraw(self, lines: list[str], *, final: bool) -> None:
        up = f"\x1b[{self._drawn}F" if self._drawn else ""
        self._out.write(up + "".join(f"\x1b[2K{line}\n" for line in lines))
        self._out.flush()
        self._drawn = 0 if final else len(lines)


def _state(phase: Phase, target: str) -> tuple[str, str]:
    """The circuit state of `target` in this phase, and a short detail."""
    if phase.transport is None:
        return "-", ""
    for s in phase.transport.suspensions():
        if s.target == target:
            if s.state == "open" and s.retry_in is not None:
                return s.state, f" (retry in {s.retry_in:.1f}s)"
            return s.state, ""
    return "closed", ""


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """Keep sidestep's log events to themselves while the demo runs (its table says it all)."""
    logger = logging.getLogger("sidestep")
    saved = logger.propagate
    logger.propagate = False  # only the library's NullHandler hears them
    try:
        yield
    finally:
        logger.propagate = saved
