"""A configuration as `sidestep doctor` reads it: leniently, for unset variables.

An unset ``${VAR}`` stands in as a placeholder (a URL of the right kind for a
whole ``url``, a word elsewhere) or, where no string passes, is left out for
its default, so the rest of the file still validates and gets its findings.
The configuration's own warnings are collected, not shown.
"""

from __future__ import annotations

import os
import re
import warnings
from collections import ChainMap
from collections.abc import Mapping
from typing import Any

from .._common.errors import ConfigError
from .._settings.config import Config, _validate
from .._settings.values import SidestepConfigWarning
from .._settings.yaml_document import (
    _interpolate,
    _parse_yaml,
    _UnresolvedReference,
    read_document,
)

__all__ = ["load_leniently", "store_url_unset", "unset_variables"]

# What an unset ${VAR} stands in as, so that the rest of a configuration validates: a
# host for a whole URL, a word for a variable inside a longer value.
_UNSET_HOST = "unset.invalid"
_UNSET_VALUE = "unset-placeholder"


def load_leniently(path: str) -> tuple[Config, list[str], list[str]]:
    """The configuration, with unset ``${VAR}``s standing in as placeholders; those names;
    the configuration's own warnings."""
    data = _parse_yaml(read_document(path), path) or {}
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


def store_url_unset(config: Config, unset: list[str]) -> bool:
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


def unset_variables(data: object, environ: Mapping[str, str] = os.environ) -> list[str]:
    """The ``${NAME}`` references in a parsed YAML tree's strings whose variable is unset."""
    found: list[str] = []
    stack = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str):
            for name in re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)\}", node):
                if name not in environ:
                    found.append(name)
    return sorted(set(found))
