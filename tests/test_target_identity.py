"""Who a target is: its credential names, its userinfo, its host's spelling, its suspensions."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import sidestep
from drivers import KINDS, Driver, route
from sidestep._config import SidestepConfigWarning
from sidestep._scopes import is_credential
from sidestep.logging import REDACTED, redact_value
from upstream import Respond, Upstream

MakeDriver = Callable[..., Driver]


@pytest.fixture(params=KINDS)
def make(request: pytest.FixtureRequest) -> Iterator[MakeDriver]:
    drivers: list[Driver] = []

    def build(config: Any = None, **kw: Any) -> Driver:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SidestepConfigWarning)
            driver = Driver(str(request.param), config, **kw)
        drivers.append(driver)
        return driver

    yield build
    for driver in drivers:
        driver.close()


def unavailable(_: Any) -> Respond:
    return Respond(503, "down")


# -- one rule for credential names ---------------------------------------------------

CAMEL_CREDENTIALS = ["X-AuthToken", "ClientSecret", "accessToken", "APIKey", "xApiKey"]
NOT_CREDENTIALS = ["max_tokens", "maxTokens", "Idempotency-Key", "author", "keywords", "alt"]


@pytest.mark.parametrize("name", [*CAMEL_CREDENTIALS, "accesstoken", "clientsecret", "Set-Cookie"])
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


# keep `sidestep` imported for the tests below that build configs directly
assert sidestep.Config
