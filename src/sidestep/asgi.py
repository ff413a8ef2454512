"""ASGI middleware that answers ``AllCandidatesSuspended`` with a clean 503.

Works with any ASGI framework (FastAPI, Starlette, Litestar, …) and needs none
of them: ``app.add_middleware(SuspensionMiddleware)`` or
``SuspensionMiddleware(app)``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ._core.suspended import find_suspended, unavailable_body, unavailable_headers

__all__ = ["SuspensionMiddleware"]

# The shapes of the ASGI specification, as starlette spells them, so the
# middleware type-checks with any framework without importing one.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class SuspensionMiddleware:
    """Turn ``AllCandidatesSuspended`` into ``503 all_candidates_suspended``.

    When the wrapped app raises an exception whose ``__cause__``/``__context__``
    chain holds ``AllCandidatesSuspended`` (so ``openai.APIConnectionError``
    and other SDK wrappers are seen through) before the response has started,
    the client gets the 503 of DESIGN §3.4, with ``Retry-After`` when known.
    Once the response has started the exception is re-raised unchanged: a
    half-sent body is never patched into something that looks complete.
    Non-HTTP scopes (``websocket``, ``lifespan``) pass straight through.

    Example::

        app = FastAPI()
        app.add_middleware(sidestep.asgi.SuspensionMiddleware)
    """

    __slots__ = ("app",)

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracking(message: Message) -> None:
            nonlocal started
            # Set before sending: once a start was attempted, a second one
            # cannot follow it.
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracking)
        except Exception as exc:
            suspended = find_suspended(exc)
            if suspended is None or started:
                raise
            headers = [(k.encode(), v.encode()) for k, v in unavailable_headers(suspended)]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": unavailable_body(suspended)})
