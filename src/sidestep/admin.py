"""The admin app: list and clear suspensions over HTTP, and a status page.

`app` is an ASGI app (Starlette, the ``admin`` extra) to mount in FastAPI or
Starlette, or to serve on its own; `wsgi_app` is the same for WSGI servers
and Flask. Both answer:

- ``GET /`` — the status page: routes, their targets, each scope's state,
  reason and a live countdown, a *Clear* button per row;
- ``GET /suspensions`` — ``{"routes": ..., "pools": ..., "total": n, "next": ...,
  "suspensions": [rows]}`` (``pools``: each pooled route's members, as this
  process counts them), filtered by ``?route=``, ``?target=``, ``?reason=``, in ``scope_id``
  order, ``?limit=`` rows (at most and by default 10,000) from just past
  ``?after=`` (the ``next`` of the page before); a weak ``ETag``, and 304 to an
  ``If-None-Match`` whose rows say the same;
- ``DELETE /suspensions/{scope_id}`` — clears it, answers its row as it was
  (404 for an unknown id), and emits ``suspension.cleared``.

Every request needs a token: ``Authorization: Bearer <token>`` (or HTTP Basic
with the token as the password, which a browser sends by itself). The app
refuses to be built without one unless ``allow_unauthenticated=True``.

The ASGI app never holds its event loop while it lists: the store is read,
its rows named, filtered and encoded, and the pools' members read, in worker
threads.

Example:
    >>> api.mount("/sidestep", sidestep.admin.app(transport, token=os.environ["ADMIN_TOKEN"]))
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import anyio.to_thread

from ._core.listed import Listed
from ._core.listing import Listing, StoreUnavailable
from ._core.routes import Router
from ._ops.admin import ListReply, ListRows, advance, handle
from ._ops.admin_answer import Answer
from ._ops.admin_origins import Origins
from ._ops.admin_tokens import Token, tokens_of
from ._settings.config import Config, as_config
from ._shells.shell import Shell

__all__ = ["Token", "app", "wsgi_app"]


def _listing_of(source: Any, config: Config | None) -> Listing:
    """The `Listing` of a transport (its store, routes and clock) or of a store.

    A store alone knows no route or target names: give the `config` whose routes
    name its scopes (without one, each row's target is its origin).
    """
    if isinstance(source, Shell):
        core = source._core
        return Listing(core.store, core.router, core.clock)
    if hasattr(source, "snapshot") and hasattr(source, "clear_async"):
        return Listing(source, Router(as_config(config)), time.monotonic)
    raise TypeError("expected a sidestep transport or a store")


def app(
    source: Any,
    *,
    token: str | Token | Sequence[Token] | None = None,
    config: Config | None = None,
    allow_unauthenticated: bool = False,
) -> Any:
    """The admin ASGI app (a Starlette app) over a transport or a store.

    Args:
        source: a `FailoverTransport`, `AsyncFailoverTransport` (or httpx2's),
            or a `StateStore` such as a `RedisStore` shared with the application.
        token: a secret (a token named ``admin`` that may clear), a `Token`, or
            several `Token`s (e.g. a read-only one for a dashboard).
        config: with a store, the configuration whose routes name its scopes.
        allow_unauthenticated: serve without any token (only behind something
            that authenticates every request itself).

    Raises:
        ValueError: no token, and `allow_unauthenticated` is not set.
        ImportError: Starlette is not installed (``pip install 'sidestep[admin]'``).
    """
    tokens = tokens_of(token, allow_unauthenticated)
    view = _listing_of(source, config)
    try:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import Response
        from starlette.routing import Route
    except ModuleNotFoundError as exc:
        raise ImportError(
            "sidestep.admin.app needs Starlette: pip install 'sidestep[admin]'"
        ) from exc

    async def endpoint(request: Request) -> Response:
        client = request.client
        steps = handle(
            request.method,
            "/" + request.path_params.get("rest", ""),
            request.url.query,
            request.headers.get("authorization"),
            f"{client.host}:{client.port}" if client else "unknown",
            request.scope.get("root_path", ""),
            tokens,
            Origins(
                request.headers.get("origin"),
                request.headers.get("sec-fetch-site"),
                request.headers.get("host"),
            ),
            request.headers.get("if-none-match"),
        )
        effect = advance(steps, None)
        while not isinstance(effect, Answer):
            if isinstance(effect, ListRows):
                taken: Listed | None = None
                with contextlib.suppress(StoreUnavailable):
                    taken = await view.alisted()
                # the pools, the filtering, the page of rows and its JSON (or the page's
                # HTML) as well
                effect = await anyio.to_thread.run_sync(_listed_step, steps, view, taken)
            else:
                cleared: Any = None
                with contextlib.suppress(StoreUnavailable):
                    cleared = (await view.aclear(effect.scope_id, effect.who), view.clock())
                effect = advance(steps, cleared)
        answer = effect
        response = Response(answer.body, answer.status)
        response.raw_headers = [(k.encode(), v.encode()) for k, v in answer.headers]
        return response

    methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    return Starlette(
        routes=[
            Route("/", endpoint, methods=methods),
            Route("/{rest:path}", endpoint, methods=methods),
        ]
    )


def wsgi_app(
    source: Any,
    *,
    token: str | Token | Sequence[Token] | None = None,
    config: Config | None = None,
    allow_unauthenticated: bool = False,
) -> Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]:
    """The admin app for WSGI servers and Flask; the same arguments and answers as `app`.

    Mount it in Flask with werkzeug's ``DispatcherMiddleware``:
    ``flask_app.wsgi_app = DispatcherMiddleware(flask_app.wsgi_app, {"/sidestep": admin})``.
    """
    tokens = tokens_of(token, allow_unauthenticated)
    view = _listing_of(source, config)

    def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        # PEP 3333 hands the decoded path over as latin-1
        path = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8", "replace")
        steps = handle(
            environ.get("REQUEST_METHOD", "GET"),
            path or "/",
            environ.get("QUERY_STRING", ""),
            environ.get("HTTP_AUTHORIZATION"),
            f"{environ.get('REMOTE_ADDR', 'unknown')}:{environ.get('REMOTE_PORT', '')}".rstrip(":"),
            environ.get("SCRIPT_NAME", ""),
            tokens,
            Origins(
                environ.get("HTTP_ORIGIN"),
                environ.get("HTTP_SEC_FETCH_SITE"),
                environ.get("HTTP_HOST"),
            ),
            environ.get("HTTP_IF_NONE_MATCH"),
        )
        effect = advance(steps, None)
        while not isinstance(effect, Answer):
            reply: Any = None
            with contextlib.suppress(StoreUnavailable):
                if isinstance(effect, ListRows):
                    reply = _reply(view, view.listed())
                else:
                    reply = (view.clear(effect.scope_id, effect.who), view.clock())
            effect = advance(steps, reply)
        answer = effect
        start_response(f"{answer.status} {_REASONS[answer.status]}", answer.headers)
        return [] if environ.get("REQUEST_METHOD") == "HEAD" else [answer.body]

    return application


def _reply(view: Listing, taken: Listed | None) -> ListReply | None:
    """What a `ListRows` effect is answered with: the listing `taken` (None: the store
    did not answer), the routes, the clock's reading and the pools' members."""
    if taken is None:
        return None
    return (taken, view.routes(), view.clock(), view.pools())


def _listed_step(steps: Any, view: Listing, taken: Listed | None) -> Any:
    """The admin app's step after a listing, in a worker thread."""
    return advance(steps, _reply(view, taken))


_REASONS = {
    200: "OK",
    304: "Not Modified",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}
