"""Prometheus metrics under gunicorn's worker processes, in prometheus_client's multiprocess mode."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from scrape import samples
from servers import serve_gunicorn
from upstream import Respond, Seen, Upstream, wait_for

CALLS = 12


def test_two_workers_add_up_and_the_gauge_counts_each_workers_suspension(
    tmp_path: Path, a: Upstream, b: Upstream
) -> None:
    """Two gunicorn workers, each with its own circuits: /metrics from either adds both up — every request counted once, A's one failure per worker, and `sidestep_suspended` equal to the number of workers that opened A (no callback collector)."""
    a.behaviour = lambda seen: Respond(503, "down")
    gate = threading.Event()

    def held(seen: Seen) -> Respond:
        return Respond(body="b", gate=gate)

    b.behaviour = held
    directory = tmp_path / "prometheus"
    directory.mkdir()
    env = {
        "PROMETHEUS_MULTIPROC_DIR": str(directory),
        "UPSTREAM_A": a.url,
        "UPSTREAM_B": b.url,
    }
    with serve_gunicorn(
        "metrics_app:application", tmp_path / "error.log", ready="/", workers=2, env=env
    ) as url:
        with ThreadPoolExecutor(max_workers=2) as pool:
            # Two calls held at B at once: each of the two sync workers is busy with one.
            first = [pool.submit(httpx.get, url + "/call", timeout=30) for _ in range(2)]
            wait_for(lambda: b.calls == 2)
            gate.set()
            answers = [f.result().text for f in first]
            answers += [httpx.get(url + "/call", timeout=30).text for _ in range(CALLS - 2)]
        pids = {answer.split()[1] for answer in answers}
        assert len(pids) == 2 and all(answer.startswith("b ") for answer in answers)
        text = httpx.get(url + "/metrics", timeout=30).text
    found = samples(text)
    route = ("route", "chat")
    assert (
        found[("sidestep_requests_total", (("outcome", "served_after_failover"), route))] == CALLS
    )
    a_failed = (("result", "unavailable"), route, ("target", "a"))
    assert found[("sidestep_attempts_total", a_failed)] == a.calls == 2
    b_served = (("result", "success"), route, ("target", "b"))
    assert found[("sidestep_attempts_total", b_served)] == CALLS
    suspended = (("reason", "unavailable"), ("scope", "origin"), ("target", "a"))
    assert found[("sidestep_suspended", suspended)] == 2
    skipped = (("reason", "unavailable"), route, ("target", "a"))
    assert found[("sidestep_candidates_skipped_total", skipped)] == CALLS - 2
