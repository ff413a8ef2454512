"""Who may use the admin app: its bearer tokens, and the token a request carries.

`Token` names a secret (and whether it may clear); `tokens_of` is the tokens an
app accepts; `authorise` finds the token a request's ``Authorization`` header
carries, ``Bearer`` or ``Basic``, compared in constant time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Token", "authorise", "tokens_of"]


@dataclass(frozen=True)
class Token:
    """One bearer token the admin app accepts: its name (for the audit record) and secret.

    A token with ``may_clear=False`` reads but cannot clear. The secret never
    appears in a repr, a log or an answer.
    """

    name: str
    secret: str = field(repr=False)
    may_clear: bool = True

    def __post_init__(self) -> None:
        if not self.name or not self.name.isprintable() or self.name != self.name.strip():
            raise ValueError("a token's name must be non-empty and printable")
        # ASCII: servers read a header as latin-1, so a client's UTF-8 would never match
        secret = self.secret
        if not secret or not secret.isascii() or not secret.isprintable() or " " in secret:
            raise ValueError(
                f"token {self.name!r}: the secret must be non-empty printable ASCII, no spaces"
            )


def tokens_of(
    token: str | Token | Sequence[Token] | None, allow_unauthenticated: bool
) -> tuple[Token, ...]:
    """The tokens an app accepts; raises unless there is one or unauthenticated use is allowed."""
    if isinstance(token, str):
        found: tuple[Token, ...] = (Token("admin", token),)
    elif isinstance(token, Token):
        found = (token,)
    else:
        found = tuple(token or ())
        if not all(isinstance(t, Token) for t in found):
            raise TypeError("token must be a string, a Token or a sequence of Tokens")
    names = [t.name for t in found]
    if len(set(names)) != len(names):
        raise ValueError("token names must be unique")
    if not found and not allow_unauthenticated:
        raise ValueError(
            "the admin app needs a token (token=...); pass allow_unauthenticated=True"
            " only behind something that authenticates every request itself"
        )
    return found


def authorise(authorization: str | None, tokens: tuple[Token, ...]) -> Token | None:
    """The token the header carries, compared in constant time with every token; None if none.

    ``Bearer <token>``, or ``Basic`` with the token as the password (any user
    name): the one way a browser sends a header by itself.
    """
    offered = _credential(authorization or "")
    if offered is None:
        return None
    digest = hashlib.sha256(offered.encode()).digest()
    found = None
    for token in tokens:  # every token compared, so timing says nothing about which matched
        if hmac.compare_digest(digest, hashlib.sha256(token.secret.encode()).digest()):
            found = token
    return found


def _credential(authorization: str) -> str | None:
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return value
    if scheme.lower() == "basic" and value:
        try:
            decoded = base64.b64decode(value, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        password = decoded.partition(":")[2]
        return password or None
    return None
