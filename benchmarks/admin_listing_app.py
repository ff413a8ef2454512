"""The host application of the admin listing benchmark (`admin_listing`), run in a process of
its own: a FastAPI app on uvicorn with the admin app mounted over a memory store of
suspended scopes, a probe of its event loop's lateness and of the collector's full
passes, and switches for the benchmark's phases.

    python benchmarks/admin_listing_app.py PORT TENANTS ORIGINS [FREEZE]

With ``FREEZE`` 1 the application hands what its start-up made to ``gc.freeze()``
before any scope is suspended, as a server that freezes its start-up heap does.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

import _bench as b  # noqa: E402  (the runner's helpers, beside this file)

APP = Path(__file__).resolve()
TOKEN = "benchmark-admin-token"  # noqa: S105  # a local server of its own
PROBE_TICK = 0.002
POLL_EVERY = 2.0


def _config() -> Any:
    import sidestep

    return sidestep.Config.model_validate(
        {
            "routes": [
                {
                    "name": "chat",
                    "targets": [
                        {"name": "primary", "url": "https://api.primary.example/v1"},
                        {
                            "name": "backup",
                            "url": "https://api.backup.example/v1",
                            "headers": {"authorization": "Bearer sk-backup-key"},
                        },
                    ],
                }
            ]
        }
    )


class _Filler:
    """Suspends scopes in a store as real verdicts would: each for an hour."""

    def __init__(self, store: Any) -> None:
        from sidestep._answers.classify import INVALID_CREDENTIAL, RATE_LIMITED, Kind, Verdict
        from sidestep._common.scopes import ScopeKind
        from sidestep._settings.policies import BreakerPolicy, Suspensions

        self.store = store
        self.policy = BreakerPolicy(cooldown=3600, max_cooldown=3600)
        self.suspensions = Suspensions()
        self.refused = Verdict(
            Kind.SUSPEND, INVALID_CREDENTIAL, ScopeKind.CREDENTIAL, failover=True, status=401
        )
        self.limited = Verdict(
            Kind.SUSPEND, RATE_LIMITED, ScopeKind.ORIGIN, True, retry_after=3600, status=429
        )

    def suspend(self, origin: str, key: str, verdict: Any) -> None:
        import time as clock

        from sidestep._common.scopes import ScopeFacts

        facts = ScopeFacts(
            origin,
            headers={"authorization": f"Bearer {key}"},
            userinfo="",
            body=None,
            fingerprint=self.store.fingerprint,
        )
        now = clock.monotonic()
        admission = self.store.admit(facts, self.policy, now)
        if admission.ticket is not None:
            self.store.record(admission.ticket, verdict, self.policy, self.suspensions, now)

    def tenants(self, n: int) -> None:
        for i in range(n):
            self.suspend("https://api.primary.example:443", f"sk-tenant-{i:08d}", self.refused)

    def origins(self, first: int, n: int) -> None:
        for i in range(first, first + n):
            self.suspend(f"https://o{i:05d}.example:443", "", self.limited)


def _churn(filler: _Filler, first: int, on: threading.Event) -> None:
    """While `on` is set, ten new origins suspended every second, as in an outage."""
    while True:
        on.wait()
        filler.origins(first, 10)
        first += 10
        time.sleep(1.0)


def _copy(store: Any, on: threading.Event, took: list[float]) -> None:
    """While `on` is set, the store's snapshot taken every 2 s, as a listing would take it."""
    while True:
        on.wait()
        started = time.perf_counter()
        store.snapshot(time.monotonic())
        took.append(time.perf_counter() - started)
        time.sleep(POLL_EVERY)


class _Probe:
    """How late each 2 ms sleep of the event loop wakes up, and the collector's full passes.

    A full pass of the garbage collector (generation 2) holds every thread while it
    walks the heap, however it was set off: each is recorded with how long it took,
    and a late wake-up is told apart when such a pass ran during its sleep.
    """

    def __init__(self) -> None:
        self.late: list[tuple[float, float, float]] = []  # (asleep at, awake at, late by)
        self.passes: list[tuple[float, float]] = []  # full collections: (began, ended)
        self._began = 0.0
        gc.callbacks.append(self._collector)

    def _collector(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.passes.append((self._began, time.perf_counter()))

    async def run(self) -> None:
        import anyio

        while True:
            started = time.perf_counter()
            await anyio.sleep(PROBE_TICK)
            woke = time.perf_counter()
            self.late.append((started, woke, woke - started - PROBE_TICK))

    def take(self) -> dict[str, float]:
        late, self.late = self.late, []
        passes, self.passes = self.passes, []
        ms = sorted(x * 1000 for _, _, x in late) or [0.0]
        other = [
            x * 1000
            for asleep, awake, x in late
            if not any(began < awake and ended > asleep for began, ended in passes)
        ]
        return {
            "max_ms": ms[-1],
            "p99_ms": b.percentile(ms, 0.99),
            "p999_ms": b.percentile(ms, 0.999),
            "wakeups": len(ms),
            "full_collections": len(passes),
            "longest_full_collection_ms": max(((e - s) * 1000 for s, e in passes), default=0.0),
            "max_without_full_collection_ms": max(other, default=0.0),
        }


def serve(port: int, tenants: int, origins: int, freeze: int = 0) -> None:
    """The host application: /ping, /lag (the probe's figures since the last call), /churn
    and /copy (``?on=1`` or ``0``), /count (the scopes held) and the admin app."""
    import anyio
    import fastapi
    import uvicorn

    import sidestep
    import sidestep.admin

    transport = sidestep.AsyncFailoverTransport(_config())
    if freeze:  # what start-up made, out of the collector's passes; the scopes stay in them
        gc.collect()
        gc.freeze()
    filler = _Filler(transport.store)
    filler.tenants(tenants)
    filler.origins(0, origins)
    probe = _Probe()
    churning, copying, copies = threading.Event(), threading.Event(), []
    threading.Thread(target=_churn, args=(filler, origins, churning), daemon=True).start()
    threading.Thread(target=_copy, args=(filler.store, copying, copies), daemon=True).start()

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> Any:
        async with anyio.create_task_group() as group:
            group.start_soon(probe.run)
            yield
            group.cancel_scope.cancel()

    api = fastapi.FastAPI(lifespan=lifespan)

    @api.get("/ping")
    async def ping() -> str:
        return "pong"

    cpu = [time.process_time()]

    @api.get("/lag")
    async def lag() -> dict[str, float]:
        figures = probe.take()
        # every thread's, the probe's and the pings' too: what the phase cost the process
        figures["cpu_ms"] = (time.process_time() - cpu[0]) * 1000
        cpu[0] = time.process_time()
        if copies:
            figures["copy_ms"] = b.median(t * 1000 for t in copies)
            copies.clear()
        return figures

    @api.get("/churn")
    async def churn(on: int) -> None:
        (churning.set if on else churning.clear)()

    @api.get("/copy")
    async def copy(on: int) -> None:
        (copying.set if on else copying.clear)()

    @api.get("/count")
    async def count() -> int:
        return len(transport.store)

    api.mount("/sidestep", sidestep.admin.app(transport, token=TOKEN))
    uvicorn.run(api, host="127.0.0.1", port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    serve(*(int(x) for x in sys.argv[1:5]))
