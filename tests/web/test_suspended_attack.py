"""The suspended gauge against a store's let-go racing a new suspension of the same scope."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

import sidestep
from drivers import route
from redis_server import fresh_prefix
from scrape import gauge_by_target
from sidestep._settings.values import SidestepConfigWarning
from sidestep._state.protocol import store_id
from sidestep.logging import add_observer, remove_observer
from sidestep.metrics import prometheus
from sidestep.metrics._labels import SUSPENDED, Measures
from upstream import Respond, Seen, Upstream, wait_for


def unavailable(seen: Seen) -> Respond:
    return Respond(503, "down")


class Gate:
    """An observer that holds one thread's `suspension.forgotten` of `target` until opened."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.reached = threading.Event()
        self.opened = threading.Event()

    def __call__(self, event: str, fields: Mapping[str, Any], /) -> None:
        if event == "suspension.forgotten" and fields.get("target") == self.target:
            self.reached.set()
            assert self.opened.wait(10)


@pytest.fixture
def gated_registry() -> Iterator[tuple[Gate, CollectorRegistry]]:
    """A gate heard before the Prometheus exporter, which reports into a fresh registry."""
    gate = Gate("a")
    add_observer(gate)
    registry = CollectorRegistry()
    prometheus.enable(registry)
    yield gate, registry
    prometheus.disable()
    remove_observer(gate)
    gate.opened.set()


def test_a_scope_suspended_again_before_its_forgetting_is_told_stays_counted(
    a: Upstream, b: Upstream, gated_registry: tuple[Gate, CollectorRegistry]
) -> None:
    """A store bounded to one scope holds A open; a request failing on B makes it forget A,
    and before that request's `suspension.forgotten` reaches the gauge, another thread's
    failure on A suspends A anew (from closed). The late forgetting is of A's former
    suspension: A, open in the store and listed, stays on the gauge (it came off, and no
    listing ever put it back: the gauge said no outage through A's whole new one)."""
    gate, registry = gated_registry
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)
        config = {
            "breaker": {"failure_threshold": 1, "cooldown": 600},
            "routes": [
                {"name": "one", "targets": [{"name": "a", "url": a.url + "/v1"}]},
                {"name": "two", "targets": [{"name": "b", "url": b.url + "/v1"}]},
            ],
        }
        transport = sidestep.FailoverTransport(config, store=sidestep.MemoryStore(max_scopes=1))
    a.behaviour = b.behaviour = unavailable
    with httpx.Client(transport=transport) as client:
        client.get(a.url + "/v1/x")  # A opens
        assert gauge_by_target(registry) == {"a": 1}
        other = threading.Thread(target=client.get, args=(b.url + "/v1/x",))
        other.start()  # B opens, A forgotten: told only once the gate opens
        try:
            wait_for(gate.reached.is_set)
            assert [row.target for row in transport.suspensions()] == ["b"]
            client.get(a.url + "/v1/x")  # A, closed as the store knows it, fails and opens
        finally:
            gate.opened.set()
            other.join(10)
        held = [row.target for row in transport.suspensions()]
        assert held == ["a"]
        assert gauge_by_target(registry) == {"a": 1}


def test_a_let_go_told_after_a_new_suspension_leaves_it_counted() -> None:
    """`suspension.forgotten` and `suspension.cleared` carry when the store let go; one that
    comes after the scope was seen suspended anew from closed is of its former suspension
    and takes nothing off; one from after that suspension takes it off."""
    measures = Measures()
    opened = {
        "route": "chat",
        "target": "a",
        "scope": "origin",
        "scope_id": "s1",
        "previous": "closed",
        "state": "open",
        "reason": "unavailable",
    }

    def gauge(event: str, fields: Mapping[str, Any]) -> float:
        return sum(n for i, _, n in measures(event, fields) if i is SUSPENDED)

    assert gauge("circuit.opened", opened) == 1
    let_go = time.monotonic()  # the store forgets s1 here...
    assert gauge("circuit.opened", opened) == 0  # ...s1 fails again, anew from closed
    for event, field in (
        ("suspension.forgotten", "forgotten_at"),
        ("suspension.cleared", "cleared_at"),
    ):
        assert gauge(event, {"scope_id": "s1", field: let_go}) == 0
    assert gauge("suspension.forgotten", {"scope_id": "s1", "forgotten_at": time.monotonic()}) == -1
    assert gauge("circuit.opened", opened) == 1
    assert gauge("suspension.cleared", {"scope_id": "s1"}) == -1  # no time: as it comes
    assert gauge("circuit.opened", opened) == 1
    assert gauge("suspension.forgotten", {"scope_id": "s1", "forgotten_at": None}) == -1


def test_a_listing_of_one_store_leaves_what_another_store_holds_counted(
    a: Upstream, b: Upstream
) -> None:
    """Two transports in one process, each with its own memory store (two clients, or an
    admin page over one of them): A opens in the first; listing the second store, which
    never held A, leaves A on the gauge (it took A off: the gauge said no outage while
    the first store held A open, at every refresh of an admin page over the second),
    and the first store's listing, which holds it, too."""
    registry = CollectorRegistry()
    prometheus.enable(registry)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SidestepConfigWarning)
            config = route(
                ("a", a.url + "/v1"), ("b", b.url + "/v1"), breaker={"failure_threshold": 1}
            )
            first = sidestep.FailoverTransport(config)
            second = sidestep.FailoverTransport(config)
        a.behaviour = unavailable
        with httpx.Client(transport=first) as client:
            assert client.get(a.url + "/v1/x").text == "b"
        assert gauge_by_target(registry) == {"a": 1}
        assert second.suspensions() == []
        assert [row.target for row in first.suspensions()] == ["a"]
        assert gauge_by_target(registry) == {"a": 1}
    finally:
        prometheus.disable()


def test_two_instances_of_one_shared_store_count_one_set_of_scopes(
    a: Upstream, b: Upstream, redis_url: str
) -> None:
    """Two transports of one process, each with a RedisStore of its own on one Redis and
    prefix (each transport builds the configured store): they hold one set of scopes, so
    A opened through the first and cleared through the second leaves the gauge, and a
    listing through either speaks for both."""
    registry = CollectorRegistry()
    prometheus.enable(registry)
    prefix = fresh_prefix()
    stores = [sidestep.RedisStore(redis_url, prefix=prefix, mirror=False) for _ in range(2)]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SidestepConfigWarning)
            config = route(
                ("a", a.url + "/v1"), ("b", b.url + "/v1"), breaker={"failure_threshold": 1}
            )
            first, second = (sidestep.FailoverTransport(config, store=s) for s in stores)
        a.behaviour = unavailable
        with httpx.Client(transport=first) as client:
            assert client.get(a.url + "/v1/x").text == "b"
        assert gauge_by_target(registry) == {"a": 1}
        (row,) = second.suspensions()
        assert gauge_by_target(registry) == {"a": 1}
        assert second.clear(row.scope_id)
        assert gauge_by_target(registry) == {}
        with httpx.Client(transport=second) as client:
            assert client.get(a.url + "/v1/x").text == "b"  # A opens again, through the second
        assert gauge_by_target(registry) == {"a": 1}
        assert first.suspensions() != []
        assert gauge_by_target(registry) == {"a": 1}
    finally:
        prometheus.disable()
        for store in stores:
            store.close()


def test_a_shared_stores_id_names_its_state_and_never_its_url(tmp_path: Path) -> None:
    """Events carry `store`: one id for two instances on one Redis URL and prefix (or one
    SQLite file), another for another prefix or file, and a memory store's its own;
    never the URL, its password or the path."""
    url = "redis://:hunter2-secret@127.0.0.1:1/3"
    redis = [sidestep.RedisStore(url, prefix=p, mirror=False) for p in ("s:", "s:", "t:")]
    files = [sidestep.SqliteStore(tmp_path / n) for n in ("one.db", "one.db", "two.db")]
    try:
        for one, same, other in (redis, files):
            assert store_id(one) == store_id(same) != store_id(other)
        memory = [sidestep.MemoryStore(), sidestep.MemoryStore()]  # both alive
        ids = [store_id(s) for s in (*redis, *files, *memory)]
        assert all(int(i, 16) >= 0 for i in ids)  # hexadecimal, nothing else
        assert len(set(ids)) == 6
        assert not any("hunter2" in i or "one.db" in i for i in ids)
    finally:
        for store in (*redis, *files):
            store.close()
