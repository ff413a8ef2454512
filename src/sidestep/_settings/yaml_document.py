"""Reading a YAML configuration document: the parts that see its text.

`_parse_yaml` parses one document with a safe loader that refuses a key given
twice and a document whose aliases stand for more than `_MAX_VALUES` values;
`_interpolate` substitutes ``${NAME}`` in its string values. Every message
names a line or a key path and the rule, never the text there: values may be
credentials.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from .._common.errors import ConfigError

__all__ = ["_UnresolvedReference", "_interpolate", "_parse_yaml", "read_document"]

# A configuration is a few kilobytes; past this, it is not one (a device, a stream).
MAX_BYTES = 4 * 2**20


def read_document(source: str) -> str:
    """The text of the file at `source`, read no further than `MAX_BYTES`.

    Raises:
        ConfigError: the file cannot be read, is not UTF-8 or is larger than
            `MAX_BYTES` (an endless file, ``/dev/zero``, is never read whole).
    """
    try:
        with open(source, "rb") as file:
            raw = file.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read the file ({exc.strerror or 'error'})") from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(
            f"{source}: larger than {MAX_BYTES // 2**20} MiB, which no configuration is"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: the file is not valid UTF-8") from None


# A configuration nests a handful of levels; PyYAML composes nodes recursively, so a
# document nested a few hundred levels deep would exhaust the interpreter's stack.
_MAX_DEPTH = 64


class _TooDeep(Exception):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses a key given twice in one mapping instead of keeping the
    last, and a document nested deeper than `_MAX_DEPTH`."""

    _depth = 0
    at: Any = None  # the mark of the node last constructed: where a value failed

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        self.at = node.start_mark
        return super().construct_object(node, deep)

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > _MAX_DEPTH:
                raise _TooDeep
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[str] = set()
    for key_node, _ in node.value:
        # merge keys (`<<`) may legitimately repeat keys they merge in; compare plain keys only
        if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
            if key_node.value in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, "found a duplicate key", key_node.start_mark
                )
            seen.add(key_node.value)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

_QUOTED = re.compile(r"'([^']*)'")


# A configuration is a few hundred values; aliases (`*name`) share one node between
# places, so a small document can stand for billions of values ("billion laughs").
_MAX_VALUES = 100_000


def _parse_yaml(text: str, source: str) -> object:
    loader = None
    try:
        loader = _UniqueKeyLoader(text)  # reads the text at once: a NUL is refused here
        data = loader.get_single_data()
        if _expanded_size(data, {}) > _MAX_VALUES:
            raise ConfigError(
                f"{source}: the document stands for more than {_MAX_VALUES:,} values"
                " once its aliases are expanded"
            )
        return data
    except yaml.MarkedYAMLError as exc:
        # never str(exc): it quotes the offending line, which may hold a secret
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = _QUOTED.sub(_mask_quoted, exc.problem or exc.context or "syntax error")
        raise ConfigError(f"{source}: invalid YAML{where}: {problem}") from None
    except yaml.YAMLError:
        raise ConfigError(f"{source}: invalid YAML (an unacceptable character)") from None
    except ConfigError:
        raise  # (a ValueError too)
    except (ValueError, KeyError, AttributeError, TypeError, OverflowError):
        # a scalar its tag or form cannot stand for (5,000 digits, 2024-02-30,
        # ``!!int three``): the constructor's message may repeat the text, never shown
        mark = None if loader is None else loader.at
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            f"{source}: invalid YAML{where}: a value its tag or form cannot stand for"
        ) from None
    except (_TooDeep, RecursionError):
        raise ConfigError(
            f"{source}: the document is nested more than {_MAX_DEPTH} levels deep"
        ) from None
    finally:
        if loader is not None:
            loader.dispose()


def _expanded_size(node: object, sizes: dict[int, int]) -> int:
    """How many values `node` holds once every alias is expanded; each shared node counted once."""
    if not isinstance(node, (dict, list)):
        return 1
    known = sizes.get(id(node))
    if known is None:
        sizes[id(node)] = _MAX_VALUES + 1  # a node reached again while being counted: a cycle
        items = node.values() if isinstance(node, dict) else node
        known = sizes[id(node)] = 1 + sum(_expanded_size(item, sizes) for item in items)
    return known


def _mask_quoted(match: re.Match[str]) -> str:
    # PyYAML quotes single characters and token kinds ('\t', '<scalar>'), which help,
    # but also tags and alias names, which are document text
    quoted = match[1]
    if len(quoted) <= 2 or re.fullmatch(r"<[\w ]+>", quoted):
        return match[0]
    return "'...'"


_REFERENCE = re.compile(r"\$\$\{|\$\{([^}]*)(\}?)")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _UnresolvedReference(Exception):
    def __init__(self, loc: tuple[str | int, ...], reason: str) -> None:
        super().__init__(reason)
        self.loc = loc
        self.reason = reason


def _interpolate(node: Any, loc: tuple[str | int, ...], environ: Mapping[str, str]) -> Any:
    """Substitute `${NAME}` in every string value of a parsed YAML tree (keys are left alone)."""
    if isinstance(node, dict):
        return {key: _interpolate(value, (*loc, key), environ) for key, value in node.items()}
    if isinstance(node, list):
        return [_interpolate(value, (*loc, index), environ) for index, value in enumerate(node)]
    if not isinstance(node, str):
        return node

    def substitute(match: re.Match[str]) -> str:
        if match[0] == "$${":
            return "${"
        name, closed = match[1], match[2]
        if not closed:
            raise _UnresolvedReference(loc, "'${' is not closed (write '$${' for a literal '${')")
        if not _VARIABLE.fullmatch(name):
            raise _UnresolvedReference(loc, "a '${...}' reference must name a variable: ${NAME}")
        if name not in environ:
            raise _UnresolvedReference(loc, f"environment variable {name!r} is not set")
        return environ[name]

    return _REFERENCE.sub(substitute, node)
