"""The documentation stays true: its runnable examples run, and the configuration reference
lists every key of the models with its default.

Runnable examples. A fenced ``python`` or ``yaml`` block in README.md or docs/*.md whose
fence is preceded by the line ``<!-- runnable -->`` is executed:

- YAML goes through `sidestep.load_config`; every ``${NAME}`` it uses is set to a
  placeholder, and a `SidestepConfigWarning` fails the test.
- Python runs in a fresh interpreter (so a block may configure logging or structlog), in a
  temporary directory holding a ``sidestep.yaml`` with one route, ``chat``, of two targets,
  ``primary`` then ``backup``. Two names are defined before the block: ``PRIMARY_URL``, a
  local upstream that answers every request 503, and ``BACKUP_URL``, a local upstream that
  answers 200 with an empty list in both the OpenAI and the Anthropic shape.
  ``OPENAI_API_KEY`` and ``ANTHROPIC_API_KEY`` are set to placeholders. A block fails the
  test by raising (its own ``assert`` statements included).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

import sidestep
from sidestep._settings.config import Config
from sidestep._settings.faults import ALLOW_CHAOS, Chaos, FaultRule
from sidestep._settings.observability import Observability
from sidestep._settings.policies import (
    BreakerPolicy,
    FailoverOverrides,
    FailoverPolicy,
    FailureRate,
    Suspensions,
    SuspensionWindow,
)
from sidestep._settings.routes import Hedge, ProviderState, Route, Target
from sidestep._settings.stores import (
    MemoryStoreSettings,
    RedisStoreSettings,
    SqliteStoreSettings,
    StoreSettings,
)
from sidestep._settings.values import SidestepConfigWarning
from upstream import Respond, Upstream

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = re.compile(r"^<!-- runnable -->\n```(python|yaml)\n(.*?)^```", re.M | re.S)


def _blocks(language: str) -> list[Any]:
    found = []
    for page in PAGES:
        for number, match in enumerate(RUNNABLE.finditer(page.read_text()), start=1):
            if match[1] == language:
                name = f"{page.relative_to(ROOT)}#{number}"
                found.append(pytest.param(match[2], id=name))
    return found


def _placeholders(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in set(re.findall(r"\$\{(\w+)\}", text)):
        monkeypatch.setenv(name, "a-placeholder-value")
    if re.search(r"^chaos:", text, re.M):  # a chaos example, as its page says to run it
        monkeypatch.setenv(ALLOW_CHAOS, "1")


def test_every_page_has_runnable_examples_of_both_kinds() -> None:
    """The convention is in use: runnable Python and YAML blocks are found, in README.md too."""
    assert len(_blocks("python")) >= 6
    assert len(_blocks("yaml")) >= 2
    assert "<!-- runnable -->\n```python" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("block", _blocks("yaml"))
def test_runnable_yaml_loads(block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runnable YAML block is a valid configuration with no warning, as written."""
    _placeholders(block, monkeypatch)
    path = tmp_path / "sidestep.yaml"
    path.write_text(block)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SidestepConfigWarning)
        config = sidestep.load_config(path)
    assert config.routes


@pytest.fixture(scope="module")
def upstreams() -> Iterator[tuple[str, str]]:
    empty = {"object": "list", "data": [], "has_more": False, "first_id": None, "last_id": None}
    primary = Upstream(lambda seen: Respond(503, b"down"), name="primary")
    backup = Upstream(
        lambda seen: Respond(200, empty, {"content-type": "application/json"}), name="backup"
    )
    try:
        yield primary.url, backup.url
    finally:
        primary.close()
        backup.close()


@pytest.mark.parametrize("block", _blocks("python"))
def test_runnable_python_runs(
    block: str, upstreams: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runnable Python block runs to its end against the local upstreams."""
    primary, backup = upstreams
    (tmp_path / "sidestep.yaml").write_text(
        textwrap.dedent(f"""\
            routes:
              - name: chat
                targets:
                  - {{name: primary, url: "{primary}"}}
                  - {{name: backup, url: "{backup}"}}
            """)
    )
    _placeholders(block, monkeypatch)
    env = {
        **os.environ,
        "OPENAI_API_KEY": "sk-placeholder",
        "ANTHROPIC_API_KEY": "sk-ant-placeholder",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    source = f"PRIMARY_URL = {primary!r}\nBACKUP_URL = {backup!r}\n{block}"
    done = subprocess.run(  # noqa: S603  # our own interpreter and the docs' own code
        [sys.executable, "-c", source],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


# --- the configuration reference ------------------------------------------------------------

REFERENCE = ROOT / "docs" / "configuration.md"
# Each table of the reference, by its heading, and the model it documents; with the
# required fields a model needs to be built, so a documented default can be checked.
SECTIONS: dict[str, tuple[type[BaseModel], dict[str, Any]]] = {
    "Top level": (Config, {}),
    "`breaker`": (BreakerPolicy, {}),
    "`breaker.failure_rate`": (FailureRate, {"threshold": 0.5}),
    "`failover`": (FailoverPolicy, {}),
    "`suspensions`": (Suspensions, {}),
    "`observability`": (Observability, {}),
    "`store.sqlite`": (SqliteStoreSettings, {"path": "state.db"}),
    "A suspension window": (SuspensionWindow, {"initial": 1, "max": None}),
    "`routes[]`": (
        Route,
        {"name": "r", "targets": [{"name": "t", "url": "https://a.example"}]},
    ),
    "`routes[].targets[]`": (Target, {"name": "t", "url": "https://a.example"}),
    "`routes[].provider_state`": (ProviderState, {}),
    "`routes[].hedge`": (Hedge, {"delay": 1, "adaptive": 0.9}),
    "`store`": (StoreSettings, {}),
    "`store.memory`": (MemoryStoreSettings, {}),
    "`store.redis`": (RedisStoreSettings, {"url": "redis://localhost"}),
    "`chaos`": (Chaos, {"faults": [{"fault": "timeout"}]}),
    "`chaos.faults[]`": (FaultRule, {"fault": "timeout"}),
}


def _tables() -> dict[str, dict[str, list[str]]]:
    """Heading -> key -> the row's cells after the key (default, rule, meaning)."""
    tables: dict[str, dict[str, list[str]]] = {}
    heading = ""
    for line in REFERENCE.read_text().splitlines():
        if line.startswith("### "):
            heading = line[4:].strip()
        elif line.startswith("| `") and heading:
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            tables.setdefault(heading, {})[cells[0].strip("`")] = cells[1:]
    return tables


def _key(model: type[BaseModel], name: str) -> str:
    return model.model_fields[name].alias or name


@pytest.mark.parametrize("heading", list(SECTIONS))
def test_reference_lists_every_key_with_its_default(heading: str) -> None:
    """Every field of the model has a row, no row names a missing field, and the default shown is the model's."""
    model, required = SECTIONS[heading]
    rows = _tables()[heading]
    keys = {_key(model, name): name for name in model.model_fields}
    assert set(rows) == set(keys)
    for key, name in keys.items():
        default, rule, meaning = rows[key]
        assert rule and meaning, key
        field = model.model_fields[name]
        if field.is_required():
            assert default == "required", key
            continue
        expected = field.get_default(call_default_factory=True)
        if isinstance(expected, BaseModel) and default.startswith("the "):
            assert default == f"the `{key}` table below", key
            assert expected == type(expected)(), key
            continue
        value = yaml.safe_load(default.strip("`"))
        built = model.model_validate({**required, key: value})
        assert getattr(built, name) == expected, key


def test_reference_route_failover_keys_are_the_failover_keys() -> None:
    """A route's failover takes exactly the global failover keys, each inheriting by default."""
    assert set(FailoverOverrides.model_fields) == set(FailoverPolicy.model_fields)
    assert all(f.default is None for f in FailoverOverrides.model_fields.values())
    assert "### `routes[].failover`" in REFERENCE.read_text()
