"""The operator's commands: `sidestep suspensions`, `sidestep clear` and `sidestep doctor`.

`suspensions` and `clear` read the store the configuration names, through
its routes: the same rows and rules as the admin API (`_listing`). A memory
store lives inside the running process, so for one they talk to that
process's admin app instead (``--admin-url``, the token from ``--token-env``).
`doctor` prints `_doctor`'s findings. Output names routes, targets, scopes
and keys, never a credential, a URL path or a query.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import logging
import os
import re
import sys
import time
import warnings
from collections import ChainMap
from collections.abc import Iterator
from typing import Any, TextIO
from urllib.parse import quote, urlsplit

from .._common.errors import ConfigError
from .._core.listing import Listing, StoreUnavailable
from .._core.listing_row import as_json, matches
from .._core.routes import Router
from .._settings.config import Config, _validate, load_config
from .._settings.stores import plain_redis_url
from .._settings.values import SidestepConfigWarning
from .._settings.yaml_document import _interpolate, _parse_yaml, _UnresolvedReference
from .._state.build import build_store
from .doctor import WARN, Finding, diagnose, unset_variables

__all__ = ["add_doctor", "add_operations", "doctor", "operate"]

_USAGE = 2
_FAILED = 1
# What an unset ${VAR} stands in as, so that the rest of a configuration validates: a
# host for a whole URL, a word for a variable inside a longer value.
_UNSET_HOST = "unset.invalid"
_UNSET_VALUE = "unset-placeholder"
_COLUMNS = ("scope_id", "route", "target", "scope", "state", "reason", "failures", "retry_in")


def add_operations(commands: Any) -> None:
    """The `suspensions` and `clear` sub-commands."""
    listing = commands.add_parser(
        "suspensions",
        help="list the scopes the configured store holds open",
        description="List what sidestep has suspended, from the store the configuration names.",
    )
    clear = commands.add_parser(
        "clear",
        help="clear one suspension by its scope_id",
        description="Clear one suspension: the next request goes to that target again.",
    )
    for parser in (listing, clear):
        _config_option(parser)
        parser.add_argument(
            "--admin-url",
            metavar="URL",
            help="ask a running admin app (sidestep.admin) instead of the store",
        )
        parser.add_argument(
            "--token-env",
            metavar="VAR",
            help="the environment variable holding the admin app's token (with --admin-url)",
        )
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.add_argument("--route", metavar="R", help="only this route's scopes")
    listing.add_argument("--target", metavar="T", help="only this target's scopes")
    listing.add_argument("--reason", metavar="REASON", help="only scopes suspended for this")
    clear.add_argument("scope_id", metavar="SCOPE_ID")


def add_doctor(commands: Any) -> None:
    doctor = commands.add_parser(
        "doctor",
        help="check a configuration without calling an upstream",
        description=(
            "Check a configuration: timeouts against budgets, targets a request can never"
            " reach, targets that are not redundant, overlapping routes, LLM settings,"
            " windows, unset variables, the store. Exit 0; 1 with --strict when any finding"
            " warns; 2 for an invalid configuration."
        ),
    )
    _config_option(doctor)
    doctor.add_argument("--json", action="store_true", help="print JSON")
    doctor.add_argument("--strict", action="store_true", help="exit 1 when any finding warns")
    doctor.add_argument(
        "--online", action="store_true", help="ping the configured Redis (no upstream is called)"
    )
    doctor.add_argument(
        "cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command `run` will start"
    )


def _config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c",
        "--config",
        metavar="FILE",
        help="the configuration file (default: the SIDESTEP_CONFIG environment variable)",
    )


# --- suspensions and clear ------------------------------------------------------------------


def operate(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run `suspensions` or `clear`; the exit status."""
    out = out or sys.stdout
    name = f"sidestep {args.command}"
    if args.admin_url:
        return _remote(args, name, out)
    path = args.config or os.environ.get("SIDESTEP_CONFIG")
    if not path:
        return _fail(name, "no configuration: -c FILE (or SIDESTEP_CONFIG)", _USAGE)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SidestepConfigWarning)
            config = load_config(path)
    except ConfigError as exc:
        return _fail(name, str(exc), _USAGE)
    if not config.store.shared:
        return _fail(
            name,
            f"the store is {config.store.kind}: suspensions live inside the running process."
            " Ask its admin app: --admin-url URL --token-env VAR",
            _USAGE,
        )
    try:
        store = build_store(config.store)
    except (ImportError, ValueError) as exc:
        return _fail(name, str(exc), _USAGE)
    try:
        view = Listing(store, Router(config))
        if args.command == "clear":
            with _audit_to_stderr():
                row = view.clear(args.scope_id, who=f"cli:{_user()}")
            result = None if row is None else as_json(row, view.clock(), time.time())
            payload: dict[str, Any] = {"cleared": result}
        else:
            rows = view.suspensions()
            filters = {k: v for k in ("route", "target", "reason") if (v := getattr(args, k))}
            now, wall = view.clock(), time.time()
            shown = [as_json(r, now, wall) for r in rows if matches(r, filters)]
            payload = {"routes": view.routes(), "suspensions": shown}
    except StoreUnavailable:
        return _fail(name, f"the store did not answer ({store!r}): nothing to show", _FAILED)
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    return _show(args, payload, out)


def _remote(args: argparse.Namespace, name: str, out: TextIO) -> int:
    import httpx

    if not args.token_env:
        return _fail(name, "--admin-url needs --token-env VAR (the variable holding the token)", 2)
    token = os.environ.get(args.token_env, "").strip()
    if not token:
        return _fail(name, f"environment variable {args.token_env!r} is not set", _USAGE)
    if not token.isascii() or not token.isprintable() or " " in token:
        # a header cannot carry it; the message never quotes it
        return _fail(name, f"environment variable {args.token_env!r} holds no usable token", _USAGE)
    base = args.admin_url.rstrip("/")
    if _in_clear(base):
        print(
            f"{name}: warning: the token goes unencrypted over http:// to a host that is"
            " not this machine; use https://",
            file=sys.stderr,
        )
    headers = {"authorization": f"Bearer {token}"}
    payload: Any = None
    try:
        # trust_env off: no HTTP(S)_PROXY, no .netrc — the token goes to the admin app alone
        with httpx.Client(headers=headers, timeout=10.0, trust_env=False) as client:
            if args.command == "clear":
                response = client.delete(f"{base}/suspensions/{quote(args.scope_id, safe='')}")
                if response.status_code == 404 and _not_found(response):
                    return _show(args, {"cleared": None}, out)
                response.raise_for_status()
                payload = {"cleared": response.json()}
            else:
                params = {k: v for k in ("route", "target", "reason") if (v := getattr(args, k))}
                payload = _every_page(client, f"{base}/suspensions", params)
    except httpx.HTTPStatusError as exc:
        return _fail(name, f"the admin app answered {exc.response.status_code}", _FAILED)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        # the exception's message may quote the URL; its kind is enough
        return _fail(name, f"cannot reach the admin app ({type(exc).__name__})", _FAILED)
    except ValueError:  # the answer is not JSON
        pass
    if not _admin_answer(payload):
        return _fail(name, "the URL answered, but not as sidestep's admin app", _FAILED)
    return _show(args, payload, out)


def _every_page(client: Any, url: str, params: dict[str, str]) -> Any:
    """The admin app's listing, every page of it, as ``{"routes": ..., "suspensions": [...]}``.

    Each answer's ``next`` is where the next page starts; an answer with none (or
    one that would not move on) is the last. An answer that is not the admin app's
    is handed back as it came, for the caller to refuse.
    """
    first = client.get(url, params=params).raise_for_status().json()
    if not _admin_answer(first):
        return first
    rows, after, more = list(first["suspensions"]), "", first
    while isinstance(more.get("next"), str) and more["next"] > after:
        after = more["next"]
        more = client.get(url, params={**params, "after": after}).raise_for_status().json()
        if not _admin_answer(more):
            return more
        rows += more["suspensions"]
    return {"routes": first.get("routes"), "suspensions": rows}


def _in_clear(url: str) -> bool:
    """Whether `url` is plain http:// to a host other than a loopback address."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
    except ValueError:
        return False  # no URL at all: the request fails before anything is sent
    if parts.scheme.lower() != "http":
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a name: it may resolve anywhere


def _not_found(response: Any) -> bool:
    """Whether a 404 is the admin app's "no such scope" (not a wrong URL's 404)."""
    try:
        return bool(response.json() == {"error": "not_found"})
    except ValueError:
        return False


def _admin_answer(payload: Any) -> bool:
    """Whether `payload` is what the admin app answers: rows (or a cleared row) to show."""
    if not isinstance(payload, dict):
        return False
    rows = [payload["cleared"]] if "cleared" in payload else payload.get("suspensions")
    return isinstance(rows, list) and all(
        isinstance(row, dict) and set(_COLUMNS) <= row.keys() for row in rows
    )


def _show(args: argparse.Namespace, payload: dict[str, Any], out: TextIO) -> int:
    if args.command == "clear":
        row = payload["cleared"]
        if row is None:
            return _fail("sidestep clear", "no suspension has that scope_id", _FAILED)
        where = f"route {row['route']}, " if row["route"] is not None else "no route, "
        print(
            f"cleared {row['scope_id']}: {where}target {row['target']},"
            f" {row['scope']} scope, was {row['state']} ({row['reason']})",
            file=out,
        )
        return 0
    if args.json:
        print(json.dumps(payload, indent=2), file=out)
        return 0
    rows = payload["suspensions"]
    if not rows:
        print("no suspensions", file=out)
        return 0
    table = [list(_COLUMNS)] + [[_cell(row, column) for column in _COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(_COLUMNS))]
    for line in table:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(), file=out)
    return 0


def _cell(row: dict[str, Any], column: str) -> str:
    value = row[column]
    if column == "retry_in":
        return "until cleared" if value is None else f"{value:.0f}s"
    return "-" if value is None else str(value)


@contextlib.contextmanager
def _audit_to_stderr() -> Iterator[None]:
    """The clear's audit record (``suspension.cleared``, WARNING) on stderr, where a shell
    keeps it, unless the logging of this process already sends sidestep's records on."""
    logger = logging.getLogger("sidestep")
    if _handled(logger):
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("sidestep: %(levelname)s %(message)s"))
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def _handled(logger: logging.Logger) -> bool:
    """Whether a record of `logger` at WARNING reaches a handler other than a NullHandler."""
    current: logging.Logger | None = logger
    while current is not None:
        if any(not isinstance(h, logging.NullHandler) for h in current.handlers):
            return True
        current = current.parent if current.propagate else None
    return False


def _user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except Exception:  # no user name in this environment: the audit record says so
        return "unknown"


def _fail(name: str, message: str, status: int) -> int:
    print(f"{name}: {message}", file=sys.stderr)
    return status


# --- doctor ---------------------------------------------------------------------------------


def doctor(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run `doctor`; 0, 1 with --strict when a finding warns, 2 for an invalid configuration."""
    out = out or sys.stdout
    path = args.config or os.environ.get("SIDESTEP_CONFIG")
    if not path:
        return _fail("sidestep doctor", "no configuration: -c FILE (or SIDESTEP_CONFIG)", _USAGE)
    try:
        config, unset, warned = _load_leniently(path)
    except ConfigError as exc:
        return _fail("sidestep doctor", str(exc), _USAGE)
    command = list(args.cmd)
    if command[:1] == ["--"]:
        command = command[1:]
    ping = _pinger(config, unset) if args.online else None
    findings = [
        *(Finding(WARN, "config", message) for message in warned),
        *diagnose(config, unset=unset, command=command, ping=ping),
    ]
    if args.json:
        print(json.dumps({"findings": [f.as_dict() for f in findings]}, indent=2), file=out)
    else:
        for finding in findings:
            print(f"{finding.status:<7} {finding.check:<16} {finding.reason}", file=out)
            if finding.keys:
                print(f"{'':<24} keys: {', '.join(finding.keys)}", file=out)
        counts = {s: sum(f.status == s for f in findings) for s in ("ok", "warn", "unknown")}
        print(", ".join(f"{n} {s}" for s, n in counts.items()), file=out)
    warns = any(f.status == WARN for f in findings)
    return 1 if args.strict and warns else 0


def _load_leniently(path: str) -> tuple[Config, list[str], list[str]]:
    """The configuration, with unset ``${VAR}``s standing in as placeholders; those names;
    the configuration's own warnings."""
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: the file is not valid UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the file ({exc.strerror or 'error'})") from None
    data = _parse_yaml(text, path) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of settings")
    unset = unset_variables(data)
    try:
        config, warned = _validated(data, unset, path)
    except ConfigError as invalid:
        if not unset:
            raise
        # A number, duration or switch that is one unset variable: no placeholder string
        # passes for it, so it is left out and its default stands in.
        try:
            config, warned = _validated(_without_lone(data, set(unset)), unset, path)
        except ConfigError:
            raise invalid from None
    return config, unset, warned


def _validated(data: dict[str, Any], unset: list[str], path: str) -> tuple[Config, list[str]]:
    """The configuration with placeholders for the unset variables; its own warnings."""
    data = _url_placeholders(data, set(unset), in_store=False)
    environ = ChainMap(dict.fromkeys(unset, _UNSET_VALUE), dict(os.environ))
    try:
        data = _interpolate(data, (), environ)
    except _UnresolvedReference as exc:
        raise ConfigError(f"{path}: {exc.reason}") from None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SidestepConfigWarning)
        config = _validate(data, path)
    return config, [str(w.message) for w in caught]


def _without_lone(node: Any, unset: set[str]) -> Any:
    """`node` without the settings and list items whose whole value is one unset ``${VAR}``
    (bar names, URLs, headers and JSON fields, for which a placeholder string serves)."""
    if isinstance(node, list):
        return [_without_lone(v, unset) for v in node if not _lone(v, unset)]
    if not isinstance(node, dict):
        return node
    return {
        key: value if key in ("headers", "json") else _without_lone(value, unset)
        for key, value in node.items()
        if key in ("name", "url") or not _lone(value, unset)
    }


def _lone(value: Any, unset: set[str]) -> bool:
    ref = re.fullmatch(r"\$\{(\w+)\}", value) if isinstance(value, str) else None
    return ref is not None and ref[1] in unset


def _store_url_unset(config: Config, unset: list[str]) -> bool:
    """Whether the store's URL stands in for an unset variable (`_url_placeholders`)."""
    url = str(getattr(config.store.options, "url", ""))
    return bool(unset) and (_UNSET_HOST in url or _UNSET_VALUE in url)


def _url_placeholders(node: Any, unset: set[str], *, in_store: bool) -> Any:
    """An unset ``url: ${VAR}`` stands in as a URL of the right kind, so the rest validates."""
    if isinstance(node, list):
        return [_url_placeholders(v, unset, in_store=in_store) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        ref = re.fullmatch(r"\$\{(\w+)\}", value) if isinstance(value, str) else None
        if key == "url" and ref and ref[1] in unset:
            scheme = "redis" if in_store else "https"
            out[key] = f"{scheme}://{_UNSET_HOST}"
        else:
            out[key] = _url_placeholders(value, unset, in_store=in_store or key == "store")
    return out


def _pinger(config: Config, unset: list[str]) -> Any:
    if config.store.kind != "redis":
        return None

    def ping() -> bool | None:
        if _store_url_unset(config, unset):
            return None  # its address is a stand-in: there is nothing to ask
        import redis  # the optional redis extra: only for a Redis store

        options = config.store.options
        try:
            client = redis.Redis.from_url(
                plain_redis_url(options.url)[0],  # type: ignore[attr-defined]  # one node of a cluster
                socket_timeout=2.0,
                socket_connect_timeout=2.0,
            )
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:  # any failure is "does not answer"; its message may quote the URL
            return False

    return ping
