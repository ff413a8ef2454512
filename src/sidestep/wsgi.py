"""WSGI middleware that answers ``AllCandidatesSuspended`` with a clean 503.

For any WSGI server and framework: ``app.wsgi_app = SuspensionMiddleware(app.wsgi_app)``.
Flask turns view errors into 500s before a WSGI middleware sees them; use
``sidestep.flask.init_app`` there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from ._core.suspended import find_suspended, unavailable_body, unavailable_headers

if TYPE_CHECKING:
    from _typeshed import OptExcInfo
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

    # An app's start_response call: status, headers and exc_info.
    _Start = tuple[str, list[tuple[str, str]], OptExcInfo | None]

__all__ = ["SuspensionMiddleware"]

_STATUS = "503 Service Unavailable"


class SuspensionMiddleware:
    """Turn ``AllCandidatesSuspended`` into ``503 all_candidates_suspended``.

    When the wrapped app raises an exception whose ``__cause__``/``__context__``
    chain holds ``AllCandidatesSuspended`` — from the call itself or while
    producing its first body chunk — and nothing of the body has reached the
    server yet, the client gets the 503 of DESIGN §3.4, with ``Retry-After``
    when known. After that the exception is re-raised unchanged, and the
    app's iterable is always closed, once.

    The app's ``start_response`` call is held until its first body chunk (or
    its first ``write()``), so headers the app set but never sent are simply
    dropped: the 503 is the server's first and only start, without
    ``exc_info``. Servers and in-process test clients (``httpx.WSGITransport``,
    werkzeug's and Flask's test clients) that re-raise any ``exc_info`` they
    are given therefore answer the 503 too. Held calls follow PEP 3333: a new
    call with ``exc_info`` replaces the held one, a second call without it is
    an error, and once the start has gone to the server further calls go
    straight to it.

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

    __slots__ = ("_held", "_server_start_response", "_server_write", "sent", "started")

    def __init__(self, start_response: StartResponse) -> None:
        self._server_start_response = start_response
        # The app's start_response call, not yet passed to the server.
        self._held: _Start | None = None
        self._server_write: Callable[[bytes], object] | None = None
        # Whether the server's start_response has been called: from then on
        # the app's calls go straight to the server.
        self.sent = False
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
        if self.sent:
            # Past the middleware: the server re-raises exc_info if it sent the headers.
            self._server_write = self._server_start_response(status, headers, exc_info)
        elif exc_info is None and self._held is not None:
            raise AssertionError("start_response called a second time without exc_info")
        else:
            self._held = (status, headers, exc_info)
        return self.write

    def write(self, data: bytes) -> object:
        """The app's ``write()``: starts the response first, then hands ``data`` to the server."""
        self.flush()
        self.started = True
        if self._server_write is None:
            raise AssertionError("write() called before start_response()")
        return self._server_write(data)

    def flush(self) -> None:
        """Pass the held start to the server, once; nothing when the app never started."""
        held, self._held = self._held, None
        if held is None:
            return
        self.sent = True
        # exc_info is the app's own, passed on as the app gave it.
        self._server_write = self._server_start_response(*held)

    def unavailable(self, exc: Exception) -> list[bytes] | None:
        """Start the 503 and return its body if ``exc``, being handled, allows it; else ``None``."""
        suspended = find_suspended(exc)
        if suspended is None or self.started or self.sent:
            return None
        self._held = None  # the app's headers were never sent: dropped
        self.sent = True
        self._server_start_response(_STATUS, unavailable_headers(suspended))
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
                exchange.flush()  # an empty body: the response still starts
                return
            except Exception as exc:
                answer = exchange.unavailable(exc)
                if answer is None:
                    raise
                self.close()  # the app's body is abandoned for the 503
                yield from answer
                return
            if not chunk:
                # An empty chunk sends nothing (PEP 3333), yet passing it on would
                # make some servers send the held headers: the 503 stays possible.
                continue
            exchange.flush()
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
