"""The configuration: pydantic models of every setting, duration and size parsing, loading.

`load_config` reads a YAML file, substitutes `${ENV_VAR}` references in its
string values and validates the result into a frozen `Config`; `as_config`
accepts what the transports accept. Errors name the source, the key path and
the reason, never a value: header values and URLs may carry credentials.
"""

from __future__ import annotations

import importlib
import math
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ._errors import ConfigError
from ._observability import Observability
from ._scopes import is_credential
from ._store_config import StoreSettings
from ._yaml_document import _interpolate, _parse_yaml, _UnresolvedReference

__all__ = [
    "BreakerPolicy",
    "ByteSize",
    "Config",
    "Duration",
    "FailoverOverrides",
    "FailoverPolicy",
    "FailureRate",
    "ProviderState",
    "Route",
    "SidestepConfigWarning",
    "SuspensionWindow",
    "Suspensions",
    "Target",
    "as_config",
    "load_config",
    "parse_duration",
    "parse_size",
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


def _refuse_bool(value: object) -> object:
    # pydantic's lax mode reads `true` as 1; for a count or a ratio that is a typo, not a number.
    if isinstance(value, bool):
        raise ValueError("expected a number, not true or false")
    return value


Duration = Annotated[float, BeforeValidator(parse_duration)]
"""Seconds, from a number, a `timedelta` or a string such as ``"30s"`` (see `parse_duration`)."""

ByteSize = Annotated[int, BeforeValidator(parse_size)]
"""Bytes, from an int or a string such as ``"16MiB"`` (see `parse_size`)."""

_PositiveDuration = Annotated[Duration, Field(gt=0)]
_NonNegativeDuration = Annotated[Duration, Field(ge=0)]
_Count = Annotated[int, BeforeValidator(_refuse_bool), Field(ge=1)]
_Ratio = Annotated[float, BeforeValidator(_refuse_bool), Field(gt=0, le=1)]
_Multiplier = Annotated[float, BeforeValidator(_refuse_bool), Field(gt=1, allow_inf_nan=False)]


# --- names, URLs, headers ------------------------------------------------------------------


def _check_name(value: str) -> str:
    if not value or value != value.strip():
        raise ValueError("a name must be non-empty, without leading or trailing whitespace")
    return value


_DEFAULT_PORTS = {"http": 80, "https": 443}
_URL_HELP = "must be an absolute http or https URL, such as https://api.example.com/v1"


def _normalise_url(value: str) -> str:
    """Lower-case scheme and host, drop a default port and trailing slashes; refuse the rest.

    Userinfo is kept (the target's Basic credentials, see `_routes`) but never echoed.
    """
    if any(ch.isspace() or not ch.isprintable() for ch in value):
        raise ValueError("a URL must not contain whitespace or control characters")
    if "?" in value or "#" in value:
        raise ValueError("a URL here must not have a query or a fragment")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        # urllib's own messages quote the offending part of the URL
        raise ValueError("the URL has a malformed host or port") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise ValueError(_URL_HELP)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}" if userinfo else host
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        netloc = f"{netloc}:{port}"
    return f"{scheme}://{netloc}{parts.path.rstrip('/')}"


def _origin(url: str) -> str:
    """The scheme, host and port of a normalised URL: what reprs may show of it."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FRAMING = "framing headers are set from the body"
_HOP_BY_HOP = "hop-by-hop headers belong to one connection, and the HTTP client sets them"
_PROXY_CREDENTIAL = (
    "a proxy's credentials go in the proxy's URL; set on a target they would reach the"
    " upstream itself (through a proxy's tunnel, or with no proxy at all)"
)
# Headers a target may not set (lowercase name -> why): each request's own is made
# anew, so a configured one would be dropped or sent beside it, breaking the framing.
# (A target's own Host is allowed: it replaces the one made from its URL.)
_REFUSED_HEADERS = {
    "content-length": _FRAMING,
    "transfer-encoding": _FRAMING,
    "connection": _HOP_BY_HOP,
    "keep-alive": _HOP_BY_HOP,
    "proxy-connection": _HOP_BY_HOP,
    "te": _HOP_BY_HOP,
    "trailer": _HOP_BY_HOP,
    "upgrade": _HOP_BY_HOP,
    "proxy-authorization": _PROXY_CREDENTIAL,
}


def _check_headers(value: object) -> object:
    """Lower-case header names and check names and values without ever quoting a value.

    Done before pydantic's own dict validation, whose error locations would
    quote a malformed name, which may be a pasted ``Authorization: Bearer ...`` line.
    """
    if not isinstance(value, Mapping):
        raise ValueError("headers must be a mapping of header names to strings")
    headers: dict[str, str] = {}
    for position, (name, text) in enumerate(value.items(), start=1):
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise ValueError(f"header #{position}: the name is not a valid HTTP header name")
        if (why := _REFUSED_HEADERS.get(name.lower())) is not None:
            raise ValueError(f"header {name!r} cannot be set by a target: {why}")
        if not isinstance(text, str):
            raise ValueError(f"header {name!r}: the value must be a string")
        if any(ch in text for ch in "\r\n\0"):
            raise ValueError(f"header {name!r}: the value contains a line break or NUL")
        if not text.isascii():
            # httpx encodes a header given as text as ASCII: every request would raise
            raise ValueError(f"header {name!r}: the value is not ASCII")
        if name.lower() in headers:
            raise ValueError(f"header {name!r} is given twice (names are case-insensitive)")
        headers[name.lower()] = text
    return headers


_Name = Annotated[str, AfterValidator(_check_name)]
_HttpUrl = Annotated[str, AfterValidator(_normalise_url)]


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


# --- warnings ------------------------------------------------------------------------------


def _warn(message: str) -> None:
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


# --- the models ----------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", hide_input_in_errors=True, populate_by_name=True
    )


class FailureRate(_Model):
    """Open a scope when the failure ratio over a sliding window reaches `threshold`."""

    threshold: _Ratio
    window: _PositiveDuration = 30.0
    minimum_calls: _Count = 20


class BreakerPolicy(_Model):
    """When a scope's circuit opens and how long it stays open (DESIGN §3.3)."""

    failure_threshold: _Count = 3
    cooldown: _PositiveDuration = 30.0
    max_cooldown: _PositiveDuration = 600.0
    backoff_multiplier: _Multiplier = 2.0
    slow_failure: _NonNegativeDuration = 1.0
    half_open_probes: _Count = 1
    failure_rate: FailureRate | None = None
    enforce: bool = True

    @model_validator(mode="after")
    def _check(self) -> BreakerPolicy:
        if self.max_cooldown < self.cooldown:
            raise ValueError("max_cooldown must not be shorter than cooldown")
        if self.cooldown < 0.1:
            _warn("breaker.cooldown is under 100ms: an open scope is retried almost at once")
        if self.failure_threshold == 1:
            _warn("breaker.failure_threshold is 1: a single transient failure opens a scope")
        return self


class FailoverPolicy(_Model):
    """How one request moves through its candidates (DESIGN §3.1)."""

    max_total_attempts: _Count = 4
    max_attempts_per_target: _Count = 1
    max_retry_wait: _NonNegativeDuration = 5.0
    total_timeout: _PositiveDuration | None = None
    first_byte_timeout: _PositiveDuration | None = None  # answers that stream only
    response_timeout: _PositiveDuration | None = None  # any answer's first body byte
    stall_timeout: _PositiveDuration | None = None
    retry_ambiguous: bool = False
    on_context_overflow: bool = True
    on_all_suspended: Literal["raise", "respond"] = "raise"


class FailoverOverrides(_Model):
    """A route's changes to the `FailoverPolicy`; a field left unset (or `None`) inherits."""

    max_total_attempts: _Count | None = None
    max_attempts_per_target: _Count | None = None
    max_retry_wait: _NonNegativeDuration | None = None
    total_timeout: _PositiveDuration | None = None
    first_byte_timeout: _PositiveDuration | None = None
    response_timeout: _PositiveDuration | None = None
    stall_timeout: _PositiveDuration | None = None
    retry_ambiguous: bool | None = None
    on_context_overflow: bool | None = None
    on_all_suspended: Literal["raise", "respond"] | None = None

    def apply(self, base: FailoverPolicy) -> FailoverPolicy:
        """Return `base` with the fields set here replacing its own, validated again.

        An explicit `None` clears a timeout the base sets (``total_timeout: null``
        on a route means no total timeout there); for the other fields, which
        cannot be `None`, it inherits.
        """
        updates = {
            name: getattr(self, name)
            for name in self.model_fields_set
            if getattr(self, name) is not None or name in _CLEARABLE
        }
        if not updates:
            return base
        return FailoverPolicy.model_validate({**base.model_dump(), **updates})


_CLEARABLE = frozenset(
    name for name, field in FailoverPolicy.model_fields.items() if field.default is None
)


class SuspensionWindow(_Model):
    """How long a reason suspension lasts: `initial`, growing to `max` (`None`: until cleared)."""

    initial: _PositiveDuration
    max: _PositiveDuration | None

    @model_validator(mode="after")
    def _check(self) -> SuspensionWindow:
        if self.max is not None and self.max < self.initial:
            raise ValueError("max must not be shorter than initial")
        return self


class Suspensions(_Model):
    """The window of each suspension reason (DESIGN §3.2)."""

    rate_limited: SuspensionWindow = SuspensionWindow(initial=1.0, max=60.0)
    quota_exhausted: SuspensionWindow = SuspensionWindow(initial=900.0, max=21600.0)
    invalid_credential: SuspensionWindow = SuspensionWindow(initial=600.0, max=21600.0)

    def window(self, reason: str) -> SuspensionWindow:
        """The window for `reason` (``"rate_limited"``, …); `KeyError` for an unknown reason."""
        return {
            "rate_limited": self.rate_limited,
            "quota_exhausted": self.quota_exhausted,
            "invalid_credential": self.invalid_credential,
        }[reason]


# A path segment as it travels (percent-encoded), or "*" for any one segment.
_PATH_SEGMENT = re.compile(r"\*|(?:[A-Za-z0-9\-._~!$&'()+,;=:@]|%[0-9A-Fa-f]{2})+")
_PATH_HELP = (
    "a path pattern is relative to the route's URL and starts with '/', such as '/jobs'"
    " or '/jobs/*/logs' ('*' stands for one whole segment)"
)


def _check_path_pattern(value: str) -> str:
    if not value.startswith("/") or value.strip("/") == "":
        raise ValueError(_PATH_HELP)
    for segment in value.strip("/").split("/"):
        if not segment:
            raise ValueError("a path pattern must not have an empty segment ('//')")
        if segment in (".", ".."):
            raise ValueError("a path pattern must not have a '.' or '..' segment")
        if not _PATH_SEGMENT.fullmatch(segment):
            raise ValueError(
                "a path pattern's segment is '*' or characters a path may hold"
                " (percent-encoded; no whitespace, '?', '#' or '*' inside a segment)"
            )
    return value.rstrip("/")


def _check_field_name(value: str) -> str:
    if not value or any(ch.isspace() or ch in '"\\' or not ch.isprintable() for ch in value):
        raise ValueError(
            "a field name must be non-empty, without whitespace, quotes or backslashes"
        )
    return value


_PathPattern = Annotated[str, AfterValidator(_check_path_pattern)]
_FieldName = Annotated[str, AfterValidator(_check_field_name)]


class ProviderState(_Model):
    """Which requests of a route name state kept by one provider (DESIGN §12).

    Such a request is never sent to a target on another origin, URL prefix or
    credential than its own (the route's first candidate for it): it is
    retried there as the policy allows, else its own answer is returned.
    `builtin` turns on the OpenAI and Anthropic rules (`_provider_state`);
    `paths` (relative to the route's URL, on segment boundaries, ``*`` one
    segment) and `fields` (top-level JSON body fields) add the route's own.
    In a file, ``auto`` is the default and ``none`` turns every rule off.
    """

    builtin: bool = True
    paths: tuple[_PathPattern, ...] = ()
    fields: tuple[_FieldName, ...] = ()


def _provider_state_shorthand(value: object) -> object:
    if value == "auto":
        return {}
    if value == "none":
        return {"builtin": False}
    if isinstance(value, str):
        raise ValueError("must be 'auto', 'none' or a mapping of builtin, paths and fields")
    return value


class Target(_Model):
    """One upstream of a route: where to send, and what to add to the request.

    `url` is stored normalised (lower-case scheme and host, no default port, no
    trailing slash). `headers` values are secrets: reprs show header names only,
    and the URL only as its origin.
    """

    name: _Name
    url: _HttpUrl
    headers: Annotated[dict[str, str], BeforeValidator(_check_headers)] = Field(
        default_factory=dict, repr=False
    )
    json_fields: dict[str, Any] = Field(default_factory=dict, alias="json")
    inherit_credentials: bool = False

    @model_validator(mode="after")
    def _one_source_of_basic_credentials(self) -> Target:
        # Userinfo in the URL is this target's Basic credentials (sent as its own
        # Authorization header); with an authorization header too, one would be lost.
        if "@" in urlsplit(self.url).netloc and "authorization" in self.headers:
            raise ValueError(
                "the URL's userinfo and the authorization header both give this target's"
                " credentials: keep one"
            )
        return self

    @model_validator(mode="after")
    def _inherits_nothing_with_a_credential(self) -> Target:
        # A target with a credential of its own gets none of the caller's (its credential
        # replaces the caller's, all of it): inherit_credentials then changes nothing.
        own = "@" in urlsplit(self.url).netloc or any(map(is_credential, self.headers))
        if self.inherit_credentials and own:
            _warn(
                f"target {self.name!r} sets a credential of its own: it gets none of the"
                " caller's, and inherit_credentials changes nothing"
            )
        return self

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        yield "name", self.name
        yield "origin", _origin(self.url)
        yield "header_names", list(self.headers)
        yield "json_keys", list(self.json_fields)
        yield "inherit_credentials", self.inherit_credentials


class Route(_Model):
    """Targets tried in order for requests that match any of them or a `match` prefix."""

    name: _Name
    match: list[_HttpUrl] = Field(default_factory=list)
    commit: Literal["first_token", "first_byte", "complete"] = "first_token"
    max_buffered_bytes: Annotated[ByteSize, Field(gt=0)] = 16 * 2**20
    avoid_rate_limits: bool = False  # a success that spent the last request suspends its scope
    # `validate` in the file: the name would shadow a pydantic method here
    validate_body: Literal["auto", "none"] = Field("auto", alias="validate")
    failover: FailoverOverrides = Field(default_factory=FailoverOverrides)
    # requests naming state kept by one provider stay with their own target
    provider_state: Annotated[ProviderState, BeforeValidator(_provider_state_shorthand)] = Field(
        default_factory=ProviderState
    )
    targets: list[Target]

    @field_validator("targets")
    @classmethod
    def _check_targets(cls, targets: list[Target]) -> list[Target]:
        if not targets:
            raise ValueError("a route needs at least one target")
        _refuse_duplicates("target", [t.name for t in targets])
        return targets

    def policy(self, base: FailoverPolicy) -> FailoverPolicy:
        """The failover policy of this route: `base` with this route's overrides."""
        return self.failover.apply(base)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for key, value in super().__repr_args__():
            yield key, ([_origin(url) for url in self.match] if key == "match" else value)


class Config(_Model):
    """The whole configuration (DESIGN §4). Frozen; `Config.model_validate(mapping)` works.

    `classifier` replaces the built-in classifier: a callable, or an import
    string (``"package.module:attribute"``) resolved when the config is
    validated, so a configuration file may import code.
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

    @field_validator("routes")
    @classmethod
    def _check_routes(cls, routes: list[Route]) -> list[Route]:
        _refuse_duplicates("route", [r.name for r in routes])
        return routes


def _refuse_duplicates(kind: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{kind} names must be unique: {name!r} is used twice")
        seen.add(name)


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
    try:
        text = Path(source).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: the file is not valid UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read the file ({exc.strerror or 'error'})") from None
    data = _parse_yaml(text, source)
    if data is None:  # an empty file, or only comments: every default
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping of settings, not {type(data).__name__}"
        )
    try:
        data = _interpolate(data, (), os.environ)
    except _UnresolvedReference as exc:
        raise ConfigError(f"{source}: {_describe(exc.loc, data)}: {exc.reason}") from None
    return _validate(data, source)


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
    try:
        return Config.model_validate(data)
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
