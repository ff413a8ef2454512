"""Pool settings: tiers, weights, balance and affinity on a route and its targets."""

from __future__ import annotations

import traceback
from typing import Any

import pytest

from sidestep._common.errors import ConfigError
from sidestep._settings.config import as_config
from sidestep._settings.routes import DEFAULT_BALANCE, Route

SECRET = "sk-live-0123456789"


def route(*targets: dict[str, Any], **fields: Any) -> Route:
    config = as_config({"routes": [{"name": "chat", "targets": list(targets), **fields}]})
    return config.routes[0]


def target(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "url": f"https://{name}.example/v1", **fields}


def refused(*targets: dict[str, Any], **fields: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        route(*targets, **fields)
    exc = caught.value
    return str(exc) + repr(exc) + "".join(traceback.format_exception(exc))


def test_a_route_with_no_pool_setting_is_ranked() -> None:
    """A route whose targets have no tier or weight, with no balance or affinity, is not pooled."""
    plain = route(target("a"), target("b"))
    assert not plain.pooled
    assert plain.balance is None and plain.affinity is None
    assert [t.tier for t in plain.targets] == [None, None]


@pytest.mark.parametrize(
    ("targets", "fields"),
    [
        ((target("a", tier=0), target("b", tier=1)), {}),
        ((target("a", weight=2), target("b")), {}),
        ((target("a"), target("b")), {"balance": "weighted"}),
        ((target("a"), target("b")), {"affinity": {"header": "x-session-id"}}),
    ],
)
def test_any_pool_setting_makes_a_route_pooled(
    targets: tuple[dict[str, Any], ...], fields: dict[str, Any]
) -> None:
    """A tier, a weight, a balance or an affinity each makes the route pooled."""
    assert route(*targets, **fields).pooled


def test_priority_is_another_name_for_tier() -> None:
    """`priority` on a target sets its tier, as `tier` does."""
    pooled = route(target("a", priority=0), target("b", tier=1))
    assert [t.tier for t in pooled.targets] == [0, 1]


def test_tier_and_priority_together_are_refused() -> None:
    """A target giving both names of its tier is refused, not read one way silently."""
    assert "priority" in refused(target("a", tier=0, priority=1))


def test_every_target_needs_a_tier_once_one_has() -> None:
    """A route where some targets have a tier names those without one."""
    shown = refused(target("a", tier=0), target("b"), target("c"))
    assert "'b', 'c'" in shown and "tier" in shown


@pytest.mark.parametrize("weight", [0, -1, True, float("inf"), "heavy"])
def test_a_weight_is_a_positive_number(weight: object) -> None:
    """A weight of zero, a negative one, a boolean, infinity or text is refused."""
    assert "weight" in refused(target("a", weight=weight))


@pytest.mark.parametrize("tier", [-1, True, 1.5])
def test_a_tier_is_a_whole_number_from_zero(tier: object) -> None:
    """A negative, boolean or fractional tier is refused."""
    assert "tier" in refused(target("a", tier=tier))


def test_balance_names_a_known_strategy() -> None:
    """An unknown balance is refused; the default applies only where the route names none."""
    assert "balance" in refused(target("a"), balance="round_robin")
    assert route(target("a"), balance="least_in_flight").balance == "least_in_flight"
    assert DEFAULT_BALANCE in ("weighted", "least_in_flight", "latency")


@pytest.mark.parametrize(
    ("affinity", "field", "value"),
    [
        ({"header": "X-Session-Id"}, "header", "x-session-id"),
        ({"json": "user"}, "json_field", "user"),
        ({"prefix": 2048}, "prefix", 2048),
    ],
)
def test_affinity_takes_one_key(affinity: dict[str, Any], field: str, value: object) -> None:
    """An affinity names a header (lower-cased), a JSON field or a prompt prefix."""
    pooled = route(target("a"), target("b"), affinity=affinity)
    assert getattr(pooled.affinity, field) == value


@pytest.mark.parametrize(
    "affinity",
    [{}, {"header": "x-a", "json": "user"}, {"prefix": 0}, {"json": 'a"b'}, {"colour": "x"}],
)
def test_affinity_refuses_anything_but_one_valid_key(affinity: dict[str, Any]) -> None:
    """No key, two keys, an empty prefix, a malformed field or an unknown key is refused."""
    assert "affinity" in refused(target("a"), affinity=affinity)


def test_a_malformed_affinity_header_is_never_quoted() -> None:
    """A pasted credential line as the affinity header is refused without being shown."""
    shown = refused(target("a"), affinity={"header": f"Authorization: Bearer {SECRET}"})
    assert "affinity" in shown
    assert SECRET not in shown


def test_pool_fields_appear_in_a_targets_repr_without_its_secrets() -> None:
    """A target's repr shows its tier and weight, never its headers' values."""
    pooled = route(target("a", tier=0, weight=2, headers={"authorization": f"Bearer {SECRET}"}))
    shown = repr(pooled.targets[0])
    assert "tier=0" in shown and "weight=2.0" in shown
    assert SECRET not in shown
