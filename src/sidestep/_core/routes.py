"""Match a request to a route, and rewrite a request for a target.

Routes are compiled once into a table keyed by origin, so matching a request
costs one dictionary look-up and a few prefix checks. Prefixes match on path
segment boundaries: ``/v1`` matches ``/v1`` and ``/v1/chat``, never ``/v10``.
"""

from __future__ import annotations

import json
from base64 import b64encode
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit

from .._common.scopes import (
    Fingerprinter,
    ScopeKey,
    ScopeKind,
    ascii_host,
    is_credential,
    origin_key,
)
from .hedging import HedgeState
from .members import Member
from .pools import Pool, pool_of
from .provider_state import StateRules

if TYPE_CHECKING:
    from .._settings.config import Config
    from .._settings.policies import FailoverPolicy
    from .._settings.routes import Route

__all__ = [
    "Candidates",
    "CompiledRoute",
    "CompiledTarget",
    "Router",
    "account",
    "carried",
    "display_origin",
    "merge_json",
    "plain",
    "rewrite_headers",
    "without_credentials",
]

_DEFAULT_PORTS = {"http": 80, "https": 443}
# Set anew for each target (Host) or by the rebuilt request from its body.
_REBUILT = frozenset({"host", "content-length", "transfer-encoding"})


def display_origin(scheme: str, host: str, port: int | None) -> str:
    """The origin as people read it: no default port, nothing after the host."""
    return f"{scheme}://{_authority(scheme, host, port)}"


def _authority(scheme: str, host: str, port: int | None) -> str:
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal
    return host if port in (None, _DEFAULT_PORTS.get(scheme)) else f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class CompiledTarget:
    """A target ready for rewriting; `headers` are secrets and never shown."""

    name: str
    scheme: str
    host: str
    port: int | None
    path: str  # the path prefix, without a trailing slash
    origin: str  # origin_key(): the scope key's origin
    shown: str  # display_origin(): what logs may show
    headers: tuple[tuple[str, str], ...] = ()
    json_fields: Mapping[str, Any] | None = None
    inherit_credentials: bool = False
    # it sets a credential of its own: a header `is_credential` names (its URL's
    # userinfo among them, compiled into its Authorization)
    credentialed: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        own = any(is_credential(name) for name, _ in self.headers)
        object.__setattr__(self, "credentialed", own)

    def __repr__(self) -> str:
        return f"CompiledTarget(name={self.name!r}, origin={self.shown!r})"

    def takes_callers_credentials(self, origin: str) -> bool:
        """Whether a request to `origin` (scope-key form) keeps its credentials — credential
        headers, URL userinfo, credential query parameters — when moved to this target.

        The one rule: a target that sets a credential of its own sends it alone, none
        of the caller's, whatever the origin (its credential replaces the caller's, all
        of it, so no attempt carries two keys, and its credential scope is its own key's).
        Any other target keeps the caller's on the request's own origin, and on another
        only with `inherit_credentials` (httpx's rule for a cross-origin redirect).
        """
        return not self.credentialed and (origin == self.origin or self.inherit_credentials)

    @property
    def host_header(self) -> str:
        return _authority(self.scheme, self.host, self.port)

    @property
    def sent_headers(self) -> tuple[tuple[str, str], ...]:
        """What it adds to every request: its Host, then its own headers (a Host of its
        own among them replaces the one made from its URL: one Host is ever sent; no
        framing or hop-by-hop header is among them: the configuration refuses those)."""
        if any(name == "host" for name, _ in self.headers):
            return self.headers
        return (("host", self.host_header), *self.headers)


@dataclass(frozen=True, slots=True)
class CompiledRoute:
    name: str
    targets: tuple[CompiledTarget, ...]
    policy: FailoverPolicy
    commit_complete: bool
    max_buffered_bytes: int
    first_token: bool = False  # an event stream's commit point is its first content
    avoid_rate_limits: bool = False
    validate: bool = False  # check the 2xx bodies buffered by commit: complete
    # no first-byte, response or stall limit, no rate limits to avoid: a 2xx is settled at
    # its headers
    plain: bool = False
    state: StateRules | None = None  # which requests name state kept by one provider
    pool: Pool | None = field(default=None, compare=False)  # None: a ranked route
    # a hedged route's budget and times to first token (None: its requests are not hedged)
    hedging: HedgeState | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Candidates:
    """A request's route (None if unrouted), its candidates in order, the path after the
    prefix, and what follows from them for every request that matches the same way.

    Remembered per origin and path, so what a request needs of its route is read once.
    """

    route: CompiledRoute | None
    targets: tuple[CompiledTarget, ...]
    rest: str  # the request path after the matched prefix
    origin: str  # the request's own origin (scope-key form)
    direct: bool  # the first candidate is the request's own URL: no rewrite needed
    policy: FailoverPolicy  # the route's, or the configuration's for an unrouted request
    name: str | None = None  # the route's
    # a body not in memory yet is read ahead: it may have to be sent again
    replay: bool = False
    plain: bool = False  # CompiledRoute.plain, or the same of the policy when unrouted
    # The origin whose health alone lets a request go as it is to its first candidate
    # (`Core.decide`): set when the first is the request's own URL and the policy
    # is plain, with no total timeout; None otherwise.
    lane: str | None = None
    # what `response.extensions["sidestep"]` says of a first attempt's answer, per
    # candidate: copied for each response
    about: tuple[dict[str, Any], ...] = ()
    # The candidates on another provider account than the first (`account`), which a
    # request naming state kept by one provider never reaches (`provider_state`); empty
    # when no rule of the route can hold a request to this path. `pinned`: the path
    # names such state, so the body need not be looked at.
    others: frozenset[int] = frozenset()
    pinned: bool = False
    # A pooled route's pools, the candidates of each order met so far (`spreading`), and
    # in those of one order each candidate's member (in flight, latency, rate limits).
    pool: Pool | None = field(default=None, compare=False, repr=False)
    variants: dict[Any, Candidates] | None = field(default=None, compare=False, repr=False)
    members: tuple[Member, ...] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(
        cls,
        route: CompiledRoute | None,
        targets: tuple[CompiledTarget, ...],
        rest: str,
        origin: str,
        direct: bool,
        policy: FailoverPolicy,
        others: frozenset[int] = frozenset(),
    ) -> Candidates:
        """The candidates, with what follows from them (`others`: the candidates on
        another provider account than the first, kept if the route's rules may hold
        requests to `rest` there)."""
        name, pool = (None, None) if route is None else (route.name, route.pool)
        quick = plain(policy) if route is None else route.plain
        state = None if route is None else route.state
        pinned = False
        if state is None or not others:
            others = frozenset()
        else:
            pinned = state.by_path(rest)
            if not pinned and not state.bodies:
                others = frozenset()  # no rule for its path, none for bodies
        return cls(
            route,
            targets,
            rest,
            origin,
            direct,
            policy,
            name,
            len(targets) > 1 or policy.max_attempts_per_target > 1,
            quick,
            targets[0].origin if direct and quick and not policy.total_timeout else None,
            tuple(
                {"route": name, "target": t.name, "attempts": 1, "failover": i > 0}
                for i, t in enumerate(targets)
            ),
            others,
            pinned,
            pool,
            None if pool is None else {},
        )


def _split(url: str) -> tuple[str, str, int | None, str]:
    parts = urlsplit(url)
    # Paths are compared and joined percent-encoded, as they travel.
    path = quote(parts.path.rstrip("/"), safe="/%:@!$&'()*+,;=-._~")
    # The host in its one normal form, as requests' hosts are compared and sent.
    return parts.scheme, ascii_host(parts.hostname or ""), parts.port, path


def _basic_credentials(url: str) -> tuple[tuple[str, str], ...]:
    """The userinfo of a target URL as that target's own Basic credentials (as httpx sends it)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return ()
    userpass = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
    return (("authorization", "Basic " + b64encode(userpass.encode()).decode("ascii")),)


def compile_target(target: Any) -> CompiledTarget:
    scheme, host, port, path = _split(target.url)
    headers = tuple((k.lower(), v) for k, v in target.headers.items())
    return CompiledTarget(
        name=target.name,
        scheme=scheme,
        host=host,
        port=port,
        path=path,
        origin=origin_key(scheme, host, port),
        shown=display_origin(scheme, host, port),
        headers=headers + _basic_credentials(target.url),
        json_fields=dict(target.json_fields) or None,
        inherit_credentials=target.inherit_credentials,
    )


_Row = tuple[str, CompiledRoute, tuple[CompiledTarget, ...], bool, frozenset[int]]


class Router:
    """The compiled routes of one configuration."""

    __slots__ = ("_table", "routes")

    def __init__(self, config: Config, clock: Any = None) -> None:
        """`clock`: the clock its pools' members are measured on (`pools.pool_of`)."""
        self.routes: dict[str, CompiledRoute] = {}
        # origin -> [(path prefix, route, candidates in order, direct, the candidates on
        # another provider account than the first)], longest prefix first
        table: dict[str, list[_Row]] = {}
        for route in config.routes:
            compiled = _compile_route(route, config.failover, clock)
            self.routes[route.name] = compiled
            targets = compiled.targets
            for index, first in enumerate(targets):
                ordered = (first, *targets[:index], *targets[index + 1 :])
                # The request's own URL serves as it is unless the target adds to it.
                direct = not first.headers and not first.json_fields
                row = (first.path, compiled, ordered, direct, _others(ordered))
                table.setdefault(first.origin, []).append(row)
            for alias in route.match:
                scheme, host, port, path = _split(alias)
                row = (path, compiled, targets, False, _others(targets))
                table.setdefault(origin_key(scheme, host, port), []).append(row)
        for prefixes in table.values():
            prefixes.sort(key=lambda p: len(p[0]), reverse=True)
        self._table = table

    def owners(self, scope: ScopeKey, fingerprint: Fingerprinter) -> tuple[tuple[str, str], ...]:
        """Every (route, target) whose scope `scope` is, for operator listings.

        All the targets on the scope's origin share its origin and model
        scopes. A credential scope belongs to the targets whose own credential
        headers give its fingerprint (such a target sends no other credential);
        failing that, to those that carry the caller's credentials (no credential
        of their own); failing that, to every target on the origin.
        """
        here = [
            (route, target)
            for route in self.routes.values()
            for target in route.targets
            if target.origin == scope.origin
        ]
        if len(here) > 1 and scope.kind in (ScopeKind.CREDENTIAL, ScopeKind.CREDENTIAL_MODEL):
            pairs = [(p, {n: v for n, v in p[1].headers if is_credential(n)}) for p in here]
            exact = [p for p, own in pairs if fingerprint(own, "") == scope.credential]
            callers = [p for p in here if not p[1].credentialed]
            here = exact or callers or here
        return tuple(dict.fromkeys((route.name, target.name) for route, target in here))

    def match(self, origin: str, path: str) -> Candidates | None:
        """The route whose longest prefix matches this origin and path, if any."""
        prefixes = self._table.get(origin)
        if not prefixes:
            return None
        for prefix, route, targets, direct, others in prefixes:
            if path == prefix or path.startswith(prefix + "/") or not prefix:
                rest = path[len(prefix) :]
                return Candidates.of(route, targets, rest, origin, direct, route.policy, others)
        return None


def account(target: CompiledTarget) -> tuple[str, str, frozenset[tuple[str, str]]]:
    """Where a target's provider state lives: its origin, its URL prefix, and the headers
    it sets (its credential, and an organization or project a header may name). Targets
    that set none send the caller's credential, the same to each on one origin."""
    return target.origin, target.path, frozenset(target.headers)


def _others(ordered: tuple[CompiledTarget, ...]) -> frozenset[int]:
    """The positions of the candidates on another provider account than the first."""
    own = account(ordered[0])
    return frozenset(i for i, t in enumerate(ordered) if account(t) != own)


def _compile_route(route: Route, base: FailoverPolicy, clock: Any) -> CompiledRoute:
    policy = route.policy(base)
    return CompiledRoute(
        name=route.name,
        targets=tuple(compile_target(t) for t in route.targets),
        policy=policy,
        commit_complete=route.commit == "complete",
        max_buffered_bytes=route.max_buffered_bytes,
        first_token=route.commit != "first_byte",
        avoid_rate_limits=route.avoid_rate_limits,
        validate=route.commit == "complete" and route.validate_body == "auto",
        # (a hedged route's requests go the general way, where the race is)
        plain=plain(policy) and not route.avoid_rate_limits and route.hedge is None,
        state=StateRules.of(
            builtin=route.provider_state.builtin,
            paths=route.provider_state.paths,
            fields=route.provider_state.fields,
        ),
        pool=pool_of(route, clock),
        hedging=None if route.hedge is None else HedgeState(route.hedge),
    )


def plain(policy: FailoverPolicy) -> bool:
    """Whether a policy sets no first-byte, response or stall limit: nothing to watch after
    the headers."""
    return (
        policy.first_byte_timeout is None
        and policy.response_timeout is None
        and policy.stall_timeout is None
    )


def rewrite_headers(
    headers: list[tuple[bytes, bytes]], target: CompiledTarget, *, keep_credentials: bool
) -> list[tuple[bytes | str, bytes | str]]:
    """The request's headers (lowercase names, the bytes sent) for `target`: Host anew,
    the caller's credentials kept only if `keep_credentials`
    (`CompiledTarget.takes_callers_credentials`). The caller's bytes go along as they
    are: a value outside ASCII is never decoded and encoded again."""
    out: list[tuple[bytes | str, bytes | str]] = [
        (name, value)
        for name, value in headers
        if carried(name.decode("latin-1"), target, keep_credentials)
    ]
    out.extend(target.sent_headers)
    return out


def carried(name: str, target: CompiledTarget, keep_credentials: bool) -> bool:
    """Whether the request's header `name` (lowercase) goes to `target` as it is: not one
    rebuilt for it, not one the target sets itself, no credential unless `keep_credentials`."""
    return (
        name not in _REBUILT
        and all(name != own for own, _ in target.headers)
        and (keep_credentials or not is_credential(name))
    )


def without_credentials(query: bytes) -> bytes:
    """A raw query string without the parameters whose names say they carry a credential."""
    kept = [
        part
        for part in query.split(b"&")
        if not is_credential(unquote(part.partition(b"=")[0].decode("ascii", "replace")))
    ]
    return b"&".join(kept)


def merge_json(body: bytes, fields: Mapping[str, Any] | None) -> bytes:
    """`fields` merged into a JSON object body; any other body is left as it is."""
    if not fields or body.lstrip()[:1] != b"{":
        return body
    try:
        document = json.loads(body)
    except ValueError:
        return body
    if not isinstance(document, dict):
        return body
    document.update(fields)
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
