"""What the admin app answers: a status, headers and a body (`Answer`).

The ASGI and WSGI shells send an `Answer` as it is; `API_HEADERS` are the
headers every JSON answer of the admin API carries.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["API_HEADERS", "Answer"]

API_HEADERS = [
    ("content-type", "application/json"),
    ("cache-control", "no-store"),
    ("x-content-type-options", "nosniff"),
]


@dataclass(frozen=True)
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
