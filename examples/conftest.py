"""What the examples' tests share: two OpenAI-compatible upstreams on 127.0.0.1 standing
in for the providers, and the environment the example apps read.

Each answers chat completions, saying which one it is (``from primary``, ``from
backup``); sidestep's pytest plugin (installed with sidestep) makes either of them fail
as a test asks (``sidestep_down``, ``sidestep_fault``, ``sidestep_faults``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class _Provider(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # the name http.server calls
        length = int(self.headers.get("content-length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        who = self.server.name  # type: ignore[attr-defined]
        body = json.dumps(
            {
                "id": f"chatcmpl-{who}",
                "object": "chat.completion",
                "created": 0,
                "model": request.get("model", ""),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": f"from {who}"},
                        "finish_reason": "stop",
                    }
                ],
            }
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet


def _serve(name: str) -> tuple[ThreadingHTTPServer, threading.Thread]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Provider)
    server.name = name  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


@pytest.fixture
def providers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Two healthy providers on 127.0.0.1, named in the environment as the examples'
    primary and backup (``PRIMARY_URL``, ``BACKUP_URL`` and their keys)."""
    running = [_serve("primary"), _serve("backup")]
    for (server, _), name in zip(running, ("PRIMARY", "BACKUP"), strict=True):
        monkeypatch.setenv(f"{name}_URL", f"http://127.0.0.1:{server.server_address[1]}/v1")
        monkeypatch.setenv(f"{name}_API_KEY", f"sk-{name.lower()}-example")
    try:
        yield
    finally:
        for server, thread in running:
            server.shutdown()
            server.server_close()
            thread.join()
