"""The whole configuration (`Config`), and reading it: from a YAML file or a mapping.

`load_config` reads a YAML file, substitutes `${ENV_VAR}` references in its
string values and validates the result into a frozen `Config`; `as_config`
accepts what the transports accept. Errors name the source, the key path and
the reason, never a value: header values and URLs may carry credentials.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .._common.errors import ConfigError
from .faults import ALLOW_CHAOS, Chaos, FaultPlanFile
from .observability import Observability
from .policies import BreakerPolicy, FailoverPolicy, Suspensions
from .routes import Route
from .stores import StoreSettings
from .values import Model, refuse_duplicates
from .yaml_document import _interpolate, _parse_yaml, _UnresolvedReference, read_document

__all__ = [
    "Config",
    "as_config",
    "load_config",
    "load_config_without_chaos",
    "load_plan",
    "unknown_names",
]

_M = TypeVar("_M", bound=BaseModel)


def _import_object(value: object) -> object:
    """Resolve ``"package.module:attribute"`` or ``"package.module.attribute"``; pass others on."""
    if not isinstance(value, str):
        return value
    module_name, colon, attribute = value.partition(":")
    if not colon:
        module_name, _, attribute = value.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"{value!r} must look like 'package.module:attribute'")
    try:
        found: object = importlib.import_module(module_name)
    except Exception as exc:
        # the module's own error message is not ours to repeat; its type and a missing name are
        missing = exc.name if isinstance(exc, ImportError) else None
        detail = f"no module named {missing!r}" if missing else f"{type(exc).__name__} on import"
        raise ValueError(f"cannot import {value!r}: {detail}") from None
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ValueError(f"cannot import {value!r}: no attribute {part!r}")
        found = getattr(found, part)
    return found


class Config(Model):
    """The whole configuration (DESIGN §4). Frozen; `Config.model_validate(mapping)` works.

    `classifier` replaces the built-in classifier: a callable, or an import
    string (``"package.module:attribute"``) resolved when the config is
    validated, so a configuration file may import code. `chaos` injects faults
    (`FaultRule`) for rehearsing an outage; it is refused unless the
    environment sets ``SIDESTEP_ALLOW_CHAOS=1``.
    """

    breaker: BreakerPolicy = Field(default_factory=BreakerPolicy)
    failover: FailoverPolicy = Field(default_factory=FailoverPolicy)
    suspensions: Suspensions = Field(default_factory=Suspensions)
    routes: list[Route] = Field(default_factory=list)
    store: StoreSettings = Field(default_factory=StoreSettings)
    observability: Observability = Field(default_factory=Observability)
    classifier: Annotated[Callable[..., Any] | None, BeforeValidator(_import_object)] = Field(
        default=None, repr=False
    )
    chaos: Chaos | None = None

    @field_validator("routes")
    @classmethod
    def _check_routes(cls, routes: list[Route]) -> list[Route]:
        refuse_duplicates("route", [r.name for r in routes])
        return routes

    @field_validator("chaos")
    @classmethod
    def _check_chaos(cls, chaos: Chaos | None) -> Chaos | None:
        if chaos is not None and os.environ.get(ALLOW_CHAOS) != "1":
            raise ValueError(
                f"fault injection is refused unless the environment sets {ALLOW_CHAOS}=1 "
                "(so that a production file cannot turn it on by accident)"
            )
        return chaos

    @model_validator(mode="after")
    def _check_chaos_names(self) -> Config:
        if self.chaos is not None:
            unknown_names(self.chaos, self.routes, "chaos.faults")
        return self


def unknown_names(plan: FaultPlanFile, routes: Sequence[Route], where: str) -> None:
    """Refuse a rule of `plan` that names a route or target `routes` do not have."""
    targets = {r.name: {t.name for t in r.targets} for r in routes}
    every: set[str] = set().union(*targets.values())
    for number, rule in enumerate(plan.faults):
        if rule.route is not None and rule.route not in targets:
            raise ValueError(f"{where}[{number}]: the configuration has no route {rule.route!r}")
        known = targets[rule.route] if rule.route is not None else every
        if rule.target is not None and rule.target not in known:
            within = f" in route {rule.route!r}" if rule.route is not None else ""
            raise ValueError(
                f"{where}[{number}]: the configuration has no target {rule.target!r}{within}"
            )


# --- loading -------------------------------------------------------------------------------


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read a YAML configuration file into a `Config`.

    String values may reference environment variables as ``${NAME}``, also
    inside longer strings (``"Bearer ${API_KEY}"``); ``$${`` stands for a
    literal ``${``. Substitution happens after parsing, so a value can never
    change the document's structure; a substituted value stays a string.

    Raises:
        ConfigError: the file cannot be read, is not valid YAML, its top level
            is not a mapping, it references an unset variable, or a setting is
            invalid. The message names the file, the key path and the reason,
            never a value.
    """
    source = os.fspath(path)
    return _validate(_read(source), source)


def load_config_without_chaos(path: str | os.PathLike[str]) -> tuple[Config, bool]:
    """Read a configuration file as `load_config` does, its ``chaos:`` section left out
    before anything else is done with it (so it is neither substituted nor validated, nor
    refused without ``SIDESTEP_ALLOW_CHAOS=1``); the `Config`, and whether the file had one.

    Raises:
        ConfigError: as `load_config`, for every other key.
    """
    source = os.fspath(path)
    data = _parsed(source)
    had_chaos = data.pop("chaos", None) is not None
    return _validate(_interpolated(data, source), source), had_chaos


def load_plan(path: str | os.PathLike[str]) -> FaultPlanFile:
    """Read a fault plan file (``seed:`` and ``faults:``, as the ``chaos:`` section) the
    way `load_config` reads a configuration.

    Raises:
        ConfigError: as `load_config`, for the plan's own keys.
    """
    source = os.fspath(path)
    return _validate_as(FaultPlanFile, _read(source), source)


def _read(source: str) -> dict[str, Any]:
    """The document at `source`, parsed and interpolated: a mapping of settings."""
    return _interpolated(_parsed(source), source)


def _parsed(source: str) -> dict[str, Any]:
    """The document at `source`, parsed, its references not substituted yet."""
    data = _parse_yaml(read_document(source), source)
    if data is None:  # an empty file, or only comments: every default
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping of settings, not {type(data).__name__}"
        )
    return data


def _interpolated(data: dict[str, Any], source: str) -> dict[str, Any]:
    """`data` with its ``${NAME}`` references substituted from the environment."""
    try:
        interpolated: dict[str, Any] = _interpolate(data, (), os.environ)
    except _UnresolvedReference as exc:
        raise ConfigError(f"{source}: {_describe(exc.loc, data)}: {exc.reason}") from None
    return interpolated


def as_config(value: Config | Mapping[str, Any] | None) -> Config:
    """Return `value` as a `Config`: `None` means every default, a mapping is validated.

    Raises:
        ConfigError: the mapping is not a valid configuration (source ``<mapping>``).
        TypeError: `value` is none of the three.
    """
    if isinstance(value, Config):
        return value
    if value is None:
        return Config()
    if isinstance(value, Mapping):
        return _validate(dict(value), "<mapping>")
    raise TypeError(f"expected a Config, a mapping or None, not {type(value).__name__}")


def _validate(data: dict[str, Any], source: str) -> Config:
    return _validate_as(Config, data, source)


def _validate_as(model: type[_M], data: dict[str, Any], source: str) -> _M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        # `from None`: the ValidationError still holds the inputs, secrets included
        problems = [
            f"{_describe(error['loc'], data)}: {_reason(error['type'], error['msg'])}"
            for error in exc.errors(include_input=False, include_url=False)
        ]
        if len(problems) == 1:
            raise ConfigError(f"{source}: {problems[0]}") from None
        listed = "".join(f"\n  {problem}" for problem in problems)
        raise ConfigError(f"{source}: {len(problems)} invalid settings:{listed}") from None


def _reason(kind: str, message: str) -> str:
    if kind == "missing":
        return "a required key is missing"
    if kind == "extra_forbidden":
        return "unknown key"
    if message.startswith("Input should be "):  # pydantic's phrasing, read as a rule
        return "must be " + message.removeprefix("Input should be ")
    return message.removeprefix("Value error, ")


def _describe(loc: Sequence[str | int], data: object) -> str:
    """A key path such as ``routes[0].targets[1].url (route 'chat', target 'backup')``."""
    path = ""
    names: list[str] = []
    node: object = data
    for key in loc:
        if isinstance(key, int):
            kind = path.rpartition(".")[2].partition("[")[0].removesuffix("s")
            path += f"[{key}]"
            node = node[key] if isinstance(node, list) and 0 <= key < len(node) else None
            name = node.get("name") if isinstance(node, dict) else None
            if isinstance(name, str) and name and name == name.strip():
                names.append(f"{kind} {name!r}")
        else:
            path = f"{path}.{key}" if path else str(key)
            node = node.get(key) if isinstance(node, dict) else None
    if not path:
        return "top level"
    return f"{path} ({', '.join(names)})" if names else path
