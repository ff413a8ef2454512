"""Tests for the configuration models, duration and size parsing, and YAML loading."""

from __future__ import annotations

import os.path
import sys
import textwrap
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from drivers import MakeDriver, route
from sidestep._common.errors import ConfigError
from sidestep._settings.config import Config, as_config, load_config
from sidestep._settings.policies import (
    BreakerPolicy,
    FailoverOverrides,
    FailoverPolicy,
    FailureRate,
    Suspensions,
    SuspensionWindow,
)
from sidestep._settings.routes import Route, Target
from sidestep._settings.values import SidestepConfigWarning, parse_duration, parse_size
from upstream import Respond, Upstream

SECRET = "sk-live-SECRET123"

DESIGN_EXAMPLE = """\
breaker:
  failure_threshold: 3        # consecutive availability failures that open a scope (> 0)
  cooldown: 30s               # first open window (> 0)
  max_cooldown: 10m           # cap for growth (>= cooldown)
  backoff_multiplier: 2.0     # > 1
  slow_failure: 1s            # >= 0
  half_open_probes: 1         # > 0
  failure_rate:               # optional
    threshold: 0.5            # 0 < threshold <= 1
    window: 30s
    minimum_calls: 20         # no decision on fewer results than this
  enforce: true               # false = observe only
failover:
  max_total_attempts: 4
  max_attempts_per_target: 1
  max_retry_wait: 5s
  total_timeout: null
  first_byte_timeout: null
  retry_ambiguous: false
  on_context_overflow: true
  on_all_suspended: raise     # raise | respond
suspensions:
  rate_limited:       {initial: 1s,  max: 1m}
  quota_exhausted:    {initial: 15m, max: 6h}
  invalid_credential: {initial: 10m, max: 6h}
routes:
  - name: chat
    match: [http://llm.internal/v1]
    commit: first_byte
    max_buffered_bytes: 16MiB
    failover: {retry_ambiguous: true, first_byte_timeout: 10s}
    targets:
      - name: primary
        url: https://api.primary.example/v1
      - name: backup
        url: https://api.backup.example/v1
        headers: {authorization: "Bearer ${BACKUP_API_KEY}"}
        json: {model: backup-model-large}
"""

MINIMAL_ROUTE = """\
routes:
  - name: chat
    targets:
      - name: primary
        url: https://api.primary.example/v1
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sidestep.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load_error(tmp_path: Path, text: str) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return caught.value


def everything_shown(exc: BaseException) -> str:
    return str(exc) + repr(exc) + "".join(traceback.format_exception(exc))


def target(**fields: Any) -> dict[str, Any]:
    return {"name": "primary", "url": "https://api.primary.example/v1", **fields}


def one_route(**fields: Any) -> dict[str, Any]:
    return {"routes": [{"name": "chat", "targets": [target()], **fields}]}


# --- defaults and the design example ------------------------------------------------------


def test_defaults_match_the_design() -> None:
    """An empty configuration has the defaults that DESIGN §4 documents."""
    config = Config()
    assert config.breaker == BreakerPolicy(
        failure_threshold=3,
        cooldown=30.0,
        max_cooldown=600.0,
        backoff_multiplier=2.0,
        slow_failure=1.0,
        half_open_probes=1,
        failure_rate=None,
        enforce=True,
    )
    assert config.failover == FailoverPolicy(
        max_total_attempts=4,
        max_attempts_per_target=1,
        max_retry_wait=5.0,
        total_timeout=None,
        first_byte_timeout=None,
        retry_ambiguous=False,
        on_context_overflow=True,
        on_all_suspended="raise",
    )
    assert config.suspensions.rate_limited == SuspensionWindow(initial=1.0, max=60.0)
    assert config.suspensions.quota_exhausted == SuspensionWindow(initial=900.0, max=21600.0)
    assert config.suspensions.invalid_credential == SuspensionWindow(initial=600.0, max=21600.0)
    assert config.routes == []
    assert config.classifier is None


def test_route_and_failure_rate_defaults() -> None:
    """A route and a failure-rate rule left mostly unset take the documented defaults."""
    route = Route(name="chat", targets=[Target(name="a", url="https://a.example")])
    assert route.match == []
    assert route.commit == "first_token"
    assert route.max_buffered_bytes == 16 * 1024 * 1024
    assert route.avoid_rate_limits is False
    assert route.failover == FailoverOverrides()
    assert route.targets[0].headers == {}
    assert route.targets[0].json_fields == {}
    assert route.targets[0].inherit_credentials is False
    rate = FailureRate(threshold=0.5)
    assert (rate.window, rate.minimum_calls) == (30.0, 20)


def test_design_example_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The full example of DESIGN §4 loads, with durations in seconds and sizes in bytes."""
    monkeypatch.setenv("BACKUP_API_KEY", "k-123")
    config = load_config(write(tmp_path, DESIGN_EXAMPLE))

    breaker = config.breaker
    assert breaker.failure_threshold == 3
    assert breaker.cooldown == 30.0
    assert breaker.max_cooldown == 600.0
    assert breaker.backoff_multiplier == 2.0
    assert breaker.slow_failure == 1.0
    assert breaker.half_open_probes == 1
    assert breaker.failure_rate == FailureRate(threshold=0.5, window=30.0, minimum_calls=20)
    assert breaker.enforce is True

    assert config.failover == FailoverPolicy()
    assert config.suspensions.rate_limited == SuspensionWindow(initial=1.0, max=60.0)
    assert config.suspensions.quota_exhausted == SuspensionWindow(initial=900.0, max=21600.0)
    assert config.suspensions.invalid_credential == SuspensionWindow(initial=600.0, max=21600.0)

    (route,) = config.routes
    assert route.name == "chat"
    assert route.match == ["http://llm.internal/v1"]
    assert route.commit == "first_byte"
    assert route.max_buffered_bytes == 16777216
    assert route.failover == FailoverOverrides(retry_ambiguous=True, first_byte_timeout=10.0)
    primary, backup = route.targets
    assert (primary.name, primary.url) == ("primary", "https://api.primary.example/v1")
    assert primary.headers == {}
    assert (backup.name, backup.url) == ("backup", "https://api.backup.example/v1")
    assert backup.headers == {"authorization": "Bearer k-123"}
    assert backup.json_fields == {"model": "backup-model-large"}
    assert backup.inherit_credentials is False

    policy = route.policy(config.failover)
    assert policy.retry_ambiguous is True
    assert policy.first_byte_timeout == 10.0
    assert policy.max_total_attempts == 4


def test_empty_file_means_every_default(tmp_path: Path) -> None:
    """A file holding only comments loads as the default configuration."""
    assert load_config(write(tmp_path, "# nothing configured yet\n")) == Config()


def test_load_config_accepts_a_str_path(tmp_path: Path) -> None:
    """load_config takes a plain string path as well as a Path."""
    assert load_config(str(write(tmp_path, MINIMAL_ROUTE))).routes[0].name == "chat"


# --- durations and sizes ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (30, 30.0),
        (1.5, 1.5),
        (0, 0.0),
        ("30", 30.0),
        ("250ms", 0.25),
        ("30s", 30.0),
        ("1.5s", 1.5),
        (".5s", 0.5),
        ("5m", 300.0),
        ("6h", 21600.0),
        ("1d", 86400.0),
        (" 10 s ", 10.0),
        (timedelta(minutes=2), 120.0),
    ],
)
def test_parse_duration_accepts(value: object, seconds: float) -> None:
    """Numbers are seconds; strings take ms, s, m, h or d; timedeltas convert."""
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    "value",
    [
        True,
        False,
        -1,
        -0.5,
        "-5s",
        "",
        "s",
        "soon",
        "5x",
        "5 min",
        "1h30m",
        "1e3s",
        "5S",
        float("nan"),
        float("inf"),
        10**400,
        "9" * 400,
        None,
        [30],
        timedelta(seconds=-1),
    ],
)
def test_parse_duration_refuses(value: object) -> None:
    """Booleans, negatives, non-finite numbers and anything unparseable are refused."""
    with pytest.raises(ValueError, match="duration"):
        parse_duration(value)


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (1000, 1000),
        (0, 0),
        ("1000", 1000),
        ("64 B", 64),
        ("512KiB", 524288),
        ("16MiB", 16777216),
        ("1GiB", 1073741824),
        ("2mib", 2097152),
        ("1.5KiB", 1536),
        ("10KB", 10_000),
        ("10MB", 10_000_000),
        ("1GB", 1_000_000_000),
    ],
)
def test_parse_size_accepts(value: object, size: int) -> None:
    """Sizes are bytes, with binary (KiB, MiB, GiB) or decimal (KB, MB, GB) units."""
    assert parse_size(value) == size


@pytest.mark.parametrize(
    "value", [True, -1, "-1KiB", "", "lots", "16 MiBs", "1.5B", "0.1KB5", 1.5, None, ["1MiB"]]
)
def test_parse_size_refuses(value: object) -> None:
    """Booleans, negatives, fractions of a byte and garbage are refused."""
    with pytest.raises(ValueError, match="size"):
        parse_size(value)


def test_durations_and_sizes_are_normalised_in_models() -> None:
    """Models store durations as float seconds and sizes as int bytes."""
    breaker = BreakerPolicy(cooldown="250ms", max_cooldown="1h")
    assert (breaker.cooldown, breaker.max_cooldown) == (0.25, 3600.0)
    route = Route(
        name="r", max_buffered_bytes="1MiB", targets=[Target(name="a", url="https://a.example")]
    )
    assert route.max_buffered_bytes == 1048576


# --- URLs, names, headers -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "normalised"),
    [
        ("https://api.example.com/v1", "https://api.example.com/v1"),
        ("HTTPS://API.Example.COM/v1/", "https://api.example.com/v1"),
        ("https://api.example.com:443/", "https://api.example.com"),
        ("http://api.example.com:80/v1", "http://api.example.com/v1"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
        ("http://[::1]:8080/x", "http://[::1]:8080/x"),
        ("https://user:pw@api.example.com/v1", "https://user:pw@api.example.com/v1"),
    ],
)
def test_target_url_is_normalised(url: str, normalised: str) -> None:
    """Scheme and host are lower-cased, default ports and trailing slashes dropped."""
    assert Target(name="a", url=url).url == normalised


@pytest.mark.parametrize(
    "url",
    [
        "api.example.com/v1",
        "/v1",
        "ftp://files.example.com",
        "https://",
        "https:///v1",
        "https://api.example.com/v1?key=1",
        "https://api.example.com/v1?",
        "https://api.example.com/v1#top",
        "https://api.example.com:99999",
        "https://api.example.com:port",
        "https://api example.com",
        "https://[::1",
    ],
)
def test_target_url_must_be_absolute_http(url: str) -> None:
    """A target URL must be an absolute http(s) URL with a host, without query or fragment."""
    with pytest.raises(ValidationError, match="url"):
        Target(name="a", url=url)


def test_match_prefixes_are_normalised_like_target_urls() -> None:
    """Route match prefixes are validated and normalised as target URLs are."""
    route = Route(name="r", match=["HTTP://LLM.internal/v1/"], targets=[target()])
    assert route.match == ["http://llm.internal/v1"]
    with pytest.raises(ValidationError, match=r"match\.0"):
        Route(name="r", match=["llm.internal"], targets=[target()])


@pytest.mark.parametrize("name", ["", " chat", "chat ", "\tchat"])
def test_names_must_be_non_empty_and_unpadded(name: str) -> None:
    """Route and target names must be non-empty with no surrounding whitespace."""
    with pytest.raises(ValidationError, match="name"):
        Target(name=name, url="https://a.example")
    with pytest.raises(ValidationError, match="name"):
        Route(name=name, targets=[target()])


def test_header_names_are_lower_cased() -> None:
    """Header names are stored lower-cased; values are kept as given."""
    t = Target(name="a", url="https://a.example", headers={"X-Api-Key": "v", "Accept": "A/B"})
    assert t.headers == {"x-api-key": "v", "accept": "A/B"}


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({"bad name": "v"}, "not a valid HTTP header name"),
        ({"x:y": "v"}, "not a valid HTTP header name"),
        ({"": "v"}, "not a valid HTTP header name"),
        ({"x-a": "v", "X-A": "w"}, "given twice"),
        ({"x-a": 3}, "must be a string"),
        ({"x-a": "v\r\nx-b: w"}, "line break"),
        ({"x-a": "café"}, "not ASCII"),
        (["authorization: v"], "must be a mapping"),
    ],
)
def test_bad_headers_are_refused(headers: object, reason: str) -> None:
    """Header names must be tokens (case-insensitively unique); values single-line ASCII
    strings (a value outside ASCII was accepted, then every request to the target raised
    `UnicodeEncodeError` when it was built)."""
    with pytest.raises(ValidationError, match=reason):
        Target(name="a", url="https://a.example", headers=headers)


# A header each request makes itself, and why a target may not set it.
FRAMING = "framing headers are set from the body"
HOP_BY_HOP = "hop-by-hop headers belong to one connection"
PROXY_CREDENTIAL = "a proxy's credentials go in the proxy's URL"
REFUSED_HEADERS = {
    "Content-Length": FRAMING,
    "Transfer-Encoding": FRAMING,
    "Connection": HOP_BY_HOP,
    "Keep-Alive": HOP_BY_HOP,
    "Proxy-Connection": HOP_BY_HOP,
    "TE": HOP_BY_HOP,
    "Trailer": HOP_BY_HOP,
    "Upgrade": HOP_BY_HOP,
    "Proxy-Authorization": PROXY_CREDENTIAL,
}
SPELLINGS = [
    spelled
    for name in REFUSED_HEADERS
    for spelled in dict.fromkeys((name, name.lower(), name.upper(), name.swapcase()))
]


@pytest.mark.parametrize("name", SPELLINGS)
def test_a_header_each_request_makes_itself_is_refused_in_any_case(name: str) -> None:
    """The framing headers, the hop-by-hop headers and Proxy-Authorization, however
    spelled, are refused on a target with the header's name and why, never its value: a
    configured one went out in place of or beside the request's own (a wrong Content-Length
    breaks the framing), or, a proxy's credential, to the upstream itself."""
    with pytest.raises(ValidationError) as caught:
        Target(name="a", url="https://a.example", headers={"accept": "x", name: SECRET})
    shown = everything_shown(caught.value)
    assert f"header {name!r} cannot be set by a target: " in shown
    assert {n.lower(): why for n, why in REFUSED_HEADERS.items()}[name.lower()] in shown
    assert SECRET not in shown


def test_headers_near_a_refused_name_are_accepted() -> None:
    """Only the exact names are refused: a header that merely contains one (X-Forwarded-Host,
    Content-Type, TE-like prefixes, Upgrade-Insecure-Requests) is an ordinary header."""
    names = ["X-Forwarded-Host", "Content-Type", "Tes", "Upgrade-Insecure-Requests", "X-Host"]
    t = Target(name="a", url="https://a.example", headers=dict.fromkeys(names, "v"))
    assert list(t.headers) == [n.lower() for n in names]


@pytest.mark.parametrize("name", REFUSED_HEADERS)
def test_every_way_a_configuration_arrives_refuses_the_same_headers(
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A Python mapping (as_config, install), a YAML file whose value comes from the
    environment (load_config), the file SIDESTEP_CONFIG names (sidestep run) and sidestep
    doctor all refuse the header, naming it and its key path, never the value; the run's
    command is never started."""
    from sidestep import install, uninstall
    from sidestep._ops.cli import main

    key = "routes[0].targets[0].headers (route 'chat', target 'primary')"
    why = f"header {name!r} cannot be set by a target: {REFUSED_HEADERS[name]}"
    data = one_route(targets=[target(headers={name: SECRET})])
    with pytest.raises(ConfigError) as caught:
        as_config(data)
    assert str(caught.value).startswith(f"<mapping>: {key}: {why}")
    assert SECRET not in everything_shown(caught.value)
    with pytest.raises(ConfigError) as caught:
        install(data)
    uninstall()
    assert why in str(caught.value) and SECRET not in everything_shown(caught.value)

    monkeypatch.setenv("TARGET_HEADER_VALUE", SECRET)
    path = write(
        tmp_path,
        f"""\
        routes:
          - name: chat
            targets:
              - name: primary
                url: https://api.primary.example/v1
                headers: {{{name}: "${{TARGET_HEADER_VALUE}}"}}
        """,
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: {key}: {why}")
    assert SECRET not in everything_shown(caught.value)

    started = tmp_path / "started"
    monkeypatch.setenv("SIDESTEP_CONFIG", str(path))
    command = ["--", sys.executable, "-c", f"open({str(started)!r}, 'w')"]
    assert main(["run", *command]) == 2
    assert not started.exists()
    assert main(["doctor", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count(why) == 2 and key in err
    assert SECRET not in out + err


HTTPX_DEFAULTS = ("accept-encoding", "connection", "user-agent")  # every client request's


def test_a_targets_allowed_headers_are_sent_exactly_once(
    make: MakeDriver, a: Upstream, b: Upstream
) -> None:
    """Through each transport, to a first target and to the one it fails over to, a
    target's headers replace the caller's of the same names, each line sent once, beside
    one Host made from the target's URL and one Content-Length made from the body."""
    a.behaviour = lambda _: Respond(503, "down")
    own = {
        "a": {"X-Api-Key": "key-a", "Accept": "application/a", "X-Tag": "a"},
        "b": {"x-api-key": "key-b", "ACCEPT": "application/b", "x-tag": "b"},
    }
    config = route(
        ("a", a.url + "/v1"),
        ("b", b.url + "/v1"),
        targets={name: {"headers": headers} for name, headers in own.items()},
    )
    caller = {"x-api-key": "caller-key", "accept": "caller/accept", "x-caller": "kept"}
    body = b'{"model": "m"}'
    r = make(config).post(a.url + "/v1/chat", headers=caller, content=body)
    assert (r.status, r.text) == (200, "b")
    for server, name in ((a, "a"), (b, "b")):
        (seen,) = server.seen
        sent = [line for line in seen.raw if line[0] not in HTTPX_DEFAULTS]
        expected = {
            "host": f"127.0.0.1:{server.port}",
            "content-length": str(len(body)),
            "x-caller": "kept",
            **{n.lower(): v for n, v in own[name].items()},
        }
        assert sorted(sent) == sorted(expected.items()), name
        assert seen.body == body


def test_json_fields_take_the_json_key() -> None:
    """A target's JSON body fields are set with the key `json`, or by field name in Python."""
    by_alias = Target.model_validate({"name": "a", "url": "https://a.example", "json": {"m": 1}})
    by_name = Target(name="a", url="https://a.example", json_fields={"m": 1})
    assert by_alias.json_fields == by_name.json_fields == {"m": 1}


# --- validation rules through load_config -------------------------------------------------


@pytest.mark.parametrize(
    ("text", "path", "reason"),
    [
        (
            "breaker: {failure_threshold: 0}",
            "breaker.failure_threshold",
            "greater than or equal to 1",
        ),
        (
            "breaker: {half_open_probes: 0}",
            "breaker.half_open_probes",
            "greater than or equal to 1",
        ),
        ("breaker: {failure_threshold: true}", "breaker.failure_threshold", "not true or false"),
        (
            "failover: {max_total_attempts: 0}",
            "failover.max_total_attempts",
            "greater than or equal to 1",
        ),
        ("failover: {max_attempts_per_target: -1}", "failover.max_attempts_per_target", "1"),
        ("breaker: {cooldown: 0}", "breaker.cooldown", "greater than 0"),
        ("breaker: {cooldown: -1s}", "breaker.cooldown", "cannot be negative"),
        ("breaker: {cooldown: 1m, max_cooldown: 30s}", "breaker", "max_cooldown"),
        ("breaker: {backoff_multiplier: 1}", "breaker.backoff_multiplier", "greater than 1"),
        ("breaker: {backoff_multiplier: 0.5}", "breaker.backoff_multiplier", "greater than 1"),
        ("breaker: {slow_failure: -1s}", "breaker.slow_failure", "cannot be negative"),
        ("breaker: {slow_failure: soon}", "breaker.slow_failure", "a duration is"),
        ("breaker: {failure_rate: {threshold: 0}}", "breaker.failure_rate.threshold", "than 0"),
        ("breaker: {failure_rate: {threshold: 1.5}}", "breaker.failure_rate.threshold", "1"),
        ("breaker: {failure_rate: {}}", "breaker.failure_rate.threshold", "missing"),
        (
            "breaker: {failure_rate: {threshold: 0.5, minimum_calls: 0}}",
            "breaker.failure_rate.minimum_calls",
            "greater than or equal to 1",
        ),
        ("breaker: {cooldown: soon}", "breaker.cooldown", "a duration is"),
        ("failover: {max_retry_wait: -2}", "failover.max_retry_wait", "negative"),
        ("failover: {total_timeout: 0}", "failover.total_timeout", "greater than 0"),
        ("failover: {on_all_suspended: ignore}", "failover.on_all_suspended", "'respond'"),
        (
            "suspensions: {rate_limited: {initial: 1m, max: 1s}}",
            "suspensions.rate_limited",
            "max must not be shorter than initial",
        ),
        ("suspensions: {rate_limited: {initial: 1s}}", "suspensions.rate_limited.max", "missing"),
        ("suspensions: {banned: {initial: 1s, max: 1m}}", "suspensions.banned", "unknown key"),
        ("breaker: {cooldwn: 5s}", "breaker.cooldwn", "unknown key"),
        ("retries: 3", "retries", "unknown key"),
        ("routes: [{name: chat, targets: []}]", "routes[0].targets (route 'chat')", "one target"),
        ("routes: [{name: chat}]", "routes[0].targets (route 'chat')", "missing"),
        (
            "routes: [{name: chat, commit: later, targets: [{name: a, url: 'https://a.example'}]}]",
            "routes[0].commit (route 'chat')",
            "'first_byte' or 'complete'",
        ),
        (
            "routes: [{name: chat, max_buffered_bytes: lots,"
            " targets: [{name: a, url: 'https://a.example'}]}]",
            "routes[0].max_buffered_bytes (route 'chat')",
            "a size is",
        ),
        (
            "routes: [{name: chat, avoid_rate_limits: sometimes,"
            " targets: [{name: a, url: 'https://a.example'}]}]",
            "routes[0].avoid_rate_limits (route 'chat')",
            "valid boolean",
        ),
        (
            "routes: [{name: chat, max_buffered_bytes: 0,"
            " targets: [{name: a, url: 'https://a.example'}]}]",
            "routes[0].max_buffered_bytes (route 'chat')",
            "greater than 0",
        ),
        (
            "routes: [{name: chat, match: [llm.internal],"
            " targets: [{name: a, url: 'https://a.example'}]}]",
            "routes[0].match[0] (route 'chat')",
            "absolute http or https URL",
        ),
        (
            "routes: [{name: chat, failover: {max_total_attempts: 0},"
            " targets: [{name: a, url: 'https://a.example'}]}]",
            "routes[0].failover.max_total_attempts (route 'chat')",
            "greater than or equal to 1",
        ),
        (
            "routes: [{name: chat, targets: [{name: a, url: 'https://a.example'}]},"
            " {name: chat, targets: [{name: b, url: 'https://b.example'}]}]",
            "routes",
            "route names must be unique: 'chat'",
        ),
        (
            "routes: [{name: chat, targets: [{name: a, url: 'https://a.example'},"
            " {name: a, url: 'https://b.example'}]}]",
            "routes[0].targets (route 'chat')",
            "target names must be unique: 'a'",
        ),
        (
            "routes: [{name: chat, targets: [{name: a, url: 'https://a.example'},"
            " {name: b, url: 'ftp://b.example'}]}]",
            "routes[0].targets[1].url (route 'chat', target 'b')",
            "absolute http or https URL",
        ),
        (
            "routes: [{name: chat, targets: [{name: a, url: 'api.example.com/v1'}]}]",
            "routes[0].targets[0].url (route 'chat', target 'a')",
            "absolute http or https URL",
        ),
        (
            "routes: [{name: chat, targets: [{name: a, url: 'https://a.example', api_key: x}]}]",
            "routes[0].targets[0].api_key (route 'chat', target 'a')",
            "unknown key",
        ),
        (
            "routes: [{name: ' chat', targets: [{name: a, url: 'https://a.example'}]}]",
            "routes[0].name:",
            "without leading or trailing whitespace",
        ),
        (
            "routes: [{name: chat, targets: [{name: a, url: 'https://a.example',"
            " headers: {'x y': v}}]}]",
            "routes[0].targets[0].headers (route 'chat', target 'a')",
            "not a valid HTTP header name",
        ),
        ("classifier: no_such_module_here:classify", "classifier", "no_such_module_here"),
    ],
)
def test_invalid_settings_name_file_key_path_and_reason(
    tmp_path: Path, text: str, path: str, reason: str
) -> None:
    """Each invalid setting is a ConfigError naming the file, the key path and the reason."""
    error = load_error(tmp_path, text + "\n")
    message = str(error)
    assert isinstance(error, ValueError)
    assert message.startswith(f"{tmp_path / 'sidestep.yaml'}: ")
    assert path in message
    assert reason in message


def test_every_invalid_setting_is_listed(tmp_path: Path) -> None:
    """Several invalid settings in one file are reported together, one per line."""
    message = str(load_error(tmp_path, "breaker: {cooldown: 0, half_open_probes: 0}\nx: 1\n"))
    assert "3 invalid settings" in message
    lines = message.splitlines()[1:]
    assert [line.split(":")[0].strip() for line in lines] == [
        "breaker.cooldown",
        "breaker.half_open_probes",
        "x",
    ]


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    """A file that does not exist is a ConfigError naming the file."""
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match=r"absent\.yaml: cannot read the file"):
        load_config(path)


def test_directory_is_a_config_error(tmp_path: Path) -> None:
    """A path that is a directory is a ConfigError, not an OSError."""
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_config(tmp_path)


def test_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    """A file that is not UTF-8 text is a ConfigError."""
    path = tmp_path / "sidestep.yaml"
    path.write_bytes(b"breaker:\n  cooldown: \xff\xfe\n")
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        load_config(path)


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    """A YAML syntax error names the file and the line, without quoting the line."""
    message = str(load_error(tmp_path, "breaker:\n  cooldown: 30s\n  oops: [1, 2\n"))
    assert message.startswith(f"{tmp_path / 'sidestep.yaml'}: invalid YAML at line ")
    assert "oops" not in message


def test_duplicate_yaml_key_is_refused(tmp_path: Path) -> None:
    """A key given twice in one mapping is an error at its line, not a silent override."""
    message = str(load_error(tmp_path, "breaker:\n  cooldown: 30s\n  cooldown: 1s\n"))
    assert "line 3" in message
    assert "duplicate key" in message


def test_yaml_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    """A key set next to a `<<` merge overrides the merged value without counting as a repeat."""
    text = """\
    suspensions:
      rate_limited: &window {initial: 1s, max: 1m}
      quota_exhausted: {<<: *window, initial: 15m, max: 6h}
    """
    quota = load_config(write(tmp_path, text)).suspensions.quota_exhausted
    assert quota == SuspensionWindow(initial=900.0, max=21600.0)


@pytest.mark.parametrize(
    "text",
    [
        "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(
            f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n"
            for p, n in zip("abcdefgh", "bcdefghi", strict=True)
        ),
        "a: &a [*a]\n",
    ],
    ids=["billion-laughs", "cycle"],
)
def test_a_document_that_aliases_expand_past_any_configuration_is_refused(
    tmp_path: Path, text: str
) -> None:
    """Aliases that stand for a billion values (or a list holding itself) are refused at once, rather than walked until memory or patience runs out."""
    message = str(load_error(tmp_path, text))
    assert "more than 100,000 values once its aliases are expanded" in message


@pytest.mark.parametrize(("text", "kind"), [("- a\n- b\n", "list"), ("just text\n", "str")])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str, kind: str) -> None:
    """A document whose top level is not a mapping is refused, naming its type only."""
    message = str(load_error(tmp_path, text))
    assert "top level must be a mapping" in message
    assert message.endswith(f"not {kind}")


# --- environment interpolation ------------------------------------------------------------


def test_env_reference_inside_a_string(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`${NAME}` is replaced inside a longer string and as a whole value."""
    monkeypatch.setenv("API_KEY", "k-1")
    monkeypatch.setenv("PRIMARY_URL", "https://api.primary.example/v2")
    text = """\
    routes:
      - name: chat
        targets:
          - name: primary
            url: ${PRIMARY_URL}
            headers: {authorization: "Bearer ${API_KEY}", x-both: "${API_KEY}-${API_KEY}"}
    """
    t = load_config(write(tmp_path, text)).routes[0].targets[0]
    assert t.url == "https://api.primary.example/v2"
    assert t.headers == {"authorization": "Bearer k-1", "x-both": "k-1-k-1"}


def test_env_values_are_validated_like_literals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A substituted string is read as the field's type: counts, durations and booleans."""
    monkeypatch.setenv("THRESHOLD", "5")
    monkeypatch.setenv("COOLDOWN", "2m")
    monkeypatch.setenv("ENFORCE", "false")
    text = "breaker: {failure_threshold: '${THRESHOLD}', cooldown: '${COOLDOWN}',"
    text += " enforce: '${ENFORCE}'}"
    breaker = load_config(write(tmp_path, text)).breaker
    assert (breaker.failure_threshold, breaker.cooldown, breaker.enforce) == (5, 120.0, False)


def test_env_value_cannot_change_the_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value holding YAML syntax stays one string: substitution follows parsing."""
    sneaky = 'v"\n    inherit_credentials: true\nbreaker: {enforce: false} # ${X}'
    monkeypatch.setenv("SNEAKY", sneaky)
    text = MINIMAL_ROUTE + "        json: {note: '${SNEAKY}'}\n"
    config = load_config(write(tmp_path, text))
    t = config.routes[0].targets[0]
    assert t.json_fields == {"note": sneaky}
    assert t.inherit_credentials is False
    assert config.breaker.enforce is True


def test_dollar_dollar_escapes_a_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`$${NAME}` stands for a literal `${NAME}` and is not looked up."""
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    monkeypatch.setenv("SET", "yes")
    text = MINIMAL_ROUTE + "        headers: {x-t: 'a $${NOT_SET_ANYWHERE} b ${SET} $$ $x'}\n"
    t = load_config(write(tmp_path, text)).routes[0].targets[0]
    assert t.headers == {"x-t": "a ${NOT_SET_ANYWHERE} b yes $$ $x"}


def test_keys_and_non_strings_are_not_interpolated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only string values are substituted: keys and other scalars are kept as written."""
    monkeypatch.setenv("KEY", "model")
    text = MINIMAL_ROUTE + "        json: {'${KEY}': 1, n: 2, ok: true}\n"
    t = load_config(write(tmp_path, text)).routes[0].targets[0]
    assert t.json_fields == {"${KEY}": 1, "n": 2, "ok": True}


def test_missing_env_var_names_variable_and_key_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unset variable is a ConfigError naming the variable and where it is used."""
    monkeypatch.delenv("BACKUP_API_KEY", raising=False)
    message = str(load_error(tmp_path, DESIGN_EXAMPLE))
    assert message == (
        f"{tmp_path / 'sidestep.yaml'}: routes[0].targets[1].headers.authorization"
        " (route 'chat', target 'backup'): environment variable 'BACKUP_API_KEY' is not set"
    )


@pytest.mark.parametrize(
    ("value", "reason"),
    [("'Bearer ${KEY'", "is not closed"), ("'${}'", "must name a variable"), ("'${1A}'", "name")],
)
def test_malformed_env_reference_is_refused(tmp_path: Path, value: str, reason: str) -> None:
    """An unterminated or nameless `${...}` is an error, not a literal sent upstream."""
    message = str(load_error(tmp_path, f"routes: [{{name: chat, notes: {value}}}]\n"))
    assert "routes[0].notes (route 'chat')" in message
    assert reason in message


# --- secrets are never echoed -------------------------------------------------------------


def in_target(fields: str, route: str = "") -> str:
    return f"routes: [{{name: chat, {route}targets: [{{name: a, {fields}}}]}}]"


URL = "url: 'https://a.example'"

# "<SECRET>" stands for the secret; ${TOKEN} is set to it
SECRET_DOCUMENTS = {
    "header value of the wrong type": in_target(f"{URL}, headers: {{authorization: [<SECRET>]}}"),
    "header value with a line break": in_target(f'{URL}, headers: {{x-k: "<SECRET>\\r\\nx: y"}}'),
    "header value outside ascii": in_target(f'{URL}, headers: {{x-k: "<SECRET>é"}}'),
    "header name pasted with its value": in_target(f'{URL}, headers: {{"Bearer <SECRET>": x}}'),
    "header value that is a mapping": in_target(f"{URL}, headers: {{x-k: {{t: <SECRET>}}}}"),
    "headers given as a string": in_target(f"{URL}, headers: 'Authorization: <SECRET>'"),
    "url with a scheme that is not http": in_target("url: 'ftp://user:<SECRET>@a.example/'"),
    "url with a bad port": in_target("url: 'https://u:<SECRET>@a.example:x/'"),
    "url with the secret as its port": in_target("url: 'https://a.example:<SECRET>/v1'"),
    "url with a query": in_target("url: 'https://a.example/v1?key=<SECRET>'"),
    "url that is not a string": in_target("url: [<SECRET>]"),
    "match prefix": in_target(URL, route="match: ['<SECRET>'], "),
    "size": in_target(URL, route="max_buffered_bytes: <SECRET>, "),
    "commit": in_target(URL, route="commit: <SECRET>, "),
    "name with padding": in_target(URL).replace("name: chat", "name: ' <SECRET>'"),
    "name of the wrong type": in_target(URL).replace("name: chat", "name: [<SECRET>]"),
    "unknown key in a target": in_target(f"{URL}, token: <SECRET>"),
    "duration": "breaker: {cooldown: <SECRET>}",
    "count": "failover: {max_total_attempts: <SECRET>}",
    "ratio": "breaker: {failure_rate: {threshold: <SECRET>}}",
    "boolean": "breaker: {enforce: <SECRET>}",
    "literal": "failover: {on_all_suspended: <SECRET>}",
    "unknown key at the top": "api_key: <SECRET>",
    "section given as a string": "breaker: <SECRET>",
    "routes given as a mapping": "routes: {chat: <SECRET>}",
    "top level scalar": "<SECRET>",
    "yaml error on the secret's line": 'routes:\n  - name: chat\n    x: {a: "Bearer <SECRET>}\n',
    "yaml mapping error on the secret's line": "breaker:\n  cooldown: <SECRET>: 30s\n",
    "yaml duplicate key on the secret's line": "breaker:\n  cooldown: 1s\n  cooldown: <SECRET>\n",
    "yaml unknown tag": "breaker: !<SECRET> 30s",
    "yaml undefined alias": "breaker: *<SECRET>",
    "yaml tab on the secret's line": "breaker:\n\tcooldown: <SECRET>\n",
    "env secret into a duration": "breaker: {cooldown: '${TOKEN}'}",
    "env secret into a url": in_target("url: 'https://a.example/?k=${TOKEN}'"),
    "env secret into a bad header": in_target(URL + ", headers: {'bad name': 'B ${TOKEN}'}"),
    "env secret into a refused header": in_target(URL + ", headers: {Connection: '${TOKEN}'}"),
    "refused header": in_target(f"{URL}, headers: {{Transfer-Encoding: <SECRET>}}"),
    "env secret into an unknown key": "token: '${TOKEN}'",
    "env secret next to a missing variable": "x: '${TOKEN} ${NOT_SET_ANYWHERE}'",
}


@pytest.mark.parametrize("text", SECRET_DOCUMENTS.values(), ids=SECRET_DOCUMENTS.keys())
def test_secret_in_a_yaml_file_is_never_echoed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    """Whatever invalid field holds a secret, the error's str, repr and traceback omit it."""
    monkeypatch.setenv("TOKEN", SECRET)
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    error = load_error(tmp_path, text.replace("<SECRET>", SECRET))
    assert str(error).startswith(str(tmp_path / "sidestep.yaml"))
    assert "SECRET123" not in everything_shown(error)


SECRET_MAPPINGS = {
    "header value": one_route(targets=[target(headers={"authorization": [SECRET]})]),
    "header value with a newline": one_route(targets=[target(headers={"x-k": f"{SECRET}\n"})]),
    "header name": one_route(targets=[target(headers={f"Bearer {SECRET}": "x"})]),
    "refused header": one_route(targets=[target(headers={"Content-Length": SECRET})]),
    "url": one_route(targets=[target(url=f"https://u:{SECRET}@a.example:bad/v1")]),
    "url object": one_route(targets=[target(url=object.__new__(type(SECRET, (), {})))]),
    "duration": {"breaker": {"cooldown": SECRET}},
    "unknown key": {"breaker": {"password": SECRET}},
    "json key of the wrong type": one_route(targets=[target(json={1: SECRET}, x=SECRET)]),
    "suspension window": {"suspensions": {"rate_limited": {"initial": SECRET, "max": SECRET}}},
}


@pytest.mark.parametrize("data", SECRET_MAPPINGS.values(), ids=SECRET_MAPPINGS.keys())
def test_secret_in_a_mapping_is_never_echoed(data: dict[str, Any]) -> None:
    """as_config errors never show a secret, whichever field holds it."""
    with pytest.raises(ConfigError, match=r"^<mapping>: ") as caught:
        as_config(data)
    assert SECRET not in everything_shown(caught.value)


class _SecretRepr:
    def __repr__(self) -> str:
        return SECRET

    __str__ = __repr__


@pytest.mark.parametrize(
    "build",
    [
        lambda: Target(name="a", url="https://a.example", headers={"authorization": _SecretRepr()}),
        lambda: Target(name="a", url=f"https://u:{SECRET}@a.example:x"),
        lambda: Target(name="a", url=f"https://a.example:{SECRET}"),
        lambda: Target(name="a", url=_SecretRepr()),
        lambda: Target(name="a", url="https://a.example", extra=SECRET),
        lambda: BreakerPolicy(cooldown=SECRET),
        lambda: FailoverOverrides(max_total_attempts=_SecretRepr()),
        lambda: Config(breaker={"enforce": SECRET}),
    ],
)
def test_validation_error_in_python_never_echoes_a_secret(build: Any) -> None:
    """Models built in Python raise ValidationErrors that hide every input value."""
    with pytest.raises(ValidationError) as caught:
        build()
    assert SECRET not in everything_shown(caught.value)


def test_reprs_hide_header_values_and_url_details() -> None:
    """Reprs and strs show target names and origins, never header values, userinfo or paths."""
    t = Target(
        name="backup",
        url=f"https://user:{SECRET}@api.backup.example/v1/private",
        headers={"X-Api-Key": SECRET},
        json={"model": "m"},
    )
    config = Config(
        routes=[Route(name="chat", match=[f"http://u:{SECRET}@llm.internal/v1"], targets=[t])],
        classifier=_SecretRepr,
    )
    for shown in (repr(t), str(t), repr(config), str(config), repr(config.routes[0])):
        assert SECRET not in shown
        assert "/v1" not in shown
    assert repr(t) == (
        "Target(name='backup', origin='https://api.backup.example',"
        " header_names=['x-api-key'], json_keys=['model'], inherit_credentials=False)"
    )
    assert "origin='https://api.backup.example'" in str(t)
    assert "match=['http://llm.internal']" in repr(config.routes[0])


# --- frozen, overrides, suspensions --------------------------------------------------------


def test_config_is_frozen() -> None:
    """Assigning to any field of any model raises."""
    config = as_config(one_route())
    with pytest.raises(ValidationError, match="frozen"):
        config.breaker = BreakerPolicy()  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        config.breaker.cooldown = 1.0  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        config.routes[0].targets[0].url = "https://b.example"  # type: ignore[misc]


def test_overrides_set_win_and_the_rest_inherit() -> None:
    """FailoverOverrides.apply replaces the fields it sets and keeps the base's others."""
    base = FailoverPolicy(max_total_attempts=6, total_timeout=20.0)
    policy = FailoverOverrides(retry_ambiguous=True, first_byte_timeout="10s").apply(base)
    assert policy == FailoverPolicy(
        max_total_attempts=6, total_timeout=20.0, retry_ambiguous=True, first_byte_timeout=10.0
    )
    assert base.retry_ambiguous is False


def test_overrides_without_fields_return_the_base() -> None:
    """With nothing overridden, the route's policy is the base policy itself."""
    base = FailoverPolicy(max_total_attempts=2)
    assert FailoverOverrides().apply(base) is base


def test_override_none_clears_a_timeout_and_inherits_the_rest() -> None:
    """An explicit null clears an inherited timeout; on other fields it inherits."""
    base = FailoverPolicy(total_timeout=20.0, max_total_attempts=6)
    overrides = FailoverOverrides.model_validate(
        {"total_timeout": None, "max_total_attempts": None}
    )
    policy = overrides.apply(base)
    assert policy.total_timeout is None
    assert policy.max_total_attempts == 6


def test_overrides_are_validated_with_the_policy_bounds() -> None:
    """Overrides refuse the values the policy refuses."""
    with pytest.raises(ValidationError, match="max_attempts_per_target"):
        FailoverOverrides(max_attempts_per_target=0)
    with pytest.raises(ValidationError, match="first_byte_timeout"):
        FailoverOverrides(first_byte_timeout="-1s")
    with pytest.raises(ValidationError, match="on_all_suspended"):
        FailoverOverrides(on_all_suspended="maybe")


def test_route_policy_applies_its_overrides() -> None:
    """Route.policy is the base with the route's failover overrides applied."""
    route = Route.model_validate(
        {"name": "r", "failover": {"on_all_suspended": "respond"}, "targets": [target()]}
    )
    policy = route.policy(FailoverPolicy(max_retry_wait=1.0))
    assert (policy.on_all_suspended, policy.max_retry_wait) == ("respond", 1.0)


def test_suspension_window_by_reason() -> None:
    """Suspensions.window looks a window up by reason name and refuses unknown reasons."""
    suspensions = Suspensions(rate_limited=SuspensionWindow(initial=2.0, max=None))
    assert suspensions.window("rate_limited") == SuspensionWindow(initial=2.0, max=None)
    assert suspensions.window("quota_exhausted").initial == 900.0
    assert suspensions.window("invalid_credential").initial == 600.0
    with pytest.raises(KeyError):
        suspensions.window("overloaded")


# --- as_config -----------------------------------------------------------------------------


def test_as_config_none_is_the_default() -> None:
    """as_config(None) is the default configuration."""
    assert as_config(None) == Config()


def test_as_config_returns_a_config_unchanged() -> None:
    """A Config passes through as the same object."""
    config = Config(breaker=BreakerPolicy(failure_threshold=5))
    assert as_config(config) is config


def test_as_config_validates_a_mapping() -> None:
    """A mapping is validated into a Config, durations normalised."""
    config = as_config({"breaker": {"cooldown": "5s"}, **one_route()})
    assert config.breaker.cooldown == 5.0
    assert config.routes[0].targets[0].name == "primary"


def test_as_config_mapping_errors_name_the_mapping() -> None:
    """An invalid mapping is a ConfigError with `<mapping>` as its source."""
    with pytest.raises(ConfigError) as caught:
        as_config({"breaker": {"backoff_multiplier": 1}})
    assert str(caught.value) == ("<mapping>: breaker.backoff_multiplier: must be greater than 1")
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__


@pytest.mark.parametrize("value", ["sidestep.yaml", 3, [("breaker", {})]])
def test_as_config_refuses_other_types(value: Any) -> None:
    """Anything but a Config, a mapping or None is a TypeError naming only the type."""
    with pytest.raises(TypeError, match=f"not {type(value).__name__}$"):
        as_config(value)


# --- classifier ----------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["os.path:join", "os.path.join", "os:path.join"])
def test_classifier_import_string_resolves(spec: str) -> None:
    """A classifier import string is resolved to the object it names."""
    assert Config(classifier=spec).classifier is os.path.join


def test_classifier_callable_is_kept() -> None:
    """A callable classifier given in Python is stored as is."""

    def classify(*args: Any) -> None:
        return None

    assert Config(classifier=classify).classifier is classify


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("no_such_module_here:classify", "no module named 'no_such_module_here'"),
        ("os.path:no_such_function", "no attribute 'no_such_function'"),
        ("classify", "must look like 'package.module:attribute'"),
        ("os:", "must look like 'package.module:attribute'"),
        ("os:sep", "callable"),
    ],
)
def test_bad_classifier_is_an_error_naming_the_string(spec: str, reason: str) -> None:
    """A classifier that cannot be imported, or is not callable, is a validation error."""
    with pytest.raises(ConfigError) as caught:
        as_config({"classifier": spec})
    message = str(caught.value)
    assert message.startswith("<mapping>: classifier: ")
    assert reason in message


def test_classifier_import_failure_does_not_repeat_the_module_error(tmp_path: Path) -> None:
    """A module that fails on import is reported by error type, not by its own message."""
    (tmp_path / "broken_classifier_mod.py").write_text(f"raise RuntimeError({SECRET!r})\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ConfigError, match="RuntimeError on import") as caught:
            as_config({"classifier": "broken_classifier_mod:classify"})
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("broken_classifier_mod", None)
    assert SECRET not in everything_shown(caught.value)


# --- warnings ------------------------------------------------------------------------------


def test_tiny_cooldown_warns_at_the_caller() -> None:
    """A cooldown under 100ms is legal but warned about, at the line that built it."""
    with pytest.warns(SidestepConfigWarning, match="cooldown is under 100ms") as record:
        BreakerPolicy(cooldown="50ms")
    assert len(record) == 1
    assert record[0].filename == __file__


def test_failure_threshold_of_one_warns() -> None:
    """failure_threshold: 1 is legal but warned about."""
    with pytest.warns(SidestepConfigWarning, match="failure_threshold is 1"):
        as_config({"breaker": {"failure_threshold": 1}})


@pytest.mark.parametrize(
    ("url", "headers"),
    [("https://api.example/v1", {"X-Api-Key": "k"}), ("https://svc:pw@api.example/v1", {})],
    ids=["key header", "userinfo"],
)
def test_inheriting_credentials_beside_a_credential_of_its_own_warns(
    url: str, headers: dict[str, str]
) -> None:
    """inherit_credentials on a target that sets its own credential is warned about, naming
    the target and never the credential: such a target gets none of the caller's."""
    with pytest.warns(SidestepConfigWarning, match="'second' sets a credential") as record:
        Target(name="second", url=url, headers=headers, inherit_credentials=True)
    assert len(record) == 1
    assert "pw" not in str(record[0].message) and "'k'" not in str(record[0].message)


def test_warning_from_a_file_points_at_the_caller(tmp_path: Path) -> None:
    """A warning raised while loading a file points at the code that called load_config."""
    path = write(tmp_path, "breaker: {cooldown: 10ms}\n")
    with pytest.warns(SidestepConfigWarning) as record:
        load_config(path)
    assert record[0].filename == __file__


def test_ordinary_values_do_not_warn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The defaults and the design's example raise no warning (warnings are errors here)."""
    monkeypatch.setenv("BACKUP_API_KEY", "k")
    Config()
    load_config(write(tmp_path, DESIGN_EXAMPLE))
    BreakerPolicy(cooldown="100ms", failure_threshold=2)
