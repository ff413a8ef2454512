"""What a store keeps of its scopes: the circuits of the unhealthy ones, and per origin a mark.

Only unhealthy scopes are kept (`Scopes.entries`, oldest first). Each origin
with any has an `Origin`: how many it keeps, when one of them was last
forgotten, its own scope's key, and the refusal that scope gives while open.
`MemoryStore` keeps them in a dict; `SqliteStore` in a view of its file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._common.scopes import ScopeKey
from .circuit import Circuit
from .protocol import Admission

__all__ = ["Origin", "Scopes"]


@dataclass(slots=True)
class Origin:
    unhealthy: int = 0  # entries kept for this origin
    forgot: int = 0  # the sequence number of the last time one of them was forgotten
    key: ScopeKey | None = None  # the origin's own scope, made once
    # its refusal, while that circuit and the offset of the caller's clock (`_refused`) stand
    refused: tuple[Circuit, float, Admission] | None = None


@dataclass(slots=True)
class Scopes:
    entries: dict[ScopeKey, Circuit] = field(default_factory=dict)
    origins: dict[str, Origin] = field(default_factory=dict)
