"""A request moved to another target, as the target receives it on a real socket.

`Rebuilder` assembles most moved requests from kept parts and hands the rest
(a one-shot streamed body, a target setting a content header) to httpx's own
construction (`as_httpx_builds`): whichever builds it, the target gets the
caller's header bytes. Each test runs on the four transports (httpx, httpx2;
sync, async) against `Upstream` servers on 127.0.0.1.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Iterator
from typing import Any

from drivers import MakeDriver
from upstream import Respond, Upstream


def _route(target: Upstream) -> dict[str, Any]:
    url = f"http://127.0.0.1:{target.port}/v1"
    return {
        "routes": [
            {
                "name": "r",
                "match": ["http://alias.example/v1"],
                "targets": [{"name": "t", "url": url}],
            }
        ]
    }


def _one_shot(is_async: bool, data: bytes) -> Any:
    def chunks() -> Iterator[bytes]:
        yield data

    async def achunks() -> AsyncIterator[bytes]:
        yield data

    return achunks() if is_async else chunks()


def test_a_streamed_body_goes_to_the_target_with_a_header_value_outside_ascii(
    make: MakeDriver, a: Upstream
) -> None:
    """A one-shot streamed body is rebuilt by httpx's own construction: it re-encoded the
    caller's decoded header strings as ASCII and raised UnicodeEncodeError on a UTF-8
    value that plain httpx sends; now the target gets the caller's bytes and the body."""
    a.behaviour = lambda seen: Respond(200, b"ok")
    driver = make(_route(a))
    value = "café".encode()
    for body in (b"in memory", None):
        content = body if body is not None else _one_shot(driver.is_async, b"streamed")
        result = driver.post(
            "http://alias.example/v1/x", headers={"x-name": value}, content=content
        )
        assert result.status == 200
        seen = a.seen[-1]
        assert seen.headers["x-name"].encode("latin-1") == value
        assert seen.body == (body if body is not None else b"streamed")


def test_a_streamed_body_with_the_callers_length_is_not_sent_chunked(
    make: MakeDriver, a: Upstream
) -> None:
    """A one-shot stream whose caller gave its Content-Length (an upload of known size)
    goes to the target framed by that length, as plain httpx sends it: moving it had
    dropped the length and sent the body chunked, which many upload endpoints refuse."""
    a.behaviour = lambda seen: Respond(200, b"ok")
    driver = make(_route(a))
    content = _one_shot(driver.is_async, b"abcd")
    result = driver.request(
        "PUT", "http://alias.example/v1/upload", headers={"Content-Length": "4"}, content=content
    )
    assert result.status == 200
    seen = a.seen[-1]
    assert seen.headers.get("content-length") == "4"
    assert "transfer-encoding" not in seen.headers
    assert seen.body == b"abcd"


def test_a_query_string_goes_to_the_target_as_the_caller_wrote_it(
    make: MakeDriver, a: Upstream
) -> None:
    """The target gets the caller's query byte for byte (encoded characters, an encoded
    slash in the path, an empty query `?`): moving it dropped a bare `?` that plain
    httpx sends."""
    a.behaviour = lambda seen: Respond(200, b"ok")
    driver = make(_route(a))
    for rest in ("/x?", "/a%2Fb?q=%20x&y=%2F&z", "/x", "?k=v"):
        assert driver.get("http://alias.example/v1" + rest).status == 200
        assert a.seen[-1].path == "/v1" + rest


def test_a_file_upload_moved_to_one_target_keeps_its_length(make: MakeDriver, a: Upstream) -> None:
    """A multipart upload from a file (a body not read ahead: one target, one attempt)
    goes to the target with the Content-Length httpx gave it, as plain httpx sends it;
    moving it had sent the upload chunked."""
    a.behaviour = lambda seen: Respond(200, b"ok")
    driver = make(_route(a))
    upload = io.BytesIO(b"x" * 1000)
    result = driver.post("http://alias.example/v1/files", files={"f": ("a.bin", upload)})
    assert result.status == 200
    seen = a.seen[-1]
    assert "transfer-encoding" not in seen.headers
    assert seen.headers["content-length"] == str(len(seen.body))
    assert b"x" * 1000 in seen.body


def test_a_followed_redirect_with_a_body_reaches_the_target(make: MakeDriver, a: Upstream) -> None:
    """A 307 followed by the client resends the body as a stream it already holds (not
    read into the request): moved to the target, it was wrapped as a sync stream (an
    async client's transport failed on it) and sent chunked; it arrives whole, with its
    Content-Length."""
    a.behaviour = lambda seen: (
        Respond(307, b"", headers={"location": "/v1/there"})
        if seen.path.endswith("/here")
        else Respond(200, b"ok")
    )
    driver = make(_route(a))
    result = driver.post("http://alias.example/v1/here", content=b'{"k":1}', follow_redirects=True)
    assert result.status == 200
    seen = a.seen[-1]
    assert seen.path == "/v1/there"
    assert seen.body == b'{"k":1}'
    assert seen.headers.get("content-length") == "7"
    assert "transfer-encoding" not in seen.headers
