"""Scope keys: what a circuit is kept for.

A scope is built from the target's origin, optionally the request's model (the
top-level ``"model"`` of a JSON object body) and optionally a fingerprint of
the credential the request carries; for a request that matched no route,
also a fingerprint of its path (its endpoint). Fingerprints are keyed hashes: no raw
credential is ever part of a key. Model and credential are worked out lazily,
because the healthy path never needs them.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import hmac
import json
import math
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import unquote

import idna

__all__ = [
    "CREDENTIAL_HEADERS",
    "Fingerprinter",
    "ScopeFacts",
    "ScopeKey",
    "ScopeKind",
    "ascii_host",
    "is_credential",
    "model_of",
    "origin_key",
]


class ScopeKind(str, enum.Enum):
    ORIGIN = "origin"
    MODEL = "origin+model"
    CREDENTIAL = "origin+credential"
    CREDENTIAL_MODEL = "origin+credential+model"
    # unrouted traffic only: the origin, the request's path and its read budget
    ENDPOINT = "origin+endpoint"


CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "cookie", "x-api-key", "api-key")
# Any other header, query parameter or logged field whose name has one of
# these words among its words is a credential too. A name is split on -, _, .
# and spaces and at camelCase humps: x-goog-api-key, X-AuthToken, accessToken,
# ClientSecret, ?key=, ?sig= — but not max_tokens, keywords or author.
_CREDENTIAL_WORDS = frozenset(
    {"auth", "authorization", "key", "apikey", "token", "secret", "password", "passwd"}
    | {"signature", "sig", "credential", "credentials", "cookie"}
)
# A word run together in lower case still counts when it ends in one of these
# (accesstoken, clientsecret, xapikey, secretkey); "key" alone is too common
# an ending (monkey, hockey), so only the keys that name a secret count.
_CREDENTIAL_ENDINGS = (
    "token",
    "secretkey",
    "privatekey",
    "accesskey",
    "signingkey",
    "secret",
    "password",
    "passwd",
    "apikey",
    "signature",
    "credential",
    "credentials",
)
_NOT_CREDENTIALS = frozenset({"idempotency-key", "idempotency_key", "idempotencykey"})
_NAME_SEPARATORS = re.compile(r"[-_.\s]+")
# camelCase humps: "XAuthToken" -> X, Auth, Token; "APIKey" -> API, Key.
_NAME_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_DEFAULT_PORTS = {"http": 80, "https": 443}
# A model name longer than this is no model name; it must not bloat keys.
_MAX_MODEL_CHARS = 256
# Bodies beyond this are not parsed for a model: the cost would land on an
# already-failing path, but it must stay bounded.
_MAX_MODEL_BODY = 4 * 1024 * 1024


@functools.lru_cache(maxsize=2048)
def is_credential(name: str) -> bool:
    """Does a header, query parameter or logged field of this name carry a credential?

    The one rule for credential names: what crosses no origin is also what
    the logging redacts.
    """
    lower = name.lower()
    if lower in CREDENTIAL_HEADERS:
        return True
    if lower in _NOT_CREDENTIALS:
        return False
    for part in _NAME_SEPARATORS.split(name):
        for word in _NAME_WORDS.findall(part):
            word = word.lower()
            if word in _CREDENTIAL_WORDS or word.endswith(_CREDENTIAL_ENDINGS):
                return True
    return False


def ascii_host(host: str) -> str:
    """A host in its one normal form: lower case, and ASCII (IDNA) as it goes on the wire.

    ``bücher.example`` and ``xn--bcher-kva.example`` are one host. The
    encoding is httpx's own (the ``idna`` package); a name it refuses is kept
    as written, lower-cased.
    """
    host = host.lower()
    if host.isascii():
        return host
    try:
        return idna.encode(host).decode("ascii")
    except (idna.IDNAError, UnicodeError):
        return host


def origin_key(scheme: str, host: str, port: int | None) -> str:
    """The origin as a key: scheme, host in its normal form (`ascii_host`) and explicit port."""
    scheme = scheme.lower()
    return f"{scheme}://{ascii_host(host)}:{port or _DEFAULT_PORTS.get(scheme, 0)}"


def model_of(body: bytes) -> str | None:
    """The top-level ``"model"`` string of a JSON object body, else None."""
    if not body or len(body) > _MAX_MODEL_BODY or body.lstrip()[:1] != b"{":
        return None
    try:
        document = json.loads(body)
    except ValueError:
        return None
    model = document.get("model") if isinstance(document, dict) else None
    if isinstance(model, str) and 0 < len(model) <= _MAX_MODEL_CHARS:
        return model
    return None


class Fingerprinter:
    """Keyed hashes of credentials.

    The key is random per process unless given, so fingerprints agree across
    processes only when they share the key (RedisStore's ``fingerprint_key``).
    """

    __slots__ = ("_key",)

    def __init__(self, key: bytes | str | None = None) -> None:
        if isinstance(key, str):
            key = key.encode()
        self._key = key if key else secrets.token_bytes(32)

    def __repr__(self) -> str:
        return "Fingerprinter(key=[redacted])"

    def __call__(self, headers: Mapping[str, str], userinfo: str, query: bytes = b"") -> str:
        """The fingerprint of the credentials a request carries, or "" for none.

        Credential headers, URL userinfo and credential query parameters count,
        in a stable order: the same credential always gives the same scope.
        """
        parts = [(name.lower(), value) for name, value in headers.items() if is_credential(name)]
        if query:
            for param in query.split(b"&"):
                name, _, value = param.decode("latin-1").partition("=")
                if is_credential(unquote(name)):
                    parts.append((f"?{unquote(name)}", value))
        if userinfo:
            parts.append(("@userinfo", userinfo))
        if not parts:
            return ""
        parts.sort()  # whatever order they came in
        mac = hmac.new(self._key, digestmod=hashlib.blake2b)
        for name, value in parts:
            mac.update(f"{name}\0{value}\0".encode())
        return mac.hexdigest()[:32]

    def endpoint(self, path: str, budget: int | None) -> str:
        """The fingerprint of a URL path and a budget: endpoint scopes never store a path."""
        data = f"path\0{path}\0{budget}".encode()
        return hmac.new(self._key, data, hashlib.blake2b).hexdigest()[:32]


@dataclass(frozen=True)
class ScopeKey:
    """One scope: its kind and the parts that identify it."""

    kind: ScopeKind
    origin: str
    credential: str = ""
    model: str = ""
    endpoint: str = ""  # an endpoint scope's path fingerprint (never a path)
    _hash: ClassVar[int]  # set on each key by __post_init__; not a field

    def __post_init__(self) -> None:
        # Its hash, made once and kept beside its fields (not one of them): a key is
        # looked up in the store's tables several times per request, and a
        # dataclass's own hash is a tuple built each time.
        parts = (self.kind, self.origin, self.credential, self.model, self.endpoint)
        object.__setattr__(self, "_hash", hash(parts))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[ScopeKey], tuple[Any, ...]]:
        # made again where it is unpickled: a hash holds that process's string hashes
        return ScopeKey, (self.kind, self.origin, self.credential, self.model, self.endpoint)

    @property
    def key(self) -> str:
        """The stable text key; holds no secret (credential and endpoint are fingerprints)."""
        return f"{self.kind.value}|{self.origin}|{self.credential}|{self.model or self.endpoint}"

    @property
    def scope_id(self) -> str:
        """An opaque, stable id for operators: a short hash of the key.

        Worked out once per key and kept beside its fields, as its hash is: a
        listing of thousands of scopes, and a clear looking for one, read every
        kept key's id.
        """
        found: str | None = self.__dict__.get("_scope_id")
        if found is None:
            found = hashlib.blake2b(self.key.encode(), digest_size=8).hexdigest()
            object.__setattr__(self, "_scope_id", found)
        return found


_ALL_KINDS = tuple(ScopeKind)
_ROUTED_KINDS = tuple(k for k in ScopeKind if k is not ScopeKind.ENDPOINT)


class ScopeFacts:
    """What the scopes of one request on one target are made of.

    The origin is known up front; the model and the credential fingerprint
    are computed on first use only, so admission on a healthy origin never
    parses a body or hashes a credential.
    """

    __slots__ = (
        "_body",
        "_credential",
        "_extensions",
        "_fingerprint",
        "_headers",
        "_model",
        "_path",
        "_query",
        "_url",
        "_userinfo",
        "origin",
    )

    def __init__(
        self,
        origin: str,
        headers: Mapping[str, str],
        body: bytes | None,
        fingerprint: Fingerprinter,
        *,
        url: Any = None,
        userinfo: bytes | str = "",
        query: bytes = b"",
        path: str = "",
        extensions: Mapping[str, Any] | None = None,
    ) -> None:
        self.origin = origin
        self._path = path  # set for unrouted requests only: their endpoint
        self._extensions = extensions  # the request's, for its read timeout (read if needed)
        self._url = url  # when given, its userinfo and query are read only if needed
        self._query = query
        self._headers = headers
        self._userinfo = userinfo
        self._body = body
        self._fingerprint = fingerprint
        self._model: str | None = None
        self._credential: str | None = None

    def __repr__(self) -> str:
        return f"ScopeFacts(origin={self.origin!r})"

    @property
    def routed(self) -> bool:
        """Whether the request matched a route: only an unrouted request's facts carry
        its path (its endpoint), never empty."""
        return not self._path

    @property
    def model(self) -> str:
        if self._model is None:
            self._model = (model_of(self._body) if self._body else None) or ""
        return self._model

    @property
    def credential(self) -> str:
        if self._credential is None:
            userinfo, query = self._userinfo, self._query
            if self._url is not None:
                userinfo, query = self._url.userinfo, self._url.query
            if isinstance(userinfo, bytes):
                userinfo = userinfo.decode("latin-1")
            self._credential = self._fingerprint(self._headers, userinfo, query)
        return self._credential

    def key(self, kind: ScopeKind) -> ScopeKey:
        """The scope of `kind` for this request; without a model, the model kinds fall back.

        An endpoint scope without a path (a routed request) falls back like the model kinds.
        """
        if kind is ScopeKind.ENDPOINT:
            if self._path:
                endpoint = self._fingerprint.endpoint(self._path, self.budget())
                return ScopeKey(kind, self.origin, endpoint=endpoint)
            kind = ScopeKind.MODEL
        model = self.model if kind in (ScopeKind.MODEL, ScopeKind.CREDENTIAL_MODEL) else ""
        if kind is ScopeKind.MODEL and not model:
            kind = ScopeKind.ORIGIN
        elif kind is ScopeKind.CREDENTIAL_MODEL and not model:
            kind = ScopeKind.CREDENTIAL
        credential = (
            self.credential if kind in (ScopeKind.CREDENTIAL, ScopeKind.CREDENTIAL_MODEL) else ""
        )
        return ScopeKey(kind, self.origin, credential, model)

    def budget(self) -> int | None:
        """The request's read timeout, as a power of two (None: unbounded).

        A timeout says the endpoint did not answer within the time this caller
        gave it, nothing about a caller that gives it more: an endpoint's scope
        is kept per budget, grouped by powers of two so that callers whose
        budgets drift a little (a shrinking deadline) still share one.
        """
        timeouts = (self._extensions or {}).get("timeout") or {}
        read = timeouts.get("read")
        if not isinstance(read, (int, float)) or read <= 0 or math.isinf(read):
            return None
        return math.ceil(math.log2(read * 1000))  # in milliseconds: 50 ms -> 6, 5 s -> 13

    def keys(self) -> tuple[ScopeKey, ...]:
        """Every scope covering this request, without repeats."""
        kinds = _ALL_KINDS if self._path else _ROUTED_KINDS  # endpoints: unrouted only
        return tuple(dict.fromkeys(self.key(kind) for kind in kinds))
