"""A WSGI app that calls a routed upstream through sidestep and serves its metrics.

gunicorn loads it as ``metrics_app:application`` in each worker, with
``PROMETHEUS_MULTIPROC_DIR`` set: ``/call`` makes one request through the
route ``chat`` (targets from ``UPSTREAM_A`` and ``UPSTREAM_B``) and answers
with the worker's pid; ``/metrics`` serves every worker's metrics added up
by ``prometheus_client``'s multiprocess collector. The configuration turns
the metrics on (``observability: {prometheus: true}``), as a deployment's would.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

import httpx
from prometheus_client import CollectorRegistry, generate_latest, multiprocess

import sidestep

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

CONFIG = {
    "breaker": {"failure_threshold": 1, "cooldown": 600, "max_cooldown": 600},
    "observability": {"prometheus": True},
    "routes": [
        {
            "name": "chat",
            "targets": [
                {"name": "a", "url": os.environ["UPSTREAM_A"] + "/v1"},
                {"name": "b", "url": os.environ["UPSTREAM_B"] + "/v1"},
            ],
        }
    ],
}
client = httpx.Client(transport=sidestep.FailoverTransport(CONFIG), timeout=30)


def application(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
    if environ["PATH_INFO"] == "/metrics":
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [generate_latest(registry)]
    if environ["PATH_INFO"] == "/call":
        answer = client.get(os.environ["UPSTREAM_A"] + "/v1/x")
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [f"{answer.text} {os.getpid()}".encode()]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ready"]
