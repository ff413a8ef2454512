"""Which requests name state kept by one provider: such a request never moves to another.

A stored response, a file, a batch, a thread, a vector store lives at the
provider that made it; another target — another origin, or another key on
the same one — answers 404 or 400 for it, and the caller's SDK does not
retry that. `StateRules` are a route's rules (`ProviderState` in the
configuration): the built-in OpenAI and Anthropic ones and the route's own.
A path is judged once, when the core first meets it (`by_path`); a JSON
body only when its request would otherwise move (`names_state`), after a
substring scan for the field names that costs far less than parsing. Pure:
no I/O, no clock.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["BUILTIN_FIELDS", "BUILTIN_PATHS", "NOT_BY_PATH", "StateRules"]

# A pattern covers the path it names and every path below it; "*" is one segment.
# They are relative to the route's URL, after a leading /v1 (a route on the bare host).
BUILTIN_PATHS = (
    # OpenAI: a stored response or chat completion (retrieve, delete, cancel, input
    # items, messages); the creating call itself (POST /responses) is not state
    "/responses/*",
    "/chat/completions/*",
    # OpenAI: collections whose objects live at the provider, creating and listing included
    "/files",
    "/uploads",
    "/batches",
    "/vector_stores",
    "/assistants",
    "/threads",
    "/conversations",
    "/fine_tuning",
    "/containers",
    "/evals",
    "/videos",
    "/skills",
    "/chatkit",
    "/realtime/calls",
    "/audio/voices",
    "/audio/voice_consents",
    "/webhook_endpoints",
    "/organization",
    "/projects",
    # Anthropic (/files and /skills as above)
    "/messages/batches",
    "/agents",
    "/sessions",
    "/environments",
    "/memory_stores",
    "/vaults",
    "/deployments",
    "/deployment_runs",
    "/dreams",
    "/tunnels",
    "/user_profiles",
    "/organizations",
)
# Operations beside the stored responses that name none: their bodies are looked at.
NOT_BY_PATH = ("/responses/compact", "/responses/input_tokens")

# The top-level JSON fields that name state (OpenAI Responses and Assistants).
BUILTIN_FIELDS = ("previous_response_id", "conversation", "prompt", "thread_id", "assistant_id")
# What a body must hold, quoted as JSON quotes a key or a string, for the built-in rules to
# parse it: those fields, and what `_nested` finds at any depth (file and vector store
# ids, a container, an input item of type item_reference, a skill's id).
_BUILTIN_NEEDLES = (
    *BUILTIN_FIELDS,
    "file_id",
    "file_ids",
    "vector_store_ids",
    "container",
    "item_reference",
    "skill_id",
)
# Nothing under these keys is a reference: the caller's own labels, and JSON schemas
# (a tool's parameters, a structured output's schema) that may describe such fields.
_NOT_LOOKED_INTO = frozenset({"metadata", "parameters", "input_schema", "schema"})
# Containers nested deeper than this are not looked into (the SDKs put every reference
# within 8 levels: a file id in a document in a tool result in a message).
_MAX_DEPTH = 16
# Skill references: Anthropic's uploaded ("custom") skills, OpenAI's skill_reference.
_SKILL_TYPES = frozenset({"custom", "skill_reference"})


def _segments(path: str) -> tuple[str, ...]:
    return tuple(path.strip("/").split("/")) if path.strip("/") else ()


def _covers(pattern: tuple[str, ...], segments: tuple[str, ...]) -> bool:
    """Whether `pattern` covers the path of `segments` or one above it."""
    if len(segments) < len(pattern):
        return False
    for p, s in zip(pattern, segments, strict=False):
        if p != s and (p != "*" or not s):
            return False
    return True


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _ref(value: Any) -> bool:
    """An id, or an object holding one (`{"id": "conv_…"}`)."""
    return _text(value) or (isinstance(value, dict) and _text(value.get("id")))


def _ids(value: Any) -> bool:
    return isinstance(value, list) and any(_text(item) for item in value)


def _present(value: Any) -> bool:
    return value is not None and value != "" and value != [] and value != {}


@dataclass(frozen=True, slots=True)
class StateRules:
    """A route's rules: which of its requests name state kept by one provider."""

    builtin: bool
    paths: tuple[tuple[str, ...], ...]  # the route's own patterns, as segments
    fields: tuple[str, ...]  # the route's own top-level JSON fields
    needles: tuple[bytes, ...]  # the field names as they appear in a JSON body
    # any needle, in one pass over a body (far quicker than a search per needle)
    scan: re.Pattern[bytes] | None = None

    @classmethod
    def of(cls, *, builtin: bool, paths: Iterable[str], fields: Iterable[str]) -> StateRules | None:
        """The compiled rules; None when there are none at all (`provider_state: none`)."""
        own_paths = tuple(_segments(p) for p in paths)
        own_fields = tuple(dict.fromkeys(fields))
        if not builtin and not own_paths and not own_fields:
            return None
        names = _BUILTIN_NEEDLES if builtin else ()
        needles = tuple(f'"{name}"'.encode() for name in dict.fromkeys((*names, *own_fields)))
        scan = re.compile(b"|".join(map(re.escape, needles))) if needles else None
        return cls(builtin, own_paths, own_fields, needles, scan)

    @property
    def bodies(self) -> bool:
        """Whether a request's body can name state (some field rule applies)."""
        return bool(self.needles)

    def by_path(self, rest: str) -> bool:
        """Whether the path after the route's prefix names state kept by one provider."""
        segments = _segments(rest)
        if any(_covers(p, segments) for p in self.paths):
            return True
        if not self.builtin or not segments:
            return False
        if segments[0] == "v1":
            segments = segments[1:]
        patterns = _BUILTIN.get(segments[0]) if segments else None
        if patterns is None or segments in _NOT_BY_PATH:
            return False
        return any(_covers(pattern, segments) for pattern in patterns)

    def names_state(self, body: bytes) -> bool:
        """Whether a JSON object body names state kept by one provider.

        Only a body holding one of the field names, quoted as JSON writes a
        key, is parsed at all (a name written with escapes is not seen).
        """
        if not body or self.scan is None or self.scan.search(body) is None:
            return False
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):
            return False
        if not isinstance(document, dict):
            return False
        if any(_present(document.get(name)) for name in self.fields):
            return True
        return self.builtin and (_top_level(document) or _nested(document))


# The built-in patterns by their first segment: a path is checked against one or two.
_BUILTIN: dict[str, tuple[tuple[str, ...], ...]] = {}
for _pattern in map(_segments, BUILTIN_PATHS):
    _BUILTIN[_pattern[0]] = (*_BUILTIN.get(_pattern[0], ()), _pattern)
_NOT_BY_PATH = frozenset(_segments(p) for p in NOT_BY_PATH)


def _top_level(document: dict[str, Any]) -> bool:
    prompt = document.get("prompt")  # a stored prompt is an object with an id; text is not
    return (
        _text(document.get("previous_response_id"))
        or _ref(document.get("conversation"))
        or (isinstance(prompt, dict) and _text(prompt.get("id")))
        or _text(document.get("thread_id"))
        or _text(document.get("assistant_id"))
    )


def _nested(document: dict[str, Any]) -> bool:
    """A reference anywhere in the document, but under `_NOT_LOOKED_INTO` or too deep."""
    stack: list[tuple[Any, int]] = [(document, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, list):
            values: Iterable[Any] = node
        else:
            kind = node.get("type")
            if kind == "item_reference" and _text(node.get("id")):
                return True  # an input item stored with an earlier response
            if kind in _SKILL_TYPES and _text(node.get("skill_id")):
                return True
            if (
                _text(node.get("file_id"))
                or _ids(node.get("file_ids"))
                or _ids(node.get("vector_store_ids"))
                or _ref(node.get("container"))
            ):
                return True
            values = (v for k, v in node.items() if k not in _NOT_LOOKED_INTO)
        if depth < _MAX_DEPTH:
            stack.extend((v, depth + 1) for v in values if isinstance(v, (dict, list)))
    return False
