"""`sidestep doctor`: each check's ok and warn, its exit codes, its JSON, and that it never
calls an upstream (only --online talks, and only to the configured Redis)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidestep import ConfigError, load_config
from sidestep._ops.cli import main
from upstream import Upstream, free_port

SECRET = "sk-doctor-secret-0123456789"


def doctor(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, yaml: str, *extra: str
) -> tuple[int, dict[str, list[dict[str, Any]]], str]:
    """Run doctor --json on `yaml`: the exit status, findings by check, and stderr."""
    path = tmp_path / "sidestep.yaml"
    path.write_text(textwrap.dedent(yaml))
    status = main(["doctor", "-c", str(path), "--json", *extra])
    out, err = capsys.readouterr()
    by_check: dict[str, list[dict[str, Any]]] = {}
    if out:
        for finding in json.loads(out)["findings"]:
            by_check.setdefault(finding["check"], []).append(finding)
    return status, by_check, err


def statuses(found: dict[str, list[dict[str, Any]]], check: str) -> list[str]:
    return [f["status"] for f in found.get(check, [])]


GOOD = """\
    failover: {total_timeout: 2m, first_byte_timeout: 20s, on_all_suspended: respond}
    routes:
      - name: chat
        targets:
          - {name: openai, url: "https://api.openai.com/v1", headers: {authorization: "Bearer ${DOCTOR_KEY}"}}
          - {name: anthropic, url: "https://api.anthropic.com/v1", headers: {x-api-key: "${DOCTOR_KEY}"}}
"""


def test_a_sound_configuration_has_no_warning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Timeouts that fit, a budget that reaches every target, distinct origins, set variables: ok everywhere; only the memory store's process count is unknown; --strict exits 0."""
    monkeypatch.setenv("DOCTOR_KEY", SECRET)
    status, found, err = doctor(capsys, tmp_path, GOOD, "--strict")
    assert status == 0, err
    warns = [f for fs in found.values() for f in fs if f["status"] == "warn"]
    assert warns == []
    assert statuses(found, "store") == ["unknown"]
    for check in ("timeouts", "budget", "redundancy", "first_byte", "windows", "variables"):
        assert statuses(found, check) == ["ok"], check
    assert found["retry_ambiguous"][0]["reason"].startswith("note: ")


def test_each_problem_is_a_warning_with_its_keys(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempts that outlast total_timeout, a target beyond the budget, two targets on one origin and key, overlapping routes, an LLM route without first_byte_timeout raising under an SDK, a small buffer, short windows, a tiny minimum_calls, an unset variable: each warns, naming its keys; exit 0, and 1 with --strict."""
    monkeypatch.setenv("DOCTOR_KEY", SECRET)
    yaml = """\
        breaker:
          cooldown: 2s
          failure_rate: {threshold: 0.5, minimum_calls: 3}
        suspensions:
          quota_exhausted: {initial: 1m, max: 1h}
        failover: {total_timeout: 30s, first_byte_timeout: 20s, max_total_attempts: 2}
        routes:
          - name: chat
            targets:
              - {name: one, url: "https://api.openai.com/v1", headers: {authorization: "Bearer ${DOCTOR_KEY}"}}
              - {name: two, url: "https://api.openai.com/v1", headers: {authorization: "Bearer ${DOCTOR_KEY}"}}
              - {name: three, url: "https://backup.example/v1", headers: {authorization: "${DOCTOR_MISSING}"}}
          - name: embeddings
            commit: complete
            max_buffered_bytes: 64KiB
            failover: {first_byte_timeout: null}
            targets:
              - {name: main, url: "https://api.openai.com/v1/embeddings"}
    """
    status, found, _ = doctor(capsys, tmp_path, yaml)
    assert status == 0
    assert statuses(found, "timeouts") == ["warn", "unknown"]
    assert "exceed total_timeout 30s" in found["timeouts"][0]["reason"]
    assert found["timeouts"][0]["keys"] == [
        "failover.first_byte_timeout",
        "failover.max_total_attempts",
        "failover.total_timeout",
    ]
    assert statuses(found, "budget") == ["warn", "ok"]
    assert "three can never be reached" in found["budget"][0]["reason"]
    assert statuses(found, "redundancy") == ["warn"]
    assert found["redundancy"][0]["keys"] == ["routes[0].targets[0]", "routes[0].targets[1]"]
    assert statuses(found, "overlap") == ["warn"]
    assert statuses(found, "first_byte") == ["ok", "warn"]
    assert found["first_byte"][1]["keys"] == ["routes[1].failover.first_byte_timeout"]
    assert statuses(found, "on_all_suspended") == ["warn", "warn"]
    assert statuses(found, "buffer") == ["warn"]
    assert [f["keys"] for f in found["windows"]] == [
        ["breaker.cooldown"],
        ["suspensions.quota_exhausted"],
    ]
    assert statuses(found, "failure_rate") == ["warn"]
    (variables,) = found["variables"]
    assert variables["status"] == "warn" and variables["reason"].endswith(": DOCTOR_MISSING")
    path = tmp_path / "sidestep.yaml"
    assert main(["doctor", "-c", str(path), "--strict"]) == 1
    text = capsys.readouterr().out
    assert text.splitlines()[-1].endswith("unknown")
    assert SECRET not in text and "DOCTOR_MISSING" in text


def test_an_invalid_configuration_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A configuration that does not validate exits 2 with the key path and reason, never the value."""
    status, found, err = doctor(
        capsys, tmp_path, f"routes: [{{name: r, targets: [{{name: t, url: 'ftp://{SECRET}'}}]}}]"
    )
    assert status == 2 and found == {}
    assert "routes[0].targets[0].url" in err and SECRET not in err
    assert main(["doctor", "-c", str(tmp_path / "missing.yaml")]) == 2


POOLED = """\
    failover: {total_timeout: 2m, first_byte_timeout: 20s, on_all_suspended: respond}
    routes:
      - name: chat
        balance: latency
        affinity: {header: x-session-id}
        targets:
          - {name: key-a, url: "https://api.openai.com/v1", headers: {authorization: "Bearer ${DOCTOR_KEY}"}, tier: 0, weight: 2}
          - {name: key-b, url: "https://api.openai.com/v1", headers: {authorization: "Bearer ${DOCTOR_KEY}x"}, tier: 0, weight: 1}
          - {name: azure, url: "https://x.openai.azure.com/openai/v1", headers: {api-key: "${DOCTOR_KEY}"}, tier: 1}
          - {name: backup, url: "https://api.anthropic.com/v1", headers: {x-api-key: "${DOCTOR_KEY}"}, tier: 1}
"""


def test_a_sound_pooled_route_has_no_warning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pooled route with a weight on each member of a pool, a conversation header as its affinity key and two members in each tier: its weights, affinity, balance and budget are ok."""
    monkeypatch.setenv("DOCTOR_KEY", SECRET)
    _, found, _ = doctor(capsys, tmp_path, POOLED)
    for check in ("weights", "affinity", "balance", "budget"):
        assert statuses(found, check) == ["ok"], check
    assert "avoid_rate_limits" not in found
    _, found, _ = doctor(capsys, tmp_path, GOOD)
    assert not {"weights", "affinity", "balance", "avoid_rate_limits"} & found.keys()


@pytest.mark.parametrize(
    ("targets", "said"),
    [
        (
            """\
              - {name: big, url: "https://a.example/v1", weight: 500}
              - {name: tiny, url: "https://b.example/v1", weight: 1}
              - {name: mid, url: "https://c.example/v1", weight: 100}""",
            "in tier 0, 'tiny' weigh under 1% of the pool: they get almost no requests",
        ),
        (
            """\
              - {name: a, url: "https://a.example/v1", tier: 0, weight: 1}
              - {name: b, url: "https://b.example/v1", tier: 0}
              - {name: c, url: "https://c.example/v1", tier: 0, weight: 3}
              - {name: d, url: "https://d.example/v1", tier: 1}
              - {name: e, url: "https://e.example/v1", tier: 1}""",
            "tier 0 gives a weight to some members and not to 'b': a member with no weight"
            " weighs the mean of those given in its pool (2)",
        ),
    ],
    ids=["negligible", "mixed"],
)
def test_weights_that_leave_a_member_next_to_nothing_or_mix_warn(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, targets: str, said: str
) -> None:
    """A member weighing under 1% of its pool, or a pool weighting some members and not others (the rule said: those without weigh the mean), warns once, naming only those members and keyed by the pool's weights; a tier with no weight at all beside it says nothing."""
    yaml = f"""\
        routes:
          - name: chat
            targets:
{targets}
    """
    _, found, _ = doctor(capsys, tmp_path, yaml)
    (weights,) = found["weights"]
    assert weights["status"] == "warn"
    assert said in weights["reason"]
    assert weights["keys"] == [f"routes[0].targets[{i}].weight" for i in range(3)]


@pytest.mark.parametrize(
    ("header", "why"),
    [
        ("connection", "hop-by-hop"),
        ("Keep-Alive", "hop-by-hop"),
        ("authorization", "carries a credential"),
        ("x-api-key", "carries a credential"),
    ],
)
def test_an_affinity_header_that_cannot_tell_conversations_apart_warns(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    header: str,
    why: str,
) -> None:
    """An affinity header that is hop-by-hop or a credential warns, naming the header, never a value."""
    monkeypatch.setenv("DOCTOR_KEY", SECRET)
    yaml = POOLED.replace("header: x-session-id", f"header: {header}")
    _, found, _ = doctor(capsys, tmp_path, yaml)
    (affinity,) = found["affinity"]
    assert affinity["status"] == "warn"
    assert f"affinity header {header.lower()!r}" in affinity["reason"] and why in affinity["reason"]
    assert affinity["keys"] == ["routes[0].affinity.header"]
    assert SECRET not in json.dumps(found)


def test_an_affinity_prefix_of_zero_is_refused_with_its_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """affinity prefix 0 (no key at all) makes the configuration invalid: exit 2, naming the key."""
    monkeypatch.setenv("DOCTOR_KEY", SECRET)
    yaml = POOLED.replace("affinity: {header: x-session-id}", "affinity: {prefix: 0}")
    status, found, err = doctor(capsys, tmp_path, yaml)
    assert status == 2 and found == {}
    assert "routes[0].affinity.prefix" in err and SECRET not in err


def test_balance_over_a_tier_of_one_member_warns(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """balance set on a route whose tier has one member warns, naming the tier and member; when every tier has one, it says the route is taken in order; without balance, no finding."""
    yaml = """\
        routes:
          - name: chat
            balance: weighted
            targets:
              - {name: a, url: "https://a.example/v1", tier: 0}
              - {name: b, url: "https://b.example/v1", tier: 0}
              - {name: c, url: "https://c.example/v1", tier: 1}
          - name: single
            balance: least_in_flight
            targets:
              - {name: only, url: "https://d.example/v1"}
          - name: tiers
            targets:
              - {name: e, url: "https://e.example/v1", tier: 0}
              - {name: f, url: "https://f.example/v1", tier: 1}
    """
    _, found, _ = doctor(capsys, tmp_path, yaml)
    first, second = found["balance"]
    assert first["status"] == second["status"] == "warn"
    assert "balance weighted is set, but 1 tier has one member (tier 1: 'c')" in first["reason"]
    assert "ranked list" not in first["reason"]
    assert first["keys"] == ["routes[0].balance", "routes[0].targets[2].tier"]
    assert "(tier 0: 'only')" in second["reason"] and "ranked list" in second["reason"]
    assert second["keys"] == ["routes[1].balance", "routes[1].targets"]


def test_avoid_rate_limits_on_a_pooled_route_warns(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """avoid_rate_limits on a pooled route warns that it suspends a member until the full reset the pool's headroom would not wait for; on a ranked route it is no finding."""
    monkeypatch.setenv("DOCTOR_KEY", SECRET)
    yaml = POOLED.replace("balance: latency", "balance: latency\n        avoid_rate_limits: true")
    _, found, _ = doctor(capsys, tmp_path, yaml)
    (avoid,) = found["avoid_rate_limits"]
    assert avoid["status"] == "warn" and avoid["keys"] == ["routes[0].avoid_rate_limits"]
    assert "until the full reset" in avoid["reason"] and "headroom" in avoid["reason"]
    yaml = GOOD.replace("- name: chat", "- name: chat\n        avoid_rate_limits: true")
    _, found, _ = doctor(capsys, tmp_path, yaml)
    assert "avoid_rate_limits" not in found


def test_the_budget_reaches_a_pools_members_by_spreading(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """On a pooled route the budget counts tiers, not places in the list: 2 attempts reach all 4 members of one pool (each request spreads); 3 attempts reach a second tier behind a pool of 2 but not a third behind 4 targets, which warns naming only its members; the same 5 targets ranked warn from the third."""
    five = """\
              - {name: a, url: "https://a.example/v1", tier: 0}
              - {name: b, url: "https://b.example/v1", tier: 0}
              - {name: c, url: "https://c.example/v1", tier: 1}
              - {name: d, url: "https://d.example/v1", tier: 1}
              - {name: e, url: "https://e.example/v1", tier: 2}"""
    yaml = f"""\
        routes:
          - name: spread
            balance: least_in_flight
            failover: {{max_total_attempts: 2}}
            targets:
{five.replace("tier: 1", "tier: 0").replace(", tier: 2}", ", tier: 0}").replace(", tier: 0", "")}
          - name: tiers
            failover: {{max_total_attempts: 3}}
            targets:
{five}
          - name: ranked
            failover: {{max_total_attempts: 2}}
            targets:
{five.replace(", tier: 0", "").replace(", tier: 1", "").replace(", tier: 2", "")}
    """
    _, found, _ = doctor(capsys, tmp_path, yaml)
    spread, tiers, ranked = found["budget"]
    assert spread["status"] == "ok" and "spread over every member" in spread["reason"]
    assert tiers["status"] == "warn"
    assert "the tiers before e hold at least max_total_attempts (3) targets" in tiers["reason"]
    assert "targets: e can never be reached" in tiers["reason"]
    assert ranked["status"] == "warn" and "c, d, e can never be reached" in ranked["reason"]


def test_the_store_findings_and_the_command_it_will_run(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A memory store under gunicorn with 4 workers warns, under one process is ok; a Redis store without fingerprint_key warns; offline it is unknown, --online pings the real server (ok) or a dead port (warn); the password never shows."""
    status, found, _ = doctor(
        capsys, tmp_path, "routes: []", "--", "gunicorn", "-w", "4", "app:app"
    )
    assert statuses(found, "store") == ["warn"]
    _, found, _ = doctor(
        capsys, tmp_path, "routes: []", "--", "uvicorn", "--workers", "1", "app:app"
    )
    assert statuses(found, "store") == ["ok"]
    _, found, _ = doctor(capsys, tmp_path, "routes: []", "--", "uvicorn", "--workers=3", "app:app")
    assert statuses(found, "store") == ["warn"]

    monkeypatch.setenv("DOCTOR_REDIS", redis_url)
    yaml = 'store: {redis: {url: "${DOCTOR_REDIS}"}}'
    _, found, _ = doctor(capsys, tmp_path, yaml)
    assert statuses(found, "store") == ["warn", "unknown"]
    assert found["store"][0]["keys"] == ["store.redis.fingerprint_key"]
    yaml = 'store: {redis: {url: "${DOCTOR_REDIS}", fingerprint_key: "${DOCTOR_KEY}"}}'
    monkeypatch.setenv("DOCTOR_KEY", SECRET)
    _, found, _ = doctor(capsys, tmp_path, yaml, "--online")
    assert statuses(found, "store") == ["ok"]
    monkeypatch.setenv("DOCTOR_REDIS", f"redis://:pw-{SECRET}@127.0.0.1:{free_port()}/0")
    status, found, _ = doctor(capsys, tmp_path, yaml, "--online", "--strict")
    assert statuses(found, "store") == ["warn"] and status == 1
    assert SECRET not in json.dumps(found)


def test_online_pings_a_node_of_a_redis_cluster(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    cluster_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A redis+cluster:// store is pinged at the node its URL names: ok while the cluster runs; the password never shows."""
    monkeypatch.setenv("DOCTOR_REDIS", cluster_url)
    monkeypatch.setenv("DOCTOR_KEY", SECRET)
    yaml = 'store: {redis: {url: "${DOCTOR_REDIS}", fingerprint_key: "${DOCTOR_KEY}"}}'
    _, found, _ = doctor(capsys, tmp_path, yaml, "--online")
    assert statuses(found, "store") == ["ok"]
    assert "s3cret-redis-pw" not in json.dumps(found)


def test_doctor_never_calls_an_upstream(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, a: Upstream
) -> None:
    """Even with --online, a route's target receives nothing: doctor reads the file only."""
    yaml = f"routes: [{{name: r, targets: [{{name: t, url: '{a.url}'}}]}}]"
    status, found, _ = doctor(capsys, tmp_path, yaml, "--online")
    assert status == 0 and found
    assert a.calls == 0 and a.connections == 0


def test_the_configurations_own_warnings_are_findings(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A legal but surprising setting (a 50 ms cooldown, failure_threshold 1) is a `config` warning, and --strict fails on it."""
    yaml = "breaker: {cooldown: 50ms, failure_threshold: 1}\n"
    status, found, _ = doctor(capsys, tmp_path, yaml, "--strict")
    assert status == 1
    reasons = [f["reason"] for f in found["config"]]
    assert statuses(found, "config") == ["warn", "warn"]
    assert any("cooldown is under 100ms" in r for r in reasons)
    assert any("failure_threshold is 1" in r for r in reasons)


def test_numbers_durations_and_switches_from_unset_variables_are_not_invalid(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A setting or list item that is one unset ${VAR} — a count, a duration, a switch, a match URL — leaves the configuration checkable: the variables warn by name and exit 0 (2 only once a set variable's value is invalid, naming its key)."""
    monkeypatch.delenv("DOCTOR_ATTEMPTS", raising=False)
    monkeypatch.delenv("DOCTOR_TIMEOUT", raising=False)
    monkeypatch.delenv("DOCTOR_RETRY", raising=False)
    monkeypatch.delenv("DOCTOR_MATCH", raising=False)
    yaml = """\
        failover:
          max_total_attempts: "${DOCTOR_ATTEMPTS}"
          total_timeout: "${DOCTOR_TIMEOUT}"
          retry_ambiguous: "${DOCTOR_RETRY}"
        routes:
          - name: chat
            match: ["${DOCTOR_MATCH}"]
            targets: [{name: a, url: "https://a.example/v1"}, {name: b, url: "https://b.example/v1"}]
    """
    status, found, err = doctor(capsys, tmp_path, yaml, "--strict")
    assert status == 1, err  # a warning, not an invalid configuration
    (variables,) = found["variables"]
    assert variables["reason"].endswith(
        ": DOCTOR_ATTEMPTS, DOCTOR_MATCH, DOCTOR_RETRY, DOCTOR_TIMEOUT"
    )
    assert statuses(found, "budget") == ["ok"]
    monkeypatch.setenv("DOCTOR_ATTEMPTS", "many")
    status, found, err = doctor(capsys, tmp_path, yaml)
    assert status == 2 and found == {}
    assert "failover.max_total_attempts" in err and "many" not in err


# (command after --, environment, whether ./gunicorn.conf.py exists, status, the reason's words)
PROCESS_FORMS = {
    "gunicorn alone runs one worker": (
        "gunicorn app:app",
        {},
        False,
        "ok",
        "gunicorn with one worker (its default)",
    ),
    "gunicorn -w N": ("gunicorn -w 4 app:app", {}, False, "warn", "gunicorn with 4 workers (-w)"),
    "gunicorn -wN": ("gunicorn -w3 app:app", {}, False, "warn", "gunicorn with 3 workers (-w)"),
    "gunicorn --workers N": (
        "gunicorn --workers 2 app:app",
        {},
        False,
        "warn",
        "2 workers (--workers)",
    ),
    "gunicorn --workers=1": (
        "gunicorn --workers=1 app:app",
        {},
        False,
        "ok",
        "gunicorn with 1 worker (--workers)",
    ),
    "python -m gunicorn": (
        "python3 -X dev -m gunicorn app:app",
        {},
        False,
        "ok",
        "gunicorn with one worker",
    ),
    "WEB_CONCURRENCY": (
        "gunicorn app:app",
        {"WEB_CONCURRENCY": "5"},
        False,
        "warn",
        "5 workers (WEB_CONCURRENCY)",
    ),
    "WEB_CONCURRENCY=1": (
        "gunicorn app:app",
        {"WEB_CONCURRENCY": "1"},
        False,
        "ok",
        "1 worker (WEB_CONCURRENCY)",
    ),
    "env WEB_CONCURRENCY=N": (
        "env WEB_CONCURRENCY=3 gunicorn app:app",
        {},
        False,
        "warn",
        "3 workers (WEB_CONCURRENCY)",
    ),
    "env -i drops WEB_CONCURRENCY": (
        "env -i gunicorn app:app",
        {"WEB_CONCURRENCY": "4"},
        False,
        "ok",
        "one worker (its default)",
    ),
    "-w overrides WEB_CONCURRENCY": (
        "gunicorn -w 1 app:app",
        {"WEB_CONCURRENCY": "8"},
        False,
        "ok",
        "1 worker (-w)",
    ),
    "GUNICORN_CMD_ARGS": (
        "gunicorn app:app",
        {"GUNICORN_CMD_ARGS": "--bind :8000 --workers 6"},
        False,
        "warn",
        "6 workers (GUNICORN_CMD_ARGS)",
    ),
    "gunicorn -c FILE": (
        "gunicorn -c deploy/gunicorn.py app:app",
        {"WEB_CONCURRENCY": "1"},
        False,
        "unknown",
        "configuration file (given with -c) may set workers: doctor does not read it",
    ),
    "gunicorn --config=FILE": (
        "gunicorn --config=python:deploy.conf app:app",
        {},
        False,
        "unknown",
        "(given with --config)",
    ),
    "gunicorn -c FILE -w N": (
        "gunicorn -c deploy/gunicorn.py -w 2 app:app",
        {},
        False,
        "warn",
        "2 workers (-w)",
    ),
    "gunicorn.conf.py in the directory": (
        "gunicorn app:app",
        {},
        True,
        "unknown",
        "gunicorn.conf.py (in this directory) may set",
    ),
    "gunicorn -w not a number": (
        "gunicorn -w $WORKERS app:app",
        {},
        False,
        "unknown",
        "whose -w is not a number here",
    ),
    "uwsgi alone runs one process": (
        "uwsgi --http :8000 -w app",
        {},
        False,
        "ok",
        "uwsgi with one process (its default)",
    ),
    "uwsgi -p N": ("uwsgi -p 4 --module app", {}, False, "warn", "4 processes (-p)"),
    "uwsgi --processes=1": ("uwsgi --processes=1", {}, False, "ok", "1 process (--processes)"),
    "uwsgi --workers N": ("uwsgi --workers 2", {}, False, "warn", "2 processes (--workers)"),
    "uwsgi UWSGI_PROCESSES": (
        "uwsgi --module app",
        {"UWSGI_PROCESSES": "3"},
        False,
        "warn",
        "(UWSGI_PROCESSES)",
    ),
    "uwsgi --ini FILE": (
        "uwsgi --ini app.ini",
        {},
        False,
        "unknown",
        "configuration file may set processes",
    ),
    "uwsgi FILE.ini": ("uwsgi app.ini", {}, False, "unknown", "doctor does not read it"),
    "uwsgi a count before its file": (
        "uwsgi --processes 1 --yaml app.yaml",
        {},
        False,
        "unknown",
        "may set processes",
    ),
    "uwsgi a count after its file": (
        "uwsgi --ini app.ini -p 1",
        {},
        False,
        "ok",
        "uwsgi with 1 process (-p)",
    ),
    "celery worker: one process per CPU": (
        "celery -A proj worker",
        {},
        False,
        "warn",
        "one process per CPU (its default",
    ),
    "celery worker -c 1": ("celery -A proj worker -c 1", {}, False, "ok", "1 process (-c)"),
    "celery worker --concurrency N": (
        "celery -A proj worker --concurrency 4",
        {},
        False,
        "warn",
        "4 processes (--concurrency)",
    ),
    "celery worker --pool solo": (
        "celery -A proj worker --pool solo",
        {},
        False,
        "ok",
        "the solo pool: one process",
    ),
    "celery worker -P threads": (
        "celery -A proj worker -P threads -c 8",
        {},
        False,
        "ok",
        "the threads pool",
    ),
    "celery worker --pool=prefork": (
        "celery -A proj worker --pool=prefork",
        {},
        False,
        "warn",
        "one process per CPU",
    ),
    "celery worker --autoscale": (
        "celery -A proj worker --autoscale=10,3",
        {},
        False,
        "warn",
        "10 processes (--autoscale",
    ),
    "celery beat": ("celery -A proj beat", {}, False, "ok", "celery, not a worker: one process"),
    "celery multi": ("celery multi start w1 w2", {}, False, "warn", "starts several workers"),
    "uvicorn alone": ("uvicorn app:app", {}, False, "ok", "without a worker option: one process"),
    "uvicorn and WEB_CONCURRENCY": (
        "uvicorn app:app",
        {"WEB_CONCURRENCY": "2"},
        False,
        "warn",
        "2 workers (WEB_CONCURRENCY)",
    ),
    "uvicorn and UVICORN_WORKERS": (
        "uvicorn app:app",
        {"UVICORN_WORKERS": "4", "WEB_CONCURRENCY": "1"},
        False,
        "warn",
        "4 workers (UVICORN_WORKERS)",
    ),
    "uvicorn --workers over UVICORN_WORKERS": (
        "uvicorn app:app --workers 1",
        {"UVICORN_WORKERS": "4"},
        False,
        "ok",
        "1 worker (--workers)",
    ),
    "uvicorn --reload --workers": (
        "uvicorn app:app --reload --workers 4",
        {},
        False,
        "ok",
        "uvicorn reloading on changes: one process",
    ),
    "uvicorn and UVICORN_RELOAD": (
        "uvicorn app:app --workers 4",
        {"UVICORN_RELOAD": "true"},
        False,
        "ok",
        "uvicorn reloading on changes: one process",
    ),
    "uvicorn and UVICORN_RELOAD off": (
        "uvicorn app:app --workers 4",
        {"UVICORN_RELOAD": "false"},
        False,
        "warn",
        "4 workers (--workers)",
    ),
}
PROCESS_VARIABLES = (
    "WEB_CONCURRENCY",
    "UVICORN_WORKERS",
    "UVICORN_RELOAD",
    "GUNICORN_CMD_ARGS",
    "UWSGI_PROCESSES",
    "UWSGI_WORKERS",
    "UWSGI_INI",
    "UWSGI_YAML",
    "UWSGI_YML",
    "UWSGI_JSON",
    "UWSGI_XML",
)


@pytest.mark.parametrize(
    ("command", "environ", "conf", "status", "words"),
    PROCESS_FORMS.values(),
    ids=PROCESS_FORMS.keys(),
)
def test_a_memory_store_follows_the_processes_the_command_runs(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    environ: dict[str, str],
    conf: bool,
    status: str,
    words: str,
) -> None:
    """The store finding warns only when the command runs several processes — gunicorn and
    uwsgi run one unless an option, an environment variable or a configuration file says
    otherwise, celery's worker one per CPU unless its concurrency or pool says otherwise,
    uvicorn one when it reloads on changes, else its workers (from UVICORN_WORKERS too) —
    and is unknown, saying so, when a configuration file it does not read may decide; an
    argument's value (a secret in --env) never shows."""
    for name in PROCESS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    here = tmp_path / "app"
    here.mkdir()
    if conf:
        (here / "gunicorn.conf.py").write_text("workers = 4\n")
    monkeypatch.chdir(here)
    secret = f"--env=API_KEY={SECRET}" if command.startswith("gunicorn") else SECRET
    _, found, err = doctor(capsys, tmp_path, "routes: []", "--", *command.split(), secret)
    (store,) = found["store"]
    assert (store["status"], store["keys"]) == (status, ["store"]), (store["reason"], err)
    assert words in store["reason"]
    assert SECRET not in store["reason"]


SHELL_FORMS = {
    "a variable set before the program, as a shell does": (
        [f"API_KEY={SECRET}", "WEB_CONCURRENCY=4", "gunicorn", "app:app"],
        "warn",
        "gunicorn with 4 workers (WEB_CONCURRENCY)",
    ),
    "the command quoted as one word": (
        [f"gunicorn -w 4 --env API_KEY={SECRET} app:app"],
        "warn",
        "gunicorn with 4 workers (-w)",
    ),
    "sh -c": (
        ["sh", "-c", f"cd /srv && API_KEY={SECRET} exec gunicorn -w 4 app:app"],
        "warn",
        "gunicorn with 4 workers (-w)",
    ),
    "bash -ec, the count a variable the shell expands": (
        ["bash", "-ec", f"exec gunicorn --workers $WORKERS --env TOKEN={SECRET} app:app"],
        "unknown",
        "gunicorn, whose --workers is not a number here",
    ),
    "a shell script, not read": (["sh", "start.sh", SECRET], "unknown", "a shell script"),
    "env -u": (["env", "-u", "WEB_CONCURRENCY", "gunicorn", "app:app"], "ok", "gunicorn with one"),
    "sidestep run -- CMD, the launcher": (
        ["sidestep", "run", "-c", "sidestep.yaml", "--", "gunicorn", "-w", "8", "app:app"],
        "warn",
        "gunicorn with 8 workers (-w)",
    ),
    "a wrapper that runs the server": (
        ["ddtrace-run", "gunicorn", "-c", "gunicorn.conf.py", "app:app"],
        "unknown",
        "gunicorn, whose configuration file (given with -c)",
    ),
    "uv run": (["uv", "run", "--frozen", "uvicorn", "app:app"], "warn", "uvicorn with 3 workers"),
    "python -mgunicorn": (
        ["python3", "-mgunicorn", "app:app"],
        "warn",
        "gunicorn with 3 workers (WEB_CONCURRENCY)",
    ),
    "a script of several lines": (
        ["sh", "-c", "set -e\ncd /srv\nexec uvicorn app:app --workers 2\n"],
        "warn",
        "uvicorn with 2 workers",
    ),
    "a program spelt with what may be a value": (
        [f"./serve?token={SECRET}", "-w", "2"],
        "warn",
        "the command with 2 workers",
    ),
}


@pytest.mark.parametrize(
    ("command", "status", "words"), SHELL_FORMS.values(), ids=SHELL_FORMS.keys()
)
def test_a_command_as_a_shell_would_run_it(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
    status: str,
    words: str,
) -> None:
    """The command after -- is read as a shell runs it — variables set before the program,
    `sh -c '... && exec gunicorn ...'`, the whole command quoted as one word, `env -u`,
    `python -mMODULE`, `sidestep run -- CMD`, a wrapper such as `ddtrace-run` — so the verdict is the server's, and no word of it other than a
    program's plain name or a worker count shows (a secret before the program was printed
    as the program's name; `sh -c 'gunicorn -w 4 ...'` was one process)."""
    for name in PROCESS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WEB_CONCURRENCY", "3")  # `env -u` takes it away
    monkeypatch.chdir(tmp_path)
    _, found, err = doctor(capsys, tmp_path, "routes: []", "--", *command)
    (store,) = found["store"]
    assert store["status"] == status, (store["reason"], err)
    assert words in store["reason"]
    assert SECRET not in store["reason"] + err


@pytest.mark.parametrize(
    "count",
    ["²", "٣", "1" + "0" * 5000, "9" * 7, "-4", "4.0", "0x4", "", " 4", "4\n"],
)
@pytest.mark.parametrize(
    "command",
    ["gunicorn -w {} app:app", "uvicorn app:app --workers={}", "celery -A t worker -c {}"],
)
def test_a_worker_count_that_is_no_plain_number_is_unknown_never_a_crash(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, count: str, command: str
) -> None:
    """A worker count written with non-ASCII digits, thousands of digits or anything but a plain short number makes the store finding unknown (exit 0), never a traceback."""
    words = command.split()
    words = [w.replace("{}", count) for w in words]
    status, found, err = doctor(capsys, tmp_path, "routes: []", "--", *words)
    assert status == 0, err
    (store,) = found["store"]
    assert store["status"] == "unknown", store["reason"]
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "document",
    [
        "breaker: " + "[" * 400 + "]" * 400,
        "breaker: " + "{a: " * 400 + "1" + "}" * 400,
        "routes:\n" + "".join("  " * i + "- \n" for i in range(300)),
        "a: &x [1]\n" + "b: " + "[" * 70 + "*x" + "]" * 70,
    ],
    ids=["flow-lists", "flow-maps", "block-lists", "just-past-the-limit"],
)
def test_yaml_nested_hundreds_of_levels_deep_is_a_config_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, document: str
) -> None:
    """A document nested deeper than a configuration ever is: load_config raises ConfigError naming the file and the depth (no RecursionError), and doctor exits 2 with one line."""
    path = tmp_path / "deep.yaml"
    path.write_text(document)
    with pytest.raises(ConfigError, match=r"deep\.yaml: the document is nested more than 64"):
        load_config(path)
    status, found, err = doctor(capsys, tmp_path, document)
    assert (status, found) == (2, {})
    assert "nested more than 64 levels" in err and "Traceback" not in err


def test_yaml_nested_as_deep_as_a_real_configuration_still_loads(tmp_path: Path) -> None:
    """The depth limit leaves room for any real configuration: a target's JSON override nested 50 levels loads."""
    nested = "{a: " * 50 + "1" + "}" * 50
    path = tmp_path / "ok.yaml"
    path.write_text(
        f"routes: [{{name: r, targets: [{{name: t, url: 'https://h.example', json: {nested}}}]}}]"
    )
    assert load_config(path).routes[0].targets[0].json_fields["a"]["a"]["a"] is not None


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.one_of(
        st.binary(max_size=300),
        st.text(max_size=300).map(lambda t: t.encode("utf-8")),
        st.text(max_size=120).map(lambda t: t.encode("utf-16")),
        st.recursive(
            st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
            lambda inner: st.one_of(
                st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
            ),
            max_leaves=40,
        ).map(lambda v: json.dumps({"breaker": v, "routes": v}).encode()),
    )
)
def test_any_bytes_as_a_configuration_load_or_fail_as_a_config_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data: bytes
) -> None:
    """Whatever a file holds (any bytes, odd encodings, YAML of any shape), load_config returns a Config or raises ConfigError, and doctor exits 0 or 2 — never another exception."""
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(data)
    with contextlib.suppress(ConfigError):
        load_config(path)
    status = main(["doctor", "-c", str(path), "--json"])
    capsys.readouterr()
    assert status in (0, 2)


def test_online_with_the_store_address_unset_is_unknown_and_contacts_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--online with `${REDIS_URL}` (or a variable inside the URL) unset reports the store unknown, saying its address is not set, and pings no made-up host."""
    monkeypatch.delenv("DOCTOR_REDIS_URL", raising=False)
    monkeypatch.delenv("DOCTOR_REDIS_HOST", raising=False)
    asked: list[Any] = []
    monkeypatch.setattr("redis.Redis.from_url", lambda *a, **k: asked.append(a))
    for url in ("${DOCTOR_REDIS_URL}", "redis://${DOCTOR_REDIS_HOST}:6379/0"):
        yaml = f'store: {{redis: {{url: "{url}", fingerprint_key: k}}}}'
        status, found, err = doctor(capsys, tmp_path, yaml, "--online")
        assert status == 0, err
        (store,) = found["store"]
        assert store["status"] == "unknown" and "not set" in store["reason"], store
    assert asked == []


@pytest.mark.parametrize(
    "document",
    [
        "breaker:\n  failure_threshold: " + "9" * 5000 + "\n",
        "routes: []\nreleased: 2024-02-30\n",
        "routes: []\n2024-13-45: x\n",
        "routes: []\nat: 2024-01-01 23:59:60\n",
        "breaker:\n  failure_threshold: !!int three\n",
        "breaker:\n  failure_threshold: !!float three\n",
        "breaker:\n  enabled: !!bool maybe\n",
        "routes: []\nat: !!timestamp soon\n",
    ],
    ids=[
        "5000-digits",
        "no-such-day",
        "no-such-month-key",
        "leap-second",
        "int-tag",
        "float-tag",
        "bool-tag",
        "timestamp-tag",
    ],
)
def test_a_scalar_yaml_cannot_construct_is_a_config_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, document: str
) -> None:
    """A scalar the YAML loader recognises but cannot make into a value (an integer of thousands of digits, a date that does not exist, a tag its text does not fit): load_config raises ConfigError naming the file and the line, and doctor exits 2 with one line, no traceback and not the value."""
    path = tmp_path / "scalar.yaml"
    path.write_text(document)
    with pytest.raises(ConfigError, match=r"scalar\.yaml: invalid YAML"):
        load_config(path)
    status, found, err = doctor(capsys, tmp_path, document)
    assert (status, found) == (2, {})
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "three" not in err and "maybe" not in err and "soon" not in err


ROOT = Path(__file__).resolve().parents[2]
# `sidestep doctor` in 600 MiB of address space: room for a real configuration, none for
# a file read whole when it never ends
BOUNDED = (
    "import resource, runpy, sys; "
    "resource.setrlimit(resource.RLIMIT_AS, (600 * 2**20, 600 * 2**20)); "
    "sys.argv = ['sidestep', *sys.argv[1:]]; "
    "runpy.run_module('sidestep', run_name='__main__')"
)


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/urandom"])
def test_a_configuration_path_that_never_ends_is_a_config_error(tmp_path: Path, path: str) -> None:
    """Pointed at a file that never ends (a device, an endless stream), doctor reads no more than a configuration could ever be and exits 2 with one line naming the file, never a MemoryError traceback; in the same bounded memory a real configuration is checked (exit 0)."""
    good = tmp_path / "good.yaml"
    good.write_text("routes: []\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for config, expected in ((str(good), 0), (path, 2)):
        done = subprocess.run(  # noqa: S603  # our own interpreter and module
            [sys.executable, "-c", BOUNDED, "doctor", "-c", config],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=env,
        )
        assert done.returncode == expected, (config, done.stderr[-500:])
        assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and path in done.stderr
