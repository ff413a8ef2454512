"""WSGI middleware that answers ``AllCandidatesSuspended`` with a clean 503.

For any WSGI server and framework: ``app.wsgi_app = SuspensionMiddleware(app.wsgi_app)``.
Flask turns view errors into 500s before a WSGI middleware sees them; use
``sidestep.flask.init_app`` there.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from ._suspended import find_suspended, unavailable_body, unavailable_headers

if TYPE_CHECKING:
    from _typeshed import OptExcInfo
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = ["SuspensionMiddleware"]

_STATUS = "503 Service Unavailable"


class SuspensionMiddleware:
    """Turn ``AllCandidatesSuspended`` into ``503 all_candidates_suspended``.

    When the wrapped app raises an exception whose ``__cause__``/``__context__``
    chain holds ``AllCandidatesSuspended`` — from the call itself or while
    producing its first body chunk — and nothing of the body has reached the
    server yet, the client gets the 503 of DESIGN §3.4, with ``Retry-After``
    when known; headers the app had already set are replaced, as PEP 3333
    allows an error handler to do. After that the exception is re-raised
    unchanged, and the app's iterable is always closed.

    Example::

        app.wsgi_app = sidestep.wsgi.SuspensionMiddleware(app.wsgi_app)
    """

    __slots__ = ("app",)

    def __init__(self, app: WSGIApplication) -> None:
        self.app = app

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        exchange = _Exchange(start_response)
        try:
            result = self.app(environ, exchange.start_response)
        except Exception as exc:
            answer = exchange.unavailable(exc)
            if answer is None:
                raise
            return answer
        return _Body(result, exchange)


class _Exchange:
    """One request's response state, between the app and the server."""

    __slots__ = ("_server_start_response", "started")

    def __init__(self, start_response: StartResponse) -> None:
        self._server_start_response = start_response
        # Whether anything of the body has gone to the server: from then on
        # the server may have sent the headers, and no 503 can replace them.
        self.started = False

    def start_response(
        self,
        status: str,
        headers: list[tuple[str, str]],
        exc_info: OptExcInfo | None = None,
        /,
    ) -> Callable[[bytes], object]:
        write = self._server_start_response(status, headers, exc_info)

        def write_tracking(data: bytes) -> object:
            self.started = True
            return write(data)

        return write_tracking

    def unavailable(self, exc: Exception) -> list[bytes] | None:
        """Start the 503 and return its body if ``exc``, being handled, allows it; else ``None``."""
        suspended = find_suspended(exc)
        if suspended is None or self.started:
            return None
        # exc_info lets the server replace headers the app set but that were never sent.
        self._server_start_response(_STATUS, unavailable_headers(suspended), sys.exc_info())
        return [unavailable_body(suspended)]


class _Body:
    """The app's iterable, watched until its first chunk; closes it exactly once."""

    __slots__ = ("_closed", "_exchange", "_result")

    def __init__(self, result: Iterable[bytes], exchange: _Exchange) -> None:
        self._result = result
        self._exchange = exchange
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        exchange = self._exchange
        chunks = iter(self._result)
        while not exchange.started:
            try:
                chunk = next(chunks)
            except StopIteration:
                return
            except Exception as exc:
                answer = exchange.unavailable(exc)
                if answer is None:
                    raise
                self.close()  # the app's body is abandoned for the 503
                yield from answer
                return
            exchange.started = True  # before the server can send anything of it
            yield chunk
        yield from chunks

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        close = getattr(self._result, "close", None)
        if close is not None:
            close()
