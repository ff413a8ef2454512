"""Redaction of log events (DESIGN §7), event emission and observers."""

from __future__ import annotations

import logging
import string
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import httpx2
import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from sidestep.logging import (
    REDACTED,
    add_observer,
    emit,
    mask_text,
    origin_of_url,
    redact,
    redact_value,
    remove_observer,
)


def redacted(**fields: Any) -> dict[str, Any]:
    return dict(redact(None, "info", fields))


# -- URLs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("https://api.example.com/v1/chat?x=1", "https://api.example.com"),
        ("https://user:pw@API.Example.com:8443/v1?key=abc#frag", "https://api.example.com:8443"),
        ("http://example.com:80/a", "http://example.com"),
        ("https://example.com:443", "https://example.com"),
        ("http://example.com:8080", "http://example.com:8080"),
        ("wss://:token@stream.example.com/ws", "wss://stream.example.com"),
        ("http://[::1]:9000/x", "http://[::1]:9000"),
        ("redis://:pw@cache:6379/0", "redis://cache:6379"),
        ("https://example.com/bot123:ABC/send", "https://example.com"),
    ],
)
def test_url_strings_keep_only_their_origin(url: str, origin: str) -> None:
    """A URL string is shown as scheme, host and a non-default port, nothing more."""
    assert origin_of_url(url) == origin
    assert redacted(url=url) == {"url": origin}


@pytest.mark.parametrize(
    "url",
    [
        httpx.URL("https://user:pw@api.example.com:8443/v1?token=abc"),
        httpx2.URL("https://user:pw@api.example.com:8443/v1?token=abc"),
        urllib.parse.urlsplit("https://user:pw@api.example.com:8443/v1?token=abc"),
    ],
)
def test_url_objects_keep_only_their_origin(url: object) -> None:
    """URL objects of either httpx flavour, and urllib's, become their origin string."""
    assert origin_of_url(url) == "https://api.example.com:8443"
    assert redacted(url=url) == {"url": "https://api.example.com:8443"}


def test_ipv6_url_objects_keep_their_brackets() -> None:
    """An IPv6 host from a URL object is written as a URL writes it."""
    assert origin_of_url(httpx.URL("http://[::1]:9000/x")) == "http://[::1]:9000"


@pytest.mark.parametrize("value", ["", "not a url", "/v1/chat", "https://", "mailto:a@b.c", 42])
def test_non_urls_have_no_origin(value: object) -> None:
    """Anything that is not an absolute URL with a host has the empty origin."""
    assert origin_of_url(value) == ""


def test_urls_inside_text_are_cut_to_their_origin() -> None:
    """URLs in a message lose userinfo, path, query and fragment; the words around them stay."""
    text = "POST https://u:p@api.example.com/v1/chat?key=abc#f failed, retrying ws://h:81/x?t=1"
    assert mask_text(text) == "POST https://api.example.com failed, retrying ws://h:81"


# -- credentials ----------------------------------------------------------------------------


CREDENTIAL_KEYS = [
    "Authorization",
    "proxy-authorization",
    "Cookie",
    "Set-Cookie",
    "X-Api-Key",
    "api-key",
    "api_key",
    "OPENAI_API_KEY",
    "refresh-token",
    "client_secret",
    "db_password",
    "X-Amz-Signature",
]


@pytest.mark.parametrize("key", CREDENTIAL_KEYS)
def test_credential_keys_are_redacted_at_any_depth(key: str) -> None:
    """Credential values become exactly "[redacted]", at the top and inside nested mappings."""
    event = redacted(
        **{key: "s3cr3t"}, headers={key: "s3cr3t", "accept": "*/*"}, outer={"x": [{key: 1}]}
    )
    assert event == {
        key: REDACTED,
        "headers": {key: REDACTED, "accept": "*/*"},
        "outer": {"x": [{key: REDACTED}]},
    }


def test_header_objects_and_pairs_are_redacted() -> None:
    """httpx Headers become redacted dicts, and (name, value) pairs lose credential values."""
    headers = httpx.Headers({"Authorization": "Bearer abc", "X-Api-Key": "k", "Accept": "a"})
    pairs = [("x-api-key", "k"), ("accept", "a")]
    assert redacted(headers=headers, raw=pairs) == {
        "headers": {"authorization": REDACTED, "x-api-key": REDACTED, "accept": "a"},
        "raw": [("x-api-key", REDACTED), ("accept", "a")],
    }


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("sent Bearer eyJhbGciOiJIUzI1NiJ9.e30.abc to A", "sent Bearer [redacted] to A"),
        ("basic dXNlcjpwYXNz", "basic [redacted]"),
        ("key sk-abcdefghijklmnop1234 rejected", "key sk-[redacted] rejected"),
        ("key sk-proj-AbCdEf_123-456789xyz", "key sk-[redacted]"),
        ("(sk-ant-api03-abcdefghijklmn)", "(sk-[redacted])"),
        ("xai-0123456789abcdef", "xai-[redacted]"),
        ("google AIzaSyD-abcdefghijklmnopqrstuv", "google AIza[redacted]"),
        ("Authorization: Bearer abc", "Authorization: [redacted]"),
        ('{"api_key": "abc", "model": "m"}', '{"api_key": "[redacted]", "model": "m"}'),
        ("token=a&secret=b&page=2", "token=[redacted]&secret=[redacted]&page=2"),
        ("password: hunter2 was wrong", "password: [redacted] was wrong"),
    ],
)
def test_credentials_inside_text_are_masked(text: str, masked: str) -> None:
    """Bearer/Basic credentials, provider keys and credential-named pairs in text are masked."""
    assert mask_text(text) == masked
    assert redacted(message=text) == {"message": masked}


@pytest.mark.parametrize(
    "text",
    [
        "every candidate of route 'chat' is suspended: primary (unavailable)",
        "task-abcdefghijklmnop",
        "circuit.opened",
        "2024-05-01T12:00:00Z",
        "the key was fine",
    ],
)
def test_plain_text_is_left_alone(text: str) -> None:
    """Text without URLs or credentials comes back unchanged."""
    assert mask_text(text) == text


# -- bodies and other values --------------------------------------------------------------


@pytest.mark.parametrize("key", ["body", "content", "json", "data", "Body"])
def test_bodies_are_never_shown(key: str) -> None:
    """Request and response bodies are replaced whole, whatever their type."""
    assert redacted(**{key: {"prompt": "hello"}}) == {key: REDACTED}
    assert redact_value(key, b"raw bytes") == REDACTED


def test_other_values_keep_their_type() -> None:
    """Names, numbers, booleans and None are left as they are, the same objects."""
    fields = {"target": "backup", "status": 503, "retry_in_s": 1.5, "failover": True, "x": None}
    assert redacted(**fields) == fields


def test_bytes_and_exceptions_are_made_safe() -> None:
    """Bytes are never shown; an exception shows its type and masked message."""
    error = httpx.ConnectError("cannot reach https://u:p@h.example/v1?key=abc")
    assert redacted(raw=b"abc", error=error) == {
        "raw": REDACTED,
        "error": "ConnectError: cannot reach https://h.example",
    }


def test_exc_info_is_left_for_structlog() -> None:
    """structlog's exc_info slot keeps its value for the exception processors."""
    assert redacted(exc_info=True) == {"exc_info": True}


def test_nested_input_is_not_modified() -> None:
    """Nested containers are rebuilt; the caller's own objects stay as they were."""
    headers = {"authorization": "Bearer abc"}
    items = ["https://u:p@h/x"]
    redacted(headers=headers, items=items)
    assert headers == {"authorization": "Bearer abc"}
    assert items == ["https://u:p@h/x"]


def test_deep_nesting_is_cut_off() -> None:
    """Containers nested beyond the walk's depth are redacted whole rather than walked."""
    value: Any = "https://u:p@h/x"
    for _ in range(50):
        value = [value]
    assert "u:p" not in repr(redacted(deep=value))


# -- the property: no secret survives -----------------------------------------------------

UNRESERVED = string.ascii_letters + string.digits + "-._~"
# Every secret starts with "Zq" and ends with "Qz", which nothing else in the
# events contains: any leaked end of a secret is seen.
SAFE_URL_PART = st.text(UNRESERVED + "!$&'()*+,;=%", min_size=1, max_size=16)
URL_SECRET = SAFE_URL_PART.map(lambda s: f"Zq{s}Qz")
TOKEN_SECRET = st.text(UNRESERVED + "+/", min_size=8, max_size=40).map(lambda s: f"Zq{s}Qz")
KEY_SECRET = st.builds(
    "{}Zq{}Qz".format,
    st.sampled_from(["sk-", "sk-proj-", "sk-ant-api03-", "xai-", "AIza"]),
    st.text(string.ascii_letters + string.digits + "_-", min_size=20, max_size=60),
)
HOSTS = st.sampled_from(["api.example.com", "127.0.0.1", "[::1]", "llm.internal:8443"])


@st.composite
def secret_urls(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A URL carrying secrets in userinfo, path, query and fragment, and those secrets."""
    user, password, segment, value, fragment = (draw(URL_SECRET) for _ in range(5))
    param = draw(st.sampled_from(["key", "q", "sig", "access_token"]))
    host = draw(HOSTS)
    scheme = draw(st.sampled_from(["http", "https", "ws", "wss"]))
    url = f"{scheme}://{user}:{password}@{host}/v1/{segment}?{param}={value}&x=1#{fragment}"
    return url, [user, password, segment, value, fragment]


@st.composite
def events(draw: st.DrawFn) -> tuple[dict[str, Any], list[str]]:
    """An event dict with secrets placed at the top, nested and inside free text."""
    url, secrets = draw(secret_urls())
    header = draw(st.sampled_from(CREDENTIAL_KEYS))
    token, key, body = draw(TOKEN_SECRET), draw(KEY_SECRET), draw(TOKEN_SECRET)
    credential = draw(st.sampled_from([token, f"Bearer {token}", f"Basic {token}"]))
    secrets += [token, key, body]
    event = {
        "event": f"POST {url} failed",
        "url": url,
        "request": {"url": httpx.URL(url), "headers": {header: credential, "accept": "*/*"}},
        header: credential,
        "headers": httpx.Headers({header: credential}),
        "raw_headers": [(header, credential)],
        "attempts": [{"note": f"retrying with {header}: {credential} and {key}"}],
        "message": f"{header}={credential}; upstream said Bearer {token} for {key} at {url}",
        "key_in_text": f"using {key} now",
        "body": body,
        "json": {"prompt": body},
        "target": "backup",
    }
    return event, secrets


@given(events())
def test_no_secret_survives_redaction(case: tuple[dict[str, Any], list[str]]) -> None:
    """Secrets in URLs, credential headers, free text and bodies never reach the redacted event."""
    event, secrets = case
    rendered = repr(redact(None, "info", event))
    for secret in secrets:
        assert secret not in rendered
    assert "Zq" not in rendered
    assert "Qz" not in rendered
    assert "'target': 'backup'" in rendered


# -- emit and observers -------------------------------------------------------------------


@pytest.mark.usefixtures("default_structlog")
def test_emit_prints_nothing_without_any_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    """With no logging configured anywhere, no event of any level reaches stdout or stderr, and emit configures nothing."""
    for event in ("upstream.failed", "circuit.opened", "all_candidates_suspended", "failover"):
        emit(event, target="a", url="https://u:p@h.example/v1?key=abc")
    assert capsys.readouterr() == ("", "")
    assert not structlog.is_configured()
    logger = logging.getLogger("sidestep")
    assert [type(h) for h in logger.handlers] == [logging.NullHandler]


@pytest.mark.usefixtures("default_structlog")
def test_stdlib_records_carry_redacted_fields(caplog: pytest.LogCaptureFixture) -> None:
    """Without structlog, events are stdlib records of logger "sidestep": a redacted "event key=value" message and the fields on record.sidestep."""
    with caplog.at_level(logging.DEBUG, logger="sidestep"):
        emit(
            "circuit.opened", target="a", url="https://u:p@h.example/v1?key=abc", authorization="x"
        )
    (record,) = caplog.records
    assert (record.name, record.levelno) == ("sidestep", logging.WARNING)
    message = record.getMessage()
    assert message.startswith("circuit.opened target=a url=https://h.example")
    assert (
        "u:p" not in message and "key=abc" not in message and "authorization=[redacted]" in message
    )
    assert record.sidestep == {  # type: ignore[attr-defined]
        "event": "circuit.opened",
        "target": "a",
        "url": "https://h.example",
        "authorization": REDACTED,
    }


@pytest.mark.parametrize(
    ("event", "level"),
    [
        ("candidate.skipped", logging.DEBUG),
        ("candidate.excluded", logging.DEBUG),
        ("failover", logging.DEBUG),
        ("upstream.failed", logging.DEBUG),
        ("circuit.half_open", logging.INFO),
        ("circuit.closed", logging.INFO),
        ("store.recovered", logging.INFO),
        ("circuit.opened", logging.WARNING),
        ("all_candidates_suspended", logging.WARNING),
        ("store.unavailable", logging.WARNING),
    ],
)
@pytest.mark.usefixtures("default_structlog")
def test_event_levels(caplog: pytest.LogCaptureFixture, event: str, level: int) -> None:
    """Per-request events are DEBUG; transitions and the store's health are INFO or WARNING."""
    with caplog.at_level(logging.DEBUG, logger="sidestep"):
        emit(event)
    assert [(r.getMessage(), r.levelno) for r in caplog.records] == [(event, level)]


@pytest.mark.usefixtures("default_structlog")
def test_nothing_is_redacted_for_a_logger_that_drops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DEBUG event that no logger or observer receives costs no redaction at all."""
    calls: list[str] = []
    monkeypatch.setattr("sidestep.logging.redact", lambda *a: calls.append("redact") or a[2])
    logging.getLogger("sidestep").setLevel(logging.INFO)
    try:
        emit("candidate.skipped", target="a", url="https://h/x")
    finally:
        logging.getLogger("sidestep").setLevel(logging.NOTSET)
    assert calls == []


def test_configured_structlog_receives_the_events_at_their_levels() -> None:
    """An application that configured structlog gets the events through it, redacted, at their levels."""
    with capture_logs() as logs:
        emit("circuit.opened", target="a", headers={"x-api-key": "k"}, retry_in_s=30.0)
        emit("failover", target="b", url="https://u:p@h/x")
    assert logs == [
        {
            "event": "circuit.opened",
            "log_level": "warning",
            "target": "a",
            "headers": {"x-api-key": REDACTED},
            "retry_in_s": 30.0,
        },
        {"event": "failover", "log_level": "debug", "target": "b", "url": "https://h"},
    ]


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Mapping[str, Any]]] = []

    def __call__(self, event: str, fields: Mapping[str, Any], /) -> None:
        self.seen.append((event, fields))


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    observer = Recorder()
    add_observer(observer)
    yield observer
    remove_observer(observer)


def test_observers_get_read_only_redacted_fields(recorder: Recorder) -> None:
    """Observers see the event name and its redacted fields, and cannot change them."""
    with capture_logs():
        emit("candidate.skipped", target="a", url="https://u:p@h/x", cookie="c")
    ((event, fields),) = recorder.seen
    assert event == "candidate.skipped"
    assert dict(fields) == {"target": "a", "url": "https://h", "cookie": REDACTED}
    with pytest.raises(TypeError):
        fields["target"] = "b"  # type: ignore[index]


def test_failing_observer_breaks_nothing(recorder: Recorder) -> None:
    """An observer that raises is ignored: emit returns, the event is logged, others still run."""

    def broken(event: str, fields: Mapping[str, Any], /) -> None:
        raise RuntimeError("metrics backend down")

    add_observer(broken)
    add_observer(recorder)  # registered twice: called after the broken one too
    try:
        with capture_logs() as logs:
            emit("failover", target="b")
    finally:
        remove_observer(broken)
    assert [e for e, _ in recorder.seen] == ["failover", "failover"]
    assert [entry["event"] for entry in logs] == ["failover"]


def test_removed_observers_are_not_called() -> None:
    """After remove_observer the observer hears nothing; removing an unknown one is harmless."""
    observer = Recorder()
    add_observer(observer)
    remove_observer(observer)
    remove_observer(observer)
    with capture_logs():
        emit("failover")
    assert observer.seen == []


def test_concurrent_registration_loses_nothing() -> None:
    """Observers added and removed from many threads at once are all accounted for."""
    observers = [Recorder() for _ in range(64)]
    barrier = threading.Barrier(len(observers))

    def register(observer: Recorder) -> None:
        barrier.wait()
        add_observer(observer)

    threads = [threading.Thread(target=register, args=(o,)) for o in observers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with capture_logs():
        emit("failover")
    assert all(len(o.seen) == 1 for o in observers)
    threads = [threading.Thread(target=remove_observer, args=(o,)) for o in observers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with capture_logs():
        emit("failover")
    assert all(len(o.seen) == 1 for o in observers)
