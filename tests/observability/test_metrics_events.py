"""The per-request events metrics and traces are built from: their order, their cost, their ends."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest
import structlog

import sidestep
from drivers import MakeDriver, route
from sidestep._core.effects import Send
from sidestep._core.loop import Core
from sidestep._core.run import Run
from sidestep.logging import add_observer, listening, remove_observer
from upstream import IN_TIME, Hang, Respond, Upstream

Seen = list[tuple[str, dict[str, Any]]]


@pytest.fixture
def seen(default_structlog: None) -> Iterator[Seen]:
    """Every event sidestep emits during the test, with its fields."""
    events: Seen = []

    def observer(event: str, fields: Mapping[str, Any]) -> None:
        events.append((event, dict(fields)))

    add_observer(observer)
    yield events
    remove_observer(observer)


def test_listening_follows_observers_and_the_logger_level(default_structlog: None) -> None:
    """Nobody listens with no observer and the logger above DEBUG; an observer or a DEBUG logger is someone."""
    logger = logging.getLogger("sidestep")
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        assert not listening()

        def observer(event: str, fields: Mapping[str, Any]) -> None:
            pass

        add_observer(observer)
        assert listening()
        remove_observer(observer)
        assert not listening()
        logger.setLevel(logging.DEBUG)
        assert listening()
        assert not listening(logging.DEBUG - 1)
    finally:
        logger.setLevel(level)


def test_listening_follows_every_change_after_an_answer_was_cached(
    default_structlog: None,
) -> None:
    """Once "nobody" has been answered (and cached), a DEBUG root logger, `logging.disable`,
    a disabled `sidestep` logger and structlog configured later each change the answer."""
    logger, root = logging.getLogger("sidestep"), logging.getLogger()
    saved = (logger.level, root.level, logger.disabled, logging.root.manager.disable)
    logger.setLevel(logging.NOTSET)
    root.setLevel(logging.WARNING)
    try:
        assert not listening()
        assert not listening()  # answered from the cache this time
        root.setLevel(logging.DEBUG)  # inherited by the sidestep logger
        assert listening()
        logging.disable(logging.DEBUG)
        assert not listening()
        logging.disable(logging.NOTSET)
        assert listening()
        logger.disabled = True
        assert not listening()
        logger.disabled = False
        root.setLevel(logging.WARNING)
        assert not listening()
        structlog.configure(processors=[])
        assert listening()
    finally:
        logger.setLevel(saved[0])
        root.setLevel(saved[1])
        logger.disabled = saved[2]
        logging.disable(saved[3])


def test_a_failover_reports_each_attempt_between_the_request_events(
    make: MakeDriver, a: Upstream, b: Upstream, seen: Seen
) -> None:
    """A 503 from A then B's answer: request.started, A's attempt (unavailable, status 503), the failover, B's attempt (success), request.finished (served_after_failover, 2 attempts)."""
    a.behaviour = lambda s: Respond(503, "down")
    d = make(route(("a", a.url + "/v1"), ("b", b.url + "/v1")))
    assert d.get(a.url + "/v1/x").text == "b"
    names = [e for e, _ in seen if e.startswith(("request.", "attempt.")) or e == "failover"]
    assert names == [
        "request.started",
        "attempt.started",
        "attempt.finished",
        "failover",
        "attempt.started",
        "attempt.finished",
        "request.finished",
    ]
    finished = [f for e, f in seen if e == "attempt.finished"]
    assert [(f["target"], f["attempt"], f["result"], f["status"]) for f in finished] == [
        ("a", 1, "unavailable", 503),
        ("b", 2, "success", 200),
    ]
    assert all(
        f["duration_s"] >= 0 and f["origin"].startswith("http://127.0.0.1:") for f in finished
    )
    [ended] = [f for e, f in seen if e == "request.finished"]
    assert (ended["outcome"], ended["attempts"], ended["route"]) == (
        "served_after_failover",
        2,
        "chat",
    )


def test_nobody_listening_builds_no_request_events(
    make: MakeDriver, a: Upstream, default_structlog: None
) -> None:
    """With no observer and no DEBUG logger, a request never reaches emit for its request or attempt events."""
    import sidestep.logging as sl

    logger = logging.getLogger("sidestep")
    level = logger.level
    logger.setLevel(logging.WARNING)
    calls: list[str] = []
    real = sl.emit

    def counting(event: str, *args: Any, **fields: Any) -> None:
        calls.append(event)
        real(event, *args, **fields)

    d = make(route(("a", a.url + "/v1")))
    try:
        import sidestep._core.watch as watch

        watch.emit = counting  # type: ignore[assignment]
        assert d.get(a.url + "/v1/x").text == "a"
    finally:
        watch.emit = real  # type: ignore[assignment]
        logger.setLevel(level)
    assert calls == []


def test_a_closed_generator_still_finishes_its_attempt_and_request(seen: Seen) -> None:
    """A request abandoned while its attempt is in flight (the generator closed: GeneratorExit) ends with attempt.finished and request.finished, both `cancelled`."""
    core = Core(
        route(("a", "https://a.example/v1")),
        store=None,
        clock=None,
        flavour=sidestep.FailoverTransport._flavour,
        exact_deadlines=False,
    )
    request = httpx.Request("GET", "https://a.example/v1/x")
    run = core.decide(request)  # someone listens: the decision stops before admitting
    assert isinstance(run, Run)
    steps = core.handle(request, run)
    assert type(next(steps)) is Send
    steps.close()
    ends = [(e, f.get("result") or f.get("outcome")) for e, f in seen if e.endswith(".finished")]
    assert ends == [("attempt.finished", "cancelled"), ("request.finished", "cancelled")]


@pytest.mark.parametrize(
    ("action", "extra", "result"),
    [
        (Respond(503, "down"), {}, "unavailable"),
        (Respond(429, "slow down"), {}, "rate_limited"),
        (Respond(404, "no such thing"), {}, "neutral"),
        (
            Respond(200, "{not json", {"content-type": "application/json"}),
            {"route": {"commit": "complete"}},
            "invalid_body",
        ),
        (Hang(), {"failover": {"response_timeout": IN_TIME}}, "timeout"),  # B's answer meets it
    ],
)
def test_each_attempt_result_is_named(
    make: MakeDriver,
    a: Upstream,
    b: Upstream,
    seen: Seen,
    action: Any,
    extra: dict[str, Any],
    result: str,
) -> None:
    """An attempt's `result` names what happened to it: an outage, a rate limit, a client error, a malformed body, a timeout."""
    a.behaviour = lambda s: action
    d = make(route(("a", a.url + "/v1"), ("b", b.url + "/v1"), **extra))
    d.get(a.url + "/v1/x")
    first = next(f for e, f in seen if e == "attempt.finished")
    assert (first["target"], first["result"]) == ("a", result)
