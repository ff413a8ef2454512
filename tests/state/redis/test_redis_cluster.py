"""RedisStore on a real Redis Cluster (3 primaries, 3 replicas, started once per session).

The store contract (tests/state/test_store.py) and the multi-process probes
(tests/state/test_store_processes.py) run on the cluster too; here is what only a
cluster has: where keys go, the mirror's broadcast, views that span every
primary, configuration, the asyncio client, and a primary killed mid-traffic.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

import sidestep
from drivers import route
from redis_cluster import RedisCluster
from redis_server import PASSWORD, fresh_prefix
from sidestep._answers.classify import Kind, Verdict
from sidestep._common.scopes import ScopeFacts, ScopeKind
from sidestep._settings.policies import BreakerPolicy, Suspensions
from sidestep._settings.stores import StoreSettings
from sidestep._state.build import build_store
from sidestep._state.failopen import LocalTicket
from sidestep._state.redis.keys import anchor, origin_hash
from sidestep._state.redis.store import RedisStore
from upstream import Upstream, wait_for

FAIL = Verdict(Kind.FAILURE, "unavailable", ScopeKind.MODEL, failover=True)
OK = Verdict(Kind.SUCCESS, None, None, failover=False)
SUSPENSIONS = Suspensions()
POLICY = BreakerPolicy(failure_threshold=2, cooldown=0.3, max_cooldown=60, half_open_probes=3)
ORIGINS = [f"https://h{i}.example:443" for i in range(24)]  # over every primary, all but surely

# The first call to a cluster learns its slots and loads the script on a node: on a busy
# machine that can outlast the store's default timeout, which these tests are not about.
SLOW_OK = 5.0


def facts(store: RedisStore, origin: str = ORIGINS[0], model: str = "m") -> ScopeFacts:
    return ScopeFacts(
        origin,
        headers={"authorization": "Bearer k"},
        userinfo="",
        body=f'{{"model": "{model}"}}'.encode(),
        fingerprint=store.fingerprint,
    )


def next_message(pubsub: Any, timeout: float = 2.0) -> str:
    """The next message published on `pubsub`'s channel (subscription confirmations skipped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.1)
        if message is not None and message["type"] == "message":
            return str(message["data"])
    raise AssertionError("nothing published in time")


def open_origin(store: RedisStore, origin: str, now: float | None = None) -> None:
    """Fail `origin`'s model scope until it opens."""
    for _ in range(POLICY.failure_threshold):
        at = time.monotonic() if now is None else now
        ticket = store.admit(facts(store, origin), POLICY, at).ticket
        assert ticket is not None
        store.record(ticket, FAIL, POLICY, SUSPENSIONS, at)


def test_keys_of_one_origin_share_a_slot_and_no_key_spans_the_store(
    redis_cluster: RedisCluster, cluster_url: str
) -> None:
    """Every key of an origin carries its hash tag (one slot, the one the store routes to); the origins spread over the primaries; no store-wide index or sequence key exists."""
    prefix = fresh_prefix()
    store = RedisStore(cluster_url, prefix=prefix, timeout=SLOW_OK)
    for origin in ORIGINS:
        open_origin(store, origin)
    keys = redis_cluster.keys(f"{prefix}:*")
    by_origin: dict[str, list[str]] = defaultdict(list)
    for key in keys:
        by_origin[key[len(prefix) + 2 : len(prefix) + 18]].append(key)
    assert sorted(by_origin) == sorted(origin_hash(o) for o in ORIGINS)
    with redis_cluster.node(redis_cluster.primaries()[0]) as node:
        for oh, group in by_origin.items():
            routed = anchor(prefix, oh)
            assert all(k.startswith(routed + ":") for k in group)
            slots = {node.execute_command("CLUSTER", "KEYSLOT", k) for k in [routed, *group]}
            assert len(slots) == 1
    assert {redis_cluster.owner(anchor(prefix, origin_hash(o))) for o in ORIGINS} == set(
        redis_cluster.primaries()
    )
    assert not [k for k in keys if k in (f"{prefix}:i", f"{prefix}:seq")]
    assert store.fallbacks == 0
    store.close()


def test_snapshot_count_and_clear_reach_every_primary(cluster_url: str) -> None:
    """The operators' views go origin by origin over every primary, from a store whose first call they are: len and snapshot see every open scope, clear finds and forgets one, an unknown id clears nothing."""
    prefix = fresh_prefix()
    writer = RedisStore(cluster_url, prefix=prefix, timeout=SLOW_OK)
    for origin in ORIGINS:
        open_origin(writer, origin)
    writer.close()
    store = RedisStore(cluster_url, prefix=prefix, timeout=SLOW_OK)
    assert len(store) == len(ORIGINS)
    snapshot = store.snapshot(time.monotonic())
    assert sorted(s.scope.origin for s in snapshot) == sorted(ORIGINS)
    assert all(s.state.value == "open" for s in snapshot)
    gone = snapshot[5]
    assert store.clear(gone.scope_id)
    assert not store.clear(gone.scope_id)
    assert not store.clear("0123456789abcdef")
    assert len(store) == len(ORIGINS) - 1
    assert store.admit(facts(store, gone.scope.origin), POLICY, time.monotonic()).ticket
    assert store.fallbacks == 0
    store.close()


def test_a_transition_is_published_to_every_node_and_reaches_other_mirrors(
    redis_cluster: RedisCluster, cluster_url: str
) -> None:
    """A scope opening in one store is published to subscribers on all six nodes (a cluster publish is broadcast) and another store's mirror stops admitting the origin without a round trip; a clear heals it there again."""
    prefix = fresh_prefix()
    subscribers = []
    for port in redis_cluster.ports:
        pubsub = redis_cluster.node(port, timeout=5).pubsub()
        pubsub.subscribe(f"{prefix}:m")
        subscribers.append(pubsub)
    writer, reader = (
        RedisStore(cluster_url, prefix=prefix, timeout=SLOW_OK),
        RedisStore(cluster_url, prefix=prefix, timeout=SLOW_OK),
    )
    origin = ORIGINS[3]
    reader.admit(facts(reader, origin), POLICY, time.monotonic())  # starts its listener
    mirror = reader._mirror
    assert mirror is not None
    wait_for(lambda: mirror.live)
    assert mirror.healthy(origin)
    open_origin(writer, origin)
    wait_for(lambda: not mirror.healthy(origin))
    oh = origin_hash(origin)
    for pubsub in subscribers:
        assert next_message(pubsub).startswith(f"{oh} 1 ")
        pubsub.close()
    (scope,) = writer.snapshot(time.monotonic())
    assert writer.clear(scope.scope_id)
    wait_for(lambda: mirror.healthy(origin))
    assert writer.fallbacks == reader.fallbacks == 0
    writer.close()
    reader.close()


@pytest.mark.parametrize("how", ["scheme", "flag"])
def test_configuration_names_a_cluster_by_scheme_or_flag(cluster_url: str, how: str) -> None:
    """`store: {redis: {url: redis+cluster://…}}` and `{url: redis://…, cluster: true}` both build a store on the cluster, whose repr shows no password."""
    url = cluster_url if how == "scheme" else cluster_url.replace("redis+cluster://", "redis://")
    options = {"url": url, "prefix": fresh_prefix()} | ({"cluster": True} if how == "flag" else {})
    store = build_store(StoreSettings.model_validate({"redis": options}))
    assert isinstance(store, RedisStore) and store._cluster
    assert PASSWORD not in repr(store)
    open_origin(store, ORIGINS[1])
    assert len(store) == 1 and store.fallbacks == 0
    store.close()


def test_cluster_needs_a_tcp_url() -> None:
    """A unix socket cannot name a cluster node: refused by the settings and by the store, as is a URL redis-py cannot read (when built, not at first use)."""
    with pytest.raises(ValueError, match="TCP"):
        StoreSettings.model_validate({"redis": {"url": "unix:///tmp/r.sock", "cluster": True}})
    with pytest.raises(ValueError, match="redis:// or rediss://"):
        RedisStore("unix:///tmp/r.sock", cluster=True)
    with pytest.raises(ValueError, match="not a usable Redis URL"):
        RedisStore("redis+cluster://127.0.0.1:notaport/0")


def test_the_async_methods_run_on_the_cluster(cluster_url: str) -> None:
    """Under asyncio the store uses redis.asyncio's cluster client: scopes open on several primaries, the snapshot and clear span them, nothing falls back."""
    store = RedisStore(cluster_url, prefix=fresh_prefix(), mirror=False, timeout=SLOW_OK)

    async def main() -> None:
        for origin in ORIGINS[:6]:
            for _ in range(POLICY.failure_threshold):
                ticket = (await store.admit_async(facts(store, origin), POLICY, 0.0)).ticket
                assert ticket is not None
                await store.record_async(ticket, FAIL, POLICY, SUSPENSIONS, 0.0)
        snapshot = await store.snapshot_async(0.0)
        assert sorted(s.scope.origin for s in snapshot) == sorted(ORIGINS[:6])
        assert await store.clear_async(snapshot[0].scope_id)
        assert len(await store.snapshot_async(0.0)) == 5
        await store.aclose()

    store._caller_clock = True
    asyncio.run(main())
    assert store.fallbacks == 0
    store.close()


def test_a_primary_killed_mid_traffic_fails_no_request_and_probes_stay_exact(
    redis_cluster: RedisCluster, cluster_url: str, a: Upstream
) -> None:
    """A primary SIGKILLed under traffic: every admission still gets a ticket and every HTTP request through an async transport answers 200 (the stores serve from memory while the cluster fails over), both go back to the promoted replica, and then a half-open scope on the moved slot admits exactly half_open_probes of 1000 attempts."""
    prefix = fresh_prefix()
    # No mirror: every admission and success is a round trip, so traffic keeps touching the cluster.
    traffic = RedisStore(cluster_url, prefix=prefix, mirror=False, retry_interval=0.05)
    http_store = RedisStore(cluster_url, prefix=prefix, mirror=False, retry_interval=0.05)
    victim_origin = "http://" + a.url.split("://", 1)[1].split("/", 1)[0]  # the upstream's
    victim = redis_cluster.owner(anchor(prefix, origin_hash(victim_origin)))
    refused: list[str] = []
    errors: list[BaseException] = []
    statuses: list[int] = []
    stop = threading.Event()
    served = [0]

    async def requests() -> None:
        transport = sidestep.AsyncFailoverTransport(route(("a", a.url + "/v1")), store=http_store)
        async with httpx.AsyncClient(transport=transport, timeout=5) as client:
            while not stop.is_set():
                try:
                    statuses.append((await client.post(a.url + "/v1/x", json={"q": 1})).status_code)
                except Exception as exc:  # any error is a failed request
                    errors.append(exc)
        await http_store.aclose()

    def drive(offset: int) -> None:
        i = offset
        while not stop.is_set():
            origin = ORIGINS[i % len(ORIGINS)]
            i += 1
            try:
                ticket = traffic.admit(facts(traffic, origin), POLICY, time.monotonic()).ticket
                if ticket is None:
                    refused.append(origin)
                    continue
                traffic.record(ticket, OK, POLICY, SUSPENSIONS, time.monotonic())
                served[0] += 1
            except BaseException as exc:  # any error is a failed request
                errors.append(exc)

    threads = [threading.Thread(target=drive, args=(n * 5,)) for n in range(4)]
    threads.append(threading.Thread(target=asyncio.run, args=(requests(),)))
    for thread in threads:
        thread.start()
    try:
        # Both have met the cluster: the node a URL names must answer a store's first call
        # (from then on redis-py knows every node).
        wait_for(lambda: served[0] > 200 and len(statuses) > 20)
        redis_cluster.kill(victim)
        killed_at = time.monotonic()
        wait_for(lambda: not traffic.available)  # it noticed, and fails open
        wait_for(lambda: not http_store.available)
        # The replica takes over (cluster-node-timeout plus an election), and the store is back.
        wait_for(lambda: victim not in redis_cluster.primaries())
        wait_for(lambda: len(redis_cluster.primaries()) == 3)
        wait_for(lambda: traffic.available)
        back, sent = served[0], len(statuses)
        wait_for(lambda: served[0] > back + 200 and traffic.available)
        wait_for(lambda: len(statuses) > sent + 20 and http_store.available)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert not errors and not refused
    assert statuses and set(statuses) == {200}
    assert traffic.fallbacks > 0 and http_store.fallbacks > 0
    assert time.monotonic() - killed_at < 30
    traffic.close()
    http_store.close()

    # The probes of a scope whose slot moved to the promoted replica stay exact. A store
    # made now learns the layout from a node that runs (the URL's may be the one killed).
    alive = redis_cluster.url_for(redis_cluster.primaries()[0])
    store = RedisStore(alive, prefix=prefix, fingerprint_key="k", timeout=SLOW_OK)
    assert redis_cluster.owner(anchor(prefix, origin_hash(victim_origin))) != victim
    open_origin(store, victim_origin)
    opened = time.monotonic()
    wait_for(lambda: time.monotonic() > opened + POLICY.cooldown)

    def attempt(_: int) -> bool:
        ticket = store.admit(facts(store, victim_origin), POLICY, time.monotonic(), 30.0).ticket
        return ticket is not None and bool(ticket.probes)

    with ThreadPoolExecutor(8) as pool:
        probes = sum(pool.map(attempt, range(1000)))
    assert probes == POLICY.half_open_probes
    assert store.fallbacks == 0
    store.close()
    redis_cluster.revive(victim)  # whole again for whatever runs next


@pytest.mark.parametrize("full_coverage", ["no", "yes"])
def test_a_primary_holding_none_of_an_origins_keys_killed_mid_traffic(
    redis_cluster: RedisCluster, full_coverage: str
) -> None:
    """A primary that serves none of an origin's slots SIGKILLed under that origin's traffic. With `cluster-require-full-coverage no`, every call keeps going to the origin's own primary while the dead one's replica takes over: nothing falls back, every admission is the cluster's. With `yes` (Redis's default) the whole cluster answers CLUSTERDOWN until then: the store falls back to memory (every admission still a ticket, none an error) and returns to the cluster afterwards."""
    prefix = fresh_prefix()
    origin = ORIGINS[0]
    own = redis_cluster.owner(anchor(prefix, origin_hash(origin)))
    victim = next(port for port in redis_cluster.primaries() if port != own)
    coverage(redis_cluster, full_coverage)
    # No mirror: every admission and success is a round trip. A long timeout: a slow
    # call on a busy machine is not what this test is about.
    store = RedisStore(
        redis_cluster.url_for(own),
        prefix=prefix,
        mirror=False,
        retry_interval=0.05,
        timeout=SLOW_OK,
    )
    stop = threading.Event()
    errors: list[BaseException] = []
    calls: list[tuple[float, float, bool]] = []  # (started, seconds, served by the cluster)

    def drive() -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                ticket = store.admit(facts(store, origin), POLICY, started).ticket
                assert ticket is not None
                store.record(ticket, OK, POLICY, SUSPENSIONS, time.monotonic())
            except BaseException as exc:  # any error is a failed request
                errors.append(exc)
                return
            calls.append((started, time.monotonic() - started, not isinstance(ticket, LocalTicket)))

    thread = threading.Thread(target=drive)
    thread.start()
    try:
        wait_for(lambda: len(calls) > 50)
        redis_cluster.kill(victim)
        killed_at = time.monotonic()
        if full_coverage == "yes":
            wait_for(lambda: not store.available)  # CLUSTERDOWN: memory
        wait_for(lambda: victim not in redis_cluster.primaries())
        wait_for(lambda: len(redis_cluster.primaries()) == 3)
        promoted_at = time.monotonic()
        wait_for(lambda: store.available)
        count = len(calls)
        wait_for(lambda: len(calls) > count + 50 and calls[-1][2])
    finally:
        stop.set()
        thread.join(30)
        redis_cluster.revive(victim)  # whole again for whatever runs next
        coverage(redis_cluster, "yes")
    assert not errors
    during = [c for c in calls if killed_at <= c[0] <= promoted_at]
    assert during, "no call while the dead primary's slots were unserved"
    if full_coverage == "no":
        assert store.fallbacks == 0
        assert all(served for _, _, served in calls)
    else:
        assert store.fallbacks > 0
        assert not all(served for _, _, served in during)
    store.close()


def coverage(cluster: RedisCluster, value: str) -> None:
    """Set `cluster-require-full-coverage` on every node that runs."""
    for port in cluster.running():
        with cluster.node(port) as node:
            node.config_set("cluster-require-full-coverage", value)


def test_a_store_built_while_the_cluster_is_away_fails_open() -> None:
    """Building a cluster store does no I/O; with no node reachable every call is served from memory (one ticket per admission, never an error)."""
    store = RedisStore("redis+cluster://:pw@127.0.0.1:1/0", prefix=fresh_prefix(), timeout=0.1)
    ticket = store.admit(facts(store), POLICY, 0.0).ticket
    assert ticket is not None
    assert store.fallbacks >= 1 and not store.available
    store.close()
