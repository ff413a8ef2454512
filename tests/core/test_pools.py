"""The order a pooled route's requests take: weights, tiers, two choices, latency,
rate-limit headroom and affinity, on the pools alone (seeded random, a fake clock)."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from collections import Counter
from typing import Any

import httpx
import pytest

from sidestep._answers.headroom import announced, has_room
from sidestep._core.affinity import key_of, rendezvous, seed
from sidestep._core.members import DECAY, Member
from sidestep._core.pools import TABLED, Pool
from sidestep._settings.routes import Affinity


def pool(balance: str, *members: tuple[str, int | None, float | None]) -> Pool:
    names, tiers, weights = zip(*members, strict=True)
    return Pool(balance, list(names), list(tiers), list(weights))


def firsts(p: Pool, n: int, seed_: int = 7, now: float = 0.0) -> Counter[str]:
    draw = random.Random(seed_).random
    return Counter(p.members[p.order(draw, now)[0]].name for _ in range(n))


@pytest.mark.parametrize("listed", [("a", "b"), ("b", "a")])
def test_weights_70_30_hold_within_two_percent(listed: tuple[str, str]) -> None:
    """Weights 7 and 3 give 70% and 30% of 5,000 seeded picks, within 2%, in either order."""
    weights = {"a": 7.0, "b": 3.0}
    p = pool("weighted", *((name, None, weights[name]) for name in listed))
    share = firsts(p, 5000)["a"] / 5000
    assert abs(share - 0.7) <= 0.02


def test_a_member_without_a_weight_weighs_the_mean_of_its_pool() -> None:
    """Weights 1 and 3 beside a member with none: it weighs 2, a third of the picks."""
    p = pool("weighted", ("a", None, 1.0), ("b", None, None), ("c", None, 3.0))
    assert p.weights == [1.0, 2.0, 3.0]
    assert abs(firsts(p, 6000)["b"] / 6000 - 1 / 3) <= 0.02


def test_a_large_pool_is_drawn_without_a_table() -> None:
    """A pool past the tabled size still draws every member once, by weight."""
    names = [f"m{i}" for i in range(TABLED + 2)]
    p = pool("weighted", *((n, None, 1.0 + (n == "m0") * 9) for n in names))
    order = p.order(random.Random(1).random, 0.0)
    assert sorted(order) == list(range(len(names)))
    assert firsts(p, 2000)["m0"] / 2000 > 0.4  # 10 of 17 units of weight


@pytest.mark.parametrize("balance", ["weighted", "least_in_flight", "latency"])
def test_tiers_come_in_order_each_pool_spread(balance: str) -> None:
    """Every order holds tier 0's members first, then tier 1's, whatever the strategy."""
    p = pool(balance, ("c", 1, None), ("a", 0, None), ("b", 0, None), ("d", 1, None))
    draw = random.Random(3).random
    seen = set()
    for _ in range(200):
        order = p.order(draw, 0.0)
        assert {p.members[i].name for i in order[:2]} == {"a", "b"}
        assert {p.members[i].name for i in order[2:]} == {"c", "d"}
        seen.add(order)
    assert len(seen) == 4  # both pools spread


def test_least_in_flight_prefers_the_less_loaded() -> None:
    """Of two members, the one with fewer attempts in flight per unit of weight goes first."""
    p = pool("least_in_flight", ("a", None, None), ("b", None, None))
    for token in range(3):
        p.members[0].took_off(token)
    assert firsts(p, 100) == Counter({"b": 100})
    heavy = pool("least_in_flight", ("a", None, 4.0), ("b", None, 1.0))
    for token in range(3):
        heavy.members[0].took_off(token)  # 3 per 4 units of weight against 1 per 1
    heavy.members[1].took_off("x")
    assert firsts(heavy, 100) == Counter({"a": 100})


def test_every_member_is_compared_not_two_drawn() -> None:
    """Of four members, the only one with nothing in flight goes first every time (two
    drawn at random would miss it half the time); the others share the ties."""
    p = pool("least_in_flight", *((n, None, None) for n in "abcd"))
    for name, load in zip("abc", (2, 1, 1), strict=True):
        member = next(m for m in p.members if m.name == name)
        for token in range(load):
            member.took_off((name, token))
    assert firsts(p, 1000) == Counter({"d": 1000})
    p.members[3].took_off("d")  # now b, c and d tie at one each: a is never first
    counts = firsts(p, 3000)
    assert "a" not in counts
    assert min(counts.values()) > 800, counts


def test_latency_compares_every_member_and_its_load() -> None:
    """Under latency balance the member of least latency * (in flight + 1) goes first:
    the fastest while idle, and the next fastest once the fastest holds enough."""
    p = pool("latency", *((n, None, None) for n in "abcd"))
    for m, seconds in zip(p.members, (0.4, 0.1, 0.3, 0.2), strict=True):
        m.sample(seconds, 0.0)
    assert firsts(p, 200) == Counter({"b": 200})
    for token in range(2):  # 0.1 * 3 against d's 0.2 * 1
        p.members[1].took_off(token)
    assert firsts(p, 200) == Counter({"d": 200})


def test_latency_estimates_hold_at_any_clock_reading() -> None:
    """A clock read in the millions of seconds, samples of zero, and one member not
    measured yet leave every estimate finite, and the picks work."""
    p = pool("latency", ("a", None, None), ("b", None, None), ("new", None, None))
    now = 5e6
    p.members[0].sample(0.0, now)
    p.members[1].sample(2.0, now)
    assert 0.0 < p.members[0].cost(now) < 1e-6
    assert p.members[1].cost(now + 3600) == pytest.approx(2.0 * 2.718281828 ** (-360), rel=1e-6)
    counts = firsts(p, 1000, now=now + 1)
    assert "b" not in counts and counts["a"] > 300 and counts["new"] > 300, counts


def test_latency_moves_share_away_from_a_slow_member_and_back() -> None:
    """A member ten times slower loses its share; once it answers fast again, its share returns."""
    p = pool("latency", ("fast", None, None), ("slow", None, None))
    draw = random.Random(11).random
    now = 0.0
    slow_until = 60.0

    def share(seconds: float) -> float:
        nonlocal now
        got = Counter[str]()
        end = now + seconds
        while now < end:
            first = p.members[p.order(draw, now)[0]]
            answer = 1.0 if first.name == "slow" and now < slow_until else 0.1
            first.sample(answer, now)
            got[first.name] += 1
            now += 0.05
        return got["slow"] / sum(got.values())

    assert share(60.0) < 0.05  # slow: tried again only as its estimate decays
    share(5 * DECAY)  # recovered: its estimate comes down to the fast one's
    assert share(60.0) > 0.35


def test_a_member_without_a_sample_costs_as_the_fastest() -> None:
    """An unmeasured member counts as the fastest measured one: tried, not shunned."""
    p = pool("latency", ("a", None, None), ("new", None, None))
    p.members[0].sample(0.5, 0.0)
    counts = firsts(p, 1000)
    assert 350 < counts["new"] < 650


def test_peak_latency_is_taken_at_once_and_decays() -> None:
    """A slower sample is the estimate at once; with no samples it decays by DECAY."""
    m = Member("m", 1.0)
    assert m.cost(0.0) < 0
    m.sample(0.1, 0.0)
    m.sample(2.0, 1.0)
    assert m.cost(1.0) == 2.0
    assert m.cost(1.0 + DECAY) == pytest.approx(2.0 / 2.718281828, rel=1e-3)
    m.sample(0.1, 1.0 + DECAY)
    assert m.cost(1.0 + DECAY) == pytest.approx(2.0 / 2.718281828, rel=1e-3)


OPENAI_LIMITS = {
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-reset-requests": "60s",
}


def test_headroom_refills_continuously() -> None:
    """A spent limit of 60 a minute has room again after a second, not after the minute."""
    buckets = announced(OPENAI_LIMITS, 0.0)
    assert not has_room(buckets, 0.0, 0)
    assert not has_room(buckets, 0.5, 0)
    assert has_room(buckets, 1.01, 0)
    assert not has_room(buckets, 1.01, 1)  # one request sent since spends it
    assert has_room(buckets, 60.0, 59)


def test_anthropic_limits_are_read() -> None:
    """Anthropic's limits, with an RFC 3339 reset, are read as buckets."""
    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "1970-01-01T00:01:40Z",
        "anthropic-ratelimit-tokens-limit": "1000",
        "anthropic-ratelimit-tokens-remaining": "900",
    }
    buckets = announced(headers, 50.0)
    assert [(b.limit, b.remaining, b.reset, b.requests) for b in buckets] == [
        (50.0, 0.0, 50.0, True),
        (1000.0, 900.0, 0.0, False),
    ]


@pytest.mark.parametrize("balance", ["weighted", "least_in_flight", "latency"])
def test_headroom_steers_away_from_a_spent_member_and_back(balance: str) -> None:
    """A member at 0 remaining goes behind the others until its limit refills."""
    p = pool(balance, ("a", None, None), ("b", None, None))
    p.members[0].heard(OPENAI_LIMITS, 0.0, 0.0)
    p.limited = True
    assert firsts(p, 200, now=0.5) == Counter({"b": 200})
    assert firsts(p, 200, now=2.0)["a"] > 50


def test_a_spent_pool_still_orders_every_member() -> None:
    """When no member has room, the order is left as it is: nothing is left out."""
    p = pool("weighted", ("a", None, None), ("b", None, None))
    for m in p.members:
        m.heard(OPENAI_LIMITS, 0.0, 0.0)
    p.limited = True
    assert sorted(p.order(random.Random(1).random, 0.0)) == [0, 1]


def test_an_answer_without_limits_keeps_the_ones_known() -> None:
    """Headers with no rate limits leave a member's last announced ones as they were."""
    m = Member("m", 1.0)
    m.heard(OPENAI_LIMITS, 0.0, 0.0)
    m.heard({"content-type": "application/json"}, 1.0, 1.0)
    assert m.buckets and m.seen_at == 0.0


def keyed(p: Pool, key: str) -> tuple[int, ...]:
    return p.order(random.Random(0).random, 0.0, key)


def test_affinity_keeps_a_key_on_one_member() -> None:
    """The same key always gives the same order, whatever the random numbers."""
    p = pool("least_in_flight", ("a", None, None), ("b", None, None), ("c", None, None))
    orders = {p.order(random.Random(n).random, 0.0, "conversation-1") for n in range(50)}
    assert len(orders) == 1
    firsts_ = Counter(keyed(p, f"k{n}")[0] for n in range(3000))
    assert all(900 < count < 1100 for count in firsts_.values())


def first_healthy(order: tuple[int, ...], down: set[int]) -> int:
    return next(i for i in order if i not in down)


def test_a_lost_member_moves_only_its_own_keys_and_takes_them_back() -> None:
    """When a member is down its keys spread over the others, the rest stay; on its
    return it gets exactly its own keys back."""
    p = pool("weighted", ("a", None, 1.0), ("b", None, 2.0), ("c", None, 1.0))
    keys = [f"user-{n}" for n in range(2000)]
    before = {k: first_healthy(keyed(p, k), set()) for k in keys}
    during = {k: first_healthy(keyed(p, k), {1}) for k in keys}
    moved = {k for k in keys if before[k] != during[k]}
    assert moved == {k for k in keys if before[k] == 1}
    assert {during[k] for k in moved} == {0, 2}
    assert abs(sum(before[k] == 1 for k in keys) / 2000 - 0.5) < 0.04  # weight 2 of 4
    after = {k: first_healthy(keyed(p, k), set()) for k in keys}
    assert after == before


def test_rendezvous_is_the_same_in_every_process() -> None:
    """Affinity ranks come from fixed hashes, not Python's per-process ones: another
    interpreter, with another hash seed, ranks the same keys the same way."""
    script = (
        "from sidestep._core.affinity import rendezvous, seed;"
        "print([rendezvous(seed(f'k{n}'), (0, 1, 2), [seed('a'), seed('b'), seed('c')],"
        " [1.0, 2.0, 1.0]) for n in range(50)])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": os.pathsep.join(sys.path)}
    there = subprocess.run(  # noqa: S603 - this interpreter, a fixed script
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    seeds = [seed("a"), seed("b"), seed("c")]
    here = [rendezvous(seed(f"k{n}"), (0, 1, 2), seeds, [1.0, 2.0, 1.0]) for n in range(50)]
    assert there == str(here)


def chat(system: str, *turns: str, **extra: Any) -> bytes:
    messages = [{"role": "user", "content": t} for t in turns]
    return json.dumps({"model": "m", "system": system, "messages": messages, **extra}).encode()


def test_affinity_keys_come_from_a_header_a_field_or_the_prompt() -> None:
    """A header's value, a JSON field, or the prompt's prefix is the key; none means no key."""
    headers = httpx.Headers({"x-session-id": "s1"})
    assert key_of(Affinity(header="x-session-id"), headers, None) == "s1"
    assert key_of(Affinity(header="x-other"), headers, None) is None
    by_user = Affinity(json="user")
    assert key_of(by_user, headers, b'{"user": "u7"}') == "u7"
    assert key_of(by_user, headers, b'{"user": 42}') == "42"
    assert key_of(by_user, headers, b'{"user": true}') is None
    assert key_of(by_user, headers, b'{"model": "m"}') is None
    assert key_of(by_user, headers, b"not json") is None
    prefix = Affinity(prefix=40)
    one = key_of(prefix, headers, chat("You are terse.", "hello", "and more"))
    same = key_of(prefix, headers, chat("You are terse.", "hello", "and more", temperature=1))
    other = key_of(prefix, headers, chat("You are verbose.", "hello"))
    assert one is not None and one == same and one != other
    assert key_of(prefix, headers, b'{"input": "a long input text"}') is not None
    assert key_of(prefix, headers, b'{"model": "m"}') is None


def test_a_weighted_pool_shares_a_refused_members_turn_by_weight() -> None:
    """Under weighted balance a member refused a moment ago goes behind, and the others
    share its turns by their weights, not the one listed after it."""
    p = pool("weighted", ("a", None, 1.0), ("b", None, 1.0), ("c", None, 2.0))
    p.members[0].refused(retry_at=100.0, now=0.0)
    p.refused = True
    counts = firsts(p, 6000, now=1.0)
    assert "a" not in counts
    assert abs(counts["b"] / 6000 - 1 / 3) <= 0.03, counts
    assert abs(counts["c"] / 6000 - 2 / 3) <= 0.03, counts


def test_a_refusal_naming_no_later_instant_still_puts_a_member_behind() -> None:
    """A half-open scope whose probe another request holds is refused with a retry at
    "now": the member still goes behind for a second (not for no time at all), and never
    for longer than five."""
    m = Member("m", 1.0)
    m.refused(retry_at=50.0, now=50.0)
    assert m.refused_until == 51.0
    m.refused(retry_at=600.0, now=50.0)
    assert m.refused_until == 55.0


def test_an_idle_member_of_a_weight_rounded_to_nothing_is_still_least_in_flight() -> None:
    """Weights 1e308 and 1e-308 (both accepted) make the second's share round to zero:
    with nothing in flight it still costs least beside a member holding 100."""
    p = pool("least_in_flight", ("a", None, 1e308), ("b", None, 1e-308))
    for token in range(100):
        p.members[0].took_off(token)
    assert firsts(p, 50) == Counter({"b": 50})


def test_members_measured_on_another_clock_are_not_shared() -> None:
    """Transports on different clocks get members of their own (latency and refusals are
    instants on a clock); on the same clock they share them. An estimate read on a clock
    that ran backwards stays finite."""
    from sidestep._core.routes import Router
    from sidestep._settings.config import as_config

    config = as_config(
        {
            "routes": [
                {
                    "name": "chat",
                    "balance": "latency",
                    "targets": [
                        {"name": "a", "url": "http://a.example/v1"},
                        {"name": "b", "url": "http://b.example/v1"},
                    ],
                }
            ]
        }
    )

    def fake() -> float:
        return 1000.0

    def pool_of(clock: Any) -> Pool:
        found = Router(config, clock).routes["chat"].pool
        assert found is not None
        return found

    default, again, other = pool_of(None), pool_of(None), pool_of(fake)
    assert default.members[0] is again.members[0]
    assert other.members[0] is not default.members[0]
    other.members[0].sample(0.5, 1e9)
    assert 0.0 < other.members[0].cost(0.0) < math.inf
