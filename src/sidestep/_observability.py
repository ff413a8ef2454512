"""The `observability:` section of the configuration: metrics and traces with no code.

``observability: {prometheus: true, otel: true}`` makes every transport built
from the configuration (so `install()` and `sidestep run`) enable
`sidestep.metrics.prometheus` and `sidestep.metrics.otel`. Asking for one
whose extra is not installed is a configuration error that names the extra.
"""

from __future__ import annotations

import importlib.util

from pydantic import BaseModel, ConfigDict, StrictBool, model_validator

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

    @model_validator(mode="after")
    def _check_extras(self) -> Observability:
        for switch, (module, extra) in _NEEDS.items():
            if getattr(self, switch) and importlib.util.find_spec(module) is None:
                raise ValueError(f"{switch}: true needs the {extra} extra: pip install '{extra}'")
        return self
