"""Hedge settings: a route's `hedge:` (delay, adaptive percentile, budget) and its refusals."""

from __future__ import annotations

import traceback
import warnings
from pathlib import Path
from typing import Any

import pytest

import sidestep
from sidestep._common.errors import ConfigError
from sidestep._settings.config import as_config
from sidestep._settings.routes import Hedge, Route
from sidestep._settings.values import SidestepConfigWarning


def targets(count: int = 2) -> list[dict[str, Any]]:
    return [{"name": f"t{n}", "url": f"https://t{n}.example/v1"} for n in range(count)]


def route(hedge: Any, count: int = 2, **fields: Any) -> Route:
    config = as_config(
        {"routes": [{"name": "chat", "targets": targets(count), "hedge": hedge, **fields}]}
    )
    return config.routes[0]


def refused(hedge: Any, count: int = 2, **fields: Any) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)
        with pytest.raises(ConfigError) as caught:
            route(hedge, count, **fields)
    exc = caught.value
    return str(exc) + repr(exc) + "".join(traceback.format_exception(exc))


def test_a_route_is_not_hedged_by_default() -> None:
    """A route that sets no `hedge:` has none, and loads with no warning."""
    config = as_config({"routes": [{"name": "chat", "targets": targets()}]})
    assert config.routes[0].hedge is None


@pytest.mark.parametrize(
    ("given", "delay", "adaptive"),
    [
        ({"delay": "750ms"}, 0.75, None),
        ({"delay": 2}, 2.0, None),
        ({"adaptive": 0.95}, None, 0.95),
        ({"delay": "1s", "adaptive": 0.9}, 1.0, 0.9),
    ],
)
def test_a_fixed_or_adaptive_delay_is_read(
    given: dict[str, Any], delay: float | None, adaptive: float | None
) -> None:
    """`delay` is a duration, `adaptive` a percentile; the budget defaults to 5%."""
    hedge = route(given).hedge
    assert hedge == Hedge(delay=delay, adaptive=adaptive, budget=0.05)


def test_the_budget_is_read() -> None:
    """`budget` is the fraction of the route's requests that may be hedged."""
    hedge = route({"delay": 1, "budget": 0.02}).hedge
    assert hedge is not None
    assert hedge.budget == 0.02
    assert hedge.burst == 10  # the bucket's size by default


def test_the_burst_is_read() -> None:
    """`burst` is how many hedges the route's bucket holds and starts with."""
    hedge = route({"delay": 1, "burst": 2}).hedge
    assert hedge is not None
    assert hedge.burst == 2


def test_a_hedge_needs_a_delay_or_a_percentile() -> None:
    """A `hedge:` with neither `delay` nor `adaptive` is refused, naming both keys."""
    message = refused({"budget": 0.05})
    assert "routes[0].hedge" in message
    assert "delay" in message
    assert "adaptive" in message


@pytest.mark.parametrize(
    ("hedge", "key"),
    [
        ({"delay": 0}, "delay"),
        ({"delay": "-1s"}, "delay"),
        ({"delay": True}, "delay"),
        ({"adaptive": 0}, "adaptive"),
        ({"adaptive": 1}, "adaptive"),
        ({"adaptive": 95}, "adaptive"),
        ({"adaptive": True}, "adaptive"),
        ({"delay": 1, "budget": 0}, "budget"),
        ({"delay": 1, "budget": 1.5}, "budget"),
        ({"delay": 1, "budget": True}, "budget"),
        ({"delay": 1, "burst": 0}, "burst"),
        ({"delay": 1, "burst": 1.5}, "burst"),
        ({"delay": 1, "burst": "10"}, "burst"),
        ({"delay": 1, "burst": True}, "burst"),
        ({"delay": 1, "burst": 10**6}, "burst"),
        ({"delay": 1, "fraction": 0.1}, "fraction"),
    ],
)
def test_invalid_values_are_refused_by_key(hedge: dict[str, Any], key: str) -> None:
    """A delay that is not above 0, a percentile not strictly between 0 and 1, a budget not in
    (0, 1], a burst not a whole number from 1 to 1000, a boolean where a number goes and an
    unknown key are refused, naming the key."""
    assert f"routes[0].hedge.{key}" in refused(hedge)


def test_a_route_of_one_target_cannot_hedge() -> None:
    """A hedge needs another target to go to: a route of one target with `hedge:` is refused."""
    assert "second target" in refused({"delay": 1}, count=1)


def test_a_delay_past_the_first_byte_limit_warns() -> None:
    """A hedge delay not shorter than the route's first_byte_timeout would never start: warned."""
    with pytest.warns(SidestepConfigWarning) as record:
        route({"delay": "10s"}, failover={"first_byte_timeout": "5s"})
    messages = [str(w.message) for w in record]
    assert any("not shorter than first_byte_timeout" in m and "'chat'" in m for m in messages)


@pytest.mark.parametrize(
    ("hedge", "match"),
    [({"adaptive": 0.3}, "adaptive is under 0.5"), ({"delay": 1, "budget": 0.5}, "above 0.25")],
)
def test_surprising_values_warn(hedge: dict[str, Any], match: str) -> None:
    """A percentile under the median, or a budget above a quarter of requests, is warned about."""
    with pytest.warns(SidestepConfigWarning) as record:
        route(hedge)
    assert any(match in str(w.message) for w in record)


def test_a_hedged_route_loads_from_a_file_without_warning(tmp_path: Path) -> None:
    """A route with an ordinary `hedge:` loads from YAML, its delay as a duration, no warning."""
    path = tmp_path / "sidestep.yaml"
    path.write_text(
        "routes:\n"
        "  - name: chat\n"
        "    hedge: {delay: 1s, budget: 0.05}\n"
        "    targets:\n"
        "      - {name: a, url: https://a.example/v1}\n"
        "      - {name: b, url: https://b.example/v1}\n"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", SidestepConfigWarning)
        config = sidestep.load_config(path)
    assert config.routes[0].hedge == Hedge(delay=1.0, budget=0.05)
