"""Flask integration: ``AllCandidatesSuspended`` in a view becomes a clean 503.

Flask turns a view's exception into a 500 before any WSGI middleware sees it,
so the mapping has to be one of Flask's error handlers: ``init_app(app)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

try:
    import flask
    from werkzeug.exceptions import HTTPException, InternalServerError
except ImportError as exc:
    raise ImportError(
        "sidestep.flask needs Flask, which is not installed: pip install 'sidestep[flask]'"
    ) from exc

from ._core.suspended import find_suspended, unavailable_body, unavailable_headers

if TYPE_CHECKING:
    from flask.typing import ResponseReturnValue

__all__ = ["init_app"]


def init_app(app: flask.Flask) -> None:
    """Answer requests whose view raised ``AllCandidatesSuspended`` with the 503.

    Registers an error handler for ``Exception`` that answers with the 503 of
    DESIGN §3.4 when the exception's ``__cause__``/``__context__`` chain holds
    ``AllCandidatesSuspended`` (so ``openai.APIConnectionError`` and other SDK
    wrappers are seen through), and leaves every other exception to Flask's
    normal handling: HTTP errors such as 404 keep their responses, handlers
    for more specific classes or codes keep precedence, an ``Exception``
    handler registered before ``init_app`` still gets the rest, and other
    errors become 500s, or propagate under ``PROPAGATE_EXCEPTIONS`` (testing
    and debug). Calling it twice does nothing more.

    Example::

        app = flask.Flask(__name__)
        sidestep.flask.init_app(app)
    """
    if "sidestep" in app.extensions:
        return
    previous = app.error_handler_spec[None][None].get(Exception)

    def handle(error: Exception) -> ResponseReturnValue:
        # Flask hands errors that escaped other handlers over as a 500 that
        # carries the original; other HTTP errors are the app's own answers.
        if isinstance(error, InternalServerError):
            original = error.original_exception
            suspended = find_suspended(original) if original is not None else None
        elif isinstance(error, HTTPException):
            suspended = None
        else:
            suspended = find_suspended(error)
        if suspended is not None:
            return flask.Response(
                unavailable_body(suspended), status=503, headers=unavailable_headers(suspended)
            )
        if previous is not None:
            return app.ensure_sync(previous)(error)  # type: ignore[no-any-return]
        if isinstance(error, HTTPException):
            return error  # what Flask does when no handler is registered
        raise error  # unhandled: Flask logs it and answers 500, or propagates it

    app.register_error_handler(Exception, handle)
    app.extensions["sidestep"] = handle
