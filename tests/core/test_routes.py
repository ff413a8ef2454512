"""Route matching and request rewriting: pure functions, no network."""

from __future__ import annotations

import warnings

import pytest

from sidestep._common.scopes import is_credential, origin_key
from sidestep._core.routes import (
    Router,
    compile_target,
    display_origin,
    merge_json,
    without_credentials,
)
from sidestep._settings.config import Config
from sidestep._settings.routes import Target
from sidestep._settings.values import SidestepConfigWarning


def router() -> Router:
    return Router(
        Config.model_validate(
            {
                "routes": [
                    {
                        "name": "chat",
                        "match": ["http://llm.internal/v1"],
                        "targets": [
                            {"name": "a", "url": "https://a.example/v1"},
                            {"name": "b", "url": "https://b.example/api/v1"},
                        ],
                    }
                ]
            }
        )
    )


@pytest.mark.parametrize(
    ("origin", "path", "expected"),
    [
        ("https://a.example:443", "/v1", ("a", "")),
        ("https://a.example:443", "/v1/chat", ("a", "/chat")),
        ("https://b.example:443", "/api/v1/x", ("b", "/x")),
        ("https://a.example:443", "/v10/chat", None),
        ("https://a.example:443", "/v", None),
        ("http://llm.internal:80", "/v1/chat", ("a", "/chat")),
        ("https://c.example:443", "/v1", None),
    ],
)
def test_prefixes_match_on_segment_boundaries(
    origin: str, path: str, expected: tuple[str, str] | None
) -> None:
    """A prefix matches itself and what lies below it, never a longer sibling segment."""
    match = router().match(origin, path)
    if expected is None:
        assert match is None
    else:
        assert match is not None
        assert (match.targets[0].name, match.rest) == expected


def test_candidates_are_the_matched_target_then_the_others_in_order() -> None:
    """Matching B's URL puts B first, then A; an alias keeps route order."""
    r = router()
    via_b = r.match("https://b.example:443", "/api/v1/x")
    via_alias = r.match("http://llm.internal:80", "/v1/x")
    assert via_b is not None and via_alias is not None
    assert [t.name for t in via_b.targets] == ["b", "a"]
    assert [t.name for t in via_alias.targets] == ["a", "b"]
    assert via_b.direct and not via_alias.direct


def test_ipv6_literals_are_bracketed() -> None:
    """An IPv6 target keeps its brackets in the Host header and in what logs show."""
    target = (
        Router(
            Config.model_validate(
                {
                    "routes": [
                        {"name": "r", "targets": [{"name": "six", "url": "http://[::1]:8080/v1"}]}
                    ]
                }
            )
        )
        .routes["r"]
        .targets[0]
    )
    assert target.host_header == "[::1]:8080"
    assert target.shown == "http://[::1]:8080"
    assert display_origin("https", "::1", 443) == "https://[::1]"


def test_json_fields_merge_only_into_json_objects() -> None:
    """A target's json fields override keys of an object body; other bodies pass untouched."""
    assert merge_json(b'{"model":"a","n":1}', {"model": "b"}) == b'{"model":"b","n":1}'
    for body in (b"[1, 2]", b"not json", b'"text"', b""):
        assert merge_json(body, {"model": "b"}) == body


def test_credential_names_and_query_parameters() -> None:
    """Credential-looking names are recognised; idempotency keys are not credentials."""
    for name in ("Authorization", "x-api-key", "X-Goog-Api-Key", "x-auth-token", "cookie", "key"):
        assert is_credential(name)
    for name in ("idempotency-key", "content-type", "accept", "x-request-id", "alt"):
        assert not is_credential(name)
    assert without_credentials(b"key=s3cret&alt=sse&access_token=t") == b"alt=sse"


def test_origin_keys_are_normalised() -> None:
    """Scheme and host case and default ports do not make two origins of one."""
    assert origin_key("HTTPS", "API.Example", None) == origin_key("https", "api.example", 443)


def test_credential_words_are_whole_parts_of_a_name() -> None:
    """max_tokens, author or x-session-id are no credentials; a percent-encoded name still is."""
    for name in ("author", "keywords", "max_tokens", "x-keyboard-layout", "x-session-id"):
        assert not is_credential(name)
    for name in ("access_token", "apiKey", "sig", "X-Amz-Signature", "client_secret"):
        assert is_credential(name)
    assert without_credentials(b"author=a&%74oken=t&keywords=k") == b"author=a&keywords=k"


def test_fingerprints_do_not_depend_on_order() -> None:
    """The same credentials in another order are the same credential scope."""
    from sidestep._common.scopes import Fingerprinter

    fp = Fingerprinter(b"k" * 32)
    assert fp({}, "", b"key=A&token=B") == fp({}, "", b"token=B&key=A")
    assert fp({"x-api-key": "1", "authorization": "2"}, "") == fp(
        {"authorization": "2", "x-api-key": "1"}, ""
    )
    assert fp({}, "", b"key=A") != fp({}, "", b"key=B")


OWN_CREDENTIALS = [
    ({"x-api-key": "k"}, ""),
    ({"Authorization": "Bearer k"}, ""),
    ({"Api-Key": "k"}, ""),
    ({"Cookie": "session=k"}, ""),
    ({"x-goog-api-key": "k"}, ""),
    ({"X-Tag": "t"}, "svc:pw@"),  # userinfo: the target's Basic credentials
]


@pytest.mark.parametrize(("headers", "userinfo"), OWN_CREDENTIALS)
@pytest.mark.parametrize("inherit", [False, True], ids=["", "inherit_credentials"])
def test_a_target_with_a_credential_of_its_own_takes_none_of_the_callers(
    headers: dict[str, str], userinfo: str, inherit: bool
) -> None:
    """A target that sets any credential — a header the credential rule names, or URL
    userinfo — keeps none of the caller's, on its own origin, another, or inheriting them."""
    with warnings.catch_warnings():
        # inherit_credentials beside a credential of its own is warned about (test_config)
        warnings.simplefilter("ignore", SidestepConfigWarning)
        target = compile_target(
            Target(
                name="t",
                url=f"https://{userinfo}api.example/v1",
                headers=headers,
                inherit_credentials=inherit,
            )
        )
    assert target.credentialed
    for origin in ("https://api.example:443", "https://alias.example:443"):
        assert not target.takes_callers_credentials(origin)


@pytest.mark.parametrize(
    ("inherit", "same", "other"),
    [(False, True, False), (True, True, True)],
    ids=["", "inherit_credentials"],
)
def test_a_target_without_a_credential_takes_the_callers_where_httpx_would(
    inherit: bool, same: bool, other: bool
) -> None:
    """A target that sets no credential (its other headers aside) keeps the caller's on its
    own origin, and on another only with inherit_credentials."""
    target = compile_target(
        Target(
            name="t",
            url="https://api.example/v1",
            headers={"X-Tag": "t", "anthropic-version": "2023-06-01"},
            inherit_credentials=inherit,
        )
    )
    assert not target.credentialed
    assert target.takes_callers_credentials("https://api.example:443") is same
    assert target.takes_callers_credentials("https://alias.example:443") is other
