"""The admin app's listings over real sockets, mounted in FastAPI under uvicorn and in Flask
under werkzeug: a store that has not changed is not read again, and what it lists again is
told at the later moment.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import fastapi
import flask
import httpx
import pytest
from werkzeug.middleware.dispatcher import DispatcherMiddleware

import sidestep
import sidestep.admin
from servers import serve_asgi, serve_wsgi
from sidestep._answers.classify import RATE_LIMITED, Kind, Verdict
from sidestep._common.scopes import ScopeFacts, ScopeKind
from sidestep._settings.policies import BreakerPolicy, Suspensions
from test_admin import TOKEN, bearer, config_for
from upstream import CLIENT_TIMEOUT, Upstream

LIMITED = Verdict(Kind.SUSPEND, RATE_LIMITED, ScopeKind.ORIGIN, True, retry_after=600, status=429)
WINDOWS = Suspensions.model_validate({"rate_limited": {"initial": 1, "max": 3600}})
POLICY = BreakerPolicy(cooldown=3600, max_cooldown=3600)


class CountingStore(sidestep.MemoryStore):
    """A memory store that counts how often it is read for a listing."""

    def __init__(self) -> None:
        super().__init__()
        self.snapshots = 0

    def snapshot(self, now: float) -> list[Any]:
        self.snapshots += 1
        return super().snapshot(now)


def suspend(store: Any, origins: list[str], now: float) -> None:
    """Suspend each origin for 600 s from `now`, as a 429 with Retry-After: 600 would."""
    for origin in origins:
        facts = ScopeFacts(origin, headers={}, body=None, fingerprint=store.fingerprint)
        admission = store.admit(facts, POLICY, now)
        assert admission.ticket is not None
        store.record(admission.ticket, LIMITED, POLICY, WINDOWS, now)


def origins(first: int, count: int) -> list[str]:
    return [f"https://o{i:05d}.example:443" for i in range(first, first + count)]


@contextlib.contextmanager
def mounted(kind: str, transport: Any) -> Iterator[str]:
    """The admin app over `transport`, mounted at /sidestep in FastAPI (ASGI, uvicorn) or in
    Flask (WSGI, werkzeug); the host's base URL."""
    if kind == "asgi":
        api = fastapi.FastAPI()
        api.mount("/sidestep", sidestep.admin.app(transport, token=TOKEN))
        with serve_asgi(api, lifespan="off") as url:
            yield url
    else:
        web = flask.Flask(__name__)
        admin = sidestep.admin.wsgi_app(transport, token=TOKEN)
        web.wsgi_app = DispatcherMiddleware(web.wsgi_app, {"/sidestep": admin})  # type: ignore[method-assign]
        with serve_wsgi(web) as url:
            yield url


def transport_for(kind: str, a: Upstream, b: Upstream, **kw: Any) -> Any:
    make: Callable[..., Any] = (
        sidestep.AsyncFailoverTransport if kind == "asgi" else sidestep.FailoverTransport
    )
    return make(config_for(a, b), **kw)


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_a_store_that_has_not_changed_is_not_read_again(
    a: Upstream, b: Upstream, kind: str
) -> None:
    """Listed, asked again with its tag, asked again without it, and shown on the page, an unchanged store is read once: the 304, the second 200 (the same rows) and the page come from that one reading. A new suspension, and a clear, each make the next listing read the store again, and it shows them."""
    store = CountingStore()
    transport = transport_for(kind, a, b, store=store)
    suspend(store, origins(0, 30), now=0.0)
    with (
        mounted(kind, transport) as url,
        httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT, headers=bearer(TOKEN)) as admin,
    ):
        first = admin.get("/sidestep/suspensions")
        assert first.status_code == 200 and first.json()["total"] == 30
        tag = first.headers["etag"]
        read = store.snapshots
        again = admin.get("/sidestep/suspensions", headers={"if-none-match": tag})
        assert again.status_code == 304
        same = admin.get("/sidestep/suspensions")
        assert same.status_code == 200 and same.headers["etag"] == tag
        assert [r["scope_id"] for r in same.json()["suspensions"]] == [
            r["scope_id"] for r in first.json()["suspensions"]
        ]
        page = admin.get("/sidestep/")
        assert "30 scopes are not healthy: 30 open." in page.text
        assert store.snapshots == read

        suspend(store, origins(30, 1), now=0.0)
        grown = admin.get("/sidestep/suspensions", headers={"if-none-match": tag})
        assert grown.status_code == 200 and grown.json()["total"] == 31
        assert grown.headers["etag"] != tag
        assert store.snapshots == read + 1

        scope_id = grown.json()["suspensions"][0]["scope_id"]
        assert admin.delete(f"/sidestep/suspensions/{scope_id}").status_code == 200
        shrunk = admin.get("/sidestep/suspensions", headers={"if-none-match": tag})
        assert shrunk.status_code == 200 and shrunk.json()["total"] == 30
        assert scope_id not in {r["scope_id"] for r in shrunk.json()["suspensions"]}
        assert store.snapshots == read + 2  # the clear found its row in the listing before


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_rows_listed_again_count_down_from_the_later_moment(
    a: Upstream, b: Upstream, kind: str
) -> None:
    """With the transport's clock moved on and the store unchanged, the rows listed again (not read again) tell the time left in each window at the later moment, under the same tag; once a window has run out it says 0."""
    now = [1000.0]
    store = CountingStore()
    transport = transport_for(kind, a, b, store=store, clock=lambda: now[0])
    suspend(store, origins(0, 5), now=1000.0)
    with (
        mounted(kind, transport) as url,
        httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT, headers=bearer(TOKEN)) as admin,
    ):
        first = admin.get("/sidestep/suspensions")
        assert {r["retry_in"] for r in first.json()["suspensions"]} == {600.0}
        read = store.snapshots
        now[0] = 1250.5
        later = admin.get("/sidestep/suspensions")
        assert {r["retry_in"] for r in later.json()["suspensions"]} == {349.5}
        assert later.headers["etag"] == first.headers["etag"]
        now[0] = 9000.0
        over = admin.get("/sidestep/suspensions")
        assert {(r["state"], r["retry_in"]) for r in over.json()["suspensions"]} == {("open", 0.0)}
        assert store.snapshots == read


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_a_sqlite_stores_rows_say_when_their_window_began(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scope a SQLite store suspended for 600 s five minutes ago lists with an ``opened_at`` five minutes back and about 300 s to go, as the memory and Redis stores' rows do: not the moment of the listing."""
    store = sidestep.SqliteStore(tmp_path / "state.db")
    began = time.time() - 300
    with monkeypatch.context() as then:
        then.setattr(time, "time", lambda: began)  # the store's wall clock, five minutes back
        suspend(store, origins(0, 1), now=time.monotonic())
    served = (
        serve_asgi(sidestep.admin.app(store, token=TOKEN), lifespan="off")
        if kind == "asgi"
        else serve_wsgi(sidestep.admin.wsgi_app(store, token=TOKEN))
    )
    with (
        served as url,
        httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT, headers=bearer(TOKEN)) as admin,
    ):
        (row,) = admin.get("/suspensions").json()["suspensions"]
    store.close()
    assert 250 < row["retry_in"] <= 300, row
    opened = datetime.fromisoformat(row["opened_at"].replace("Z", "+00:00")).timestamp()
    assert abs(opened - began) < 5, (row["opened_at"], began)
