"""The admin app over real sockets: ASGI under uvicorn, WSGI under werkzeug, mounted in FastAPI
and Flask, against a memory store (through the transport) and a real Redis (through the store),
with suspensions caused by real failing upstreams."""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

import fastapi
import flask
import httpx
import pytest
from fastapi.middleware.cors import CORSMiddleware
from werkzeug.middleware.dispatcher import DispatcherMiddleware

import sidestep
import sidestep._ops.admin_page
import sidestep.admin
from redis_server import PASSWORD, DelayProxy, RedisServer, fresh_prefix
from servers import serve_asgi, serve_wsgi
from sidestep._answers.classify import RATE_LIMITED, Kind, Verdict
from sidestep._common.scopes import ScopeFacts, ScopeKind
from sidestep._core.listed import Listed
from sidestep._settings.policies import BreakerPolicy, Suspensions
from sidestep._settings.values import SidestepConfigWarning
from sidestep.logging import add_observer, remove_observer
from upstream import CLIENT_TIMEOUT, IN_TIME, Respond, Upstream

# seconds a Redis call may take where a test only reads back what was written
LOADED = 10.0
TOKEN = "admin-token-0123456789"
READER = "reader-token-0123456789"
TOKENS = [
    sidestep.admin.Token("ops", TOKEN),
    sidestep.admin.Token("dashboard", READER, may_clear=False),
]
CREDENTIAL = "sk-primary-credential-0123456789"


def config_for(primary: Upstream, backup: Upstream) -> sidestep.Config:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SidestepConfigWarning)  # failure_threshold: 1
        return sidestep.Config.model_validate(
            {
                "breaker": {"failure_threshold": 1, "cooldown": "5m", "max_cooldown": "10m"},
                "routes": [
                    {
                        "name": "chat",
                        "targets": [
                            {
                                "name": "primary",
                                "url": f"{primary.url}/v1",
                                "headers": {"authorization": f"Bearer {CREDENTIAL}"},
                            },
                            {"name": "backup", "url": f"{backup.url}/v1"},
                        ],
                    }
                ],
            }
        )


class Setup:
    """A transport whose primary failed once (its scope open), and the admin's source."""

    def __init__(self, store_kind: str, a: Upstream, b: Upstream, redis_url: str) -> None:
        a.behaviour = lambda seen: Respond(503, b"down")
        self.a, self.b = a, b
        self.config = config_for(a, b)
        self.store: Any = None
        self.source: Any = None
        if store_kind == "redis":
            # the application's store, and the admin's own client of the same shared state;
            # Redis may take its time on a busy machine: these tests read what was written,
            # and a store failing open to its own memory after 0.25 s would not show it
            shared = {
                "prefix": fresh_prefix(),
                "fingerprint_key": "shared-fingerprint-key",
                "timeout": LOADED,
            }
            self.store = sidestep.RedisStore(redis_url, **shared)
            self.source = sidestep.RedisStore(redis_url, **shared)
        self.transport = sidestep.FailoverTransport(self.config, store=self.store)
        self.client = httpx.Client(transport=self.transport)
        # With memory, only the transport's own process can read its state.
        self.source = self.source or self.transport
        self.admin_config = self.config if store_kind == "redis" else None

    def fail_primary(self) -> None:
        response = self.client.post(f"{self.a.url}/v1/chat?key=secret-query", json={})
        assert response.text == "b"  # failed over
        assert [row.target for row in self.transport.suspensions()] == ["primary"]

    def asgi(self, **kw: Any) -> Any:
        kw.setdefault("token", TOKENS)
        return sidestep.admin.app(self.source, config=self.admin_config, **kw)

    def wsgi(self, **kw: Any) -> Any:
        kw.setdefault("token", TOKENS)
        return sidestep.admin.wsgi_app(self.source, config=self.admin_config, **kw)

    def close(self) -> None:
        self.client.close()
        if self.store is not None:
            self.store.close()
            self.source.close()


@pytest.fixture(params=["memory", "redis"])
def setup(
    request: pytest.FixtureRequest, a: Upstream, b: Upstream, redis_url: str
) -> Iterator[Setup]:
    """A memory store read through its transport, or a real Redis read through the store."""
    built = Setup(request.param, a, b, redis_url)
    yield built
    built.close()


@contextlib.contextmanager
def served(setup: Setup, kind: str, **kw: Any) -> Iterator[str]:
    """The admin app served alone: ASGI under uvicorn or WSGI under werkzeug."""
    if kind == "asgi":
        with serve_asgi(setup.asgi(**kw), lifespan="off") as url:
            yield url
    else:
        with serve_wsgi(setup.wsgi(**kw)) as url:
            yield url


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture
def events() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    seen: list[tuple[str, dict[str, Any]]] = []

    def observer(event: str, fields: Any) -> None:
        seen.append((event, dict(fields)))

    add_observer(observer)
    yield seen
    remove_observer(observer)


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_lists_then_clears_what_real_traffic_suspended(
    setup: Setup, kind: str, events: list[tuple[str, dict[str, Any]]]
) -> None:
    """GET /suspensions lists the failing primary; DELETE clears it, answers the row as it was, audits who did it; the next request reaches the primary; a second DELETE is a 404."""
    setup.fail_primary()
    with served(setup, kind) as url, httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT) as admin:
        listed = admin.get("/suspensions", headers=bearer(TOKEN))
        assert listed.status_code == 200
        assert listed.headers["cache-control"] == "no-store"
        data = listed.json()
        assert data["routes"] == {"chat": ["primary", "backup"]}
        (row,) = data["suspensions"]
        assert row["route"] == "chat" and row["target"] == "primary"
        assert row["state"] == "open" and row["reason"] == "unavailable"
        assert row["failures"] == 1 and 250 < row["retry_in"] <= 300
        assert row["targets"] == [{"route": "chat", "target": "primary"}]
        opened = datetime.fromisoformat(row["opened_at"].replace("Z", "+00:00"))
        assert abs((datetime.now(timezone.utc) - opened).total_seconds()) < 60

        cleared = admin.delete(f"/suspensions/{row['scope_id']}", headers=bearer(TOKEN))
        assert cleared.status_code == 200
        assert cleared.json()["scope_id"] == row["scope_id"]
        assert cleared.json()["state"] == "open"
        assert admin.get("/suspensions", headers=bearer(TOKEN)).json()["suspensions"] == []
        again = admin.delete(f"/suspensions/{row['scope_id']}", headers=bearer(TOKEN))
        assert again.status_code == 404

    (audit,) = [fields for event, fields in events if event == "suspension.cleared"]
    assert audit["target"] == "primary" and audit["route"] == "chat"
    assert audit["scope"] == row["scope"] and audit["reason"] == "unavailable"
    assert audit["who"].startswith("ops@127.0.0.1:")
    setup.a.behaviour = lambda seen: Respond(200, b"a")
    before = setup.a.calls
    assert setup.client.post(f"{setup.a.url}/v1/chat", json={}).text == "a"
    assert setup.a.calls == before + 1


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_filters_by_route_target_and_reason(setup: Setup, kind: str) -> None:
    """?route=, ?target= and ?reason= keep only the rows that match; an unknown filter is ignored."""
    setup.fail_primary()
    with (
        served(setup, kind) as url,
        httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT, headers=bearer(READER)) as admin,
    ):

        def count(query: str) -> int:
            return len(admin.get(f"/suspensions?{query}").json()["suspensions"])

        assert count("route=chat") == 1
        assert count("route=other") == 0
        assert count("target=primary") == 1
        assert count("target=backup") == 0
        assert count("reason=unavailable") == 1
        assert count("reason=rate_limited") == 0
        assert count("colour=blue") == 1


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_every_endpoint_needs_a_token_and_a_wrong_one_gets_no_hint(setup: Setup, kind: str) -> None:
    """No token, a wrong token, a malformed header or a cookie all get the same 401 on every endpoint; the page invites a browser login; HTTP Basic with the token as password reads."""
    setup.fail_primary()
    scope_id = setup.transport.suspensions()[0].scope_id
    with served(setup, kind) as url, httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT) as admin:
        answers = []
        for method, path in [
            ("GET", "/"),
            ("GET", "/suspensions"),
            ("DELETE", f"/suspensions/{scope_id}"),
            ("GET", "/nowhere"),
        ]:
            for headers in [
                {},
                bearer("wrong-token"),
                bearer(TOKEN[:-1]),
                {"authorization": TOKEN},
                {"authorization": "Basic !!!"},
                {"cookie": f"token={TOKEN}"},
            ]:
                response = admin.request(method, path, headers=headers)
                assert response.status_code == 401, (method, path, headers)
                answers.append(response.content)
        assert set(answers) == {b'{"error": "unauthorized"}'}
        page = admin.get("/")
        assert page.headers["www-authenticate"].startswith("Basic ")
        basic = base64.b64encode(f"anyone:{READER}".encode()).decode()
        assert admin.get("/suspensions", headers={"authorization": f"Basic {basic}"}).is_success
    assert len(setup.transport.suspensions()) == 1  # nothing was cleared


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_a_read_only_token_reads_but_cannot_clear_and_clearing_is_never_a_get(
    setup: Setup, kind: str
) -> None:
    """The read-only token lists but gets 403 on DELETE; GET or POST on a suspension is a 405; the scope stays open."""
    setup.fail_primary()
    scope_id = setup.transport.suspensions()[0].scope_id
    with served(setup, kind) as url, httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT) as admin:
        assert admin.get("/suspensions", headers=bearer(READER)).status_code == 200
        forbidden = admin.delete(f"/suspensions/{scope_id}", headers=bearer(READER))
        assert forbidden.status_code == 403
        for method in ("GET", "POST"):
            refused = admin.request(method, f"/suspensions/{scope_id}", headers=bearer(TOKEN))
            assert refused.status_code == 405
            assert refused.headers["allow"] == "DELETE"
        assert admin.post("/suspensions", headers=bearer(TOKEN)).status_code == 405
    assert [row.scope_id for row in setup.transport.suspensions()] == [scope_id]


def test_the_app_refuses_to_be_built_without_a_token(a: Upstream, b: Upstream) -> None:
    """No token raises, for ASGI and WSGI alike; allow_unauthenticated=True serves without one; bad tokens are refused."""
    transport = sidestep.FailoverTransport(config_for(a, b))
    for build in (sidestep.admin.app, sidestep.admin.wsgi_app):
        with pytest.raises(ValueError, match="needs a token"):
            build(transport)
        with pytest.raises(ValueError, match="needs a token"):
            build(transport, token=[])
        with pytest.raises(ValueError, match="unique"):
            build(
                transport, token=[sidestep.admin.Token("x", "s1"), sidestep.admin.Token("x", "s2")]
            )
    with pytest.raises(ValueError, match="secret"):
        sidestep.admin.Token("ops", "has space")
    assert "s3cr3t" not in repr(sidestep.admin.Token("ops", "s3cr3t"))
    with pytest.raises(TypeError):
        sidestep.admin.app(object(), token=TOKEN)
    open_app = sidestep.admin.app(transport, allow_unauthenticated=True)
    with serve_asgi(open_app, lifespan="off") as url:
        assert httpx.get(f"{url}/suspensions").json() == {
            "routes": {"chat": ["primary", "backup"]},
            "pools": {},
            "total": 0,
            "next": None,
            "suspensions": [],
        }


def test_mounted_in_fastapi_and_flask(setup: Setup) -> None:
    """Mounted under /sidestep in FastAPI and in Flask (DispatcherMiddleware), the API answers there and the page points its script at that prefix."""
    setup.fail_primary()
    api = fastapi.FastAPI()
    api.mount("/sidestep", setup.asgi())
    web = flask.Flask(__name__)
    web.wsgi_app = DispatcherMiddleware(web.wsgi_app, {"/sidestep": setup.wsgi()})  # type: ignore[method-assign]
    servers: list[Callable[[], Any]] = [
        lambda: serve_asgi(api, lifespan="off"),
        lambda: serve_wsgi(web),
    ]
    for serve in servers:
        with (
            serve() as url,
            httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT, headers=bearer(TOKEN)) as admin,
        ):
            rows = admin.get("/sidestep/suspensions").json()["suspensions"]
            assert [row["target"] for row in rows] == ["primary"]
            page = admin.get("/sidestep/")
            assert page.status_code == 200
            assert 'data-base="/sidestep/"' in page.text


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_the_page_is_readable_without_scripts_under_a_strict_policy(
    setup: Setup, kind: str
) -> None:
    """The page lists each route's targets with their state in its HTML (no script needed), loads nothing from elsewhere, and forbids every source but its own hashed script and style."""
    setup.fail_primary()
    with (
        served(setup, kind) as url,
        httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT, headers=bearer(TOKEN)) as admin,
    ):
        page = admin.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy
    assert "script-src 'sha256-" in policy and "unsafe" not in policy
    assert "connect-src 'self'" in policy and "frame-ancestors 'none'" in policy
    text = page.text
    assert '<th colspan="7">chat</th>' in text
    assert '<tr class="open"' in text and "<td>primary</td>" in text
    assert '<tr class="healthy"><td>backup</td>' in text
    assert "http://" not in text and "https://" not in text and "src=" not in text
    assert "/v1" not in text and CREDENTIAL not in text


def test_the_json_rows_are_the_transport_rows(setup: Setup) -> None:
    """The API's row and transport.suspensions() describe the same scope alike (one row builder)."""
    setup.fail_primary()
    (mine,) = setup.transport.suspensions()
    with served(setup, "asgi") as url:
        (row,) = httpx.get(f"{url}/suspensions", headers=bearer(TOKEN)).json()["suspensions"]
    assert (row["scope_id"], row["target"], row["route"], row["scope"], row["state"]) == (
        mine.scope_id,
        mine.target,
        mine.route,
        mine.scope,
        mine.state,
    )
    assert json.dumps(row).count(setup.a.url.split("//")[1]) == 0


@contextlib.contextmanager
def admin_over_redis(
    kind: str, a: Upstream, b: Upstream, app_url: str, admin_url: str, **options: Any
) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    """The application's client on Redis at `app_url`, and a client of the admin app served
    over its own RedisStore at `admin_url` (with `options`); the primary answers 503."""
    a.behaviour = lambda seen: Respond(503, b"down")
    config = config_for(a, b)
    shared = {"prefix": fresh_prefix(), "fingerprint_key": "shared-fingerprint-key"}
    store = sidestep.RedisStore(app_url, retry_interval=0, timeout=LOADED, **shared)
    source = sidestep.RedisStore(admin_url, retry_interval=0, **options, **shared)
    build = sidestep.admin.app if kind == "asgi" else sidestep.admin.wsgi_app
    app = build(source, token=TOKEN, config=config)
    with contextlib.ExitStack() as stack:
        stack.callback(store.close)
        stack.callback(source.close)
        client = stack.enter_context(
            httpx.Client(transport=sidestep.FailoverTransport(config, store=store))
        )
        url = stack.enter_context(
            serve_asgi(app, lifespan="off") if kind == "asgi" else serve_wsgi(app)
        )
        admin = stack.enter_context(
            httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT, headers=bearer(TOKEN))
        )
        yield client, admin


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_a_redis_that_stops_answering_is_a_503_not_an_empty_list(
    a: Upstream, b: Upstream, kind: str
) -> None:
    """With the shared Redis down, the list, the page and a clear answer 503 store_unavailable (never "no suspensions" or "not found", and never the URL's password); once Redis answers again, what fails next is listed and clears."""
    server = RedisServer()
    server.start()
    with contextlib.ExitStack() as stack:
        stack.callback(server.stop)
        client, admin = stack.enter_context(admin_over_redis(kind, a, b, server.url, server.url))
        assert client.post(f"{a.url}/v1/chat", json={}).text == "b"
        (row,) = admin.get("/suspensions").json()["suspensions"]
        server.stop()
        for method, path in [
            ("GET", "/suspensions"),
            ("GET", "/"),
            ("DELETE", f"/suspensions/{row['scope_id']}"),
        ]:
            answer = admin.request(method, path)
            assert answer.status_code == 503, (method, path)
            assert answer.json() == {"error": "store_unavailable"}
            assert PASSWORD not in answer.text
        server.start()  # empty: nothing is persisted
        assert admin.get("/suspensions").json()["suspensions"] == []
        assert client.post(f"{a.url}/v1/chat", json={}).text == "b"
        (again,) = admin.get("/suspensions").json()["suspensions"]
        assert admin.delete(f"/suspensions/{again['scope_id']}").status_code == 200


def test_a_secret_no_header_carries_as_typed_is_refused(a: Upstream, b: Upstream) -> None:
    """A token's secret must be printable ASCII: a non-ASCII one, which a client sends as UTF-8 and a server reads as latin-1, would never match a Bearer header, so it is refused when the token is made."""
    transport = sidestep.FailoverTransport(config_for(a, b))
    for secret in ("tökén-0123456789", "tab\there", "nul\x00here"):
        with pytest.raises(ValueError, match="printable ASCII") as raised:
            sidestep.admin.Token("ops", secret)
        assert secret not in str(raised.value)
        with pytest.raises(ValueError, match="printable ASCII"):
            sidestep.admin.app(transport, token=secret)


class LateProxy(DelayProxy):
    """A proxy in front of Redis that holds back one reply: the one `skip` replies from now."""

    def __init__(self, server: RedisServer) -> None:
        super().__init__(server)
        self._skip, self._late = -1, 0.0

    def late(self, skip: int, seconds: float) -> None:
        with self._lock:
            self._skip, self._late = skip, seconds

    def _pause(self) -> float:
        with self._lock:
            self.replies += 1
            self._skip -= 1
            return self._late if self._skip == -1 else 0.0


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_a_clear_whose_answer_redis_never_gives_is_a_503_not_a_404(
    a: Upstream,
    b: Upstream,
    kind: str,
    redis_server: RedisServer,
    events: list[tuple[str, dict[str, Any]]],
) -> None:
    """When Redis lists a scope but the clear's reply does not come in time, DELETE answers 503 store_unavailable: whether it was cleared is unknown, so never "not found", and no audit event claims it."""
    proxy = LateProxy(redis_server)
    with contextlib.ExitStack() as stack:
        stack.callback(proxy.close)
        client, admin = stack.enter_context(
            # a timeout the listing's reply meets on a busy machine, and the late one misses
            admin_over_redis(kind, a, b, redis_server.url, proxy.url, timeout=IN_TIME)
        )
        assert client.post(f"{a.url}/v1/chat", json={}).text == "b"
        (row,) = admin.get("/suspensions").json()["suspensions"]  # connected, script loaded
        proxy.late(skip=1, seconds=2 * IN_TIME)  # the listing's reply comes, the clear's does not
        answer = admin.delete(f"/suspensions/{row['scope_id']}")
        assert answer.status_code == 503
        assert answer.json() == {"error": "store_unavailable"}
    assert "suspension.cleared" not in [event for event, _ in events]


def basic(token: str) -> dict[str, str]:
    return {"authorization": "Basic " + base64.b64encode(f"ops:{token}".encode()).decode()}


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_a_clear_a_browser_says_comes_from_another_origin_is_refused_whatever_it_carries(
    setup: Setup, kind: str
) -> None:
    """A DELETE whose Sec-Fetch-Site is cross-site or same-site, or (without it) whose Origin is not the app's host, gets 403 with Basic and Bearer credentials alike and the scope stays open; same-origin markers, and requests with no browser marker at all (a script, curl), clear."""
    setup.fail_primary()
    scope_id = setup.transport.suspensions()[0].scope_id
    with served(setup, kind) as url, httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT) as admin:
        host = httpx.URL(url).netloc.decode()
        refused_markers: list[dict[str, str]] = [
            {"sec-fetch-site": "cross-site"},
            {"sec-fetch-site": "same-site"},
            {"sec-fetch-site": "cross-site", "origin": f"http://{host}"},
            {"origin": "http://evil.example"},
            {"origin": "null"},
            {"origin": f"http://{host}.evil.example"},
        ]
        for markers in refused_markers:
            for credential in (basic(TOKEN), bearer(TOKEN)):
                refused = admin.delete(f"/suspensions/{scope_id}", headers=credential | markers)
                assert refused.status_code == 403, markers
                assert refused.json() == {"error": "cross_origin"}
        assert [row.scope_id for row in setup.transport.suspensions()] == [scope_id]
        # the page's own button: same-origin, with its Basic credentials
        same = {"sec-fetch-site": "same-origin", "origin": f"http://{host}"}
        assert admin.delete(f"/suspensions/{scope_id}", headers=basic(TOKEN) | same).is_success
        setup.fail_primary()
        scope_id = setup.transport.suspensions()[0].scope_id
        only_origin = {"origin": f"http://{host}"}
        cleared = admin.delete(f"/suspensions/{scope_id}", headers=bearer(TOKEN) | only_origin)
        assert cleared.is_success
        setup.fail_primary()
        scope_id = setup.transport.suspensions()[0].scope_id
        assert admin.delete(f"/suspensions/{scope_id}", headers=basic(TOKEN)).is_success
        # reading stays open to any origin the token is good for
        listed = admin.get("/suspensions", headers=bearer(TOKEN) | refused_markers[0])
        assert listed.status_code == 200


def test_mounted_under_a_permissive_cors_policy_a_cross_origin_clear_is_refused(
    setup: Setup,
) -> None:
    """Mounted in FastAPI behind CORSMiddleware(allow_credentials=True) for a frontend's origin, the preflight passes (the host app answers it) but the DELETE that follows from that origin is refused and the scope stays open."""
    setup.fail_primary()
    scope_id = setup.transport.suspensions()[0].scope_id
    frontend = "http://frontend.example"
    api = fastapi.FastAPI()
    api.add_middleware(
        CORSMiddleware,
        allow_origins=[frontend],
        allow_credentials=True,
        allow_methods=["*"],
        allow_headers=["*"],
    )
    api.mount("/sidestep", setup.asgi())
    with (
        serve_asgi(api, lifespan="off") as url,
        httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT) as admin,
    ):
        path = f"/sidestep/suspensions/{scope_id}"
        preflight = admin.options(
            path, headers={"origin": frontend, "access-control-request-method": "DELETE"}
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == frontend
        sent = admin.delete(
            path, headers=basic(TOKEN) | {"origin": frontend, "sec-fetch-site": "cross-site"}
        )
        assert sent.status_code == 403
    assert [row.scope_id for row in setup.transport.suspensions()] == [scope_id]


LIMITED = Verdict(Kind.SUSPEND, RATE_LIMITED, ScopeKind.ORIGIN, True, retry_after=3600, status=429)


def suspend_origins(store: Any, count: int, first: int = 0) -> list[str]:
    """Suspend `count` unrouted origins in `store` as a 429 from each would; their origins."""
    policy = BreakerPolicy(cooldown=3600, max_cooldown=3600)
    origins = [f"https://o{i:05d}.example:443" for i in range(first, first + count)]
    for origin in origins:
        facts = ScopeFacts(origin, headers={}, body=None, fingerprint=store.fingerprint)
        admission = store.admit(facts, policy, time.monotonic())
        assert admission.ticket is not None
        store.record(admission.ticket, LIMITED, policy, Suspensions(), time.monotonic())
    return origins


def store_of(setup: Setup) -> Any:
    return setup.store if setup.store is not None else setup.transport.store


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_pages_of_rows_join_into_the_whole_listing(setup: Setup, kind: str) -> None:
    """?limit= pages the rows in scope_id order, each answer saying the total and the next page's ?after=; the pages join into the whole list, with no row twice, even when a row of a later page is cleared between pages; filters page alike."""
    setup.fail_primary()
    suspend_origins(store_of(setup), 24)
    with (
        served(setup, kind) as url,
        httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT, headers=bearer(TOKEN)) as admin,
    ):
        whole = admin.get("/suspensions").json()
        assert whole["total"] == 25 and whole["next"] is None
        ids = [row["scope_id"] for row in whole["suspensions"]]
        assert ids == sorted(ids) and len(set(ids)) == 25

        seen, after, totals = [], None, set()
        while True:
            page = admin.get("/suspensions", params={"limit": 10, "after": after or ""}).json()
            totals.add(page["total"])
            seen += [row["scope_id"] for row in page["suspensions"]]
            assert len(page["suspensions"]) <= 10
            if page["next"] is None:
                break
            assert page["next"] == page["suspensions"][-1]["scope_id"]
            after = page["next"]
        assert seen == ids and totals == {25}

        first = admin.get("/suspensions", params={"limit": 10}).json()
        assert admin.delete(f"/suspensions/{ids[12]}").status_code == 200
        rest = []
        after = first["next"]
        while after is not None:
            page = admin.get("/suspensions", params={"limit": 10, "after": after}).json()
            rest += [row["scope_id"] for row in page["suspensions"]]
            after = page["next"]
        assert [r["scope_id"] for r in first["suspensions"]] + rest == ids[:12] + ids[13:]

        limited = admin.get("/suspensions", params={"reason": "rate_limited", "limit": 5}).json()
        assert limited["total"] == 23 and len(limited["suspensions"]) == 5
        assert {row["reason"] for row in limited["suspensions"]} == {"rate_limited"}
        chat = admin.get("/suspensions", params={"route": "chat", "limit": 5}).json()
        assert chat["total"] == 1 and chat["next"] is None
        assert [row["target"] for row in chat["suspensions"]] == ["primary"]


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_a_limit_that_is_not_a_positive_whole_number_is_refused(setup: Setup, kind: str) -> None:
    """?limit= of 0, a negative, a fraction, a word or a non-ASCII digit is a 400 invalid_limit; a limit past 10,000 is taken as 10,000; an ?after= past the last row is an empty last page that still counts every row."""
    setup.fail_primary()
    with (
        served(setup, kind) as url,
        httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT, headers=bearer(READER)) as admin,
    ):
        for limit in ("0", "-1", "1.5", "ten", "\u0663", "1e3"):
            refused = admin.get("/suspensions", params={"limit": limit})
            assert refused.status_code == 400, limit
            assert refused.json() == {"error": "invalid_limit"}
        assert admin.get("/suspensions", params={"limit": "99999999999"}).json()["total"] == 1
        past = admin.get("/suspensions", params={"after": "z"}).json()
        assert past["suspensions"] == [] and past["total"] == 1 and past["next"] is None


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_a_listing_that_says_nothing_new_is_a_304(setup: Setup, kind: str) -> None:
    """Each listing carries a weak ETag; asked again with it in If-None-Match (or with *), nothing having changed, the answer is a 304 with no body; once a scope is cleared, a 200 with the new rows and a new tag."""
    setup.fail_primary()
    suspend_origins(store_of(setup), 3)
    with (
        served(setup, kind) as url,
        httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT, headers=bearer(TOKEN)) as admin,
    ):
        first = admin.get("/suspensions")
        tag = first.headers["etag"]
        assert tag.startswith('W/"')
        again = admin.get("/suspensions", headers={"if-none-match": tag})
        assert again.status_code == 304 and again.content == b""
        assert again.headers["etag"] == tag
        assert admin.get("/suspensions", headers={"if-none-match": "*"}).status_code == 304
        strong = tag.removeprefix("W/")
        listed = admin.get("/suspensions", headers={"if-none-match": f'"other", {strong}'})
        assert listed.status_code == 304
        other_page = admin.get("/suspensions?limit=2", headers={"if-none-match": tag})
        assert other_page.status_code == 200
        scope_id = first.json()["suspensions"][0]["scope_id"]
        assert admin.delete(f"/suspensions/{scope_id}").status_code == 200
        changed = admin.get("/suspensions", headers={"if-none-match": tag})
        assert changed.status_code == 200 and changed.headers["etag"] != tag
        assert changed.json()["total"] == 3


def test_the_pages_html_stays_small_with_thousands_of_scopes(a: Upstream, b: Upstream) -> None:
    """With 2,000 unrouted origins suspended, the page's HTML says how many scopes are not healthy, lists every route's targets and the first 100 origins, and counts the rest on one line; with nothing suspended it says every target is healthy."""
    transport = sidestep.FailoverTransport(config_for(a, b))
    with serve_asgi(sidestep.admin.app(transport, token=TOKEN), lifespan="off") as url:
        healthy = httpx.get(f"{url}/", headers=bearer(TOKEN)).text
        assert '<p id="summary">Every target is healthy.</p>' in healthy
        origins = suspend_origins(transport.store, 2_000)
        page = httpx.get(f"{url}/", headers=bearer(TOKEN)).text
    assert '<p id="summary">2,000 scopes are not healthy: 2,000 open.</p>' in page
    assert '<tr class="healthy"><td>primary</td>' in page
    assert '<tr class="healthy"><td>backup</td>' in page
    assert page.count('<tr class="open"') == 100
    assert f"<td>{origins[99]}</td>" in page and f"<td>{origins[100]}</td>" not in page
    assert "1,900 more origins (1,900 more scopes), listed with scripts on" in page


class GatedStore(sidestep.MemoryStore):
    """A memory store whose snapshot, once armed, says it began and waits for the test."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.entered = threading.Event()
        self.gate = threading.Event()

    def snapshot(self, now: float) -> list[Any]:
        if self.armed:
            self.entered.set()
            if not self.gate.wait(60):
                raise RuntimeError("the test never opened the gate")
        return super().snapshot(now)


@pytest.mark.parametrize(
    ("held", "request_line"),
    [
        ("the snapshot", "GET /sidestep/suspensions"),
        ("the report of what was listed", "GET /sidestep/suspensions"),
        ("the encoding of its rows", "GET /sidestep/suspensions"),
        ("the snapshot", "GET /sidestep/"),
        ("the encoding of its rows", "GET /sidestep/"),
        ("the snapshot", "DELETE /sidestep/suspensions/{scope_id}"),
    ],
)
def test_the_host_apps_loop_answers_while_a_listing_of_10000_rows_is_being_taken(
    a: Upstream, b: Upstream, held: str, request_line: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mounted in a FastAPI app over its async transport's memory store of 10,000 suspended scopes, a listing (the API's, the page's, or a clear's) held in the middle of being taken — in the store's snapshot, in reporting what it listed, or in encoding its rows — leaves the app's event loop free: /ping answers three times while the listing is held, and once let go the listing answers in full."""
    store = GatedStore()
    transport = sidestep.AsyncFailoverTransport(config_for(a, b), store=store)
    origins = suspend_origins(store, 10_000)
    scope_id = next(row.scope_id for row in transport.suspensions() if row.target == origins[0])
    api = fastapi.FastAPI()

    @api.get("/ping")
    async def ping() -> str:
        return "pong"

    api.mount("/sidestep", sidestep.admin.app(transport, token=TOKEN))
    entered, gate = store.entered, store.gate

    def observer(event: str, fields: Any) -> None:
        if event == "suspensions.listed":
            entered.set()
            if not gate.wait(60):
                raise RuntimeError("the test never opened the gate")

    def holding(encode: Callable[..., Any]) -> Callable[..., Any]:
        def held_encoding(*args: Any) -> Any:
            entered.set()
            if not gate.wait(60):
                raise RuntimeError("the test never opened the gate")
            return encode(*args)

        return held_encoding

    if held == "the snapshot":
        store.armed = True
    elif held == "the encoding of its rows":
        # the page's rows, and the API's
        monkeypatch.setattr(
            "sidestep._ops.admin_page.as_json", holding(sidestep._ops.admin_page.as_json)
        )
        monkeypatch.setattr(Listed, "encoded", holding(Listed.encoded))
    else:
        add_observer(observer)
    method, path = request_line.split(" ")
    answers: list[httpx.Response] = []
    try:
        with serve_asgi(api, lifespan="off") as url:
            listing = threading.Thread(
                target=lambda: answers.append(
                    httpx.request(
                        method,
                        url + path.format(scope_id=scope_id),
                        headers=bearer(TOKEN),
                        timeout=60,
                    )
                )
            )
            listing.start()
            try:
                assert entered.wait(30), "the listing never began"
                for _ in range(3):
                    assert httpx.get(f"{url}/ping", timeout=10).json() == "pong"
                assert listing.is_alive() and not answers  # still held at the gate
            finally:
                gate.set()
                listing.join(60)
    finally:
        remove_observer(observer)
    (answer,) = answers
    assert answer.status_code == 200
    if path == "/sidestep/suspensions":
        assert answer.json()["total"] == 10_000 and len(answer.json()["suspensions"]) == 10_000
    elif path == "/sidestep/":
        assert "10,000 scopes are not healthy: 10,000 open." in answer.text
    else:
        assert answer.json()["target"] == origins[0]
        assert len(transport.suspensions()) == 9_999


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_a_limit_of_thousands_of_digits_is_taken_as_the_most_a_page_holds(
    a: Upstream, b: Upstream, kind: str
) -> None:
    """?limit= written with thousands of digits (past the interpreter's limit on converting digits to an integer), or with thousands of leading zeros, answers like any limit: the first taken as 10,000 rows and the second as what it says, never a 500."""
    transport = sidestep.FailoverTransport(config_for(a, b))
    suspend_origins(transport.store, 3)
    serve: Callable[[], Any] = (
        (lambda: serve_asgi(sidestep.admin.app(transport, token=TOKEN), lifespan="off"))
        if kind == "asgi"
        else (lambda: serve_wsgi(sidestep.admin.wsgi_app(transport, token=TOKEN)))
    )
    with (
        serve() as url,
        httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT, headers=bearer(TOKEN)) as admin,
    ):
        huge = admin.get("/suspensions", params={"limit": "9" * 5000})
        assert huge.status_code == 200, huge.text[:200]
        assert len(huge.json()["suspensions"]) == 3 and huge.json()["next"] is None
        padded = admin.get("/suspensions", params={"limit": "0" * 5000 + "2"})
        assert padded.status_code == 200, padded.text[:200]
        assert len(padded.json()["suspensions"]) == 2 and padded.json()["next"] is not None
