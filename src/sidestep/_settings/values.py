"""What settings are made of: durations, sizes, counts and ratios as YAML and
Python give them; the models' common base; the warning for a legal but surprising setting.
"""

from __future__ import annotations

import math
import re
import sys
import warnings
from datetime import timedelta
from decimal import Decimal
from typing import Annotated

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
)

__all__ = [
    "ByteSize",
    "Count",
    "Duration",
    "Model",
    "Multiplier",
    "NonNegativeDuration",
    "PositiveDuration",
    "Ratio",
    "SidestepConfigWarning",
    "parse_duration",
    "parse_size",
    "refuse_bool",
    "refuse_duplicates",
    "warn",
]


class SidestepConfigWarning(UserWarning):
    """A setting that is legal but probably not what was meant."""


# --- durations and sizes -------------------------------------------------------------------

_DURATION = re.compile(r"([+-]?)(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?")
_DURATION_UNITS = {
    "ms": Decimal("0.001"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
    "d": Decimal(86400),
}
_DURATION_HELP = "a duration is a number of seconds or a string such as '250ms', '30s', '5m', '6h'"

_SIZE = re.compile(r"([+-]?)(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE_HELP = "a size is a number of bytes or a string such as '512KiB', '16MiB', '10MB'"


def parse_duration(value: object) -> float:
    """Return a duration in seconds from a number, a `timedelta` or a string like ``"250ms"``.

    Units: ``ms``, ``s``, ``m``, ``h``, ``d``; a bare number is seconds.

    Raises:
        ValueError: for booleans, negative or non-finite durations, and anything
            else; the message never repeats the value.
    """
    if isinstance(value, bool):
        raise ValueError(f"{_DURATION_HELP}, not true or false")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            raise ValueError("a duration must be finite") from None
    elif isinstance(value, str) and (match := _DURATION.fullmatch(value.strip())):
        sign, number, unit = match.groups()
        seconds = float(Decimal(number) * _DURATION_UNITS[unit or "s"])
        seconds = -seconds if sign == "-" else seconds
    else:
        raise ValueError(_DURATION_HELP)
    if not math.isfinite(seconds):
        raise ValueError("a duration must be finite")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


def parse_size(value: object) -> int:
    """Return a size in bytes from an int or a string like ``"16MiB"`` (binary) or ``"10MB"``.

    Raises:
        ValueError: for booleans, negative sizes, fractions of a byte and anything
            else; the message never repeats the value.
    """
    if isinstance(value, bool):
        raise ValueError(f"{_SIZE_HELP}, not true or false")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and (match := _SIZE.fullmatch(value.strip())):
        sign, number, unit = match.groups()
        exact = Decimal(number) * _SIZE_UNITS[(unit or "b").lower()]
        if exact != exact.to_integral_value():
            raise ValueError("a size must be a whole number of bytes")
        size = -int(exact) if sign == "-" else int(exact)
    else:
        raise ValueError(_SIZE_HELP)
    if size < 0:
        raise ValueError("a size cannot be negative")
    return size


def refuse_bool(value: object) -> object:
    # pydantic's lax mode reads `true` as 1; for a count or a ratio that is a typo, not a number.
    if isinstance(value, bool):
        raise ValueError("expected a number, not true or false")
    return value


Duration = Annotated[float, BeforeValidator(parse_duration)]
"""Seconds, from a number, a `timedelta` or a string such as ``"30s"`` (see `parse_duration`)."""

ByteSize = Annotated[int, BeforeValidator(parse_size)]
"""Bytes, from an int or a string such as ``"16MiB"`` (see `parse_size`)."""

PositiveDuration = Annotated[Duration, Field(gt=0)]
NonNegativeDuration = Annotated[Duration, Field(ge=0)]
Count = Annotated[int, BeforeValidator(refuse_bool), Field(ge=1)]
Ratio = Annotated[float, BeforeValidator(refuse_bool), Field(gt=0, le=1)]
Multiplier = Annotated[float, BeforeValidator(refuse_bool), Field(gt=1, allow_inf_nan=False)]


# --- warnings ------------------------------------------------------------------------------


def warn(message: str) -> None:
    """Warn at the first frame outside sidestep and pydantic: the line that built the config."""
    frame = sys._getframe(1)
    level = 2  # the caller of this function
    while frame.f_back is not None and frame.f_globals.get("__name__", "").partition(".")[0] in {
        "sidestep",
        "pydantic",
    }:
        frame = frame.f_back
        level += 1
    warnings.warn(message, SidestepConfigWarning, stacklevel=level)


class Model(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", hide_input_in_errors=True, populate_by_name=True
    )


def refuse_duplicates(kind: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{kind} names must be unique: {name!r} is used twice")
        seen.add(name)
