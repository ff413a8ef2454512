"""An error event before a streamed answer's first token, as the plain answer it stands for.

Pure, no I/O. A head (`first_token`) that meets an error before any content
hands its payload here: `error_answer` gives the status and JSON body the
provider would have answered with had the request not streamed, for the
classifier to judge as it judges that answer.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["error_answer"]

# The error's type or code -> the status the provider answers it with when not streaming.
_ERROR_STATUSES = {
    "invalid_request_error": 400,
    "invalid_prompt": 400,
    "context_length_exceeded": 400,
    "authentication_error": 401,
    "invalid_api_key": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    "requests": 429,
    "tokens": 429,
    "api_error": 500,
    "server_error": 500,
    "service_unavailable": 503,
    "timeout_error": 504,
    "overloaded_error": 529,
}
_UNKNOWN_ERROR = 500  # an error before any content that says nothing known: the upstream's


def error_answer(dialect_payload: Any) -> tuple[int, bytes]:
    """The status and JSON body an error event before any content stands for.

    The body is the error as the provider's plain answer carries it
    (``{"error": {...}}``, Anthropic's ``{"type": "error", "error": {...}}``),
    so the classifier judges it as it judges that answer: an overload as a
    529, a rate limit as a 429 (with its quota signals), a request at fault
    as a 400. An error of no known type or code is a 500.
    """
    payload = dialect_payload if isinstance(dialect_payload, dict) else {}
    error: Any = payload.get("error")
    if not isinstance(error, dict):
        response = payload.get("response")
        if payload.get("type") == "response.failed" and isinstance(response, dict):
            error = response.get("error")  # OpenAI Responses: the failed response's error
        else:
            error = {k: v for k, v in payload.items() if k in ("code", "message", "param")}
    if not isinstance(error, dict):
        error = {}
    status = _UNKNOWN_ERROR
    for key in ("code", "type"):
        value = error.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 400 <= value < 600:
            status = value  # a gateway's HTTP status as the code
            break
        found = _ERROR_STATUSES.get(value) if isinstance(value, str) else None
        if found is not None:
            status = found
            break
    body = payload if payload.get("type") == "error" and "error" in payload else {"error": error}
    return status, json.dumps(body).encode()
