"""A WSGI app that calls one upstream with plain httpx and says which worker answered.

It never imports sidestep: under ``sidestep run`` every client it makes has
sidestep underneath. gunicorn loads it as ``outage_app:application``; the
upstream's URL comes from ``OUTAGE_UPSTREAM``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

_client = httpx.Client(timeout=10)


def application(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
    """Answers ``<worker pid> <upstream status> <upstream body>``."""
    response = _client.get(os.environ["OUTAGE_UPSTREAM"])
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [f"{os.getpid()} {response.status_code} {response.text}".encode()]
