"""Which requests name state kept by one provider: the rules, their configuration, the
candidates they leave out. Pure: no network."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidestep._common.errors import ConfigError
from sidestep._core.provider_state import BUILTIN_PATHS, StateRules
from sidestep._core.routes import Router
from sidestep._settings.config import Config, as_config, load_config
from sidestep._settings.routes import ProviderState, Route

BUILTIN = StateRules.of(builtin=True, paths=(), fields=())


def builtin() -> StateRules:
    assert BUILTIN is not None
    return BUILTIN


# --- by path ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rest",
    [
        "/responses/resp_1",
        "/responses/resp_1/input_items",
        "/responses/resp_1/cancel",
        "/chat/completions/chatcmpl_1",
        "/chat/completions/chatcmpl_1/messages",
        "/files",
        "/files/file-1/content",
        "/uploads/upload_1/parts",
        "/batches",
        "/batches/batch_1/cancel",
        "/vector_stores/vs_1/search",
        "/assistants/asst_1",
        "/threads/thread_1/runs/run_1",
        "/conversations/conv_1/items",
        "/fine_tuning/jobs/ftjob_1/events",
        "/containers/cntr_1/files",
        "/messages/batches",
        "/messages/batches/msgbatch_1/results",
        "/skills/skill_1/versions",
        "/v1/responses/resp_1",
        "/v1/messages/batches/msgbatch_1",
        "/v1/files",
    ],
)
def test_a_path_naming_stored_state_is_held(rest: str) -> None:
    """Stored responses and completions, and every OpenAI and Anthropic collection of provider objects, are held by their path (after an optional /v1)."""
    assert builtin().by_path(rest)


@pytest.mark.parametrize(
    "rest",
    [
        "",
        "/",
        "/responses",
        "/responses/compact",
        "/responses/input_tokens",
        "/chat/completions",
        "/completions",
        "/embeddings",
        "/messages",
        "/messages/count_tokens",
        "/models",
        "/moderations",
        "/images/generations",
        "/audio/speech",
        "/filesystem/x",
        "/v2/files",
        "/v1",
    ],
)
def test_a_path_naming_no_stored_state_is_not_held(rest: str) -> None:
    """Creating a response, a chat completion, a message or an embedding names no state, nor does a path that only starts like a collection's name."""
    assert not builtin().by_path(rest)


def test_every_builtin_path_is_held_with_an_id_below_it() -> None:
    """Each built-in pattern covers an object below it, with or without /v1 before it."""
    for pattern in BUILTIN_PATHS:
        path = pattern.replace("*", "x_1") + "/obj_1"
        assert builtin().by_path(path), path
        assert builtin().by_path("/v1" + path), path


def test_a_routes_own_patterns_match_whole_segments() -> None:
    """A route's pattern covers the path and below it on segment boundaries, '*' one non-empty segment, with no /v1 skipped."""
    rules = StateRules.of(builtin=False, paths=("/jobs/*/logs", "/exports"), fields=())
    assert rules is not None
    assert rules.by_path("/jobs/7/logs")
    assert rules.by_path("/jobs/7/logs/page/2")
    assert rules.by_path("/exports")
    assert not rules.by_path("/jobs/7")
    assert not rules.by_path("/jobs//logs")
    assert not rules.by_path("/exportsx")
    assert not rules.by_path("/v1/exports")
    assert not rules.by_path("/files/f_1")  # the built-in rules are off


def test_no_rule_at_all_is_no_rules() -> None:
    """`provider_state: none` compiles to nothing: no request is ever held."""
    assert StateRules.of(builtin=False, paths=(), fields=()) is None


# --- by body ---------------------------------------------------------------------------------

FILE_PART = {"type": "file", "file": {"file_id": "file-1"}}
ANTHROPIC_DOCUMENT = {"type": "document", "source": {"type": "file", "file_id": "file_1"}}


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "input": "hi", "previous_response_id": "resp_1"},
        {"model": "m", "input": "hi", "conversation": "conv_1"},
        {"model": "m", "input": "hi", "conversation": {"id": "conv_1"}},
        {"model": "m", "prompt": {"id": "pmpt_1", "version": "2"}},
        {"thread_id": "thread_1"},
        {"assistant_id": "asst_1"},
        {"model": "m", "messages": [{"role": "user", "content": [FILE_PART]}]},
        {
            "model": "m",
            "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}],
        },
        {"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]},
        {"model": "m", "tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]},
        {"model": "m", "tools": [{"type": "code_interpreter", "container": "cntr_1"}]},
        {
            "model": "m",
            "tools": [
                {"type": "code_interpreter", "container": {"type": "auto", "file_ids": ["f"]}}
            ],
        },
        {"model": "m", "messages": [{"role": "user", "content": [ANTHROPIC_DOCUMENT]}]},
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "content": [ANTHROPIC_DOCUMENT]}],
                }
            ],
        },
        {"model": "m", "container": "container_1"},
        {"model": "m", "container": {"skills": [{"type": "custom", "skill_id": "skill_1"}]}},
        {
            "model": "m",
            "tools": [{"type": "shell", "skills": [{"type": "skill_reference", "skill_id": "s"}]}],
        },
    ],
)
def test_a_body_naming_stored_state_is_held(body: dict[str, Any]) -> None:
    """A stored response, conversation, prompt, thread or assistant at the top, or a file, vector store, container, stored item or uploaded skill inside, names state."""
    assert builtin().names_state(json.dumps(body).encode())


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "input": "hi"},
        {"model": "m", "input": "hi", "store": True},
        {"model": "m", "input": "hi", "previous_response_id": None},
        {"model": "m", "input": "hi", "conversation": ""},
        {"model": "m", "prompt": "Once upon a time"},
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        {"model": "m", "input": "hi", "metadata": {"thread_id": "mine", "file_id": "mine"}},
        {
            "model": "m",
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "read",
                        "parameters": {
                            "type": "object",
                            "properties": {"file_id": {"type": "string"}},
                            "required": ["file_id"],
                        },
                    },
                }
            ],
        },
        {"model": "m", "tools": [{"name": "t", "input_schema": {"default": {"file_id": "x"}}}]},
        {"model": "m", "tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]},
        {
            "model": "m",
            "container": {"id": None, "skills": [{"type": "anthropic", "skill_id": "xlsx"}]},
        },
        {"model": "m", "tools": [{"type": "file_search", "vector_store_ids": []}]},
    ],
)
def test_a_body_naming_no_stored_state_is_not_held(body: dict[str, Any]) -> None:
    """A plain generation, `store: true`, empty references, the caller's metadata and JSON schemas that describe such fields name no state."""
    assert not builtin().names_state(json.dumps(body).encode())


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b'["previous_response_id"]', b'{"previous_response_id": ', b"\xff\xfe"],
)
def test_a_body_that_is_no_json_object_names_nothing(body: bytes) -> None:
    """Bodies that do not parse as a JSON object, a list holding a field's name included, name no state."""
    assert not builtin().names_state(body)


def test_a_body_without_any_field_name_is_not_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body in which no field name appears quoted is judged by a substring scan alone, never parsed."""

    def parse(_: bytes) -> Any:
        raise AssertionError("parsed")

    monkeypatch.setattr("sidestep._core.provider_state.json.loads", parse)
    body = json.dumps({"model": "m", "input": "the file_id of my thread"}).encode()
    assert not builtin().names_state(body)


def test_a_reference_nested_too_deep_is_not_looked_for() -> None:
    """The walk stops 16 levels down: a file id deeper than the SDKs ever put one is not found."""
    shallow: Any = {"file_id": "f"}
    deep: Any = {"file_id": "f"}
    for _ in range(7):
        shallow = {"content": [shallow]}
    for _ in range(9):
        deep = {"content": [deep]}
    assert builtin().names_state(json.dumps(shallow).encode())
    assert not builtin().names_state(json.dumps(deep).encode())


def test_a_routes_own_fields_are_top_level_and_must_hold_a_value() -> None:
    """A route's field names state at the top of the body when present and not null or empty; nested, it does not."""
    rules = StateRules.of(builtin=False, paths=(), fields=("job_ref",))
    assert rules is not None
    assert rules.names_state(b'{"job_ref": "j_1"}')
    assert rules.names_state(b'{"job_ref": 7}')
    for value in ("null", '""', "[]", "{}"):
        assert not rules.names_state(b'{"job_ref": ' + value.encode() + b"}")
    assert not rules.names_state(b'{"inner": {"job_ref": "j_1"}}')
    assert not rules.names_state(b'{"previous_response_id": "resp_1"}')  # built-ins off


# --- configuration ---------------------------------------------------------------------------

TARGETS = [{"name": "a", "url": "https://a.example/v1"}]


def route(provider_state: Any) -> Route:
    return Route.model_validate({"name": "r", "targets": TARGETS, "provider_state": provider_state})


def test_the_default_is_the_builtin_rules() -> None:
    """A route without `provider_state` has the built-in rules and nothing of its own, as `auto` says."""
    default = Route.model_validate({"name": "r", "targets": TARGETS}).provider_state
    assert default == ProviderState() == route("auto").provider_state
    assert (default.builtin, default.paths, default.fields) == (True, (), ())


def test_none_turns_every_rule_off_and_a_mapping_adds_a_routes_own() -> None:
    """`none` is no built-in rule; a mapping keeps the built-ins unless it says `builtin: false`."""
    assert route("none").provider_state == ProviderState(builtin=False)
    own = route({"paths": ["/jobs/*/", "/exports"], "fields": ["job_ref"]}).provider_state
    assert own == ProviderState(builtin=True, paths=("/jobs/*", "/exports"), fields=("job_ref",))


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("sometimes", "must be 'auto', 'none' or a mapping of builtin, paths and fields"),
        ({"paths": ["jobs"]}, "starts with '/'"),
        ({"paths": ["/"]}, "starts with '/'"),
        ({"paths": ["/jobs//logs"]}, "empty segment"),
        ({"paths": ["/jobs/../admin"]}, "'.' or '..' segment"),
        ({"paths": ["/jobs?x=1"]}, "no whitespace, '?', '#' or '*' inside a segment"),
        ({"paths": ["/jobs/j*"]}, "no whitespace, '?', '#' or '*' inside a segment"),
        ({"paths": ["/my jobs"]}, "no whitespace"),
        ({"fields": [""]}, "a field name must be non-empty"),
        ({"fields": ['job"ref']}, "without whitespace, quotes or backslashes"),
        ({"builtin": "yes please"}, "must be a valid boolean"),
        ({"pinned": True}, "unknown key"),
    ],
)
def test_invalid_provider_state_settings_are_refused_with_their_key_path(
    value: Any, reason: str
) -> None:
    """A bad shorthand, pattern, field name or key is refused at load time, naming the key path and the rule."""
    config = {"routes": [{"name": "r", "targets": TARGETS, "provider_state": value}]}
    with pytest.raises(ConfigError) as caught:
        as_config(config)
    message = str(caught.value)
    assert "routes[0].provider_state" in message and "(route 'r')" in message
    assert reason in message


def test_provider_state_loads_from_yaml(tmp_path: Path) -> None:
    """The YAML shorthand and mapping forms load as written."""
    path = tmp_path / "sidestep.yaml"
    path.write_text(
        "routes:\n"
        "  - name: one\n"
        "    provider_state: none\n"
        "    targets: [{name: a, url: https://a.example/v1}]\n"
        "  - name: two\n"
        "    provider_state: {builtin: false, paths: [/jobs], fields: [job_ref]}\n"
        "    targets: [{name: a, url: https://a.example/v1}]\n"
    )
    one, two = load_config(path).routes
    assert one.provider_state == ProviderState(builtin=False)
    assert two.provider_state == ProviderState(builtin=False, paths=("/jobs",), fields=("job_ref",))


# --- the candidates a held request never reaches ---------------------------------------------


def router(*targets: dict[str, Any], **route_extra: Any) -> Router:
    return Router(
        Config.model_validate({"routes": [{"name": "r", "targets": list(targets), **route_extra}]})
    )


A = {"name": "a", "url": "https://a.example/v1"}
A_KEY = "https://a.example:443"


@pytest.mark.parametrize(
    ("other", "elsewhere"),
    [
        ({"name": "b", "url": "https://b.example/v1", "headers": {"api-key": "k"}}, True),
        ({"name": "b", "url": "https://b.example/v1", "inherit_credentials": True}, True),
        (
            {"name": "b", "url": "https://a.example/v1", "headers": {"authorization": "Bearer 2"}},
            True,
        ),
        (
            {"name": "b", "url": "https://a.example/v1", "headers": {"openai-organization": "o"}},
            True,
        ),
        ({"name": "b", "url": "https://u:p@a.example/v1"}, True),
        ({"name": "b", "url": "https://a.example/azure/v1"}, True),
        ({"name": "b", "url": "http://a.example/v1"}, True),
        ({"name": "b", "url": "https://a.example/v1", "json": {"model": "bigger"}}, False),
    ],
)
def test_another_origin_prefix_or_header_is_another_provider_account(
    other: dict[str, Any], elsewhere: bool
) -> None:
    """A candidate with another origin, URL prefix, credential or header than the first is on another account; one differing only in its JSON fields is not."""
    cands = router(A, other).match(A_KEY, "/v1/files/file_1")
    assert cands is not None
    assert cands.others == (frozenset({1}) if elsewhere else frozenset())
    assert cands.pinned == elsewhere  # (nothing to hold it from on one account)


def test_the_first_candidate_is_the_target_the_request_matched() -> None:
    """Matching the second target's URL makes it the request's own target and the first the other account."""
    b = {"name": "b", "url": "https://b.example/v1", "headers": {"api-key": "k"}}
    cands = router(A, b).match("https://b.example:443", "/v1/responses/resp_1")
    assert cands is not None
    assert [t.name for t in cands.targets] == ["b", "a"]
    assert cands.others == frozenset({1})


def test_candidates_remember_what_their_path_asks_of_the_body() -> None:
    """A held path needs no body look; a path the body rules may hold keeps its other accounts; with no rule that could hold it, none are kept."""
    b = {"name": "b", "url": "https://b.example/v1", "headers": {"api-key": "k"}}
    held = router(A, b).match(A_KEY, "/v1/responses/resp_1")
    by_body = router(A, b).match(A_KEY, "/v1/responses")
    own_paths = router(A, b, provider_state={"builtin": False, "paths": ["/jobs"]})
    free = own_paths.match(A_KEY, "/v1/responses")
    off = router(A, b, provider_state="none").match(A_KEY, "/v1/files/file_1")
    assert held is not None and (held.pinned, held.others) == (True, frozenset({1}))
    assert by_body is not None and (by_body.pinned, by_body.others) == (False, frozenset({1}))
    assert free is not None and (free.pinned, free.others) == (False, frozenset())
    assert off is not None and (off.pinned, off.others) == (False, frozenset())
