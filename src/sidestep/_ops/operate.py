"""The operator's commands `sidestep suspensions` and `sidestep clear`.

They read the store the configuration names, through its routes: the same
rows and rules as the admin API (`_core.listing`). A memory store lives inside the
running process, so for one they talk to that process's admin app instead
(``--admin-url``, the token from ``--token-env``). Output names routes,
targets, scopes and keys, never a credential, a URL path or a query.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any, TextIO
from urllib.parse import quote, urlsplit

from .._common.errors import ConfigError
from .._core.listing import Listing, StoreUnavailable
from .._core.listing_row import as_json, matches
from .._core.routes import Router
from .._settings.config import load_config
from .._settings.values import SidestepConfigWarning
from .._state.build import build_store
from .command_line import FAILED, USAGE, config_option, fail

__all__ = ["add_operations", "operate"]

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
        config_option(parser)
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


def operate(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run `suspensions` or `clear`; the exit status."""
    out = out or sys.stdout
    name = f"sidestep {args.command}"
    if args.admin_url:
        return _remote(args, name, out)
    path = args.config or os.environ.get("SIDESTEP_CONFIG")
    if not path:
        return fail(name, "no configuration: -c FILE (or SIDESTEP_CONFIG)", USAGE)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SidestepConfigWarning)
            config = load_config(path)
    except ConfigError as exc:
        return fail(name, str(exc), USAGE)
    if not config.store.shared:
        return fail(
            name,
            f"the store is {config.store.kind}: suspensions live inside the running process."
            " Ask its admin app: --admin-url URL --token-env VAR",
            USAGE,
        )
    try:
        store = build_store(config.store)
    except (ImportError, ValueError) as exc:
        return fail(name, str(exc), USAGE)
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
        return fail(name, f"the store did not answer ({store!r}): nothing to show", FAILED)
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    return _show(args, payload, out)


def _remote(args: argparse.Namespace, name: str, out: TextIO) -> int:
    import httpx

    if not args.token_env:
        return fail(name, "--admin-url needs --token-env VAR (the variable holding the token)", 2)
    token = os.environ.get(args.token_env, "").strip()
    if not token:
        return fail(name, f"environment variable {args.token_env!r} is not set", USAGE)
    if not token.isascii() or not token.isprintable() or " " in token:
        # a header cannot carry it; the message never quotes it
        return fail(name, f"environment variable {args.token_env!r} holds no usable token", USAGE)
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
        return fail(name, f"the admin app answered {exc.response.status_code}", FAILED)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        # the exception's message may quote the URL; its kind is enough
        return fail(name, f"cannot reach the admin app ({type(exc).__name__})", FAILED)
    except ValueError:  # the answer is not JSON
        pass
    if not _admin_answer(payload):
        return fail(name, "the URL answered, but not as sidestep's admin app", FAILED)
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
    if host == "localhost":
        return False  # (a name under .localhost may still be looked up in DNS: it warns)
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
            return fail("sidestep clear", "no suspension has that scope_id", FAILED)
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
