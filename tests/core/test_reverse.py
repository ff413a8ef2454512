"""What a rewritten target's answer looks like to the client: redirects and cookies.

Real upstreams on 127.0.0.1 and real clients following redirects with their
own cookie jars, for all four transports. The backup is addressed as
``localhost`` so that it is another host for the cookie jar, not only another
port.
"""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import pytest

from drivers import MakeDriver, route
from upstream import Respond, Seen, Upstream


def backup_url(b: Upstream) -> str:
    return f"http://localhost:{b.port}"


def failover_pair(a: Upstream, b: Upstream) -> dict[str, Any]:
    """Route chat: A first, then B on another origin with a key of its own."""
    return route(
        ("a", a.url + "/v1"),
        ("b", backup_url(b) + "/v1"),
        targets={"b": {"headers": {"authorization": "Bearer BACKUP-KEY"}}},
    )


def carries(seen: list[Seen], secret: str) -> bool:
    return any(secret in value for s in seen for value in s.headers.values())


def down(_: Seen) -> Respond:
    return Respond(503, "down")


@pytest.mark.parametrize("key", ["x-api-key", "api-key", "x-goog-api-key"])
def test_a_backup_redirect_goes_back_through_the_route(
    make: MakeDriver, a: Upstream, b: Upstream, key: str
) -> None:
    """A backup's 307 to its own origin is followed through the route: the backup never gets the caller's key."""
    a.behaviour = down

    def backup(seen: Seen) -> Respond:
        if seen.path == "/v1/chat":
            return Respond(307, "", headers={"location": backup_url(b) + "/v1/chat/"})
        return Respond(body="b")

    b.behaviour = backup
    d = make(failover_pair(a, b))
    r = d.post(
        a.url + "/v1/chat",
        json={"q": 1},
        headers={key: "PRIMARY-KEY"},
        follow_redirects=True,
    )
    assert (r.status, r.text) == (200, "b")
    assert not carries(b.seen, "PRIMARY-KEY")
    assert [s.path for s in b.seen] == ["/v1/chat", "/v1/chat/"]
    assert all(s.headers["authorization"] == "Bearer BACKUP-KEY" for s in b.seen)
    # the followed request was the client's own URL again, so the route tried A first
    assert [(s.path, s.headers[key]) for s in a.seen] == [
        ("/v1/chat", "PRIMARY-KEY"),
        ("/v1/chat/", "PRIMARY-KEY"),
    ]


def test_a_relative_backup_redirect_maps_to_the_client_url(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A relative Location under the backup's prefix reaches the client as the same place under its own URL."""
    a.behaviour = down
    b.behaviour = lambda _: Respond(
        302, "", headers={"location": "/v1/other?page=2", "content-location": "chat"}
    )
    d = make(failover_pair(a, b))
    r = d.get(a.url + "/v1/chat", headers={"x-api-key": "PRIMARY-KEY"})
    assert r.status == 302
    assert r.headers["location"] == a.url + "/v1/other?page=2"
    assert r.headers["content-location"] == a.url + "/v1/chat"


def test_a_backup_redirect_off_its_prefix_is_not_followed(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A backup's redirect outside its route prefix reaches the client without a Location: nothing is followed."""
    a.behaviour = down
    b.behaviour = lambda seen: (
        Respond(body="login page")
        if seen.path == "/login"
        else Respond(307, "", headers={"location": backup_url(b) + "/login"})
    )
    d = make(failover_pair(a, b))
    r = d.post(
        a.url + "/v1/chat",
        json={"q": 1},
        headers={"x-api-key": "PRIMARY-KEY"},
        follow_redirects=True,
    )
    assert r.status == 307
    assert "location" not in r.headers
    assert [s.path for s in b.seen] == ["/v1/chat"]
    assert not carries(b.seen, "PRIMARY-KEY")


def test_a_backup_cookie_never_reaches_the_primary(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A cookie set by the backup is not kept under the primary's origin, so the primary never gets it."""
    answers = itertools.chain([Respond(503, "down")], itertools.repeat(Respond(body="a")))
    a.behaviour = lambda _: next(answers)
    b.behaviour = lambda _: Respond(
        body="b", headers={"set-cookie": "backup_session=B-SESSION; Path=/"}
    )
    d = make(failover_pair(a, b))
    first = d.get(a.url + "/v1/chat")
    assert d.get(a.url + "/v1/chat").text == "a"
    assert [s.path for s in a.seen] == ["/v1/chat", "/v1/chat"]
    assert not carries(a.seen, "B-SESSION")
    assert (first.text, "set-cookie" in first.headers) == ("b", False)


def test_an_alias_target_redirect_goes_back_through_the_alias(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """A target reached through a `match` alias redirects to itself: the client follows the alias, its key stays home."""

    def target(seen: Seen) -> Respond:
        if seen.path == "/v1/chat":
            return Respond(307, "", headers={"location": a.url + "/v1/chat/"})
        return Respond(body="a")

    a.behaviour = target
    config = failover_pair(a, b)
    config["routes"][0]["match"] = ["http://llm.internal/v1"]
    d = make(config)
    r = d.post(
        "http://llm.internal/v1/chat",
        json={"q": 1},
        headers={"x-api-key": "CLIENT-KEY"},
        follow_redirects=True,
    )
    assert (r.status, r.text) == (200, "a")
    assert [s.path for s in a.seen] == ["/v1/chat", "/v1/chat/"]
    assert not carries(a.seen, "CLIENT-KEY")


def same_origin_answer(seen: Seen) -> Respond:
    """A 307 with a relative and an absolute URL, and a host-only cookie, then whatever it was sent."""
    if seen.path == "/v1/chat":
        return Respond(
            307,
            "",
            headers={
                "location": "/v1/chat/?page=2",
                "content-location": "/elsewhere",
                "set-cookie": "session=S1; Path=/",
            },
        )
    return Respond(body=seen.headers.get("cookie", "no cookie"))


def test_a_same_origin_target_answers_as_plain_httpx(make: MakeDriver, b: Upstream) -> None:
    """A second key on the client's own origin: its redirects and Set-Cookie reach the client
    exactly as without sidestep, and the followed redirect comes back to it with its own key
    alone: the cookie the client then sends is the client's, and no credential of the
    client's goes to a target that sets its own."""
    b.behaviour = lambda seen: (
        Respond(429, "slow down") if seen.headers["x-api-key"] == "K" else same_origin_answer(seen)
    )
    with httpx.Client(headers={"x-api-key": "SECOND-KEY"}) as plain:
        expected = plain.get(b.url + "/v1/chat")
        followed = plain.get(b.url + "/v1/chat", follow_redirects=True)

    # The client's key K is rate limited; "second" is the same origin and prefix with its own key.
    config = route(
        ("first", b.url + "/v1"),
        ("second", b.url + "/v1"),
        targets={"second": {"headers": {"x-api-key": "SECOND-KEY"}}},
    )
    d = make(config)
    r = d.get(b.url + "/v1/chat", headers={"x-api-key": "K"})
    assert r.extensions["sidestep"]["target"] == "second"
    assert r.status == expected.status_code == 307
    assert {k: r.headers[k] for k in ("location", "content-location", "set-cookie")} == {
        k: expected.headers[k] for k in ("location", "content-location", "set-cookie")
    }
    r = d.get(b.url + "/v1/chat", headers={"x-api-key": "K"}, follow_redirects=True)
    assert followed.text == "session=S1"
    assert (r.extensions["sidestep"]["target"], r.text) == ("second", "no cookie")
    assert b.seen[-1].headers["x-api-key"] == "SECOND-KEY"


def test_a_followed_redirect_body_is_replayed_on_failover(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """The client's redirected POST (bytes passed as a stream) still fails over with its body."""
    a.behaviour = lambda seen: (
        Respond(307, "", headers={"location": "/v1/moved"})
        if seen.path == "/v1/chat"
        else Respond(503, "down")
    )
    d = make(failover_pair(a, b))
    r = d.post(a.url + "/v1/chat", json={"q": 1}, follow_redirects=True)
    assert (r.status, r.text) == (200, "b")
    assert [(s.path, s.json()) for s in b.seen] == [("/v1/moved", {"q": 1})]
