"""Which fault a plan picks for an attempt: pure decisions, time and draws handed in."""

from __future__ import annotations

from typing import Any

import httpx

from sidestep._core.faults import Injector, injected, made_answer, mark
from sidestep._settings.faults import FaultRule

# Where attempts go, as the loop names them (route, target); None: an unrouted request.
PRIMARY = ("chat", "primary")
BACKUP = ("chat", "backup")
EMBED = ("embed", "primary")
UNROUTED = None


def rule(**settings: Any) -> FaultRule:
    return FaultRule.model_validate({"fault": "status", "status": 503, **settings})


def never() -> float:
    raise AssertionError("no draw is taken for a rule without a rate")


def picks(
    injector: Injector, where: tuple[str, str] | None, n: int, now: float = 0.0
) -> list[str | None]:
    found = [injector.pick(where, now, never) for _ in range(n)]
    return [None if f is None else f.rule.label for f in found]


def test_a_rule_selects_its_target_and_route_only() -> None:
    """A rule for `primary` fires on the primary's attempts, not the backup's; one narrowed to route `embed` fires on that route's primary only; an unrouted request never gets a fault."""
    injector = Injector()
    injector.add(rule(target="primary", route="embed", status=500), 0.0)
    injector.add(rule(target="primary"), 0.0)
    assert picks(injector, PRIMARY, 1) == ["status_503"]
    assert picks(injector, EMBED, 1) == ["status_500"]
    assert picks(injector, BACKUP, 1) == [None]
    assert picks(injector, UNROUTED, 1) == [None]


def test_times_counts_the_faults_a_rule_injects() -> None:
    """`times: 2` injects into the first two attempts it selects and none after; the attempts it does not select do not use it up."""
    injector = Injector()
    injector.add(rule(target="primary", times=2), 0.0)
    assert picks(injector, BACKUP, 3) == [None, None, None]
    assert picks(injector, PRIMARY, 3) == ["status_503", "status_503", None]


def test_a_duration_counts_from_when_the_rule_was_added() -> None:
    """`for: 30s` injects until 30 seconds after the rule was added, on the clock handed in, and not from then on."""
    injector = Injector()
    injector.add(rule(duration=30), 100.0)
    assert picks(injector, PRIMARY, 1, now=129.9) == ["status_503"]
    assert picks(injector, PRIMARY, 1, now=130.0) == [None]


def test_a_rate_draws_once_per_selected_attempt() -> None:
    """`rate: 0.5` fires when the draw handed in falls under 0.5: a draw each time the rule is asked, the first rule that fires winning over the rules after it."""
    draws = iter([0.1, 0.7, 0.49, 0.5])
    injector = Injector()
    injector.add(rule(target="primary", rate=0.5), 0.0)
    injector.add(FaultRule.model_validate({"fault": "timeout", "target": "primary"}), 0.0)
    found = [injector.pick(PRIMARY, 0.0, lambda: next(draws)) for _ in range(4)]
    assert [f.rule.label if f else None for f in found] == [
        "status_503",
        "timeout",
        "status_503",
        "timeout",
    ]


def test_every_injection_is_an_event_and_is_kept_when_asked(
    events: list[tuple[str, dict[str, Any]]],
) -> None:
    """Each fault picked is told as `fault.injected` with its route, target and fault, and no URL; an injector made to keep its history lists it."""
    injector = Injector(keep=True)
    injector.add(rule(target="backup", status=429), 0.0)
    injector.pick(PRIMARY, 0.0, never)
    injector.pick(BACKUP, 0.0, never)
    assert [e for e in events if e[0] == "fault.injected"] == [
        ("fault.injected", {"route": "chat", "target": "backup", "fault": "status_429"})
    ]
    assert injector.history is not None
    assert [(i.route, i.target, i.fault) for i in injector.history] == [
        ("chat", "backup", "status")
    ]


def test_made_up_answers() -> None:
    """A status fault answers its status with JSON and, when asked, Retry-After in seconds and milliseconds; a malformed body is JSON cut short; an error event is an SSE error every dialect reads."""
    injector = Injector()
    injector.add(rule(status=429, retry_after=1.5), 0.0)
    picked = injector.pick(PRIMARY, 0.0, never)
    assert picked is not None
    status, headers, body = made_answer(picked)
    assert status == 429
    assert ("retry-after", "2") in headers and ("retry-after-ms", "1500") in headers
    assert b"rate_limit_error" in body
    for fault, check in (
        ("malformed_body", lambda b: b.startswith(b'{"id"') and not b.endswith(b"}")),
        ("error_event", lambda b: b.startswith(b"event: error\ndata: {") and b"overloaded" in b),
    ):
        other = Injector()
        other.add(FaultRule.model_validate({"fault": fault}), 0.0)
        found = other.pick(PRIMARY, 0.0, never)
        assert found is not None
        status, _, body = made_answer(found)
        assert status == 200 and check(body), fault


def test_marks_tell_injected_results_from_others() -> None:
    """A marked response or exception gives back its injection; an unmarked one gives None."""
    injector = Injector()
    injector.add(rule(), 0.0)
    picked = injector.pick(PRIMARY, 0.0, never)
    assert picked is not None
    response = httpx.Response(503)
    error = httpx.ConnectError("refused")
    assert injected(response) is None and injected(error) is None
    assert injected(mark(response, picked)) is picked
    assert injected(mark(error, picked)) is picked
