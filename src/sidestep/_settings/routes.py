"""Routes and their targets: names, URLs and headers checked without ever quoting a
value, path patterns, the provider state a route keeps to one target, and the pools
(tiers, weights, balance, affinity) a route may spread its requests over.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AliasChoices,
    BeforeValidator,
    Field,
    field_validator,
    model_validator,
)

from .._common.scopes import is_credential
from .policies import FailoverOverrides, FailoverPolicy
from .values import ByteSize, Model, PositiveDuration, Ratio, refuse_bool, refuse_duplicates, warn

__all__ = [
    "BALANCES",
    "DEFAULT_BALANCE",
    "MAX_POOL",
    "Affinity",
    "Balance",
    "Hedge",
    "ProviderState",
    "Route",
    "Target",
]

Balance = Literal["weighted", "least_in_flight", "latency"]
BALANCES: tuple[Balance, ...] = ("weighted", "least_in_flight", "latency")
# The strategy of a pool whose route names none (see docs/pools.md for why).
DEFAULT_BALANCE: Balance = "latency"
# The most members one pool (a tier of a pooled route) holds.
MAX_POOL = 16


# --- names, URLs, headers ------------------------------------------------------------------


def _check_name(value: str) -> str:
    if not value or value != value.strip():
        raise ValueError("a name must be non-empty, without leading or trailing whitespace")
    return value


_DEFAULT_PORTS = {"http": 80, "https": 443}
_URL_HELP = "must be an absolute http or https URL, such as https://api.example.com/v1"


def _normalise_url(value: str) -> str:
    """Lower-case scheme and host, drop a default port and trailing slashes; refuse the rest.

    Userinfo is kept (the target's Basic credentials, see `_core.routes`) but never echoed.
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


class ProviderState(Model):
    """Which requests of a route name state kept by one provider (DESIGN §12).

    Such a request is never sent to a target on another origin, URL prefix or
    credential than its own (the route's first candidate for it): it is
    retried there as the policy allows, else its own answer is returned.
    `builtin` turns on the OpenAI and Anthropic rules (`_core.provider_state`);
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


_Tier = Annotated[int, BeforeValidator(refuse_bool), Field(ge=0)]
_Weight = Annotated[float, BeforeValidator(refuse_bool), Field(gt=0, allow_inf_nan=False)]


def _check_header_name(value: object) -> object:
    if not isinstance(value, str) or not _TOKEN.fullmatch(value):
        raise ValueError("the affinity header is not a valid HTTP header name")
    return value.lower()


class Affinity(Model):
    """What keeps a pooled route's related requests on one member: exactly one of a
    request header's value, a top-level JSON body field, or the first `prefix`
    characters of the prompt (see `_core.affinity`)."""

    header: Annotated[str, BeforeValidator(_check_header_name)] | None = None
    json_field: _FieldName | None = Field(None, alias="json")
    prefix: Annotated[int, BeforeValidator(refuse_bool), Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Affinity:
        given = [self.header, self.json_field, self.prefix]
        if sum(value is not None for value in given) != 1:
            raise ValueError("affinity takes exactly one of header, json or prefix")
        return self


_Percentile = Annotated[float, BeforeValidator(refuse_bool), Field(gt=0, lt=1)]
# A hedge budget's bucket: how many hedges it holds, and starts with.
_Burst = Annotated[int, BeforeValidator(refuse_bool), Field(ge=1, le=1000, strict=True)]
# Budgets above this send a second request for more than one request in four: warned of.
_LAVISH_BUDGET = 0.25


class Hedge(Model):
    """A route's hedged requests (docs/hedging.md): after `delay` seconds, or the first
    target's recent `adaptive` percentile of time to first token, with no first token,
    the next candidate is started beside the attempt in flight; hedges are at most the
    `budget` fraction of the route's requests, plus the `burst` the bucket holds (and
    starts with).

    With both `delay` and `adaptive`, `delay` is the wait until enough times to first
    token are known, and the longest the adaptive delay may be; with `adaptive` alone,
    no hedge is sent until then.
    """

    delay: PositiveDuration | None = None
    adaptive: _Percentile | None = None
    budget: Ratio = 0.05
    burst: _Burst = 10

    @model_validator(mode="after")
    def _check(self) -> Hedge:
        if self.delay is None and self.adaptive is None:
            raise ValueError(
                "hedge needs delay (seconds to wait for a first token), adaptive (a percentile"
                " of the target's recent times to first token, such as 0.95), or both"
            )
        if self.adaptive is not None and self.adaptive < 0.5:
            warn(
                "hedge.adaptive is under 0.5: most requests would wait longer than the"
                " delay, and the budget would be spent on ordinary ones"
            )
        if self.budget > _LAVISH_BUDGET:
            warn(
                "hedge.budget is above 0.25: more than one request in four may be sent"
                " twice, and a cancelled request's prompt is still billed"
            )
        return self


class Target(Model):
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
    # A pooled route's targets of one tier share its load, lower tiers first
    # (`priority` in a file as well); a weight is a member's share within its tier.
    tier: _Tier | None = Field(None, validation_alias=AliasChoices("tier", "priority"))
    weight: _Weight | None = None

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
            warn(
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
        if self.tier is not None:
            yield "tier", self.tier
        if self.weight is not None:
            yield "weight", self.weight


class Route(Model):
    """Targets tried in order for requests that match any of them or a `match` prefix.

    A route whose targets have tiers, weights, or which sets `balance` or
    `affinity`, is pooled: each request orders each tier's members its own way
    (`_core.pools`); any other route is a ranked list.
    """

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
    # how a pool orders its members (None: `DEFAULT_BALANCE` for a pooled route)
    balance: Balance | None = None
    affinity: Affinity | None = None
    # a second attempt beside a slow first one (None: requests are never hedged)
    hedge: Hedge | None = None
    targets: list[Target]

    @field_validator("targets")
    @classmethod
    def _check_targets(cls, targets: list[Target]) -> list[Target]:
        if not targets:
            raise ValueError("a route needs at least one target")
        refuse_duplicates("target", [t.name for t in targets])
        with_tier = [t.name for t in targets if t.tier is not None]
        if with_tier and len(with_tier) != len(targets):
            missing = ", ".join(repr(t.name) for t in targets if t.tier is None)
            raise ValueError(
                f"once one target has a tier, every target needs one; without: {missing}"
            )
        return targets

    @model_validator(mode="after")
    def _pools_within_bounds(self) -> Route:
        # Each request of a pool gets one of its members' orders, and the core keeps each
        # order met per path: a bounded pool keeps that bounded (`_core.pools`).
        if self.pooled:
            sizes: dict[int | None, int] = {}
            for t in self.targets:
                sizes[t.tier] = sizes.get(t.tier, 0) + 1
            for tier, size in sizes.items():
                if size > MAX_POOL:
                    which = "its targets" if tier is None else f"tier {tier}"
                    raise ValueError(
                        f"a pool holds at most {MAX_POOL} members; {which} has {size}"
                        " (put the rest in a further tier, or in another route)"
                    )
        return self

    @model_validator(mode="after")
    def _hedge_has_room(self) -> Route:
        hedge = self.hedge
        if hedge is None:
            return self
        if len(self.targets) < 2:
            raise ValueError("hedge needs a second target to send the hedge to")
        limit = self.failover.first_byte_timeout
        if hedge.delay is not None and limit is not None and hedge.delay >= limit:
            warn(
                f"route {self.name!r}: hedge.delay is not shorter than first_byte_timeout:"
                " the attempt fails over before a hedge would start"
            )
        return self

    @property
    def pooled(self) -> bool:
        """Whether requests are spread over pools, rather than tried in the listed order."""
        return (
            self.balance is not None
            or self.affinity is not None
            or any(t.tier is not None or t.weight is not None for t in self.targets)
        )

    def policy(self, base: FailoverPolicy) -> FailoverPolicy:
        """The failover policy of this route: `base` with this route's overrides."""
        return self.failover.apply(base)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for key, value in super().__repr_args__():
            yield key, ([_origin(url) for url in self.match] if key == "match" else value)
