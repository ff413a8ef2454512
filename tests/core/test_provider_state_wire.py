"""Requests naming state kept by one provider, through the four transports on real sockets:
they stay with their own target, retried there or answered as it answered."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import sidestep
from drivers import MakeDriver, route
from sidestep._core.provider_state import StateRules
from sidestep.logging import add_observer, remove_observer
from upstream import Action, Reset, Respond, Seen, Upstream

UNAVAILABLE = b'{"error": {"type": "server_error", "message": "try again"}}'


def unavailable(_: Seen) -> Action:
    """A transient 503 whose headers and body the caller must get as they are."""
    return Respond(
        503, UNAVAILABLE, {"content-type": "application/json", "x-request-id": "req_a_1"}
    )


def then_ok(*first: Callable[[Seen], Action]) -> Callable[[Seen], Action]:
    """Each of `first` once, then 200 "a" for good."""
    answers = itertools.chain(first, itertools.repeat(lambda _: Respond(body="a")))
    return lambda seen: next(answers)(seen)


def azure(a: Upstream, b: Upstream, **extra: Any) -> dict[str, Any]:
    """Route "chat": `a` (the caller's URL), then `b` on its own origin with its own key."""
    targets = extra.pop("targets", {})
    return route(
        ("a", a.url + "/v1"),
        ("b", b.url + "/v1"),
        targets={"b": {"headers": {"api-key": "b-key"}}, **targets},
        **extra,
    )


@pytest.fixture(autouse=True)
def scripted(a: Upstream) -> None:
    a.behaviour = unavailable


@pytest.fixture
def events() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every sidestep event of the test, with its fields."""
    seen: list[tuple[str, dict[str, Any]]] = []

    def observer(event: str, fields: Any) -> None:
        seen.append((event, dict(fields)))

    add_observer(observer)
    yield seen
    remove_observer(observer)


def assert_answered_as_a_did(r: Any, *, excluded: list[str] | None = None) -> None:
    assert (r.status, r.body, r.headers["x-request-id"]) == (503, UNAVAILABLE, "req_a_1")
    about = {"route": "chat", "target": "a", "attempts": 1, "failover": False}
    assert r.extensions["sidestep"] == {**about, "excluded": excluded or ["b"]}


def test_a_stored_response_is_never_fetched_from_another_provider(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """GET /responses/{id} answered 503 by its own target comes back as that 503, status, headers and body intact; the other provider is never asked."""
    d = make(azure(a, b))
    r = d.get(a.url + "/v1/responses/resp_1")
    assert_answered_as_a_did(r)
    assert (a.calls, b.calls) == (1, 0)


def test_a_stored_response_is_retried_in_place_as_the_policy_allows(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """With two attempts per target, the request naming a stored response is sent to its own target again and served by it."""
    a.behaviour = then_ok(unavailable)
    d = make(azure(a, b, failover={"max_attempts_per_target": 2, "max_retry_wait": 0}))
    r = d.get(a.url + "/v1/responses/resp_1/input_items")
    assert (r.status, r.text) == (200, "a")
    about = {"route": "chat", "target": "a", "attempts": 2, "failover": False}
    assert r.extensions["sidestep"] == about  # nothing was left out: it never had to move
    assert (a.calls, b.calls) == (2, 0)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/responses", {"model": "m", "input": "hi", "previous_response_id": "resp_1"}),
        ("/v1/responses", {"model": "m", "input": "hi", "conversation": {"id": "conv_1"}}),
        (
            "/v1/chat/completions",
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": [{"type": "file", "file": {"file_id": "file-1"}}]}
                ],
            },
        ),
        (
            "/v1/messages",
            {
                "model": "m",
                "max_tokens": 8,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "document", "source": {"type": "file", "file_id": "file_1"}}
                        ],
                    }
                ],
            },
        ),
        ("/v1/messages/batches", {"requests": []}),
        ("/v1/files", {"purpose": "batch"}),
    ],
    ids=["previous_response_id", "conversation", "chat-file", "anthropic-file", "batches", "files"],
)
def test_a_post_naming_stored_state_stays_with_its_provider(
    make: MakeDriver, a: Upstream, b: Upstream, path: str, body: dict[str, Any]
) -> None:
    """A POST continuing a stored response or conversation, citing an uploaded file, or to a collection of provider objects is answered by its own target only."""
    d = make(azure(a, b, failover={"retry_ambiguous": True}))
    assert_answered_as_a_did(d.post(a.url + path, json=body))
    assert (a.calls, b.calls) == (1, 0)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/responses", {"model": "m", "input": "hi", "store": True}),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": []}),
        ("/v1/embeddings", {"model": "m", "input": "hi"}),
    ],
    ids=["responses", "chat", "messages", "embeddings"],
)
def test_a_request_naming_no_stored_state_still_fails_over(
    make: MakeDriver, a: Upstream, b: Upstream, path: str, body: dict[str, Any]
) -> None:
    """A new response (stored or not), a chat completion, a message or an embedding moves to the other provider as before."""
    d = make(azure(a, b))
    r = d.post(a.url + path, json=body)
    assert (r.status, r.text) == (200, "b")
    assert r.extensions["sidestep"] == {
        "route": "chat",
        "target": "b",
        "attempts": 2,
        "failover": True,
    }
    assert b.seen[0].headers["api-key"] == "b-key"


def test_a_second_key_on_the_same_origin_is_another_provider_account(
    make: MakeDriver, a: Upstream
) -> None:
    """A file is not looked for with another key on the same origin: the 503 of the caller's own key comes back."""
    config = route(
        ("a", a.url + "/v1"),
        ("b", a.url + "/v1"),
        targets={"b": {"headers": {"authorization": "Bearer second-key"}}},
    )
    d = make(config)
    r = d.get(a.url + "/v1/files/file-1", headers={"authorization": "Bearer first-key"})
    assert_answered_as_a_did(r)
    assert [s.headers["authorization"] for s in a.seen] == ["Bearer first-key"]


def test_a_target_on_the_same_account_still_takes_a_held_request(
    make: MakeDriver, a: Upstream
) -> None:
    """A candidate that differs only in its JSON fields (another model on the same key) is the same account: the held request moves to it."""
    a.behaviour = then_ok(unavailable)
    config = route(
        ("a", a.url + "/v1"),
        ("bigger", a.url + "/v1"),
        targets={"bigger": {"json": {"model": "bigger"}}},
    )
    d = make(config)
    r = d.post(a.url + "/v1/responses", json={"model": "m", "previous_response_id": "resp_1"})
    assert (r.status, r.text, r.extensions["sidestep"]["target"]) == (200, "a", "bigger")
    assert [s.json()["model"] for s in a.seen] == ["m", "bigger"]


def test_a_held_request_whose_own_target_is_open_ends_all_suspended(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Its own target's circuit still rules: open, it is skipped, the other provider is left out, and the request ends with AllCandidatesSuspended."""
    d = make(azure(a, b, breaker={"failure_threshold": 1}))
    assert_answered_as_a_did(d.get(a.url + "/v1/batches/batch_1"))  # opens a
    with pytest.raises(sidestep.AllCandidatesSuspended) as caught:
        d.get(a.url + "/v1/batches/batch_1")
    assert [c.target for c in caught.value.candidates] == ["a"]
    assert (a.calls, b.calls) == (1, 0)
    assert d.get(a.url + "/v1/models").text == "b"  # stateless: the other provider serves it


def test_a_held_request_all_suspended_answers_the_synthetic_503_naming_whom_it_left_out(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """With on_all_suspended: respond, the synthetic 503's attribution names the provider left out."""
    config = azure(a, b, breaker={"failure_threshold": 1}, failover={"on_all_suspended": "respond"})
    d = make(config)
    d.get(a.url + "/v1/files")  # opens a
    r = d.get(a.url + "/v1/files")
    assert (r.status, r.headers["x-sidestep"]) == (503, "all_candidates_suspended")
    assert r.extensions["sidestep"] == {
        "route": "chat",
        "target": None,
        "attempts": 0,
        "failover": False,
        "excluded": ["b"],
    }
    assert b.calls == 0


def test_a_connection_failure_of_its_own_target_is_raised_as_it_came(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A reset on the held request's own target reaches the caller as the transport error, not as the other provider's 404."""
    a.behaviour = lambda _: Reset()
    d = make(azure(a, b))
    with pytest.raises(d.http.TransportError) as caught:
        d.get(a.url + "/v1/responses/resp_1")
    assert not isinstance(caught.value, sidestep.AllCandidatesSuspended)
    assert b.calls == 0


def test_provider_state_none_lets_every_request_move(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """With provider_state: none, a stored response is fetched from the other provider as before."""
    d = make(azure(a, b, route={"provider_state": "none"}))
    r = d.get(a.url + "/v1/responses/resp_1")
    assert (r.text, r.extensions["sidestep"]["target"]) == ("b", "b")


def test_a_routes_own_paths_and_fields_hold_its_requests(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A route's own path patterns and top-level fields hold its requests; with the built-ins off, a file moves."""
    state = {"builtin": False, "paths": ["/jobs/*"], "fields": ["job_ref"]}
    d = make(azure(a, b, route={"provider_state": state}, failover={"retry_ambiguous": True}))
    assert d.get(a.url + "/v1/jobs/j_1/log").status == 503
    assert d.post(a.url + "/v1/run", json={"job_ref": "j_1"}).status == 503
    assert b.calls == 0
    assert d.get(a.url + "/v1/jobs").text == "b"
    assert d.get(a.url + "/v1/files/file-1").text == "b"
    assert d.post(a.url + "/v1/run", json={"job_ref": None}).text == "b"


def test_leaving_a_provider_out_is_told_by_an_event_naming_no_path_or_id(
    make: MakeDriver, a: Upstream, b: Upstream, events: list[tuple[str, dict[str, Any]]]
) -> None:
    """A DEBUG candidate.excluded names the route, both targets, the reason and whether the path or the body held it; never the path or an id."""
    d = make(azure(a, b, failover={"retry_ambiguous": True}))
    d.get(a.url + "/v1/responses/resp_SECRET1")
    d.post(a.url + "/v1/responses", json={"model": "m", "previous_response_id": "resp_SECRET2"})
    excluded = [fields for event, fields in events if event == "candidate.excluded"]
    common = {"route": "chat", "target": "b", "own": "a", "reason": "provider_state"}
    assert excluded == [{**common, "rule": "path"}, {**common, "rule": "body"}]
    assert "SECRET" not in str(events) and "/responses" not in str(events)
    assert not [event for event, _ in events if event == "failover"]


def test_the_body_is_looked_at_only_when_the_request_would_move(
    make: MakeDriver, a: Upstream, b: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A served request's body is never parsed for state, a held path's neither; a failing one's once, however many providers it could move to."""
    looked: list[bytes] = []
    names_state = StateRules.names_state

    def counted(self: StateRules, body: bytes) -> bool:
        looked.append(body)
        return names_state(self, body)

    monkeypatch.setattr(StateRules, "names_state", counted)
    c = Upstream(name="c")
    try:
        config = azure(a, b, failover={"retry_ambiguous": True})
        config["routes"][0]["targets"].append({"name": "c", "url": c.url + "/v1"})
        d = make(config)
        a.behaviour = then_ok(unavailable, unavailable)
        body = {"model": "m", "input": "hi", "previous_response_id": "resp_1"}
        assert d.post(a.url + "/v1/responses", json=body).status == 503  # a looks, once
        assert d.get(a.url + "/v1/responses/resp_1").status == 503  # the path says it all
        assert d.post(a.url + "/v1/responses", json=body).text == "a"  # served: no look
        assert [json.loads(b) for b in looked] == [body]
        assert (b.calls, c.calls) == (0, 0)
    finally:
        c.close()
