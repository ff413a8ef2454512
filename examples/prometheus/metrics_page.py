"""Render sidestep's metrics page after a simulated outage, as HTML (and a PNG with chromium).

Two targets on one route, answered in-process: the primary serves, goes down
(503) for a while — it fails, opens, is skipped, then probed back closed —
and the backup answers meanwhile. The page is what
``prometheus_client.generate_latest`` serves at ``/metrics``, ``sidestep_``
lines only, unchanged. Run from the repository root::

    python examples/prometheus/metrics_page.py docs/images/metrics-page.png
"""

from __future__ import annotations

import html
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry, generate_latest

import sidestep
from sidestep.metrics import prometheus

CONFIG = {
    "breaker": {"failure_threshold": 2, "cooldown": 30},
    "routes": [
        {
            "name": "chat",
            "targets": [
                {"name": "primary", "url": "https://primary.example/v1"},
                {"name": "backup", "url": "https://backup.example/v1"},
            ],
        }
    ],
}


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def outage_page() -> str:
    """The metrics exposition after 40 healthy requests, 60 during the outage, 40 after."""
    down = False

    clock = Clock()

    def upstream(request: httpx.Request) -> httpx.Response:
        primary = request.url.host == "primary.example"
        clock.now += 0.4 if primary else 0.7  # each answer's latency, on the transport's clock
        if down and primary:
            return httpx.Response(503, json={"error": "overloaded"})
        return httpx.Response(200, json={"ok": True})

    registry = CollectorRegistry()
    prometheus.enable(registry)
    try:
        transport = sidestep.FailoverTransport(
            CONFIG, transport=httpx.MockTransport(upstream), clock=clock
        )
        with httpx.Client(transport=transport) as client:
            for phase, count in (("up", 40), ("down", 60), ("up", 40)):
                down = phase == "down"
                for _ in range(count):
                    clock.now += 1.0
                    client.post("https://primary.example/v1/chat/completions", json={"model": "m"})
        return generate_latest(registry).decode()
    finally:
        prometheus.disable()


def as_html(page: str) -> str:
    lines = [
        line
        for line in page.splitlines()
        if "sidestep_" in line and "_created" not in line and "_bucket" not in line
    ]
    body = "\n".join(
        f'<span class="c">{html.escape(line)}</span>' if line.startswith("#") else html.escape(line)
        for line in lines
    )
    return f"""<!doctype html><meta charset="utf-8"><title>/metrics</title>
<style>body{{margin:0;background:#fff;font:13px/1.35 "DejaVu Sans Mono",monospace;color:#111}}
header{{background:#e6522c;color:#fff;padding:8px 14px;font:bold 14px sans-serif}}
pre{{margin:0;padding:10px 14px}} .c{{color:#777}}</style>
<header>GET /metrics — sidestep after an outage of the primary (histogram buckets omitted)</header>
<pre>{body}</pre>"""


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "metrics-page.png")
    page = as_html(outage_page())
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if out.suffix == ".html" or browser is None:
        out.with_suffix(".html").write_text(page)
        return
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "metrics.html"
        source.write_text(page)
        subprocess.run(  # noqa: S603 -- a fixed command line
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--screenshot={out.resolve()}",
                "--window-size=1280,640",
                source.as_uri(),
            ],
            check=True,
            capture_output=True,
        )


if __name__ == "__main__":
    main()
