"""The core's memories change no answer: a full one starts again, a key carried elsewhere still finds its entry.

Pure logic: the upstream is an `httpx.MockTransport` that records where each
request went; a scope key crosses into a real child Python process.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

import sidestep
from sidestep._common.scopes import ScopeKey, ScopeKind
from sidestep._core.memories import CACHE_LIMIT, remember

CONFIG = {
    "routes": [
        {
            "name": "wide",
            "match": ["http://alias.example/v1"],
            "targets": [{"name": "p", "url": "http://p.example/v1"}],
        },
        {
            "name": "narrow",
            "match": ["http://alias.example/v1/chat"],
            "targets": [{"name": "q", "url": "http://q.example/x"}],
        },
    ]
}

# (the URL asked for request n, the URL that must be sent, the route it matched)
FORMS = [
    ("http://alias.example/v1/n{n}", "http://p.example/v1/n{n}", "wide"),
    ("http://alias.example/v1/chat/n{n}", "http://q.example/x/n{n}", "narrow"),
    ("http://alias.example:8080/v1/chat/n{n}", "http://alias.example:8080/v1/chat/n{n}", None),
    ("https://alias.example/v1/n{n}?q=1", "https://alias.example/v1/n{n}?q=1", None),
    ("http://alias.example/v1/caf%C3%A9/n{n}", "http://p.example/v1/caf%C3%A9/n{n}", "wide"),
]


def test_more_paths_than_the_candidates_memory_holds_still_go_where_they_match() -> None:
    """Candidates are remembered per scheme, host, port and path, and the memory starts
    again when full: past that many distinct paths, mixing overlapping routes (the longest
    prefix wins), unrouted ports and schemes and percent-encoded paths, every request is
    still sent to its own target's URL under its own route, the paths asked before the
    memory started again included."""
    sent: list[str] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        sent.append(str(request.url))
        return httpx.Response(200, content=b"ok")

    transport = sidestep.FailoverTransport(CONFIG, transport=httpx.MockTransport(upstream))
    with httpx.Client(transport=transport) as client:

        def check(n: int) -> None:
            asked, expected, route = FORMS[n % len(FORMS)]
            response = client.get(asked.format(n=n))
            assert sent[-1] == expected.format(n=n)
            assert response.extensions["sidestep"]["route"] == route

        for n in range(CACHE_LIMIT + 2 * len(FORMS) + 100):
            check(n)
        assert len(transport._core._matched) <= CACHE_LIMIT  # it started again
        for n in range(2 * len(FORMS)):  # asked before it started again
            check(n)


_CHILD = """
import pickle, sys
from sidestep._common.scopes import ScopeKey, ScopeKind
table = pickle.loads(sys.stdin.buffer.read())
key = ScopeKey(ScopeKind.CREDENTIAL_MODEL, "https://api.example:443", "fp", "m")
print(table.get(key), [hash(k) == hash(key) for k in table])
"""


def test_a_scope_key_unpickled_in_another_process_finds_its_entry() -> None:
    """A scope key's hash is made once, with the string hashes of the process that made
    it; unpickled in a process with other string hashes (another PYTHONHASHSEED), the key
    is made again there, so a table keyed by it answers for the key made there."""
    key = ScopeKey(ScopeKind.CREDENTIAL_MODEL, "https://api.example:443", "fp", "m")
    data = pickle.dumps({key: "suspended"})
    src = str(Path(sidestep.__file__).parent.parent)
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": src}
        child = subprocess.run(  # noqa: S603  # this Python, a program of our own
            [sys.executable, "-c", _CHILD], input=data, capture_output=True, env=env, check=True
        )
        assert child.stdout.decode().split() == ["suspended", "[True]"]


def test_a_scope_key_replaced_or_copied_hashes_as_one_made_anew() -> None:
    """The cached hash follows the fields: a key made by `dataclasses.replace`, copied, or
    unpickled equals and hashes as the key made from the same parts."""
    key = ScopeKey(ScopeKind.ORIGIN, "https://a.example:443")
    other: Any = dataclasses.replace(key, origin="https://b.example:443")
    assert other == ScopeKey(ScopeKind.ORIGIN, "https://b.example:443")
    assert hash(other) == hash(ScopeKey(ScopeKind.ORIGIN, "https://b.example:443"))
    for again in (copy.copy(key), copy.deepcopy(key), pickle.loads(pickle.dumps(key))):  # noqa: S301
        assert again == key and hash(again) == hash(key)
        assert {key: 1}[again] == 1


def test_a_scope_keys_fields_are_its_parts_and_nothing_else() -> None:
    """The hash made once is kept beside the key's fields, not as one of them: a snapshot
    dumped with `dataclasses.asdict` (an operator's script) holds the scope's parts
    only, never a number that differs from one process to the next."""
    key = ScopeKey(ScopeKind.MODEL, "https://a.example:443", model="m")
    assert dataclasses.asdict(key) == {
        "kind": ScopeKind.MODEL,
        "origin": "https://a.example:443",
        "credential": "",
        "model": "m",
        "endpoint": "",
    }
    assert "_hash" not in repr(key)


def test_a_full_memory_is_emptied_and_keeps_what_comes_next() -> None:
    """`remember` bounds every memory of the core at `CACHE_LIMIT` entries without
    freezing it on the first keys: past the limit it holds the newest, never more."""
    memory: dict[int, str] = {}
    for n in range(CACHE_LIMIT + 10):
        assert remember(memory, n, f"v{n}") == f"v{n}"
        assert len(memory) <= CACHE_LIMIT
    assert memory[CACHE_LIMIT + 9] == f"v{CACHE_LIMIT + 9}"
    assert 0 not in memory


def test_a_request_moved_past_full_memories_still_goes_whole_and_without_credentials() -> None:
    """More distinct URLs and header names than the moved-URL and header-fate memories
    hold, moved to a backup on another origin: each request still reaches the backup
    with its own path and query, its own headers, and no credential (neither the
    `api_key` query parameter nor `Authorization`); both memories stay bounded."""
    seen: list[httpx.Request] = []

    def backup(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    config = {
        "routes": [
            {
                "name": "api",
                "match": ["http://api.example/v1"],
                "targets": [{"name": "backup", "url": "http://backup.example/v2"}],
            }
        ]
    }
    transport = sidestep.FailoverTransport(config, transport=httpx.MockTransport(backup))
    with httpx.Client(transport=transport) as client:
        for n in range(CACHE_LIMIT + 50):
            client.get(
                f"http://api.example/v1/items/{n}",
                params={"page": n, "api_key": "secret"},
                headers={f"x-h{n}": str(n), "Authorization": "Bearer secret"},
            )
    assert len(seen) == CACHE_LIMIT + 50
    for n, request in enumerate(seen):
        assert str(request.url) == f"http://backup.example/v2/items/{n}?page={n}"
        assert request.headers[f"x-h{n}"] == str(n)
        assert "authorization" not in request.headers
    plan = next(iter(transport._core._rebuilder._plans.values()))
    assert all(len(urls) <= CACHE_LIMIT for urls in plan.urls)
    assert all(len(fates) <= CACHE_LIMIT for fates in plan.fates)
