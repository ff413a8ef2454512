"""Fault plans under the four transports, against real upstreams on 127.0.0.1."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest

import sidestep
from drivers import FakeClock, MakeDriver, route
from sidestep import testing
from sidestep.metrics._labels import FAULTS, Measures
from upstream import IN_TIME, Respond, Stream, Upstream

CHAT = "/v1/chat/completions"
BODY = {"model": "m", "messages": [], "stream": True}


def pair(a: Upstream, b: Upstream, **extra: Any) -> dict[str, Any]:
    breaker = extra.pop("breaker", {"failure_threshold": 1, "cooldown": 30})
    failover = {"retry_ambiguous": True, **extra.pop("failover", {})}
    return route(
        ("primary", a.url + "/v1"),
        ("backup", b.url + "/v1"),
        breaker=breaker,
        failover=failover,
        **extra,
    )


def states(d: Any) -> dict[str, tuple[str, str | None]]:
    return {s.target: (s.state, s.reason) for s in d.transport.suspensions()}


# Each fault, and whether the primary is still called under it (its answer spoiled).
FAILING = [
    pytest.param(testing.status(503), False, id="status"),
    pytest.param(testing.timeout(), False, id="timeout"),
    pytest.param(testing.connect_error(), False, id="connect_error"),
    pytest.param(testing.cut_stream(), True, id="cut_stream"),
    pytest.param(testing.stalled_stream(), True, id="stalled_stream"),
    pytest.param(testing.error_event(), False, id="error_event"),
]


@pytest.mark.parametrize(("fault", "sends"), FAILING)
def test_each_fault_fails_over_and_opens_the_primary(
    fault: testing.Fault, sends: bool, make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Under each fault on the primary the request is answered by the backup, the primary's circuit opens (an in-memory store counts injected failures), and the primary is called only when the fault spoils its real answer."""
    a.behaviour = lambda seen: Stream([b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'])
    b.behaviour = lambda seen: Respond(body=b'{"answer": "b"}')
    d = make(pair(a, b, failover={"stall_timeout": IN_TIME}))
    plan = testing.FaultPlan().inject(fault, target="primary").apply(d.transport)
    result = d.post(a.url + CHAT, json=BODY)
    assert result.status == 200 and result.body == b'{"answer": "b"}'
    assert result.extensions["sidestep"]["target"] == "backup"
    assert states(d)["primary"][0] == "open"
    assert a.calls == (1 if sends else 0)
    assert plan.injected == [testing.Injected("chat", "primary", plan.rules[0].label)]


def test_a_429_with_retry_after_suspends_for_its_window(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """An injected 429 with Retry-After suspends the primary as rate limited, for that window on the transport's clock, and the backup answers."""
    clock = FakeClock()
    d = make(pair(a, b), clock=clock)
    testing.FaultPlan().inject(testing.status(429, retry_after=20), target="primary").apply(
        d.transport
    )
    assert d.get(a.url + "/v1/models").body == b"b"
    (suspension,) = d.transport.suspensions()
    assert (suspension.target, suspension.reason) == ("primary", "rate_limited")
    assert suspension.retry_in == pytest.approx(20)


def test_a_stream_cut_after_its_first_bytes_reaches_the_caller(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A cut after the commit point is raised to the caller as the flavour's protocol error, after the bytes before it, and counts against the primary."""
    a.behaviour = lambda seen: Respond(body=b"0123456789")
    d = make(pair(a, b))
    testing.FaultPlan().inject(testing.cut_stream(after_bytes=4), target="primary").apply(
        d.transport
    )
    chunks: list[bytes] = []
    with pytest.raises((httpx.RemoteProtocolError, httpx2.RemoteProtocolError), match="cut"):
        d.stream("GET", a.url + "/v1/items", chunks.append)
    assert b"".join(chunks) == b"0123"
    assert states(d)["primary"][0] == "open"


def test_a_malformed_body_is_caught_by_commit_complete_only(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A malformed JSON body reaches the caller on a route that commits at the first byte; on one that commits complete, it fails over to the backup."""
    plain = make(pair(a, b))
    checked = make(pair(a, b, route={"commit": "complete"}))
    for d in (plain, checked):
        testing.FaultPlan().inject(testing.malformed_body(), target="primary").apply(d.transport)
    assert plain.get(a.url + "/v1/items").body.startswith(b'{"id": "injected"')
    assert checked.get(a.url + "/v1/items").body == b"b"


def test_a_shared_store_does_not_count_injected_failures_unless_told(
    make: MakeDriver, a: Upstream, b: Upstream, tmp_path: Path
) -> None:
    """Over a SQLite store the injected 503 still fails over, but opens no circuit in the shared file; a rule with count: true opens it."""
    store = sidestep.SqliteStore(str(tmp_path / "state.db"), timeout=30)
    d = make(pair(a, b), store=store)
    plan = testing.FaultPlan().inject(testing.status(503), target="primary", times=1)
    plan.apply(d.transport)
    assert d.get(a.url + "/v1/items").extensions["sidestep"]["target"] == "backup"
    assert d.transport.suspensions() == []
    plan.inject(testing.status(503), target="primary", times=1, count=True)
    assert d.get(a.url + "/v1/items").extensions["sidestep"]["target"] == "backup"
    assert states(d) == {"primary": ("open", "unavailable")}


def test_times_and_duration_on_the_plans_clock(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """`times` ends a rule after that many faults; `duration` ends one when the plan's clock passes it; the primary answers again afterwards."""
    clock = FakeClock()
    d = make(pair(a, b, breaker={"failure_threshold": 10}))
    plan = testing.FaultPlan(clock=clock)
    plan.inject(testing.connect_error(), target="primary", times=2).apply(d.transport)
    served = [d.get(a.url + "/v1/x").extensions["sidestep"]["target"] for _ in range(3)]
    assert served == ["backup", "backup", "primary"]
    plan.inject(testing.status(500), target="primary", duration=60)
    clock.advance(59)
    assert d.get(a.url + "/v1/x").extensions["sidestep"]["target"] == "backup"
    clock.advance(1)
    assert d.get(a.url + "/v1/x").extensions["sidestep"]["target"] == "primary"


def test_removing_the_plan_restores_the_transport(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Leaving the plan's `with` block takes its layer out: the inner transport is the one the transport was built with throughout, and the primary answers again once its circuit is reset."""
    d = make(pair(a, b))
    inner = d.transport.inner
    with testing.FaultPlan().inject(testing.status(503), target="primary").apply(d.transport):
        assert d.transport.inner is inner
        assert d.get(a.url + "/v1/x").body == b"b"
    assert d.transport.inner is inner and d.transport._inner is inner
    assert not d.transport._core.injecting
    assert testing.reset_circuits(d.transport) == 1
    assert d.get(a.url + "/v1/x").body == b"a"


def test_events_and_the_faults_counter(
    make: MakeDriver, a: Upstream, b: Upstream, events: list[tuple[str, dict[str, Any]]]
) -> None:
    """An injected fault is a `fault.injected` event naming route, target and fault, which the metrics count under sidestep_faults_injected."""
    d = make(pair(a, b))
    testing.FaultPlan().inject(testing.status(502), target="primary").apply(d.transport)
    d.get(a.url + "/v1/x")
    measures = Measures()
    injected = [f for e, f in events if e == "fault.injected"]
    assert injected == [{"route": "chat", "target": "primary", "fault": "status_502"}]
    assert measures("fault.injected", injected[0]) == [
        (FAULTS, ("chat", "primary", "status_502"), 1)
    ]


def test_wrap_install_and_everywhere(a: Upstream, b: Upstream) -> None:
    """A plan applies to a client wrap() put sidestep under, to one install() wrapped, and with everywhere() to every transport built while it is on; a rule naming an unknown target is refused."""
    config = sidestep.Config.model_validate(pair(a, b, breaker={"failure_threshold": 5}))
    plan = testing.FaultPlan().inject(testing.status(503), target="primary")
    wrapped = sidestep.wrap(httpx2.Client(), config)
    sidestep.install(config)
    try:
        installed = httpx.Client()
        with plan.apply(wrapped, installed):
            assert wrapped.get(a.url + "/v1/x").text == "b"
            assert installed.get(a.url + "/v1/x").text == "b"
        with plan.everywhere():
            later = sidestep.FailoverTransport(config)
            with httpx.Client(transport=later) as client:
                assert client.get(a.url + "/v1/x").text == "b"
        assert len(plan.injected) == 3
        with pytest.raises(sidestep.ConfigError, match="no target 'ghost'"):
            testing.FaultPlan().inject(testing.timeout(), target="ghost").apply(wrapped)
        with pytest.raises(TypeError, match="no sidestep transport"):
            plan.apply(httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200))))
        installed.close()
    finally:
        sidestep.uninstall()
        wrapped.close()


def test_an_uncounted_probe_gives_its_slot_back(make: MakeDriver, a: Upstream, b: Upstream) -> None:
    """A half-open primary's probe that gets an injected 503 its rule does not count (`count: false`) records nothing and frees its slot: once the plan is gone, the next request is the probe, and its success closes the primary."""
    clock = FakeClock()
    d = make(pair(a, b), clock=clock)
    a.behaviour = lambda seen: Respond(503, b"down")
    assert d.get(a.url + "/v1/x").body == b"b"  # a real 503: the primary opens
    a.behaviour = lambda seen: Respond(body=b"a")
    clock.advance(31)  # past its cooldown: the next request is its probe
    plan = testing.FaultPlan().inject(testing.status(503), target="primary", count=False)
    with plan.apply(d.transport):
        assert d.get(a.url + "/v1/x").body == b"b"
    assert a.calls == 1 and states(d)["primary"][0] == "half_open"
    assert d.get(a.url + "/v1/x").body == b"a"
    assert d.transport.suspensions() == []


def test_a_fault_reaches_the_target_it_names_where_targets_share_a_url(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Two keys to one API share a URL, and a later route reuses the other route's URL:
    a rule for one key fails that key's attempts only (the other key answers), and a rule
    for the later route's target fires on that route's attempts. The inner transport
    never sees the attempt's name."""
    seen: list[Any] = []
    a.behaviour = lambda s: (seen.append(s), Respond(body="a"))[1]
    config = {
        "breaker": {"failure_threshold": 5, "cooldown": 30},
        "routes": [
            {"name": "embed", "targets": [{"name": "main", "url": b.url + "/v1"}]},
            {
                "name": "chat",
                "match": [a.url + "/chat"],
                "targets": [
                    {"name": "key1", "url": a.url + "/v1", "headers": {"authorization": "k1"}},
                    {"name": "key2", "url": a.url + "/v1", "headers": {"authorization": "k2"}},
                    {"name": "backup", "url": b.url + "/v1"},
                ],
            },
        ],
    }
    d = make(config)
    plan = testing.FaultPlan().inject(testing.status(503), target="key1", route="chat")
    plan.inject(testing.status(503), target="backup", route="chat")
    plan.apply(d.transport)
    result = d.get(a.url + "/chat/x")
    assert result.status == 200 and result.text == "a"
    assert result.extensions["sidestep"]["target"] == "key2"
    assert [s.headers.get("authorization") for s in seen] == ["k2"]
    assert [(i.route, i.target) for i in plan.injected] == [("chat", "key1")]
    a.behaviour = lambda s: Respond(503)
    d.get(a.url + "/chat/x")  # key1 injected, key2 really down, backup injected
    assert [(i.route, i.target) for i in plan.injected][1:] == [
        ("chat", "key1"),
        ("chat", "backup"),
    ]
    assert b.calls == 0


def test_an_injected_delay_ends_at_the_attempts_read_timeout(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """An injected timeout's delay is cut at the attempt's read timeout, as a silent
    upstream's would be: the request fails over long before the rule's 30 s."""
    b.behaviour = lambda s: Respond(body="b")
    d = make(pair(a, b), timeout=0.5)
    testing.FaultPlan().inject(testing.timeout(delay=30), target="primary").apply(d.transport)
    started = time.monotonic()
    result = d.get(a.url + "/v1/x")
    assert result.text == "b"
    assert time.monotonic() - started < 20  # (30 s if the delay ran whole)


@pytest.mark.parametrize("flavour", ["httpx", "httpx2"])
def test_a_stream_is_cut_even_when_the_inner_transport_read_it_already(flavour: str) -> None:
    """Over an inner transport that hands its answer already read (MockTransport), a
    cut_stream after 4 bytes still cuts the body the caller reads."""
    http: Any = httpx2 if flavour == "httpx2" else httpx
    module: Any = sidestep.httpx2 if flavour == "httpx2" else sidestep
    inner = http.MockTransport(lambda r: http.Response(200, content=b"0123456789"))
    config = route(("primary", "http://a.example/v1"), ("backup", "http://b.example/v1"))
    transport = module.FailoverTransport(config, transport=inner)
    plan = testing.FaultPlan().inject(testing.cut_stream(after_bytes=4), target="primary")
    plan.apply(transport)
    with http.Client(transport=transport) as client, pytest.raises(http.RemoteProtocolError):
        client.get("http://a.example/v1/x").read()
    assert len(plan.injected) == 1


def test_a_plan_is_not_under_a_client_after_uninstall(a: Upstream, b: Upstream) -> None:
    """A client install() wrapped, with a plan applied to it, sends straight to the
    upstream once sidestep is uninstalled: no fault and no failover."""
    a.behaviour = lambda s: Respond(body="a")
    config = sidestep.Config.model_validate(pair(a, b, breaker={"failure_threshold": 5}))
    sidestep.install(config)
    try:
        client = httpx.Client()
        plan = testing.FaultPlan().inject(testing.status(503), target="primary").apply(client)
        assert client.get(a.url + "/v1/x").text == "b"
    finally:
        sidestep.uninstall()
    try:
        response = client.get(a.url + "/v1/x")
        assert response.status_code == 200 and response.text == "a"
        assert "sidestep" not in response.extensions
        assert len(plan.injected) == 1
    finally:
        client.close()


def test_a_rules_names_need_one_transport_the_plan_is_under(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Under two transports of different configurations, a rule is accepted when one of them has its route and target, and injects there; a target neither has, or a target outside the route named, is refused naming it; a plan under no transport yet takes any name, and apply() refuses a rule its transport's own configuration lacks."""
    d = make(pair(a, b))
    elsewhere = {"name": "elsewhere", "url": b.url + "/v1"}
    other = make({"routes": [{"name": "other", "targets": [elsewhere]}]})
    plan = testing.FaultPlan().apply(d.transport, other.transport)
    plan.inject(testing.status(503), target="primary", times=1)
    plan.inject(testing.status(502), route="other", target="elsewhere", times=1)
    assert d.get(a.url + "/v1/x").extensions["sidestep"]["target"] == "backup"
    assert plan.injected == [testing.Injected("chat", "primary", "status_503")]
    unknown = "none of the 2 sidestep transports the plan is under has a target 'ghost'"
    with pytest.raises(sidestep.ConfigError, match=unknown):
        plan.inject(testing.timeout(), target="ghost")
    with pytest.raises(sidestep.ConfigError, match="a target 'elsewhere' in route 'chat'"):
        plan.inject(testing.timeout(), route="chat", target="elsewhere")
    assert len(plan.rules) == 2
    unchecked = testing.FaultPlan().inject(testing.timeout(), target="primary")
    with pytest.raises(sidestep.ConfigError, match="the configuration has no target 'primary'"):
        unchecked.apply(d.transport, other.transport)
