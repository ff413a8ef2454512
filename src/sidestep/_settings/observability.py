"""The `observability:` section of the configuration: metrics and traces with no code.

``observability: {prometheus: true, otel: true}`` makes every transport built
from the configuration (so `install()` and `sidestep run`) enable
`sidestep.metrics.prometheus` and `sidestep.metrics.otel`. Asking for one
whose extra is not installed is a configuration error that names the extra.
"""

from __future__ import annotations

import importlib.util

from pydantic import BaseModel, ConfigDict, StrictBool, ValidationInfo, field_validator

__all__ = ["Observability"]

# Each switch, the module it needs, and the extra that installs it.
_NEEDS = {
    "prometheus": ("prometheus_client", "sidestep[prometheus]"),
    "otel": ("opentelemetry", "sidestep[otel]"),
}


class Observability(BaseModel):
    """Which metrics and traces sidestep reports from its events (none by default)."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    prometheus: StrictBool = False
    otel: StrictBool = False

    @property
    def enabled(self) -> bool:
        return self.prometheus or self.otel

    @field_validator("prometheus", "otel")
    @classmethod
    def _check_extra(cls, on: bool, info: ValidationInfo) -> bool:
        module, extra = _NEEDS[str(info.field_name)]
        if on and importlib.util.find_spec(module) is None:
            raise ValueError(f"needs the {extra} extra: pip install '{extra}'")
        return on
