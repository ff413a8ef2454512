"""RedisStore's mirror against a real Redis: no round trip on the healthy path, news from the
other stores, and never a stale "healthy" when the subscription is lost.

How soon the news comes is measured by the benchmark (`benchmarks/redis_store.py`), not
here: on a busy machine it may take any time.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

import sidestep
import sidestep._state.redis.mirror
from redis_server import DelayProxy, RedisServer, fresh_prefix
from sidestep._answers.classify import Kind, Verdict
from sidestep._common.scopes import ScopeFacts, ScopeKind
from sidestep._settings.policies import BreakerPolicy, Suspensions
from sidestep._state.redis.keys import origin_hash
from sidestep._state.redis.store import RedisStore
from upstream import IN_TIME, Upstream, wait_for

ORIGIN = "https://api.example:443"
OK = Verdict(Kind.SUCCESS, None, None, failover=False)
FAIL = Verdict(Kind.FAILURE, "unavailable", ScopeKind.MODEL, failover=True)
P = BreakerPolicy(failure_threshold=2, cooldown=600, max_cooldown=600)


def facts(store: RedisStore, model: str = "m") -> ScopeFacts:
    return ScopeFacts(
        ORIGIN,
        headers={"authorization": "Bearer k"},
        userinfo="",
        body=f'{{"model": "{model}"}}'.encode(),
        fingerprint=store.fingerprint,
    )


def open_scope(store: RedisStore) -> None:
    for _ in range(2):
        ticket = store.admit(facts(store), P, 0).ticket
        assert ticket is not None
        store.record(ticket, FAIL, P, Suspensions(), 0)


def live(store: RedisStore) -> RedisStore:
    """`store` once its mirror follows the channel (the first admission starts it)."""
    assert store._mirror is not None
    store.admit(facts(store, "warm-up"), P, 0)
    wait_for(lambda: store._mirror is not None and store._mirror.live)
    return store


def counting(store: RedisStore) -> list[str]:
    """The script calls `store` makes from now on, by operation."""
    calls: list[str] = []
    script = store._clients._script

    def count(*args: Any, **kw: Any) -> Any:
        calls.append(kw["args"][0])
        return script(*args, **kw)

    store._clients._script = count  # type: ignore[assignment]
    return calls


@pytest.fixture
def pair(redis_url: str) -> Iterator[tuple[RedisStore, RedisStore]]:
    """Two stores on one prefix, as two processes would have, each with its mirror live."""
    prefix = fresh_prefix()
    one = live(RedisStore(redis_url, prefix=prefix, fingerprint_key="k", retry_interval=0.05))
    two = live(RedisStore(redis_url, prefix=prefix, fingerprint_key="k", retry_interval=0.05))
    yield one, two
    one.close()
    two.close()


def test_a_healthy_origin_costs_no_round_trip_once_the_mirror_is_live(
    pair: tuple[RedisStore, RedisStore],
) -> None:
    """With the mirror live, 200 admissions and successes on a healthy origin make no script call; an unhealthy origin still asks Redis."""
    store, _ = pair
    calls = counting(store)
    for _ in range(200):
        ticket = store.admit(facts(store), P, 0).ticket
        assert ticket is not None and ticket.generations is None
        assert store.record(ticket, OK, P, Suspensions(), 0) == ()
    assert calls == []
    open_scope(store)
    assert store.admit(facts(store), P, 0).ticket is None
    assert calls[-1] == "admit"
    assert store.fallbacks == 0


def test_a_transition_reaches_another_mirror(pair: tuple[RedisStore, RedisStore]) -> None:
    """A scope opened through one store becomes known to the other store's mirror, which then asks Redis and is refused."""
    one, two = pair
    assert two._mirror is not None and two._mirror.healthy(ORIGIN)
    ticket = one.admit(facts(one), P, 0).ticket
    assert ticket is not None
    one.record(ticket, FAIL, P, Suspensions(), 0)  # the origin gains a scope: news
    wait_for(lambda: not two._mirror.healthy(ORIGIN))  # type: ignore[union-attr]
    again = one.admit(facts(one), P, 0).ticket
    assert again is not None
    one.record(again, FAIL, P, Suspensions(), 0)  # the threshold: open
    assert two.admit(facts(two), P, 0).ticket is None


def test_a_lost_subscription_means_round_trips_until_a_snapshot_rebuilt_the_mirror(
    pair: tuple[RedisStore, RedisStore], redis_server: RedisServer
) -> None:
    """Its subscription killed, a mirror stops vouching at once; what changed meanwhile comes back with the snapshot when it subscribes again."""
    one, two = pair
    mirror = two._mirror
    assert mirror is not None
    calls = counting(two)
    with redis_server.client() as admin:
        admin.client_kill_filter(_type="pubsub")
    wait_for(lambda: not mirror.live)
    assert mirror.losses >= 1
    open_scope(one)  # news that `two` never receives
    wait_for(lambda: mirror.live)  # subscribed again, from a snapshot
    assert origin_hash(ORIGIN) in mirror._sick
    assert calls[0] == "origins"
    assert two.admit(facts(two), P, 0).ticket is None


def test_while_the_mirror_is_not_live_every_admission_asks_redis(
    pair: tuple[RedisStore, RedisStore], redis_server: RedisServer
) -> None:
    """Between the loss and the new snapshot the store falls back to a round trip per admission: never a stale healthy."""
    one, two = pair
    mirror = two._mirror
    assert mirror is not None
    mirror._retry_interval = 3600.0  # it stays lost for the test
    with redis_server.client() as admin:
        admin.client_kill_filter(_type="pubsub")
    wait_for(lambda: not mirror.live)
    calls = counting(two)
    ticket = two.admit(facts(two), P, 0).ticket
    assert ticket is not None
    assert calls == ["admit"]
    open_scope(one)
    assert two.admit(facts(two), P, 0).ticket is None
    mirror.stop()


def test_a_silent_subscription_is_found_lost_by_its_heartbeat(redis_server: RedisServer) -> None:
    """Replies held back for far longer than the heartbeat: the mirror stops vouching, though the connection stays open (and the replies would come at last)."""
    proxy = DelayProxy(redis_server)
    store = RedisStore(proxy.url, prefix=fresh_prefix(), retry_interval=3600)
    try:
        assert store._mirror is not None
        store._mirror._heartbeat = IN_TIME  # a busy machine's answers make it: never lost early
        live(store)
        proxy.delay = 30.0
        wait_for(lambda: store._mirror is not None and not store._mirror.live)
    finally:
        proxy.delay = 0.0
        store.close()
        proxy.close()


def test_close_stops_the_listener_and_the_mirror_is_optional(redis_url: str) -> None:
    """close() stops the listener thread; with mirror=False no thread is ever started."""
    store = live(RedisStore(redis_url, prefix=fresh_prefix()))
    assert store._mirror is not None
    thread = store._mirror._thread
    assert thread is not None and thread.is_alive() and thread.daemon
    store.close()
    assert not thread.is_alive()
    before = set(threading.enumerate())
    plain = RedisStore(redis_url, prefix=fresh_prefix(), mirror=False)
    for _ in range(3):
        ticket = plain.admit(facts(plain), P, 0).ticket
        assert ticket is not None
        plain.record(ticket, OK, P, Suspensions(), 0)
    assert plain._mirror is None
    assert not {t for t in threading.enumerate() if t.name == "sidestep-redis-mirror"} - before
    plain.close()


def test_close_while_other_threads_admit_leaves_one_listener_at_most(redis_url: str) -> None:
    """close() while another thread keeps admitting: the closed listener ends (the
    admissions start a new one, as after any close), so one listener at most is left and
    a second close() ends it."""
    before = set(threading.enumerate())  # other tests' stores may still listen
    store = live(RedisStore(redis_url, prefix=fresh_prefix()))
    done = threading.Event()

    def admit() -> None:
        for _ in range(100_000):  # bounded; stopped as soon as close() returned
            if done.is_set():
                return
            store.admit(facts(store), P, 0)

    thread = threading.Thread(target=admit)
    thread.start()
    try:
        wait_for(lambda: store._mirror is not None and store._mirror._thread is not None)
        assert store._mirror is not None
        closed = store._mirror._thread
        assert closed is not None
        store.close()
    finally:
        done.set()
        thread.join()
    wait_for(lambda: not closed.is_alive())  # it ends, whatever the admissions started
    listeners = [
        t
        for t in set(threading.enumerate()) - before
        if t.name == "sidestep-redis-mirror" and t.is_alive()
    ]
    assert len(listeners) <= 1  # the one the admissions after close() started, if any
    store.close()
    wait_for(lambda: not any(t.is_alive() for t in listeners))


def test_while_redis_refuses_writes_the_local_fallback_decides_not_the_mirror() -> None:
    """Redis out of memory (or a primary demoted to a read-only replica): the subscription
    stays live but verdicts cannot be written. Admissions then go to the local fallback as
    with mirror=False, so failures still open the circuit instead of being dropped."""
    server = RedisServer()
    server.start()
    try:
        store = RedisStore(server.url, prefix=fresh_prefix(), retry_interval=3600)
        assert store._mirror is not None
        store._mirror._heartbeat = IN_TIME  # a busy machine's answers make it: never lost
        live(store)
        admin = redis.Redis.from_url(server.url)
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", "1")
        for _ in range(3):  # the first failure finds Redis refusing; two more open locally
            ticket = store.admit(facts(store), P, 0).ticket
            assert ticket is not None
            store.record(ticket, FAIL, P, Suspensions(), 0)
        assert store._mirror is not None and store._mirror.live
        assert not store.available
        assert store.admit(facts(store), P, 0).ticket is None
        store.close()
        admin.close()
    finally:
        server.stop()


def test_clients_built_one_after_another_leave_no_listener_behind(
    redis_url: str, a: Upstream
) -> None:
    """Each transport built from a configuration naming Redis makes its own store, which
    nobody closes: once such a client is closed and dropped, its store's listener thread
    ends (and its subscription closes), so clients made one after another add no thread."""
    before = set(threading.enumerate())  # other tests' stores may still listen
    config = {
        "store": {"redis": {"url": redis_url, "prefix": fresh_prefix()}},
        "routes": [{"name": "r", "targets": [{"name": "a", "url": a.url + "/v1"}]}],
    }
    for _ in range(5):
        with httpx.Client(transport=sidestep.FailoverTransport(config)) as client:
            assert client.get(a.url + "/v1/x").text == "a"
    del client

    def listeners() -> int:
        gc.collect()  # again each time: a listener may have held its mirror at the last one
        new = set(threading.enumerate()) - before
        return sum(t.name == "sidestep-redis-mirror" for t in new)

    wait_for(lambda: listeners() == 0)


def test_origins_whose_scopes_expired_do_not_pile_up_in_the_mirror(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scope that expires is not announced: its origin stays in the mirror until the mirror
    outgrows twice its last snapshot, when a new snapshot drops it. Origins that failed once
    and were never asked about again do not accumulate."""
    monkeypatch.setattr(sidestep._state.redis.mirror, "_MIN_BOUND", 8, raising=False)
    prefix = fresh_prefix()
    watcher = live(RedisStore(redis_url, prefix=prefix))
    writer = RedisStore(redis_url, prefix=prefix, ttl=0.2, mirror=False)
    assert watcher._mirror is not None

    def fail_once(origin: str) -> None:
        f = ScopeFacts(origin, headers={}, userinfo="", body=b"{}", fingerprint=writer.fingerprint)
        ticket = writer.admit(f, P, 0).ticket
        assert ticket is not None
        writer.record(ticket, FAIL, P, Suspensions(), 0)

    gone = [f"https://gone{i}.example:443" for i in range(20)]
    for origin in gone:
        fail_once(origin)
    wait_for(lambda: len(writer) == 0)  # every scope expired, none announced
    for i in range(40):
        fail_once(f"https://new{i}.example:443")
    wait_for(lambda: origin_hash("https://new39.example:443") in watcher._mirror._sick)
    assert not {origin_hash(o) for o in gone} & set(watcher._mirror._sick)
    watcher.close()
    writer.close()
