"""Scenario 1, overhead: the cost per request of the transport layer on the healthy path.

An httpx client over `httpx.MockTransport` (no network) sends requests one
after another: bare, through sidestep (no configuration, and with a route of
two targets), and through each peer wrapped as a user would wrap it. Async
and sync clients both. Samples are interleaved (A B C … A B C …); the table
shows each median in microseconds of CPU time per request (the process's own
time, so that other work on a busy machine does not count) and its ratio to
bare httpx: the median of each round's ratio, since samples side by side
share the machine's state of the moment.

Metrics and traces are off for every variant but one: "sidestep, routed,
metrics+traces" samples the routed transport with Prometheus
(`prometheus_client`, a registry of its own) and OpenTelemetry (the SDK's
providers, metrics and spans recorded, nothing exported) both enabled for
its samples only; a row reports what they add per request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx

import _bench as b
import sidestep
from _bench import Row

SCENARIO = "overhead"
URL = "http://api.example/v1/items"
ROUTED = {
    "routes": [
        {
            "name": "api",
            "targets": [
                {"name": "primary", "url": "http://api.example/v1"},
                {"name": "backup", "url": "http://backup.example/v1"},
            ],
        }
    ]
}


OBSERVED = "sidestep, routed, metrics+traces"  # the one variant sampled with exporters on
_EXPORTERS = ("prometheus_client", "opentelemetry.sdk")


def _exporters_missing() -> str | None:
    return b.missing(_EXPORTERS)


@contextlib.contextmanager
def _observed(name: str) -> Iterator[None]:
    """Prometheus and OpenTelemetry enabled while variant `name` is sampled, if it is OBSERVED."""
    if name != OBSERVED:
        yield
        return
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from prometheus_client import CollectorRegistry

    from sidestep.metrics import otel, prometheus

    prometheus.enable(CollectorRegistry())
    otel.enable(MeterProvider(), TracerProvider())
    try:
        yield
    finally:
        otel.disable()
        prometheus.disable()


def _ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, content=b'{"ok":true}')


def _mock() -> httpx.MockTransport:
    return httpx.MockTransport(_ok)


# -- async --------------------------------------------------------------------------------

AsyncMaker = Callable[[], httpx.AsyncBaseTransport]


def _async_variants() -> tuple[dict[str, AsyncMaker], list[str]]:
    variants: dict[str, AsyncMaker] = {
        "httpx (bare)": _mock,
        "sidestep": lambda: sidestep.AsyncFailoverTransport(transport=_mock()),
        "sidestep, routed": lambda: sidestep.AsyncFailoverTransport(ROUTED, transport=_mock()),
    }
    if _exporters_missing() is None:
        variants[OBSERVED] = variants["sidestep, routed"]
    plan = b.Plan(("http://api.example/v1", "http://backup.example/v1"), 5.0, 30.0, 60.0)
    ready, absent = b.available(b.PEERS)
    for name in ready:
        variants[name] = lambda name=name: b.PEERS[name][1](_mock(), plan)
    return variants, absent


async def _async_sample(make: AsyncMaker, requests: int) -> float:
    async with httpx.AsyncClient(transport=make()) as client:
        return await b.cpu_per_call_async(lambda: client.get(URL), requests)


# -- sync ---------------------------------------------------------------------------------

SyncMaker = Callable[[], httpx.BaseTransport]


class _SyncGuard(httpx.BaseTransport):
    """A sync peer breaker per host around an inner transport (what a user of it writes)."""

    def __init__(self, inner: httpx.BaseTransport, guard: Callable[..., Any]) -> None:
        self._inner = inner
        self._guard = guard

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        def send() -> httpx.Response:
            response = self._inner.handle_request(request)
            if response.status_code >= 500:
                response.close()
                raise b.Unhealthy(response.status_code)
            return response

        response: httpx.Response = self._guard(request.url.netloc.decode(), send)
        return response


def _pybreaker_sync() -> httpx.BaseTransport:
    import pybreaker

    breakers: dict[str, Any] = {}

    def guard(host: str, send: Callable[[], httpx.Response]) -> httpx.Response:
        breaker = breakers.get(host) or breakers.setdefault(
            host, pybreaker.CircuitBreaker(fail_max=b.THRESHOLD, reset_timeout=30)
        )
        response: httpx.Response = breaker.call(send)
        return response

    return _SyncGuard(_mock(), guard)


def _circuitbreaker_sync() -> httpx.BaseTransport:
    import circuitbreaker

    guarded: dict[str, Callable[..., httpx.Response]] = {}

    def through(send: Callable[[], httpx.Response]) -> httpx.Response:
        return send()

    def guard(host: str, send: Callable[[], httpx.Response]) -> httpx.Response:
        wrapped = guarded.get(host)
        if wrapped is None:
            breaker = circuitbreaker.CircuitBreaker(
                failure_threshold=b.THRESHOLD, recovery_timeout=30, name=f"bench-sync-{host}"
            )
            wrapped = guarded[host] = breaker(through)
        return wrapped(send)

    return _SyncGuard(_mock(), guard)


def _interlock_sync() -> httpx.BaseTransport:
    from interlock.integrations.httpx import CircuitBreakerTransport

    transport: httpx.BaseTransport = CircuitBreakerTransport(_mock())
    return transport


def _retries_sync() -> httpx.BaseTransport:
    from httpx_retries import Retry, RetryTransport

    transport: httpx.BaseTransport = RetryTransport(transport=_mock(), retry=Retry(total=1))
    return transport


def _sync_variants() -> dict[str, SyncMaker]:
    variants: dict[str, SyncMaker] = {
        "httpx (bare)": _mock,
        "sidestep": lambda: sidestep.FailoverTransport(transport=_mock()),
        "sidestep, routed": lambda: sidestep.FailoverTransport(ROUTED, transport=_mock()),
    }
    if _exporters_missing() is None:
        variants[OBSERVED] = variants["sidestep, routed"]
    peers: dict[str, SyncMaker] = {
        "interlock-cb": _interlock_sync,
        "pybreaker": _pybreaker_sync,
        "circuitbreaker": _circuitbreaker_sync,
        "httpx-retries": _retries_sync,
    }
    ready, _ = b.available(peers)
    variants.update({name: peers[name] for name in ready})
    return variants


def _sync_sample(make: SyncMaker, requests: int) -> float:
    with httpx.Client(transport=make()) as client:
        return b.cpu_per_call(lambda: client.get(URL), requests)


# -- the scenario ------------------------------------------------------------------------------


def run(quick: bool) -> list[Row]:
    rounds, requests = (1, 30) if quick else (15, 2000)
    async_variants, absent = _async_variants()
    sync_variants = _sync_variants()
    times: dict[str, list[float]] = {}

    async def measure_async() -> None:
        for _ in range(rounds):
            for name, make in async_variants.items():
                with _observed(name):
                    sample = await _async_sample(make, requests)
                times.setdefault(f"async {name}", []).append(sample)

    with b.quiet_logs():
        asyncio.run(measure_async())
        for _ in range(rounds):
            for name, make in sync_variants.items():
                with _observed(name):
                    times.setdefault(f"sync {name}", []).append(_sync_sample(make, requests))
    samples = {name: [t * 1e6 for t in values] for name, values in times.items()}
    rows: list[Row] = []
    for flavour in ("async", "sync"):
        bare = samples[f"{flavour} httpx (bare)"]
        for name, values in samples.items():
            if name.startswith(flavour + " "):
                ratio = b.paired_ratio(values, bare)
                rows.append(
                    b.row(
                        SCENARIO, name, b.median(values), "µs/request", f"{ratio:.2f}x bare httpx"
                    )
                )
    rows += b.absent_rows(SCENARIO, absent)
    if _exporters_missing() is not None:
        rows += b.absent_rows(SCENARIO, [OBSERVED])
    return rows + _observed_cost(samples) + _verdicts(samples, rounds, requests)


def _observed_cost(samples: dict[str, list[float]]) -> list[Row]:
    """What Prometheus and OpenTelemetry together add to a routed request."""
    rows = []
    for flavour in ("async", "sync"):
        observed = samples.get(f"{flavour} {OBSERVED}")
        if observed is not None:
            added = b.paired_difference(observed, samples[f"{flavour} sidestep, routed"])
            rows.append(
                b.row(
                    SCENARIO,
                    f"{flavour}: added by metrics+traces",
                    added,
                    "µs/request",
                    "Prometheus and OpenTelemetry (SDK) both on, against both off",
                )
            )
    return rows


def _verdicts(samples: dict[str, list[float]], rounds: int, requests: int) -> list[Row]:
    rows = []
    note = f"median of {rounds} rounds' ratios, samples of {requests} requests"
    for flavour in ("async", "sync"):
        bare = samples[f"{flavour} httpx (bare)"]
        routed = samples[f"{flavour} sidestep, routed"]
        ours = b.paired_ratio(routed, bare)
        added = b.paired_difference(routed, bare)
        rows.append(
            b.at_most(
                SCENARIO,
                f"{flavour}: sidestep (routed) <= 1.05x bare httpx per request",
                ours,
                1.05,
                f"+{added:.1f} µs/request; {note}",
            )
        )
        peer = samples.get(f"{flavour} interlock-cb")
        if peer is not None:
            theirs = b.paired_ratio(peer, bare)
            rows.append(
                b.verdict(
                    SCENARIO,
                    f"{flavour}: sidestep below interlock-cb's transport",
                    ours,
                    "x",
                    ours < theirs,
                    f"interlock-cb {theirs:.2f}x",
                )
            )
    return rows
