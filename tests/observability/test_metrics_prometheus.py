"""Prometheus metrics from sidestep's events, in a real prometheus_client registry."""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import sidestep
from drivers import FakeClock, MakeDriver, route
from redis_server import fresh_prefix
from scrape import gauge_by_target
from sidestep import AllCandidatesSuspended
from sidestep._settings.values import SidestepConfigWarning
from sidestep.logging import add_observer, remove_observer
from sidestep.metrics import prometheus
from sidestep.metrics._labels import INSTRUMENTS, SUSPENDED, Measures
from upstream import Respond, Seen, Upstream, wait_for


def unavailable(seen: Seen) -> Respond:
    return Respond(503, "down")


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def a_then_b(a: Upstream, b: Upstream, cooldown: float) -> dict[str, Any]:
    """Route `chat`: A, then B; one failure opens a scope for `cooldown` seconds."""
    return route(
        ("a", a.url + "/v1"),
        ("b", b.url + "/v1"),
        breaker={"failure_threshold": 1, "cooldown": cooldown},
    )


def test_counters_move_through_an_outage(
    make: MakeDriver, a: Upstream, b: Upstream, registry: CollectorRegistry
) -> None:
    """Served, then failed over, then A skipped while open, then probed and closed again: every instrument counts what happened, and the suspended gauge goes up and back down."""
    clock = FakeClock()
    config = a_then_b(a, b, cooldown=10)
    d = make(config, clock=clock)
    assert d.get(a.url + "/v1/x").text == "a"
    assert value(registry, "sidestep_requests_total", route="chat", outcome="served") == 1
    assert (
        value(registry, "sidestep_attempts_total", route="chat", target="a", result="success") == 1
    )
    assert value(registry, "sidestep_attempt_duration_seconds_count", route="chat", target="a") == 1

    a.behaviour = unavailable
    assert d.get(a.url + "/v1/x").text == "b"  # A fails and opens; B answers
    outcome = "served_after_failover"
    assert value(registry, "sidestep_requests_total", route="chat", outcome=outcome) == 1
    assert (
        value(registry, "sidestep_attempts_total", route="chat", target="a", result="unavailable")
        == 1
    )
    assert (
        value(registry, "sidestep_failovers_total", route="chat", from_target="a", to_target="b")
        == 1
    )
    opened = {"target": "a", "scope": "origin", "reason": "unavailable"}
    transition = {**opened, "from_state": "closed", "to_state": "open"}
    assert value(registry, "sidestep_circuit_transitions_total", **transition) == 1
    assert value(registry, "sidestep_suspended", **opened) == 1

    for _ in range(3):
        assert d.get(a.url + "/v1/x").text == "b"  # A is skipped: never called
    skipped = {"route": "chat", "target": "a", "reason": "unavailable"}
    assert value(registry, "sidestep_candidates_skipped_total", **skipped) == 3
    assert a.calls == 2

    a.behaviour = lambda seen: Respond(body="a")
    clock.advance(11)
    assert d.get(a.url + "/v1/x").text == "a"  # the probe succeeds and A closes
    assert value(registry, "sidestep_probes_admitted_total", target="a", scope="origin") == 1
    closed = {"target": "a", "scope": "origin", "reason": "unavailable"}
    assert value(registry, "sidestep_suspended", **closed) == 0
    assert (
        value(
            registry,
            "sidestep_circuit_transitions_total",
            **closed,
            from_state="half_open",
            to_state="closed",
        )
        == 1
    )
    assert value(registry, "sidestep_requests_total", route="chat", outcome="served") == 2


def test_all_suspended_and_upstream_error_outcomes(
    make: MakeDriver, a: Upstream, registry: CollectorRegistry
) -> None:
    """The last failing answer handed over counts as upstream_error; a request with every candidate open counts as all_suspended."""
    a.behaviour = unavailable
    d = make(route(("a", a.url + "/v1"), breaker={"failure_threshold": 1}), clock=FakeClock())
    assert d.get(a.url + "/v1/x").status == 503
    with pytest.raises(AllCandidatesSuspended):
        d.get(a.url + "/v1/x")
    assert value(registry, "sidestep_requests_total", route="chat", outcome="upstream_error") == 1
    assert value(registry, "sidestep_requests_total", route="chat", outcome="all_suspended") == 1


def test_connection_errors_count_as_error_outcomes(
    make: MakeDriver, registry: CollectorRegistry
) -> None:
    """An attempt that cannot connect is `unavailable` with its duration observed; the request raising is `error`."""
    from upstream import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    d = make(route(("a", dead + "/v1")), clock=FakeClock())
    with pytest.raises(Exception, match="onnect"):
        d.get(dead + "/v1/x")
    assert value(registry, "sidestep_requests_total", route="chat", outcome="error") == 1
    assert (
        value(registry, "sidestep_attempts_total", route="chat", target="a", result="unavailable")
        == 1
    )


def test_unrouted_traffic_is_labelled_by_origin_up_to_a_cap(
    make: MakeDriver, a: Upstream, b: Upstream, registry: CollectorRegistry
) -> None:
    """An unrouted request's target label is its origin only (no path, query or userinfo); past the cap, origins count as `other`."""
    d = make(None)
    d.get(f"http://user:pw@127.0.0.1:{a.port}/secret/path?key=sk-abcdefghijkl")
    text = generate_latest(registry).decode()
    assert f'target="http://127.0.0.1:{a.port}"' in text
    assert 'route=""' in text
    for secret in ("secret", "path", "sk-abc", "user", "pw@"):
        assert secret not in text
    measures = Measures(max_origins=1)
    first = measures("attempt.finished", {"route": None, "target": "http://x", "result": "success"})
    second = measures(
        "attempt.finished", {"route": None, "target": "http://y", "result": "success"}
    )
    assert first[0][1] == ("", "http://x", "success")
    assert second[0][1] == ("", "other", "success")


def test_every_instrument_is_registered_with_its_labels(registry: CollectorRegistry) -> None:
    """The registry exposes each documented instrument, under its documented name and type."""
    text = generate_latest(registry).decode()
    for instrument in INSTRUMENTS:
        kind = {"counter": "counter", "histogram": "histogram", "updown": "gauge"}[instrument.kind]
        assert f"# TYPE {instrument.exposed} {kind}" in text


def test_enable_is_idempotent_and_refuses_a_second_registry(registry: CollectorRegistry) -> None:
    """Enabling again into the same registry changes nothing; into another one is refused."""
    prometheus.enable(registry)
    with pytest.raises(ValueError, match="enabled already"):
        prometheus.enable(CollectorRegistry())


def test_a_scope_cleared_by_hand_leaves_the_suspended_gauge(
    make: MakeDriver, a: Upstream, b: Upstream, registry: CollectorRegistry
) -> None:
    """`transport.clear()` emits `suspension.cleared`, which takes the scope off the gauge; clearing it again changes nothing."""
    a.behaviour = unavailable
    d = make(
        route(("a", a.url + "/v1"), ("b", b.url + "/v1"), breaker={"failure_threshold": 1}),
        clock=FakeClock(),
    )
    assert d.get(a.url + "/v1/x").text == "b"
    opened = {"target": "a", "scope": "origin", "reason": "unavailable"}
    assert value(registry, "sidestep_suspended", **opened) == 1
    (row,) = d.transport.suspensions()
    assert d.transport.clear(row.scope_id) is True
    assert value(registry, "sidestep_suspended", **opened) == 0
    assert d.transport.clear(row.scope_id) is False
    assert value(registry, "sidestep_suspended", **opened) == 0


def test_two_scopes_of_one_target_and_kind_count_apart() -> None:
    """The gauge follows scopes by id: two models of one target open at once count twice, and closing one leaves the other counted."""
    measures = Measures()

    def transition(scope_id: str, previous: str, state: str) -> float:
        fields = {
            "route": "chat",
            "target": "a",
            "scope": "origin+model",
            "scope_id": scope_id,
            "previous": previous,
            "state": state,
            "reason": "unavailable",
        }
        return sum(
            amount
            for instrument, _, amount in measures("circuit.opened", fields)
            if instrument.prometheus == "sidestep_suspended"
        )

    assert transition("m1", "closed", "open") == 1
    assert transition("m2", "closed", "open") == 1
    assert transition("m1", "half_open", "closed") == -1
    assert transition("m2", "open", "half_open") == 0
    assert transition("m2", "half_open", "closed") == -1


def test_a_scope_shared_by_two_targets_leaves_the_gauge_under_the_labels_it_came_in(
    make: MakeDriver, a: Upstream, b: Upstream, registry: CollectorRegistry
) -> None:
    """One upstream named `openai` in one route and `oai` in another is one scope: opened through the first and closed through the second, the gauge goes back to 0 under `openai` and never below 0 under `oai`."""
    clock = FakeClock()
    config = {
        "breaker": {"failure_threshold": 1, "cooldown": 10},
        "routes": [
            {
                "name": name,
                "match": [f"http://{name}.internal/v1"],
                "targets": [
                    {"name": alias, "url": a.url + "/v1"},
                    {"name": f"backup-{name}", "url": b.url + "/v1"},
                ],
            }
            for name, alias in (("one", "openai"), ("two", "oai"))
        ],
    }
    d = make(config, clock=clock)
    a.behaviour = unavailable
    assert d.get("http://one.internal/v1/x").text == "b"
    opened = {"scope": "origin", "reason": "unavailable"}
    assert value(registry, "sidestep_suspended", target="openai", **opened) == 1
    a.behaviour = lambda seen: Respond(body="a")
    clock.advance(11)
    assert d.get("http://two.internal/v1/x").text == "a"  # the probe, through `oai`, closes it
    assert d.transport.suspensions() == []
    assert value(registry, "sidestep_suspended", target="openai", **opened) == 0
    assert value(registry, "sidestep_suspended", target="oai", **opened) == 0


def listed_by_target(rows: list[sidestep.Suspension]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for row in rows:
        totals[row.target] = totals.get(row.target, 0.0) + 1
    return totals


def bounded_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A store of `kind` that keeps one scope at most."""
    if kind == "memory":
        return sidestep.MemoryStore(max_scopes=1)
    if kind == "sqlite":
        return sidestep.SqliteStore(tmp_path / "state.db", max_scopes=1)
    url = request.getfixturevalue("redis_url")
    return sidestep.RedisStore(url, prefix=fresh_prefix(), max_scopes=1, mirror=False)


@pytest.mark.parametrize("store_kind", ["memory", "sqlite", "redis"])
def test_a_suspended_scope_the_store_forgets_leaves_the_gauge(
    store_kind: str,
    make: MakeDriver,
    a: Upstream,
    b: Upstream,
    registry: CollectorRegistry,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    default_structlog: None,
) -> None:
    """A store bounded to one scope holds A open; B failing next makes it forget A: `suspension.forgotten` (naming A, its scope and reason, never a path) takes A off the gauge, and after every step the gauge holds, per target, exactly what `suspensions()` lists."""
    clock = FakeClock()
    store = bounded_store(store_kind, request, tmp_path)
    config = a_then_b(a, b, cooldown=60)
    d = make(config, clock=clock, store=store)
    events: list[tuple[str, dict[str, object]]] = []

    def observer(event: str, fields: Mapping[str, object]) -> None:
        events.append((event, dict(fields)))

    add_observer(observer)
    try:
        a.behaviour = unavailable
        assert d.get(a.url + "/v1/secret-path?key=q").text == "b"  # A opens
        assert gauge_by_target(registry) == listed_by_target(d.transport.suspensions()) == {"a": 1}
        b.behaviour = unavailable
        assert d.get(a.url + "/v1/secret-path?key=q").status == 503  # A skipped, B opens
        assert gauge_by_target(registry) == listed_by_target(d.transport.suspensions()) == {"b": 1}
        a.behaviour = lambda seen: Respond(body="a")
        assert d.get(a.url + "/v1/x").text == "a"  # forgotten, A is called again
        assert a.calls == 2
        assert gauge_by_target(registry) == listed_by_target(d.transport.suspensions()) == {"b": 1}
    finally:
        remove_observer(observer)
        if store_kind == "redis" and d.is_async:
            d.run(store.aclose())  # the driver's loop stops without closing its async generators
        if store_kind != "memory":
            store.close()
    (forgotten,) = [f for e, f in events if e == "suspension.forgotten"]
    assert forgotten["target"] == "a" and forgotten["route"] == "chat"
    assert (forgotten["scope"], forgotten["state"]) == ("origin", "open")
    assert (forgotten["reason"], forgotten["cause"]) == ("unavailable", "max_scopes")
    assert "secret-path" not in repr(forgotten) and "key=q" not in repr(forgotten)


def test_a_suspension_whose_window_ended_stays_counted_as_it_stays_listed(
    make: MakeDriver, a: Upstream, b: Upstream, registry: CollectorRegistry
) -> None:
    """A's window ends and nobody sends it a probe: the store still holds A open (listed `open`, retry_in 0: its next request is its probe), and the gauge still counts it; the probe's success takes it off both."""
    clock = FakeClock()
    config = a_then_b(a, b, cooldown=10)
    d = make(config, clock=clock)
    a.behaviour = unavailable
    assert d.get(a.url + "/v1/x").text == "b"
    clock.advance(3600)
    (row,) = d.transport.suspensions()
    assert (row.target, row.state, row.retry_in) == ("a", "open", 0.0)
    assert gauge_by_target(registry) == {"a": 1}
    a.behaviour = lambda seen: Respond(body="a")
    assert d.get(a.url + "/v1/x").text == "a"
    assert gauge_by_target(registry) == listed_by_target(d.transport.suspensions()) == {}


def test_a_scope_redis_let_expire_leaves_the_gauge_at_the_next_listing(
    make: MakeDriver, a: Upstream, b: Upstream, registry: CollectorRegistry, redis_url: str
) -> None:
    """Redis drops A's key `ttl` after its window ended, with no call of sidestep's to tell: the next listing (`suspensions()`, as the admin API and the CLI read it) no longer holds A, and its `suspensions.listed` event takes A off the gauge."""
    store = sidestep.RedisStore(redis_url, prefix=fresh_prefix(), ttl=0.05, mirror=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)
        config = route(
            ("a", a.url + "/v1"),
            ("b", b.url + "/v1"),
            breaker={"failure_threshold": 1, "cooldown": 0.05},
        )
        d = make(config, store=store)
    try:
        a.behaviour = unavailable
        assert d.get(a.url + "/v1/x").text == "b"
        assert gauge_by_target(registry) == {"a": 1}
        wait_for(lambda: d.transport.suspensions() == [])  # polled: the key expires in Redis
        assert gauge_by_target(registry) == {}
    finally:
        if d.is_async:
            d.run(store.aclose())
        store.close()


def test_a_listing_takes_off_only_what_was_counted_before_it_was_asked_for() -> None:
    """A scope counted, then missing from a listing asked for after: it leaves the gauge; a scope that opens while a listing is under way (its transition seen after the listing was asked for) stays, though that listing did not hold it."""
    measures = Measures()

    def opened(scope_id: str) -> float:
        fields = {
            "route": "chat",
            "target": "a",
            "scope": "origin+model",
            "scope_id": scope_id,
            "previous": "closed",
            "state": "open",
            "reason": "unavailable",
        }
        return sum(a for i, _, a in measures("circuit.opened", fields) if i is SUSPENDED)

    def listed(held: tuple[str, ...], listed_at: float) -> float:
        fields = {"scope_ids": held, "listed_at": listed_at}
        return sum(a for i, _, a in measures("suspensions.listed", fields) if i is SUSPENDED)

    assert opened("m1") == 1
    assert opened("m2") == 1
    asked = time.monotonic()
    assert opened("m3") == 1  # after the listing was asked for, before it came back
    assert listed(("m2",), asked) == -1  # m1 is gone; m3 is too new to judge
    assert listed(("m2",), asked) == 0
    assert listed(("m2", "m3"), time.monotonic()) == 0
    assert listed((), time.monotonic()) == -2
