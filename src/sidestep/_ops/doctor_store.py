"""The doctor's check of the store.

A memory store keeps circuits per process: whether that splits them depends
on how many processes the command after ``--`` runs (`processes`). A Redis
store wants a fingerprint_key shared by every process, and answers a PING
only with ``--online``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from .._settings.stores import StoreSettings, redis_server
from .doctor_findings import OK, UNKNOWN, WARN, Finding
from .processes import processes

__all__ = ["store"]


def store(
    store: StoreSettings, command: Sequence[str], ping: Callable[[], bool | None] | None
) -> Iterator[Finding]:
    if store.kind == "memory":
        yield _memory(command)
        return
    options = store.options
    if store.kind == "redis":
        if getattr(options, "fingerprint_key", None) is None:
            yield Finding(
                WARN,
                "store",
                "redis store without fingerprint_key: each process fingerprints credentials"
                " with its own random key, so credential scopes are not shared",
                ("store.redis.fingerprint_key",),
            )
        server = redis_server(options.url)  # type: ignore[attr-defined]
        if ping is None:
            yield Finding(
                UNKNOWN,
                "store",
                f"redis store at {server}: not contacted (--online pings it)",
                ("store.redis.url",),
            )
            return
        answered = ping()
        if answered is None:
            yield Finding(
                UNKNOWN,
                "store",
                "redis store: not contacted, its address is not set here",
                ("store.redis.url",),
            )
        elif answered:
            yield Finding(OK, "store", f"redis store at {server} answers", ("store.redis.url",))
        else:
            yield Finding(
                WARN,
                "store",
                f"redis store at {server} does not answer: processes fall back to memory",
                ("store.redis.url",),
            )


def _memory(command: Sequence[str]) -> Finding:
    """A memory store under the command: per-process circuits split between workers."""
    if not command:
        return Finding(
            UNKNOWN,
            "store",
            "memory store: circuits are per process; whether the app runs in several is"
            " not known here (give the command after --)",
            ("store",),
        )
    run = processes(command)
    if run.several is None:
        return Finding(
            UNKNOWN,
            "store",
            f"memory store under {run.what}; if it runs several processes, each learns"
            " every outage on its own",
            ("store",),
        )
    if run.several:
        return Finding(
            WARN,
            "store",
            f"memory store under {run.what}: each worker process learns every outage"
            " on its own; a redis store shares circuits across them",
            ("store",),
        )
    return Finding(OK, "store", f"memory store under {run.what}", ("store",))
