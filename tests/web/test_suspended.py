"""Finding a suspension behind wrappers, and the 503 built from it."""

from __future__ import annotations

import builtins
import json
import sys
from typing import NoReturn

import httpx2
import openai
import pytest

from sidestep._core.suspended import (
    find_suspended,
    retry_after_header,
    unavailable_body,
    unavailable_headers,
)
from suspensions import MESSAGE, raise_as_sdk, suspension


def raised(exc: BaseException) -> BaseException:
    """`exc` after being raised and caught, with its traceback and chain as Python sets them."""
    try:
        raise exc
    except BaseException as caught:
        return caught


def raise_while_handling(error: Exception, *, suppress: bool) -> NoReturn:
    """Raise a RuntimeError in the handler of `error`, hiding the context when `suppress`."""
    try:
        raise error
    except Exception:
        if suppress:
            raise RuntimeError("wrapped") from None
        raise RuntimeError("wrapped")  # noqa: B904 - the implicit context is the point


def test_finds_the_error_itself() -> None:
    """The suspension itself is found."""
    error = suspension()
    assert find_suspended(error) is error


def test_sees_through_an_sdk_error_raised_from_it() -> None:
    """An SDK connection error raised `from` the suspension leads back to it."""
    error = suspension()
    with pytest.raises(openai.APIConnectionError) as wrapper:
        raise_as_sdk(error)
    assert find_suspended(wrapper.value) is error


def test_follows_context_even_when_suppressed() -> None:
    """An error raised while handling the suspension leads back to it, `from None` too."""
    error = suspension()
    for suppress in (False, True):
        with pytest.raises(RuntimeError) as wrapper:
            raise_while_handling(error, suppress=suppress)
        assert wrapper.value.__suppress_context__ is suppress
        assert find_suspended(wrapper.value) is error


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception groups are built in from 3.11")
def test_looks_into_nested_exception_groups() -> None:
    """A suspension inside a group inside a group, after other members, is found."""
    error = suspension()
    group = builtins.ExceptionGroup
    inner = group("inner", [ValueError("first"), raised(error)])
    outer = group("outer", [KeyError("k"), inner])
    assert find_suspended(RuntimeError("x")) is None
    assert find_suspended(raised(outer)) is error


def test_unrelated_errors_hold_no_suspension() -> None:
    """A chain without the suspension gives None."""
    with pytest.raises(openai.APIConnectionError) as wrapper:
        raise_as_sdk(httpx2.ConnectError("refused"))
    assert find_suspended(wrapper.value) is None


def test_cycles_end() -> None:
    """A cycle in the chain is walked once and gives None when it holds no suspension."""
    first, second = RuntimeError("a"), RuntimeError("b")
    first.__context__ = second
    second.__cause__ = first
    assert find_suspended(first) is None


def test_long_chains_are_bounded() -> None:
    """A suspension ten links down is found; an absurdly long chain is cut off, not walked."""
    error = suspension()
    link: BaseException = error
    for i in range(10):
        wrapper = RuntimeError(i)
        wrapper.__cause__ = link
        link = wrapper
    assert find_suspended(link) is error
    for i in range(10_000):
        wrapper = RuntimeError(i)
        wrapper.__cause__ = link
        link = wrapper
    assert find_suspended(link) is None


@pytest.mark.parametrize(
    ("retry_after", "header"),
    [(11.2, "12"), (12.0, "12"), (0.2, "1"), (0.0, "1"), (None, None)],
)
def test_retry_after_is_whole_seconds_rounded_up(
    retry_after: float | None, header: str | None
) -> None:
    """Retry-After is the ceiling of the earliest re-admission, at least 1, absent when unknown."""
    assert retry_after_header(suspension(retry_after)) == header


def test_body_carries_the_same_retry_after_and_no_names() -> None:
    """The body is the documented JSON, with Retry-After's number, and names no target or route."""
    body = unavailable_body(suspension(11.2))
    assert json.loads(body) == {
        "error": {"type": "all_candidates_suspended", "message": MESSAGE, "retry_after": 12}
    }
    assert b"primary" not in body
    assert b"chat" not in body
    assert json.loads(unavailable_body(suspension(None)))["error"]["retry_after"] is None


def test_headers_describe_the_body() -> None:
    """The headers give the JSON type, the body's length and Retry-After only when known."""
    error = suspension(3.5)
    assert unavailable_headers(error) == [
        ("content-type", "application/json"),
        ("content-length", str(len(unavailable_body(error)))),
        ("retry-after", "4"),
    ]
    assert "retry-after" not in dict(unavailable_headers(suspension(None)))


def test_headers_are_a_new_list_each_time() -> None:
    """Callers may extend the list they get without changing the next one."""
    error = suspension()
    unavailable_headers(error).append(("x-extra", "1"))
    assert ("x-extra", "1") not in unavailable_headers(error)
