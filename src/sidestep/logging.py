"""Redaction of log events, and the emission of sidestep's own events.

``redact`` is a structlog processor that applies the redaction rules
(DESIGN §7) to any event dict, so applications can put it in their own chain.
``emit`` reports one sidestep event, redacted: to the standard library logger
``logging.getLogger("sidestep")`` (which has only a ``NullHandler`` of its
own, so the application's logging configuration decides where it goes), or
through ``structlog.get_logger("sidestep")`` when the application configured
structlog; and to the registered observers.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
from collections.abc import Mapping, MutableMapping
from types import MappingProxyType
from typing import Any, Protocol

import structlog

from ._common.scopes import is_credential

__all__ = [
    "REDACTED",
    "Observer",
    "add_observer",
    "emit",
    "listening",
    "mask_text",
    "origin_of_url",
    "redact",
    "redact_value",
    "remove_observer",
]

REDACTED = "[redacted]"

# Keys whose values are credentials, compared with case, "-" and "_" ignored.
_CREDENTIAL_WORDS = (
    "authorization",
    "cookie",
    "key",
    "token",
    "secret",
    "password",
    "passwd",
    "signature",
)
# Request and response bodies are never logged, whatever they hold.
_BODY_KEYS = frozenset({"body", "content", "json", "data"})
# structlog's own slot for exception info: processors further down expect the
# original value (True, an exception or a sys.exc_info() tuple).
_PASSTHROUGH_KEYS = frozenset({"exc_info"})

_DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}
# Containers nested deeper than this are not walked, and are redacted whole.
_MAX_DEPTH = 12

# A URL in text ends at whitespace or at a character that never belongs to a
# URL as written; every other character is taken as part of it, so no piece
# of a secret stays behind. The look-behind keeps the scan linear.
_URL_RE = re.compile(
    r"(?<![A-Za-z0-9+.\-])(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]{0,30})://"
    r"(?P<authority>[^\s/?#\"<>]*)[^\s\"<>]*"
)
_CREDENTIAL_RE = re.compile(
    # Authorization: Bearer xxx, api_key=xxx, "client_secret": "xxx"
    r"(?<![\w\-])(?P<label>[\w\-]{0,40}?(?i:" + "|".join(_CREDENTIAL_WORDS) + r")[\w\-]{0,40}?"
    r"[\"']?\s*[:=]\s*[\"']?)(?i:(?:bearer|basic)\s+)?[^\s\"',;&]+"
    # Bearer xxx, Basic xxx
    r"|(?i:\b(?P<auth>bearer|basic)\s+)[^\s\"'<>,;]+"
    # sk-..., sk-proj-..., sk-ant-..., xai-..., AIza...
    r"|(?<![A-Za-z0-9])(?P<prefix>sk-|xai-|AIza)[A-Za-z0-9_\-]{8,}"
)
# Every match of _CREDENTIAL_RE contains one of these, lower-cased; most text
# contains none, and substring tests are far cheaper than a regex pass.
_CREDENTIAL_HINTS = (*_CREDENTIAL_WORDS, "bearer", "basic", "sk-", "xai-", "aiza")
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[\w.~%\-]+)(?::(\d{0,5}))?")


def origin_of_url(url: str | object) -> str:
    """The origin of ``url``: ``scheme://host`` plus a non-default port.

    ``url`` is a string or a URL object (anything with ``scheme`` and
    ``host``, such as ``httpx.URL`` and ``httpx2.URL``, or ``hostname``, such
    as urllib's parse results). Userinfo, path, query and fragment are never
    part of the result.

    Returns:
        The origin, or ``""`` when ``url`` is not an absolute URL with a host.

    Example:
        >>> origin_of_url("https://user:pw@API.example.com:8443/v1?key=x")
        'https://api.example.com:8443'
    """
    if isinstance(url, str):
        match = _URL_RE.fullmatch(url.strip())
        if match is None:
            return ""
        return _origin(match["scheme"], match["authority"]) or ""
    scheme = getattr(url, "scheme", None)
    host = getattr(url, "host", None) or getattr(url, "hostname", None)
    if not isinstance(scheme, str) or not isinstance(host, str) or not scheme or not host:
        return ""
    try:
        port = getattr(url, "port", None)
    except ValueError:  # urllib's parse results raise on a malformed port
        return ""
    scheme = scheme.lower()
    host = host.lower()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return _join_origin(scheme, host, port if isinstance(port, int) else None)


def _origin(scheme: str, authority: str) -> str | None:
    # Userinfo ends at the last "@", as in every URL parser.
    host_port = _HOST_PORT.fullmatch(authority.rpartition("@")[2])
    if host_port is None:
        return None
    port = host_port[2]
    return _join_origin(scheme.lower(), host_port[1].lower(), int(port) if port else None)


def _join_origin(scheme: str, host: str, port: int | None) -> str:
    if port is None or _DEFAULT_PORTS.get(scheme) == port:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def _mask_url(match: re.Match[str]) -> str:
    origin = _origin(match["scheme"], match["authority"])
    return origin if origin is not None else REDACTED


def _mask_credential(match: re.Match[str]) -> str:
    if match["auth"] is not None:
        return f"{match['auth']} {REDACTED}"
    if match["label"] is not None:
        return f"{match['label']}{REDACTED}"
    return f"{match['prefix']}{REDACTED}"


def mask_text(text: str) -> str:
    """``text`` with its secrets masked, for messages and other free text.

    URLs are cut to their origin; ``Bearer``/``Basic`` credentials,
    ``sk-``/``xai-``/``AIza`` API keys and the values of ``name=value`` or
    ``name: value`` pairs whose name looks like a credential become
    ``[redacted]``.

    Example:
        >>> mask_text("POST https://api.example.com/v1?key=abc with Bearer eyJhbGciOi")
        'POST https://api.example.com with Bearer [redacted]'
    """
    if "://" in text:
        text = _URL_RE.sub(_mask_url, text)
    folded = text.lower()
    for hint in _CREDENTIAL_HINTS:  # a plain loop: measurably cheaper than any()
        if hint in folded:
            return _CREDENTIAL_RE.sub(_mask_credential, text)
    return text


@functools.lru_cache(maxsize=1024)
def _is_sensitive_key(key: str) -> bool:
    # A credential by the same rule that keeps it from crossing origins.
    return key.lower().replace("-", "").replace("_", "") in _BODY_KEYS or is_credential(key)


def redact_value(key: str, value: object) -> object:
    """``value`` as it may be logged under ``key``.

    The whole value is ``"[redacted]"`` when ``key`` names a credential
    (``Authorization``, ``x-api-key``, ``client_secret``, …) or a body
    (``body``, ``content``, ``json``, ``data``); otherwise ``value`` is
    redacted by its type: text is masked (``mask_text``), URL objects become
    their origin, mappings, lists and tuples are redacted item by item into
    new containers, bytes are never shown, exceptions are shown as their
    masked type and message, and any other value is returned as it is.
    """
    return _redact_item(key, value, 0)


def _redact(value: object, depth: int) -> object:
    if isinstance(value, str):
        return mask_text(value)
    if value is None or isinstance(value, (int, float)):
        return value
    if depth >= _MAX_DEPTH:
        return REDACTED
    if isinstance(value, Mapping):
        return {
            key: (
                _redact_item(key, item, depth + 1)
                if isinstance(key, str)
                else _redact(item, depth + 1)
            )
            for key, item in value.items()
        }
    if hasattr(value, "scheme") and (hasattr(value, "host") or hasattr(value, "hostname")):
        return origin_of_url(value) or REDACTED
    if isinstance(value, (list, tuple)):
        # A (name, value) pair is how raw header lists carry credentials.
        if len(value) == 2 and isinstance(value[0], str) and _is_sensitive_key(value[0]):
            return (value[0], REDACTED) if isinstance(value, tuple) else [value[0], REDACTED]
        items = [_redact(item, depth + 1) for item in value]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, (bytes, bytearray, memoryview)):
        return REDACTED
    if isinstance(value, BaseException):
        return mask_text(f"{type(value).__name__}: {value}")
    return value


def _redact_item(key: str, value: object, depth: int) -> object:
    if key in _PASSTHROUGH_KEYS:
        return value
    if _is_sensitive_key(key):
        return REDACTED
    return _redact(value, depth)


def redact(
    logger: object, method_name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A structlog processor applying the redaction rules to ``event_dict``.

    Every top-level value is replaced by ``redact_value(key, value)``; nested
    containers are rebuilt, never modified in place. Place it after
    ``format_exc_info`` (or ``dict_tracebacks``) so that rendered tracebacks
    are masked too: ``exc_info`` itself is left for those processors::

        structlog.configure(processors=[
            structlog.processors.format_exc_info,
            sidestep.logging.redact,
            structlog.processors.JSONRenderer(),
        ])
    """
    for key, value in list(event_dict.items()):
        redacted = redact_value(key, value)
        if redacted is not value:
            event_dict[key] = redacted
    return event_dict


class Observer(Protocol):
    """Called with every event sidestep emits, and its fields already redacted.

    Observers feed metrics and other instrumentation. They run in the thread
    or task that emitted the event, so they should be quick; an exception
    from an observer is ignored rather than break a request.
    """

    def __call__(self, event: str, fields: Mapping[str, Any], /) -> None: ...


# Per-request events are DEBUG; transitions and the shared store's health are
# INFO or WARNING, so what an outage writes at INFO follows transitions, not traffic.
# An injected fault is INFO: a rehearsal's log tells its own faults from a real outage.
_LEVELS = {
    "fault.injected": logging.INFO,
    "circuit.opened": logging.WARNING,
    "circuit.half_open": logging.INFO,
    "circuit.closed": logging.INFO,
    "all_candidates_suspended": logging.WARNING,
    "store.unavailable": logging.WARNING,
    "store.recovered": logging.INFO,
    "suspension.forgotten": logging.INFO,
}
_STRUCTLOG_METHODS = {
    logging.DEBUG: "debug",
    logging.INFO: "info",
    logging.WARNING: "warning",
}
_logger = logging.getLogger("sidestep")
_logger.addHandler(logging.NullHandler())  # a library adds no other handler
_structlog_logger = structlog.get_logger("sidestep")
_structlog_configured = structlog.is_configured
# Read on every request (`listening`), so read cheaply: the logger's own answers per
# level, which logging empties in place whenever any level changes, and structlog's
# configuration object, whose flag `structlog.is_configured()` returns. Only a logger
# that answers from that cache has it read: one of an application's logger class
# (`logging.setLoggerClass`) with its own `isEnabledFor` is asked, every time.
_answers: dict[int, bool] = {}  # never filled: `isEnabledFor` is asked
if type(_logger).isEnabledFor is logging.Logger.isEnabledFor:
    _answers = getattr(_logger, "_cache", _answers)
_structlog_config: Any = getattr(getattr(structlog, "_config", None), "_CONFIG", None)
if not isinstance(getattr(_structlog_config, "is_configured", None), bool):
    _structlog_config = None  # not the structlog this was written for: ask it
_observers: tuple[Observer, ...] = ()
_observers_lock = threading.Lock()


def add_observer(observer: Observer) -> None:
    """Call ``observer(event, fields)`` for every event sidestep emits from now on."""
    global _observers
    with _observers_lock:
        _observers = (*_observers, observer)


def remove_observer(observer: Observer) -> None:
    """Stop calling ``observer``; removing one that is not registered does nothing."""
    global _observers
    with _observers_lock:
        _observers = tuple(o for o in _observers if o != observer)


def listening(level: int = logging.DEBUG) -> bool:
    """Whether an event at ``level`` would reach anyone: an observer or a logger.

    The core asks before it builds the fields of its per-request events
    (``attempt.*``, ``request.*``), so that with no observer and no logger
    at ``level`` they cost one call and nothing else.
    """
    if _observers:
        return True
    enabled = _answers.get(level)  # None: not asked since the levels last changed
    if enabled is None:
        if _logger.isEnabledFor(level):
            return True
    elif enabled and not _logger.disabled:
        return True
    if _structlog_config is not None:
        return bool(_structlog_config.is_configured)
    return _structlog_configured()


def _shown(value: Any) -> str:
    """A field's value in a ``key=value`` line: quoted (as JSON quotes a string) when it
    holds anything that could end it or start another pair, so that a value (a peer's
    forwarded address, say) can never forge ``route=``/``target=`` pairs or lines."""
    text = value if isinstance(value, str) else str(value)
    if text and text.isprintable() and not _UNSAFE.search(text):
        return text
    return json.dumps(text)


_UNSAFE = re.compile(r'[\s="\\]')


def emit(event: str, /, _level: int | None = None, **fields: Any) -> None:
    """Report sidestep's event ``event`` with ``fields``, redacted, and tell the observers.

    ``_level`` overrides the event's usual level (DEBUG for per-request events,
    INFO or WARNING for transitions and the store's health). When the
    application configured structlog, the event goes through
    ``structlog.get_logger("sidestep")``; otherwise through the standard
    library's ``logging.getLogger("sidestep")`` as ``"event key=value ..."``,
    with the fields also on the record as ``record.sidestep``. sidestep never
    configures either. Nothing is formatted for a logger that would drop it.
    """
    level = _LEVELS.get(event, logging.DEBUG) if _level is None else _level
    observers = _observers
    if structlog.is_configured():
        redact(_structlog_logger, _STRUCTLOG_METHODS[level], fields)
        getattr(_structlog_logger, _STRUCTLOG_METHODS[level])(event, **fields)
    elif _logger.isEnabledFor(level):
        redact(_logger, _STRUCTLOG_METHODS[level], fields)
        shown = " ".join(f"{k}={_shown(v)}" for k, v in fields.items() if v is not None)
        _logger.log(
            level,
            "%s %s" if shown else "%s%s",
            event,
            shown,
            extra={"sidestep": {"event": event, **fields}},
        )
    elif observers:
        redact(_logger, _STRUCTLOG_METHODS[level], fields)
    else:
        return
    if observers:
        frozen = MappingProxyType(fields)
        for observer in observers:
            try:
                observer(event, frozen)
            except Exception:  # noqa: S112 - instrumentation must never break a request
                continue
