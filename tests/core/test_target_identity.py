"""Who a target is: its credential names, its userinfo, its host's spelling, its suspensions."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

import sidestep
from drivers import MakeDriver, route
from sidestep._common.scopes import is_credential
from sidestep.logging import REDACTED, redact_value
from upstream import Respond, Upstream, free_port


def unavailable(_: Any) -> Respond:
    return Respond(503, "down")


# -- one rule for credential names ---------------------------------------------------

CAMEL_CREDENTIALS = ["X-AuthToken", "ClientSecret", "accessToken", "APIKey", "xApiKey"]
NOT_CREDENTIALS = [
    "max_tokens",
    "maxTokens",
    "Idempotency-Key",
    "author",
    "keywords",
    "alt",
    "monkey",
]


@pytest.mark.parametrize(
    "name",
    [*CAMEL_CREDENTIALS, "accesstoken", "clientsecret", "Set-Cookie", "secretkey", "aws_accesskey"],
)
def test_camel_case_and_run_together_credential_names_are_credentials(name: str) -> None:
    """camelCase humps and lower-case runs ending in a credential word name a credential."""
    assert is_credential(name)


@pytest.mark.parametrize("name", NOT_CREDENTIALS)
def test_ordinary_names_stay_ordinary(name: str) -> None:
    """max_tokens, Idempotency-Key, author and their kin are not credentials."""
    assert not is_credential(name)


@pytest.mark.parametrize("name", [*CAMEL_CREDENTIALS, *NOT_CREDENTIALS])
def test_logging_redacts_exactly_what_stays_on_its_origin(name: str) -> None:
    """A field's value is redacted in logs if and only if its name is a credential name."""
    redacted = redact_value(name, "value-1234") == REDACTED
    assert redacted == is_credential(name)


def test_camel_case_credentials_do_not_cross_origins(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """?accessToken=, X-AuthToken and ClientSecret meant for A never reach B's origin."""
    a.behaviour = unavailable
    d = make(route(("a", a.url + "/v1"), ("b", b.url + "/v1")))
    headers = {"X-AuthToken": "tok-secret", "ClientSecret": "cs-secret", "maxTokens": "5"}
    r = d.get(a.url + "/v1/x?accessToken=at-secret&page=2", headers=headers)
    assert r.text == "b"
    (seen,) = b.seen
    assert seen.path == "/v1/x?page=2"
    assert "x-authtoken" not in seen.headers
    assert "clientsecret" not in seen.headers
    assert seen.headers["maxtokens"] == "5"
    assert "secret" not in json.dumps(seen.headers)


# -- userinfo in a target URL ------------------------------------------------------------


def basic(userpass: str) -> str:
    return "Basic " + base64.b64encode(userpass.encode()).decode()


def test_target_userinfo_is_sent_as_its_basic_credentials(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Userinfo in a target URL reaches that target as Basic credentials, first or failover."""
    a.behaviour = unavailable
    a_url = a.url.replace("http://", "http://svc:s3cret@") + "/v1"
    b_url = b.url.replace("http://", "http://b%40svc:p%3Aw@") + "/v1"
    d = make(route(("a", a_url), ("b", b_url)))
    assert d.get(a.url + "/v1/x").text == "b"
    assert a.seen[0].headers["authorization"] == basic("svc:s3cret")
    assert b.seen[0].headers["authorization"] == basic("b@svc:p:w")


def test_target_userinfo_and_authorization_header_are_refused_together() -> None:
    """A target giving Basic userinfo and an authorization header fails to load, quoting neither."""
    config = route(("a", "https://svc:s3cret@a.example/v1"))
    config["routes"][0]["targets"][0]["headers"] = {"Authorization": "Bearer hdr-secret"}
    with pytest.raises(sidestep.ConfigError) as caught:
        sidestep.FailoverTransport(config)
    message = str(caught.value)
    assert "userinfo" in message
    assert "authorization" in message
    assert "s3cret" not in message
    assert "hdr-secret" not in message


# -- one spelling of a host ----------------------------------------------------------------


@pytest.mark.parametrize("configured", ["xn--bcher-kva.example", "BÜCHER.example"])
@pytest.mark.parametrize("requested", ["xn--bcher-kva.example", "bücher.example"])
def test_a_host_matches_its_route_in_either_spelling(
    configured: str, requested: str, make: MakeDriver, b: Upstream
) -> None:
    """An IDN target written in ASCII or Unicode matches requests in either spelling and fails over."""
    port = free_port()
    d = make(route(("a", f"http://{configured}:{port}/v1"), ("b", b.url + "/v1")))
    r = d.get(f"http://{requested}:{port}/v1/x")
    assert (r.text, r.extensions["sidestep"]["route"]) == ("b", "chat")


# -- suspensions name their own targets ------------------------------------------------------


def two_keys(a: Upstream) -> dict[str, Any]:
    """The two-keys-one-origin route of docs/sdks.md: main-key sends the caller's key, second-key its own."""
    return route(
        ("main-key", a.url + "/v1"),
        ("second-key", a.url + "/v1"),
        targets={"second-key": {"headers": {"x-api-key": "SECOND"}}},
    )


def test_a_suspension_names_the_target_whose_key_it_is(make: MakeDriver, a: Upstream) -> None:
    """A rate limit on second-key is listed as second-key, the bad main key as main-key."""
    a.behaviour = lambda seen: (
        Respond(429, "slow down") if seen.headers["x-api-key"] == "SECOND" else Respond(401, "no")
    )
    d = make(two_keys(a))
    r = d.post(a.url + "/v1/messages", json={"model": "m"}, headers={"x-api-key": "MAIN"})
    assert r.status == 429
    rows = {s.reason: s for s in d.transport.suspensions()}
    assert (rows["rate_limited"].route, rows["rate_limited"].target) == ("chat", "second-key")
    assert rows["rate_limited"].targets == (("chat", "second-key"),)
    assert (rows["invalid_credential"].target, rows["invalid_credential"].targets) == (
        "main-key",
        (("chat", "main-key"),),
    )


def test_a_shared_scope_lists_every_target_that_shares_it(make: MakeDriver, a: Upstream) -> None:
    """An outage of the origin's model scope belongs to both keys' targets: both are listed."""
    a.behaviour = unavailable
    config = two_keys(a)
    config["breaker"]["failure_threshold"] = 1
    d = make(config)
    d.post(a.url + "/v1/messages", json={"model": "m"}, headers={"x-api-key": "MAIN"})
    (s,) = d.transport.suspensions()
    assert (s.scope, s.state) == ("origin+model", "open")
    assert s.targets == (("chat", "main-key"), ("chat", "second-key"))
    assert (s.route, s.target) == ("chat", "main-key")


# -- a target's credential replaces the caller's ------------------------------------------

RATE_LIMITED = Respond(429, "slow down", {"retry-after": "60"})


@pytest.mark.parametrize(
    ("second", "credential"),
    [
        ({"headers": {"x-api-key": "SECOND"}}, ("x-api-key", "SECOND")),
        ({"url": "svc:s3cond@"}, ("authorization", basic("svc:s3cond"))),
    ],
    ids=["key header", "userinfo"],
)
def test_a_same_origin_target_with_its_own_credential_gets_none_of_the_callers(
    make: MakeDriver, a: Upstream, second: dict[str, Any], credential: tuple[str, str]
) -> None:
    """The caller's key is rate limited; the same origin's second target, with a key or
    userinfo of its own, receives that credential alone — not the caller's userinfo (its
    Authorization), key, cookie or credential query parameter — while the first target,
    which sets none, still receives the caller's."""
    a.behaviour = lambda seen: (
        Respond(body="second") if seen.headers.get(credential[0]) == credential[1] else RATE_LIMITED
    )
    url = a.url + "/v1"
    target: dict[str, Any] = {"headers": second.get("headers", {})}
    if "url" in second:
        url = url.replace("http://", "http://" + second["url"])
    config = route(("main-key", a.url + "/v1"), ("second-key", url), targets={"second-key": target})
    d = make(config)
    caller = a.url.replace("http://", "http://user:MAIN-PW@")
    r = d.post(
        caller + "/v1/messages?api_key=MAIN-Q&beta=true",
        json={"model": "m"},
        headers={"x-api-key": "MAIN-KEY", "cookie": "session=MAIN-COOKIE"},
    )
    assert (r.status, r.text) == (200, "second")
    first, failover = a.seen
    assert first.headers["authorization"] == basic("user:MAIN-PW")
    assert first.headers["cookie"] == "session=MAIN-COOKIE"
    assert first.path == "/v1/messages?api_key=MAIN-Q&beta=true"
    assert failover.path == "/v1/messages?beta=true"
    sent = {name for name, _ in failover.raw}
    assert {credential[0], "cookie", "authorization", "x-api-key"} & sent == {credential[0]}
    assert failover.headers[credential[0]] == credential[1]
    assert "MAIN" not in json.dumps(failover.raw)


def test_a_key_targets_scope_is_its_own_key_when_the_caller_sent_a_bearer_token(
    make: MakeDriver, a: Upstream
) -> None:
    """A caller authenticating with Authorization (the Anthropic SDK's auth_token) fails
    over to second-key: its rate limit is second-key's own credential scope, not one of
    the caller's token and the key mixed, and is listed as second-key's."""
    a.behaviour = lambda seen: (
        RATE_LIMITED if "authorization" not in seen.headers else Respond(401, "no")
    )
    d = make(two_keys(a))
    r = d.post(
        a.url + "/v1/messages", json={"model": "m"}, headers={"authorization": "Bearer MAIN"}
    )
    assert r.status == 429
    assert "authorization" not in a.seen[1].headers
    rows = {s.reason: s for s in d.transport.suspensions()}
    assert rows["rate_limited"].targets == (("chat", "second-key"),)
    assert rows["invalid_credential"].targets == (("chat", "main-key"),)
