"""Fault rules: what a fault plan (`sidestep.testing`) or the `chaos:` section injects.

A rule names a fault (`fault:` and the settings of that fault), the requests it
applies to (`route`, `target`), and when (`times`, `for`, `rate`, all of them
when several are given); `count` says whether an injected failure counts
against the target's circuit. A plan file (`sidestep demo --plan FILE`) is a
`FaultPlanFile`; the `chaos:` section of a configuration is the same document,
refused unless the environment allows it (`ALLOW_CHAOS`, checked by `Config`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, Field, StrictBool, model_validator

from .values import Count, Model, NonNegativeDuration, PositiveDuration, Ratio, refuse_bool

__all__ = [
    "ALLOW_CHAOS",
    "FAULTS",
    "Chaos",
    "FaultKind",
    "FaultPlanFile",
    "FaultRule",
]

ALLOW_CHAOS = "SIDESTEP_ALLOW_CHAOS"
"""The environment variable that must be ``1`` for a configuration with ``chaos:`` to load."""

FaultKind = Literal[
    "status",
    "timeout",
    "connect_error",
    "malformed_body",
    "cut_stream",
    "stalled_stream",
    "error_event",
]
FAULTS: tuple[FaultKind, ...] = get_args(FaultKind)
# The settings each fault takes besides the selectors (every other one must be left out).
_SETTINGS: dict[str, frozenset[str]] = {
    "status": frozenset({"status", "retry_after"}),
    "timeout": frozenset({"delay"}),
    "connect_error": frozenset(),
    "malformed_body": frozenset(),
    "cut_stream": frozenset({"after_bytes"}),
    "stalled_stream": frozenset({"after_bytes"}),
    "error_event": frozenset({"error"}),
}
_ERROR_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}")


def _check_name(value: str) -> str:
    if not value or value != value.strip():
        raise ValueError("a name must be non-empty, without leading or trailing whitespace")
    return value


def _check_error_type(value: str) -> str:
    if not _ERROR_TYPE.fullmatch(value):
        raise ValueError("an error type is a word such as 'overloaded_error' or 'server_error'")
    return value


_Name = Annotated[str, AfterValidator(_check_name)]
_Status = Annotated[int, Field(ge=400, le=599)]
_Bytes = Annotated[int, Field(ge=0)]


class FaultRule(Model):
    """One fault, the requests it applies to, and when.

    Selectors: `route` and `target` name the configuration's route and target
    (either left out: any); a rule applies to routed requests only. `times`
    (the first N requests it applies to), `for` (seconds from when the rule
    was added, or the transport built) and `rate` (the share of requests, drawn
    from the plan's seeded random numbers) narrow it further; a rule with none
    of them applies to every request it selects. `count`: whether an injected
    failure counts against the target's circuit — left out, it does in a store
    of this process (`MemoryStore`) and does not in a shared one.
    """

    fault: FaultKind
    target: _Name | None = None
    route: _Name | None = None
    status: _Status | None = None
    retry_after: NonNegativeDuration | None = None
    delay: NonNegativeDuration = 0.0
    after_bytes: _Bytes = 0
    error: Annotated[str, AfterValidator(_check_error_type)] = "overloaded_error"
    times: Count | None = None
    duration: PositiveDuration | None = Field(default=None, alias="for")
    rate: Ratio | None = None
    count: StrictBool | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_bool_counts(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in ("status", "after_bytes"):
                if key in data:
                    refuse_bool(data[key])
        return data

    @model_validator(mode="after")
    def _check_settings(self) -> FaultRule:
        own = _SETTINGS[self.fault]
        fields = type(self).model_fields
        given = {
            name
            for name in self.model_fields_set & _ALL_SETTINGS
            if getattr(self, name) != fields[name].default  # its default, even if written
        }
        foreign = sorted(given - own)
        if foreign:
            names = ", ".join(foreign)
            raise ValueError(f"fault {self.fault!r} takes no {names}")
        if self.fault == "status" and self.status is None:
            raise ValueError("fault 'status' needs a status (400 to 599)")
        return self

    @property
    def label(self) -> str:
        """The fault as metrics and events name it: its kind, a status fault's code with it."""
        return f"status_{self.status}" if self.fault == "status" else self.fault


_ALL_SETTINGS = frozenset().union(*_SETTINGS.values())


class FaultPlanFile(Model):
    """A fault plan as a file holds it: the rules in order (the first that applies wins),
    and the seed of the random numbers `rate` draws from."""

    seed: Annotated[int, Field(strict=True)] | None = None
    faults: Annotated[list[FaultRule], Field(min_length=1)]


class Chaos(FaultPlanFile):
    """The `chaos:` section: faults injected into the transports built from the
    configuration, for rehearsing an outage in staging. Loading it needs
    ``SIDESTEP_ALLOW_CHAOS=1`` in the environment."""
