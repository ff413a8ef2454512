"""A clean install, as a new user gets it: run by .ci/run in a fresh venv holding only the wheel.

Imports sidestep, sends one request through `AsyncFailoverTransport` to a
server on 127.0.0.1, checks what httpx2's absence or presence means, and exits
non-zero on any failure.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

import sidestep


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


async def one_request(url: str) -> httpx.Response:
    config = {"routes": [{"name": "r", "targets": [{"name": "a", "url": url + "/v1"}]}]}
    transport = sidestep.AsyncFailoverTransport(config)
    async with httpx.AsyncClient(transport=transport) as client:
        return await client.get(url + "/v1/x")


def main() -> int:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        response = asyncio.run(one_request(f"http://127.0.0.1:{server.server_address[1]}"))
    finally:
        server.shutdown()
    assert (response.status_code, response.text) == (200, "hello"), response
    sidestep.wrap(httpx.Client()).close()
    if importlib.util.find_spec("httpx2") is None:
        assert "httpx2" not in sys.modules, "httpx2 was imported"
        try:
            importlib.import_module("sidestep.httpx2")
        except ImportError as exc:
            assert "sidestep[httpx2]" in str(exc), exc
        else:
            raise AssertionError("sidestep.httpx2 imported without httpx2")
        flavours = "httpx only"
    else:
        import httpx2

        assert issubclass(sidestep.AllCandidatesSuspended, httpx2.TransportError)
        flavours = "httpx and httpx2"
    print(f"smoke: sidestep {sidestep.__version__} on Python {sys.version.split()[0]}: "
          f"one request answered 200 ({flavours})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
