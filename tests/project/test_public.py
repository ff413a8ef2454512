"""The public surface and the documentation's configuration examples stay what they say."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import httpx
import httpx2
import pytest

import sidestep
from sidestep._answers.classify import Exchange, Kind, classify
from sidestep._settings.config import load_plan
from sidestep._settings.faults import ALLOW_CHAOS
from sidestep._settings.values import SidestepConfigWarning

ROOT = Path(__file__).resolve().parents[2]
# The README and every page of the documentation site.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
YAML_BLOCKS = [
    block for page in PAGES for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S)
]


def test_public_names_are_pinned() -> None:
    """Nothing becomes public by accident: __all__ is exactly this, sorted."""
    assert sidestep.__all__ == [
        "AllCandidatesSuspended",
        "AsyncFailoverTransport",
        "CandidateStatus",
        "Config",
        "ConfigError",
        "FailoverTransport",
        "InvalidUpstreamBody",
        "MemoryStore",
        "SidestepError",
        "SqliteStore",
        "StateStore",
        "Suspension",
        "__version__",
        "install",
        "load_config",
        "uninstall",
        "wrap",
    ]
    assert sidestep.__all__ == sorted(sidestep.__all__)
    assert sidestep.RedisStore.__name__ == "RedisStore"  # lazily, with the redis extra


def test_import_works_without_the_optional_extras() -> None:
    """`import sidestep` needs neither redis nor flask; RedisStore then says how to get it."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('redis', 'flask'):\n"
        "            raise ModuleNotFoundError(name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import sidestep, sidestep.asgi, sidestep.wsgi, sidestep.logging, sidestep.httpx2\n"
        "try:\n"
        "    sidestep.RedisStore\n"
        "except ImportError as e:\n"
        "    print('hint:', e)\n"
    )
    out = subprocess.run(  # noqa: S603  # our own interpreter and code
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert "pip install 'sidestep[redis]'" in out.stdout


def test_suspended_error_is_a_transport_error_of_both_flavours() -> None:
    """SDKs on either flavour catch it as their transport error."""
    error = sidestep.AllCandidatesSuspended(())
    assert isinstance(error, httpx.TransportError)
    assert isinstance(error, httpx2.TransportError)
    assert isinstance(error, sidestep.SidestepError)


@pytest.mark.parametrize("block", YAML_BLOCKS)
def test_documented_configurations_load(
    block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every YAML configuration the README and docs/*.md show is valid as written (a chaos one where its page says to allow it), and so is every fault plan file they show."""
    if re.search(r"^faults:", block, re.M) and not re.search(r"^routes:", block, re.M):
        path = tmp_path / "plan.yaml"
        path.write_text(block)
        assert load_plan(path).faults  # a fault plan file, not a configuration
        return
    if re.search(r"^chaos:", block, re.M):
        monkeypatch.setenv(ALLOW_CHAOS, "1")
    for name in set(re.findall(r"\$\{(\w+)\}", block)):
        # a store's URL must look like one; every other value is opaque
        value = (
            "redis://placeholder:6379/0" if name.endswith("REDIS_URL") else "a-placeholder-value"
        )
        monkeypatch.setenv(name, value)
    path = tmp_path / "sidestep.yaml"
    path.write_text(block)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SidestepConfigWarning)
        config = sidestep.load_config(path)
    assert config.routes


@pytest.mark.parametrize(
    ("status", "kind", "failover"),
    [
        (200, Kind.SUCCESS, False),
        (301, Kind.SUCCESS, False),
        (500, Kind.FAILURE, True),
        (502, Kind.FAILURE, True),
        (503, Kind.FAILURE, True),
        (504, Kind.FAILURE, True),
        (529, Kind.FAILURE, True),
        (408, Kind.FAILURE, True),
        (501, Kind.NEUTRAL, False),
        (505, Kind.NEUTRAL, False),
        (429, Kind.SUSPEND, True),
        (401, Kind.SUSPEND, True),
        (400, Kind.NEUTRAL, False),
        (404, Kind.NEUTRAL, False),
        (422, Kind.NEUTRAL, False),
    ],
)
def test_documented_classification_table_matches_the_code(
    status: int, kind: Kind, failover: bool
) -> None:
    """The rows of the table in docs/requests.md, for bodies that carry no special signal."""
    verdict = classify(Exchange(method="POST", request_headers={}, status=status))
    assert (verdict.kind, verdict.failover) == (kind, failover)
