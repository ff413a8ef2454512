"""Scenario 12, admin listing: the host application's event loop and the status page at scale.

Every measurement is taken against a real server: a FastAPI application
served by uvicorn on 127.0.0.1 in a process of its own, with the admin app
mounted at ``/sidestep`` over its transport's memory store, filled with
suspended scopes (half tenants' credential scopes on a routed origin, half
unrouted origins).

- **The loop.** A probe task in the application sleeps 2 ms over and over and
  keeps how late each wake-up came. With 10,000 scopes, the worst, 99th and
  99.9th percentile lateness, and the 99th percentile of a ``/ping`` sent
  every 20 ms, and the CPU time the application's process used (all its
  threads), are taken over 30 s each: while idle; while a client lists
  every row (``GET /sidestep/suspensions``, 2.5 MB) every 2 s; while the
  status page polls in headless Chromium with nothing changing; and while it
  polls as ten new origins are suspended every second (the store's bound
  forgets the ten oldest). Chromium runs the page as it is, with only a
  long-task observer added. The collector's full passes (generation 2), which hold every
  thread of the process whatever set them off, are counted and timed, and the
  worst lateness outside them is given as well. One phase has no admin app
  in it: a thread of the application takes the store's snapshot every 2 s, as
  a listing does first, which tells what the store's copy costs the loop by
  itself (and how long it takes).
- **The machine.** Beside the application, a bare event loop in a process of
  its own (no admin app, no store) sleeps 2 ms over and over through every
  phase: how late it wakes is what the machine alone (other processes,
  Chromium) costs a loop meanwhile, so that a busy machine is told apart from
  the application's own stalls.
- **The page.** Chromium opens the status page over 2,000 suspended unrouted
  origins while ten new ones are suspended every second. A
  ``PerformanceObserver('longtask')`` and a ``requestAnimationFrame`` loop
  (which keeps Chromium drawing: not in the loop's phases), installed before
  the page's own script runs, record every task over 50 ms and the longest
  gap between two frames: during the first load (up to the
  first refresh drawn), and from then on through five refreshes and a scroll
  to the end and back. The same first load of a page with one origin gives
  what a cold Chromium costs here whatever the page holds.

    python benchmarks/admin_listing.py           # full: 10,000 scopes, 2,000 origins
    python benchmarks/admin_listing.py --quick   # smaller and shorter: a smoke run

Chromium and chromedriver (Debian's ``chromium``, ``chromium-driver``) and
selenium are needed for the page; without them those rows say so.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

import _bench as b  # noqa: E402  (the runner's helpers, beside this file)
from _bench import Row  # noqa: E402
from _lateness import Machine, machine_beside  # noqa: E402
from admin_listing_app import APP, POLL_EVERY, TOKEN  # noqa: E402

SCENARIO = "admin_listing"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
LOOP_LIMIT_MS, PAGE_LIMIT_MS = 20.0, 100.0

# -- the measurements ------------------------------------------------------------------------


@contextlib.contextmanager
def _application(tenants: int, origins: int, *, freeze: bool = False) -> Iterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE)])}
    command = [sys.executable, str(APP), str(port), str(tenants), str(origins), str(int(freeze))]
    child = subprocess.Popen(command, env=env)  # noqa: S603  # the application beside this file
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if child.poll() is not None:
                raise RuntimeError("the application stopped before it served")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/ping", timeout=1).is_success:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the application did not start in time")
            time.sleep(0.2)
        yield url
    finally:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _pings(url: str, stop: threading.Event, times: list[float]) -> None:
    with httpx.Client(base_url=url) as client:
        while not stop.wait(0.02):
            started = time.perf_counter()
            client.get("/ping")
            times.append(time.perf_counter() - started)


@contextlib.contextmanager
def _pinging(url: str) -> Iterator[list[float]]:
    times: list[float] = []
    stop = threading.Event()
    thread = threading.Thread(target=_pings, args=(url, stop, times), daemon=True)
    thread.start()
    try:
        yield times
    finally:
        stop.set()
        thread.join()


def _phase(url: str, machine: Machine, seconds: float, work: Any = None) -> dict[str, float]:
    """The probe's figures, /ping's 99th percentile and the bare loop's figures (the
    machine's), over `seconds` while `work` runs."""
    httpx.get(f"{url}/lag")  # starts a fresh window
    machine.take()
    extra: dict[str, float] = {}
    with _pinging(url) as pings:
        if work is None:
            time.sleep(seconds)
        else:
            extra = work(seconds) or {}
    figures = httpx.get(f"{url}/lag").json()
    alone = machine.take()
    figures["ping_p99_ms"] = b.percentile(sorted(p * 1000 for p in pings), 0.99)
    figures["machine_max_ms"] = alone["max_ms"]
    figures["machine_p999_ms"] = alone["p999_ms"]
    return figures | extra


def _list_every_row(url: str) -> Any:
    def work(seconds: float) -> dict[str, float]:
        took, size = [], 0
        headers = {"authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                started = time.perf_counter()
                answer = client.get("/sidestep/suspensions")
                took.append(time.perf_counter() - started)
                size = len(answer.content)
                time.sleep(max(0.0, POLL_EVERY - took[-1]))
        return {"listing_ms": b.median(t * 1000 for t in took), "listing_bytes": size}

    return work


def _browser(*, frames: bool) -> Any:
    """Headless Chromium recording every long task, and with `frames` the longest gap
    between two frames (a frame loop keeps Chromium drawing, and so busy, all along)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="sidestep-bench-")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1100,800",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd(
        "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Bearer {TOKEN}"}}
    )
    # Before any script of the page: every long task, and the longest gap between frames.
    source = """
        window.__long = [];
        new PerformanceObserver(function (list) {
          list.getEntries().forEach(function (e) {
            window.__long.push([e.startTime, e.duration]);
          });
        }).observe({ type: "longtask", buffered: true });
        window.__gap = 0;
    """
    if frames:
        source += """
        (function frame(last) {
          requestAnimationFrame(function (now) {
            if (last !== null) { window.__gap = Math.max(window.__gap, now - last); }
            frame(now);
          });
        })(null);
        """
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": source})
    return driver, profile


def _refreshed(driver: Any) -> bool:
    status = driver.execute_script("return document.getElementById('status').textContent")
    return str(status).startswith("Updated")


def _watch_page(
    url: str,
    seconds: float,
    *,
    load_only: bool = False,
    frames: bool,
    machine: Machine | None = None,
) -> Any:
    """Chromium on the page: its first load, then `seconds` of refreshes and a scroll (the
    loop's and the `machine`'s windows start once the first refresh is drawn)."""

    def work(_: float) -> dict[str, Any]:
        driver, profile = _browser(frames=frames)
        try:
            started = time.monotonic()
            driver.get(f"{url}/sidestep/")
            while not _refreshed(driver):
                if time.monotonic() - started > 60:
                    raise RuntimeError("the page never refreshed")
                time.sleep(0.02)
            # from here on: the steady state (the first refresh is drawn)
            drawn = driver.execute_script("var at = performance.now(); window.__gap = 0; return at")
            if load_only:
                return _tasks(driver.execute_script("return window.__long"), drawn, 0.0)
            httpx.get(f"{url}/lag")  # the loop's window starts once Chromium is up and drawing
            if machine is not None:
                machine.take()
            time.sleep(seconds / 2)
            driver.execute_script("window.scrollTo(0, document.body.scrollHeight)")
            time.sleep(0.5)
            last = driver.execute_script(
                "var r = document.querySelectorAll('tr[data-scope] td:first-child');"
                " return r.length ? r[r.length - 1].textContent : ''"
            )
            driver.execute_script("window.scrollTo(0, document.body.scrollHeight / 2)")
            time.sleep(seconds / 2)
            said = driver.execute_script(
                "var said = document.getElementById('summary'); return said ? said.textContent : ''"
            )
            rows = driver.execute_script("return document.querySelectorAll('tbody tr').length")
            gap = driver.execute_script("return window.__gap")
            long = driver.execute_script("return window.__long")
            held = httpx.get(f"{url}/count").json()
        finally:
            driver.quit()
            shutil.rmtree(profile, ignore_errors=True)
        figures = _tasks(long, drawn, gap)
        return figures | {
            "page_scopes_said": float(str(said).split(" ")[0].replace(",", "") or "nan"),
            "page_scopes_held": held,
            "page_rows_in_table": rows,
            "page_last_origin_drawn": last,
        }

    return work


def _tasks(long: list[list[float]], drawn: float, gap: float) -> dict[str, Any]:
    """Long tasks (start, duration) before and after `drawn` (ms on the page's clock)."""
    before = [d for at, d in long if at < drawn]
    after = [d for at, d in long if at >= drawn]
    return {
        "page_first_load_longest_task_ms": max(before, default=0.0),
        "page_first_load_long_tasks": len(before),
        "page_steady_longest_task_ms": max(after, default=0.0),
        "page_steady_long_tasks": len(after),
        "page_steady_longest_frame_gap_ms": gap,
        "page_first_refresh_drawn_s": drawn / 1000,
    }


def _chromium_missing() -> str | None:
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(binary):
            return f"{binary} is missing: apt-get install chromium chromium-driver"
    if b.missing(["selenium"]):
        return "selenium is not installed"
    return None


def _switched(url: str, what: str, work: Any = None) -> Any:
    """`work` (or a wait) with the application's `what` (churn or copy) switched on."""

    def switched(seconds: float) -> Any:
        httpx.get(f"{url}/{what}", params={"on": 1})
        try:
            return work(seconds) if work is not None else time.sleep(seconds)
        finally:
            httpx.get(f"{url}/{what}", params={"on": 0})

    return switched


_LOOP_FIGURES = (
    ("max_ms", "ms"),
    ("max_without_full_collection_ms", "ms"),
    ("full_collections", ""),
    ("longest_full_collection_ms", "ms"),
    ("p99_ms", "ms"),
    ("p999_ms", "ms"),
    ("ping_p99_ms", "ms"),
    ("cpu_ms", "ms"),
    ("machine_max_ms", "ms"),
    ("machine_p999_ms", "ms"),
    ("copy_ms", "ms"),
    ("listing_ms", "ms"),
    ("listing_bytes", "bytes"),
)
_PAGE_POLLING = ("the page polling, no change", "the page polling, 10 new scopes/s")
_FROZEN = "the page polling, 10 new scopes/s, start-up heap frozen"


def _loop_rows(phases: dict[str, dict[str, Any]], scopes: str) -> list[Row]:
    rows = []
    for name, figures in phases.items():
        for metric, unit in _LOOP_FIGURES:
            if metric in figures:
                out = b.row(SCENARIO, f"loop: {metric}", float(figures[metric]), unit)
                out["subject"] = f"{scopes}, {name}"
                rows.append(out)
        for metric, value in figures.items():
            if metric == "page_steady_longest_task_ms":
                rows.append(b.row(SCENARIO, f"{metric} ({name})", float(value), "ms", scopes))
    for names, heap in ((_PAGE_POLLING, ""), ((_FROZEN,), ", start-up heap frozen")):
        polling = [phases[name] for name in names if name in phases]
        if not polling:
            continue
        worst = max(f["max_ms"] for f in polling)
        passes = sum(int(f["full_collections"]) for f in polling)
        longest = max(f["longest_full_collection_ms"] for f in polling)
        other = max(f["max_without_full_collection_ms"] for f in polling)
        alone = max(f["machine_max_ms"] for f in polling)
        rows.append(
            b.verdict(
                SCENARIO,
                f"no event-loop stall over {LOOP_LIMIT_MS:.0f} ms while the page polls"
                f" {scopes}{heap}",
                worst,
                "ms",
                worst <= LOOP_LIMIT_MS,
                f"the probe's latest 2 ms wake-up; {passes} full collections (longest"
                f" {longest:.0f} ms), {other:.1f} ms outside them; idle:"
                f" {phases['idle']['max_ms']:.1f} ms; a bare loop beside it: {alone:.1f} ms",
            )
        )
    return rows


def _page_rows(page: dict[str, Any], cold: dict[str, Any], origins: int) -> list[Row]:
    rows = []
    for metric, value in page.items():
        unit = "ms" if metric.endswith("_ms") else "s" if metric.endswith("_s") else ""
        shown = value if isinstance(value, str) else float(value)
        rows.append(b.row(SCENARIO, metric, shown, unit, f"{origins:,} origins"))
    for metric in ("page_first_load_longest_task_ms", "page_first_load_long_tasks"):
        rows.append(b.row(SCENARIO, metric, float(cold[metric]), "", "1 origin (a cold Chromium)"))
    worst = float(
        max(page["page_steady_longest_task_ms"], page["page_steady_longest_frame_gap_ms"])
    )
    rows.append(
        b.verdict(
            SCENARIO,
            f"no page stall over {PAGE_LIMIT_MS:.0f} ms at {origins:,} origins",
            worst,
            "ms",
            worst <= PAGE_LIMIT_MS,
            f"after the first refresh is drawn: longest task"
            f" {page['page_steady_longest_task_ms']:.0f} ms, longest gap between frames"
            f" {page['page_steady_longest_frame_gap_ms']:.0f} ms over refreshes with ten new"
            f" origins each second and a scroll to the end; first load"
            f" {page['page_first_load_longest_task_ms']:.0f} ms (one origin:"
            f" {cold['page_first_load_longest_task_ms']:.0f} ms)",
        )
    )
    return rows


def run(quick: bool) -> list[Row]:
    tenants, origins = (250, 250) if quick else (5_000, 5_000)
    page_origins = 200 if quick else 2_000
    seconds = 4.0 if quick else 10.0  # Chromium on the page over 2,000 origins
    window = 4.0 if quick else 30.0  # each phase of the loop's measurement
    no_chromium = _chromium_missing()
    scopes = f"{tenants + origins:,} scopes"
    with _application(tenants, origins) as url, machine_beside() as machine:
        phases = {"idle": _phase(url, machine, window)}
        phases["an API client listing every row each 2 s"] = _phase(
            url, machine, window, _list_every_row(url)
        )
        # no admin app at all: a thread of the application copies the store as a listing does
        copying = _switched(url, "copy")
        phases["a thread copying the store every 2 s"] = _phase(url, machine, window, copying)
        if no_chromium is None:
            steady, churned = _PAGE_POLLING
            # the page as it runs: no frame loop of the benchmark's keeping Chromium busy
            watch = _watch_page(url, window, frames=False, machine=machine)
            phases[steady] = _phase(url, machine, window, watch)
            phases[churned] = _phase(url, machine, window, _switched(url, "churn", watch))
    if no_chromium is None:
        # the same, in an application that froze its start-up heap (gc.freeze)
        with _application(tenants, origins, freeze=True) as url, machine_beside() as machine:
            watch = _watch_page(url, window, frames=False, machine=machine)
            phases[_FROZEN] = _phase(url, machine, window, _switched(url, "churn", watch))
    rows = _loop_rows(phases, scopes)
    if no_chromium is not None:
        rows.append(b.row(SCENARIO, "page: skipped", None, "", no_chromium))
        return rows
    with _application(0, page_origins) as url:
        page = _switched(url, "churn", _watch_page(url, seconds, frames=True))(seconds)
    with _application(0, 1) as url:
        cold = _watch_page(url, seconds, load_only=True, frames=True)(seconds)
    return rows + _page_rows(page, cold, page_origins)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller and shorter: a smoke run")
    args = parser.parse_args(argv)
    import run as runner  # the runner's tables

    rows = run(args.quick)
    print(runner.table(rows), runner.verdicts(rows), sep="\n\n")
    return 0 if all(r.get("verdict", "pass") == "pass" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
