"""The request rebuilt for another target is byte for byte the one httpx itself builds.

`Rebuilder` assembles a moved request from kept parts; `as_httpx_builds` asks
httpx (or httpx2) to build it, with its constructor, from the moved URL, the
rewritten header list and the body.
Pure construction, no I/O: every field a transport reads is compared, the raw
header list (names, values, order) first.
"""

from __future__ import annotations

import warnings
from typing import Any

import httpx
import httpx2
import pytest

from sidestep._core.rebuild import Rebuilder, as_httpx_builds, moved_url, with_extensions
from sidestep._core.routes import CompiledTarget, compile_target
from sidestep._settings.routes import Target
from sidestep._settings.values import SidestepConfigWarning

METHODS = ["GET", "HEAD", "DELETE", "OPTIONS", "POST", "PUT", "PATCH", "QUERY", "PROPFIND"]
BODIES = [b"", b'{"model":"a","messages":[]}', b"x" * 5000]
HEADERS = [
    [],
    [("Accept", "application/json"), ("X-Trace", "1"), ("x-trace", "2")],
    [
        ("Authorization", "Bearer caller-secret"),
        ("Content-Type", "application/json"),
        ("X-Api-Key", "k"),
        ("User-Agent", "sdk/1.0"),
        ("Content-Length", "999"),
        ("Host", "api.example"),
        ("X-Own", "the caller's"),
    ],
]
TARGETS = [
    compile_target(Target(name="plain", url="http://backup.example/v2")),
    compile_target(
        Target(
            name="own",
            url="https://backup.example:8443/v1",
            headers={"Authorization": "Bearer theirs", "X-Own": "theirs"},
        )
    ),
    compile_target(Target(name="basic", url="http://user:pw@backup.example/")),
]


def fields(request: Any) -> dict[str, Any]:
    """What a transport sends and reads of a request."""
    return {
        "type": type(request),
        "method": request.method,
        "url": str(request.url),
        "raw": request.headers.raw,
        "headers": vars(request.headers),
        "encoding": request.headers.encoding,
        "content": request.content,
        "stream": type(request.stream),
        "streamed": b"".join(request.stream),
        "extensions": request.extensions,
        "attributes": sorted(vars(request)),
    }


def reference(
    request: Any, target: CompiledTarget, rest: str, keep: bool, body: bytes | None
) -> Any:
    """The moved request as httpx's own constructor builds it."""
    url = moved_url(request.url, target, rest, keep)
    ext = {k: v for k, v in request.extensions.items() if k != "sni_hostname"}
    return as_httpx_builds(request, url, target, keep, body, ext)


@pytest.mark.parametrize("module", [httpx, httpx2], ids=["httpx", "httpx2"])
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
@pytest.mark.parametrize("keep", [False, True], ids=["credentials dropped", "kept"])
def test_a_rebuilt_request_is_the_one_httpx_builds(
    module: Any, target: CompiledTarget, keep: bool
) -> None:
    """For every method, body and header list, the kept-parts request has httpx's raw
    headers in httpx's order (Content-Length before or after the others as httpx puts it),
    its URL, body, stream type and extensions — asked twice, so cached parts are reused."""
    rebuilder = Rebuilder()
    ext = {"timeout": {"connect": 1.0}, "sni_hostname": "api.example"}
    for method in METHODS:
        for body in BODIES:
            for headers in HEADERS:
                request = module.Request(
                    method, "http://api.example/v1/chat?x=1", headers=headers, extensions=ext
                )
                expected = fields(reference(request, target, "/chat", keep, body))
                assert "sni_hostname" not in expected["extensions"]
                for _ in range(2):
                    built = rebuilder.build(request, target, "/chat", keep, body)
                    assert fields(built) == expected, (method, body[:10], headers)
    # and every one of them was assembled from the kept parts, attribute by attribute,
    # not handed back to httpx
    assert len(rebuilder._shapes) == 2 * len(METHODS)
    assert all(shape is not None and shape[-1] for shape in rebuilder._shapes.values())


@pytest.mark.parametrize("module", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_a_streamed_body_is_built_by_httpx(module: Any) -> None:
    """What the kept parts cannot place as httpx would — a one-shot streamed body — is
    still built exactly as httpx builds it (a target never sets a content header: the
    configuration refuses one)."""
    rebuilder = Rebuilder()

    def chunks() -> Any:
        yield b"one-shot"

    streamed = module.Request("PUT", "http://a.example/x", content=chunks())
    built = rebuilder.build(streamed, TARGETS[0], "/x", False, None)
    expected = reference(streamed, TARGETS[0], "/x", False, None)
    assert built.headers.raw == expected.headers.raw
    assert built.headers.raw[-1] == (b"Transfer-Encoding", b"chunked")


@pytest.mark.parametrize("module", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_a_header_value_outside_ascii_goes_to_the_target_as_the_caller_sent_it(
    module: Any,
) -> None:
    """Re-encoding decoded header strings as ASCII refused a UTF-8 value (rewriting the
    request for the target raised); the kept bytes go along unchanged, from the kept
    parts and from httpx's own construction alike."""
    request = module.Request(
        "POST", "http://a.example/x", headers={"X-Name": "café".encode()}, content=b"{}"
    )
    built = Rebuilder().build(request, TARGETS[0], "/x", False, b"{}")
    assert fields(built) == fields(reference(request, TARGETS[0], "/x", False, b"{}"))
    assert built.headers.raw == [
        (b"x-name", "café".encode()),
        (b"host", b"backup.example"),
        (b"Content-Length", b"2"),
    ]


@pytest.mark.parametrize("module", [httpx, httpx2], ids=["httpx", "httpx2"])
@pytest.mark.parametrize(
    ("own", "host"),
    [({"X-Tag": "b"}, b"10.0.0.7:8080"), ({"Host": "api.example"}, b"api.example")],
    ids=["host from its url", "a host of its own"],
)
def test_a_request_for_a_target_sends_one_host(
    module: Any, own: dict[str, str], host: bytes
) -> None:
    """The caller's own `Host` goes, and the target's takes its place — made from its URL,
    or the target's own `Host` header when it sets one: one `Host` either way (both
    constructions once sent two, a request servers refuse with a 400), from kept parts
    as from httpx."""
    target = compile_target(Target(name="b", url="http://10.0.0.7:8080/v1", headers=own))
    request = module.Request(
        "POST", "http://alias.example/v1/chat", headers={"Host": "alias.example"}, content=b"{}"
    )
    built = Rebuilder().build(request, target, "/chat", False, b"{}")
    assert fields(built) == fields(reference(request, target, "/chat", False, b"{}"))
    assert [v for n, v in built.headers.raw if n.lower() == b"host"] == [host]


@pytest.mark.parametrize("module", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_a_request_class_with_a_constructor_of_its_own_is_built_by_that_constructor(
    module: Any,
) -> None:
    """A request made attribute by attribute skips the class's constructor: for a class
    whose constructor sets more than httpx's (a subclass of the application's), the
    kept parts go through that constructor, and the request has what it sets."""

    class Tagged(module.Request):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.tag = "the application's"

    rebuilder = Rebuilder()
    request = Tagged("POST", "http://api.example/v1/chat", content=b"{}")
    built = rebuilder.build(request, TARGETS[0], "/chat", False, b"{}")
    assert type(built) is Tagged and built.tag == "the application's"
    assert fields(built) == fields(reference(request, TARGETS[0], "/chat", False, b"{}"))
    assert [shape and shape[-1] for shape in rebuilder._shapes.values()] == [False]


@pytest.mark.parametrize("module", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_a_url_moved_to_one_target_is_never_another_targets(module: Any) -> None:
    """Moved URLs are remembered per target: the same caller URL asked for two targets,
    in turn and again, gets each target's own URL, credentials dropped where they must be."""
    rebuilder = Rebuilder()
    request = module.Request("POST", "http://user:pw@api.example/v1/chat?api_key=s&x=1")
    asked = [
        (TARGETS[0], False, "http://backup.example/v2/chat?x=1"),
        (TARGETS[1], True, "https://user:pw@backup.example:8443/v1/chat?api_key=s&x=1"),
        (TARGETS[1], False, "https://backup.example:8443/v1/chat?x=1"),
    ]

    def moved(target: CompiledTarget, keep: bool) -> str:
        return str(rebuilder.build(request, target, "/chat", keep, b"{}").url)

    first = [moved(target, keep) for target, keep, _ in asked]
    again = [moved(target, keep) for target, keep, _ in asked[:2]]
    assert first == [expected for _, _, expected in asked]
    assert again == first[:2]


@pytest.mark.parametrize("module", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_a_request_with_extensions_of_its_own_is_the_same_request_otherwise(module: Any) -> None:
    """`with_extensions` gives an attempt its own timeouts: the copy has the request's
    method, URL, headers, body and stream, and the given extensions; the request it was
    made from keeps its own extensions object, unchanged."""
    request = module.Request(
        "POST", "http://a.example/x", content=b"{}", extensions={"timeout": {"read": 9.0}}
    )
    mine = request.extensions
    copied = with_extensions(request, {"timeout": {"read": 1.0}})
    assert type(copied) is type(request)
    assert copied.headers.raw == request.headers.raw
    assert (copied.method, copied.url, copied.content) == (request.method, request.url, b"{}")
    assert copied.stream is request.stream
    assert copied.extensions == {"timeout": {"read": 1.0}}
    assert request.extensions is mine and mine == {"timeout": {"read": 9.0}}


@pytest.mark.parametrize("module", [httpx, httpx2], ids=["httpx", "httpx2"])
@pytest.mark.parametrize(
    ("url", "own"),
    [
        ("http://api.example/v1", {"x-api-key": "SECOND"}),
        ("http://svc:pw@api.example/v1", {}),
    ],
    ids=["key header", "userinfo"],
)
@pytest.mark.parametrize("inherit", [False, True], ids=["", "inherit_credentials"])
def test_a_target_with_its_own_credential_on_the_callers_origin_gets_none_of_the_callers(
    module: Any, url: str, own: dict[str, str], inherit: bool
) -> None:
    """A target on the caller's own origin that sets a credential gets that credential
    alone — none of the caller's credential headers, cookies, userinfo or credential query
    parameters — from the kept parts and from httpx's own construction alike."""
    with warnings.catch_warnings():
        # inherit_credentials beside a credential of its own is warned about (test_config)
        warnings.simplefilter("ignore", SidestepConfigWarning)
        target = compile_target(
            Target(name="second", url=url, headers=own, inherit_credentials=inherit)
        )
    keep = target.takes_callers_credentials("http://api.example:80")
    request = module.Request(
        "POST",
        "http://user:MAIN-PW@api.example/v1/messages?api_key=MAIN-Q&beta=true",
        headers=[
            ("Authorization", "Bearer MAIN-TOKEN"),
            ("X-Api-Key", "MAIN-KEY"),
            ("Cookie", "session=MAIN-COOKIE"),
            ("anthropic-version", "2023-06-01"),
        ],
        content=b"{}",
    )
    built = Rebuilder().build(request, target, "/messages", keep, b"{}")
    assert fields(built) == fields(reference(request, target, "/messages", keep, b"{}"))
    assert str(built.url) == "http://api.example/v1/messages?beta=true"
    sent = [(name.lower(), value) for name, value in built.headers.raw]
    assert "MAIN" not in repr(sent)
    assert (b"anthropic-version", b"2023-06-01") in sent
    credentials = [(n, v) for n, v in sent if n in (b"authorization", b"x-api-key", b"cookie")]
    assert credentials == [(n.encode(), v.encode()) for n, v in target.headers]
