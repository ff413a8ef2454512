"""The client's view of a rewritten target's headers: a pure function, no network."""

from __future__ import annotations

from typing import Any

import httpx
import httpx2
import pytest

from sidestep._common.scopes import origin_key
from sidestep._core.reverse import client_view, may_change
from sidestep._core.routes import Candidates, compile_target
from sidestep._settings.policies import FailoverPolicy


class _Target:
    def __init__(self, url: str) -> None:
        self.name = "t"
        self.url = url
        self.headers: dict[str, str] = {}
        self.json_fields: dict[str, object] = {}
        self.inherit_credentials = False


CLIENT = httpx.URL("https://user:pw@api.primary.example/openai/v1/chat?stream=1")
CLIENT_ORIGIN = origin_key("https", "api.primary.example", None)


def view(target_url: str, headers: list[tuple[str, str]]) -> list[tuple[str, str]] | None:
    raw = [(k.encode(), v.encode()) for k, v in headers]
    target = compile_target(_Target(target_url))
    out = client_view(
        raw,
        target,
        CLIENT,
        Candidates.of(None, (target,), "/chat", CLIENT_ORIGIN, False, FailoverPolicy()),
    )
    return None if out is None else [(k.decode(), v.decode()) for k, v in out]


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("https://backup.example/api/v1/chat/", "https://api.primary.example/openai/v1/chat/"),
        ("HTTPS://Backup.Example:443/api/v1", "https://api.primary.example/openai/v1"),
        ("/api/v1/models?page=2#top", "https://api.primary.example/openai/v1/models?page=2#top"),
        ("models", "https://api.primary.example/openai/v1/models"),
        ("?after=x", "https://api.primary.example/openai/v1/chat?after=x"),
        ("//backup.example/api/v1/x", "https://api.primary.example/openai/v1/x"),
        ("https://u:p@backup.example/api/v1/x", "https://api.primary.example/openai/v1/x"),
        ("/api/v1/x?key=K&access_token=T&n=1", "https://api.primary.example/openai/v1/x?n=1"),
        ("https://api.primary.example/status", "https://api.primary.example/status"),
        ("https://u:p@api.primary.example/s?sig=S", "https://api.primary.example/s"),
        ("https://backup.example/api/v10", None),
        ("/login", None),
        ("http://backup.example/api/v1/x", None),
        ("https://backup.example:8443/api/v1/x", None),
        ("https://elsewhere.example/api/v1/x", None),
        ("ftp://backup.example/api/v1/x", None),
        ("https://backup.example:bad/api/v1", None),
    ],
)
def test_a_location_from_another_origin_maps_into_the_client_url_or_is_dropped(
    location: str, expected: str | None
) -> None:
    """Under the target's prefix it maps to the client's prefix; on the client's origin it stays; else it is dropped."""
    out = view(
        "https://backup.example/api/v1",
        [("Location", location), ("Content-Location", location), ("x-other", location)],
    )
    kept = [] if expected is None else [("Location", expected), ("Content-Location", expected)]
    assert out == [*kept, ("x-other", location)]


def test_cookies_from_another_origin_are_dropped() -> None:
    """Set-Cookie (and Set-Cookie2) from a target on another origin never reach the client."""
    out = view(
        "https://backup.example/api/v1",
        [("set-cookie", "a=1"), ("Set-Cookie2", "b=2"), ("content-type", "text/plain")],
    )
    assert out == [("content-type", "text/plain")]


def test_a_same_origin_target_on_another_prefix_keeps_its_cookies() -> None:
    """On the client's origin under another prefix: cookies stay, URLs move to the client's prefix."""
    out = view(
        "https://api.primary.example/v2",
        [("set-cookie", "a=1"), ("location", "/v2/x?key=K"), ("location", "/other")],
    )
    assert out == [
        ("set-cookie", "a=1"),
        ("location", "https://api.primary.example/openai/v1/x?key=K"),
        ("location", "https://api.primary.example/other"),
    ]


def test_a_root_target_maps_every_path_on_its_origin() -> None:
    """A target with no path prefix: every path on its origin lies under it."""
    out = view("https://backup.example", [("location", "/anything")])
    assert out == [("location", "https://api.primary.example/openai/v1/anything")]


@pytest.mark.parametrize(
    "headers",
    [
        [("content-type", "application/json")],
        [("location", "/openai/v1/x"), ("set-cookie", "a=1")],
    ],
)
def test_nothing_changes_without_need(headers: list[tuple[str, str]]) -> None:
    """No URL or cookie header, or the client's own origin and prefix: the headers are left as they are."""
    assert view("https://api.primary.example/openai/v1", headers) is None


@pytest.mark.parametrize("module", [httpx, httpx2], ids=["httpx", "httpx2"])
@pytest.mark.parametrize(
    ("name", "changes"),
    [
        ("Location", True),
        ("CONTENT-LOCATION", True),
        ("set-cookie", True),
        ("Set-Cookie2", True),
        ("X-Location", False),
        ("Link", False),
    ],
)
def test_an_answer_is_looked_at_only_when_it_holds_a_header_the_view_may_change(
    module: Any, name: str, changes: bool
) -> None:
    """`may_change` is the quick look before `client_view`: it finds each header the view
    rewrites or drops, in any case, and an answer it passes over is one the view would
    hand back unchanged (None)."""
    headers = module.Headers([("Content-Type", "text/plain"), (name, "https://elsewhere.example/")])
    assert may_change(headers) is changes
    assert may_change(_RawOnly(headers.raw)) is changes
    if not changes:
        assert (
            view("https://backup.example/api", [(k.decode(), v.decode()) for k, v in headers.raw])
            is None
        )


class _RawOnly:
    """Headers as any other mapping of them keeps them: only the raw pairs."""

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.raw = raw
