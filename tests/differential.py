"""A harness that runs one client program plain and under `sidestep.install()`, to compare.

A *program* is an `async def program(h, world, o)` taking an HTTP flavour
module (`httpx` or `httpx2`), the `World` of real servers on 127.0.0.1, and
an `Observer` it tells what it saw. It opens its clients through
`world.client(...)`, which gives a sync or an async client of the flavour
behind one awaitable face: in the sync kind every await completes at once, so
the program is driven without any event loop and the client is a plain
`Client`; in the async kinds it runs under anyio (asyncio or trio) with an
`AsyncClient`. `run()` runs a program once, plain or installed (a fresh
`install(store=MemoryStore())`, undone after), and returns what it observed,
the requests each server received included.

Observations are *strict* (must be identical) or *aside*: labelled separately,
for the places where an outage may legitimately be failed fast.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from werkzeug.http import parse_dict_header
from werkzeug.wrappers import Request, Response

import sidestep
from proxy import Proxy, dead_proxy_url
from servers import serve_wsgi

FLAVOURS = [name for name in ("httpx", "httpx2") if importlib.util.find_spec(name) is not None]
KINDS = ("sync", "asyncio", "trio")
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
VARYING_HEADERS = {"date", "server"}
SLOW_SECONDS = 0.3
# what /slow?hold=long waits: longer than any stall of a loaded test process, so that a
# caller's short read budget always runs out first (at 0.3 s, a trio run once saw the answer)
HELD_SECONDS = 5.0
# the most /held and /held-stream wait for `Origin.release` (a program releases them sooner)
RELEASE_BOUND = 30.0
USER, PASSWORD, REALM = "user", "right", "differential"

# --- the origin server -----------------------------------------------------------------------


@dataclass
class Received:
    """One request as a server got it: what a credential or cookie looked like, not its bytes."""

    method: str
    target: str
    authorization: str | None
    cookie: str | None


class Origin:
    """A WSGI app with every endpoint the programs use; it records each request it receives."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._hits: dict[str, int] = {}
        self._nonces = 0
        # what /held and /held-stream wait for: set by a program, made anew by `reset`
        self.release = threading.Event()

    def reset(self) -> None:
        with self._lock:
            self.received.clear()
            self._hits.clear()
            self._nonces = 0
            # a fresh gate, the old one set: what a previous run still holds is let go
            held, self.release = self.release, threading.Event()
        held.set()

    def arrived(self, path: str) -> int:
        """How many requests for `path` (query left out) have arrived so far."""
        with self._lock:
            return sum(r.target.split("?")[0] == path for r in self.received)

    def __call__(self, environ: Any, start_response: Any) -> Any:
        request = Request(environ)
        body = request.get_data()  # read it all, so keep-alive stays in step
        with self._lock:
            self.received.append(
                Received(
                    request.method,
                    request.full_path.rstrip("?"),
                    self._authorization(request),
                    request.headers.get("cookie"),
                )
            )
            hits = self._hits[request.path] = self._hits.get(request.path, 0) + 1
        try:
            response = self._answer(request, body, hits)
        finally:
            request.close()  # the uploaded files' temporary files
        return response(environ, start_response)

    def _authorization(self, request: Request) -> str | None:
        value = request.headers.get("authorization")
        if value is not None and value.startswith("Digest "):
            return "Digest " + ("valid" if self._digest_valid(request) else "invalid")
        return value

    def _answer(self, request: Request, body: bytes, hits: int) -> Response:
        path = request.path
        auth = request.headers.get("authorization")
        if path in ("/public", "/fast"):
            return Response(f"{path[1:]} from {self.name}", content_type="text/plain")
        if path == "/slow":
            # the scenario: an endpoint that answers late
            threading.Event().wait(HELD_SECONDS if request.args.get("hold") else SLOW_SECONDS)
            return Response("slow", content_type="text/plain")
        if path == "/held":
            # answers once the program sets `release`: until then its caller waits for the head
            self.release.wait(RELEASE_BOUND)
            return Response("held", content_type="text/plain")
        if path == "/held-stream":
            return Response(self._held_stream(), content_type="text/plain", direct_passthrough=True)
        if path == "/login-required":
            return Response("login required", status=401, content_type="text/plain")
        if path == "/basic":
            if request.authorization is not None and (
                request.authorization.username,
                request.authorization.password,
            ) == (USER, PASSWORD):
                return Response("basic ok")
            return Response(
                "basic denied",
                status=401,
                headers={"WWW-Authenticate": f'Basic realm="{REALM}"'},
            )
        if path == "/digest":
            if auth is not None and auth.startswith("Digest ") and self._digest_valid(request):
                return Response("digest ok")
            with self._lock:
                self._nonces += 1
                nonce = f"nonce-{self._nonces}"
            challenge = f'Digest realm="{REALM}", qop="auth", nonce="{nonce}", opaque="o"'
            return Response("digest denied", status=401, headers={"WWW-Authenticate": challenge})
        if path == "/token":
            return _json({"token": "fresh"})
        if path == "/api":
            if auth == "Bearer fresh":
                return _json({"data": "secret stuff"})
            return _json(
                {"error": "token expired"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )
        if path == "/forbidden":
            return _json({"error": "forbidden"}, status=403)
        if path.startswith("/status/"):
            code = int(path.rsplit("/", 1)[1])
            return _json({"error": f"status {code}"}, status=code)
        if path == "/recovers":
            # answers 500 four times, then 200: an SDK retrying it four times gets through
            if hits <= 4:
                return _json({"error": {"type": "server_error"}}, status=500)
            return _json({"ok": True})
        if path == "/rate-limited":
            if hits == 1:
                return _json({"error": "slow down"}, status=429, headers={"Retry-After": "0"})
            return _json({"ok": True})
        if path == "/busy":
            if hits == 1:
                return _json({"error": "busy"}, status=429, headers={"Retry-After": "3600"})
            return _json({"ok": True})
        if path.startswith("/redirect/"):
            code = int(path.rsplit("/", 1)[1])
            return Response(
                "", status=code, headers={"Location": request.args.get("to", "/public")}
            )
        if path == "/relative/redirect":
            return Response("", status=302, headers={"Location": "../public"})
        if path == "/echo":
            return _json(_echo(request, body))
        if path == "/whoami":
            return _json({"authorization": auth, "cookie": request.headers.get("cookie")})
        if path == "/set-cookie":
            response = Response("cookies set")
            response.set_cookie("session", "abc123", path="/")
            response.set_cookie("theme", "dark", path="/")
            return response
        if path == "/chunks":
            parts = [b"alpha ", b"beta\ngam", b"ma\r\ndelta\n", b"", b"epsilon"]
            return Response(iter(parts), content_type="text/plain", direct_passthrough=True)
        if path == "/long":
            chunk = b"x" * 4096
            return Response((chunk for _ in range(4096)), direct_passthrough=True)
        if path == "/big":
            return Response(_BIG, content_type="application/octet-stream")
        if path == "/empty":
            return Response(status=204)
        if path == "/etag":
            if request.headers.get("if-none-match") == '"v1"':
                return Response(status=304, headers={"ETag": '"v1"'})
            return Response("tagged", headers={"ETag": '"v1"'})
        return _json({"error": "no such path"}, status=404)

    def _held_stream(self) -> Iterator[bytes]:
        """A first chunk at once; the rest once the program sets `release`."""
        yield b"first chunk"
        self.release.wait(RELEASE_BOUND)
        yield b", the rest"

    def _digest_valid(self, request: Request) -> bool:
        value = request.headers.get("authorization", "")
        p = parse_dict_header(value.removeprefix("Digest "))
        if p.get("username") != USER:
            return False
        ha1 = _md5(f"{USER}:{REALM}:{PASSWORD}")
        ha2 = _md5(f"{request.method}:{p.get('uri')}")
        expected = _md5(f"{ha1}:{p.get('nonce')}:{p.get('nc')}:{p.get('cnonce')}:auth:{ha2}")
        return p.get("response") == expected


_BIG = bytes(range(256)) * 4096  # 1 MiB


def _md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


def _json(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps(payload), status=status, headers=headers, content_type="application/json"
    )


def _echo(request: Request, body: bytes) -> dict[str, Any]:
    content_type = request.headers.get("content-type", "")
    multipart = content_type.startswith("multipart/")  # its random boundary varies the bytes
    return {
        "method": request.method,
        "target": request.full_path.rstrip("?"),
        "content_type": content_type.split(";")[0],
        "length": len(body),
        "sha256": None if multipart else hashlib.sha256(body).hexdigest(),
        "chunked": request.headers.get("transfer-encoding") == "chunked",
        "form": sorted(request.form.items(multi=True)),
        "files": sorted((k, f.filename, f.read().decode()) for k, f in request.files.items()),
        "json": request.get_json(silent=True)
        if content_type.startswith("application/json")
        else None,
    }


# --- one uniform client face over sync and async clients ------------------------------------


class Face:
    """A sync or async client of one flavour behind awaitable methods.

    With a sync client every method returns without suspending, so a program
    driven by `drive()` runs straight through on the calling thread.
    """

    def __init__(self, raw: Any, sync: bool) -> None:
        self.raw = raw
        self.sync = sync

    async def request(self, method: str, url: str, **kwargs: Any) -> Any:
        if self.sync:
            return self.raw.request(method, url, **kwargs)
        return await self.raw.request(method, url, **kwargs)

    async def get(self, url: str, **kwargs: Any) -> Any:
        return await self.request("GET", url, **kwargs)

    async def post(self, url: str, **kwargs: Any) -> Any:
        return await self.request("POST", url, **kwargs)

    async def put(self, url: str, **kwargs: Any) -> Any:
        return await self.request("PUT", url, **kwargs)

    async def send(self, request: Any, **kwargs: Any) -> Any:
        if self.sync:
            return self.raw.send(request, **kwargs)
        return await self.raw.send(request, **kwargs)

    @contextlib.asynccontextmanager
    async def stream(self, method: str, url: str, **kwargs: Any) -> AsyncIterator[Any]:
        if self.sync:
            with self.raw.stream(method, url, **kwargs) as response:
                yield response
        else:
            async with self.raw.stream(method, url, **kwargs) as response:
                yield response

    async def collect(self, response: Any, kind: str, **kwargs: Any) -> list[Any]:
        """All of `response.iter_<kind>()` (or `aiter_<kind>()`)."""
        if self.sync:
            return list(getattr(response, f"iter_{kind}")(**kwargs))
        return [part async for part in getattr(response, f"aiter_{kind}")(**kwargs)]

    async def first(self, response: Any, kind: str) -> Any:
        """The first item of `response.iter_<kind>()`, leaving the rest unread."""
        if self.sync:
            parts = getattr(response, f"iter_{kind}")()
            try:
                return next(parts)
            finally:
                parts.close()
        aparts = getattr(response, f"aiter_{kind}")()
        try:
            return await aparts.__anext__()
        finally:
            await aparts.aclose()

    async def close_response(self, response: Any) -> None:
        if self.sync:
            response.close()
        else:
            await response.aclose()

    async def close(self) -> None:
        if self.sync:
            self.raw.close()
        else:
            await self.raw.aclose()

    async def __aenter__(self) -> Face:
        if self.sync:
            self.raw.__enter__()
        else:
            await self.raw.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.sync:
            self.raw.__exit__(*exc)
        else:
            await self.raw.__aexit__(*exc)


def drive(coroutine: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine that never suspends (a program over sync clients) to its end."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()
    raise AssertionError("a sync program suspended: it awaited something other than its client")


# --- the world a program runs in -------------------------------------------------------------


class World:
    """Two origins (`a`, `b`), a live forward proxy and a dead proxy URL, all on 127.0.0.1."""

    def __init__(
        self, a: str, b: str, origins: dict[str, Origin], proxy: Proxy, dead_proxy: str
    ) -> None:
        self.a = a
        self.b = b
        self.origins = origins
        self.proxy = proxy
        self.live_proxy = proxy.url
        self.dead_proxy = dead_proxy
        self.kind = "sync"
        self.h: Any = None
        self._monkeypatch: pytest.MonkeyPatch | None = None

    @property
    def sync(self) -> bool:
        return self.kind == "sync"

    def client(self, **kwargs: Any) -> Face:
        """A new client of the run's flavour and kind (`h.Client` or `h.AsyncClient`)."""
        cls = self.h.Client if self.sync else self.h.AsyncClient
        return Face(cls(**kwargs), self.sync)

    def transport(self, **kwargs: Any) -> Any:
        """A new `HTTPTransport` (or `AsyncHTTPTransport`) of the run's flavour."""
        cls = self.h.HTTPTransport if self.sync else self.h.AsyncHTTPTransport
        return cls(**kwargs)

    async def pause(self, seconds: float) -> None:
        """Wait as the program would: a blocking sleep in the sync kind, anyio's in the others."""
        if self.sync:
            time.sleep(seconds)  # noqa: ASYNC251  # the sync kind never runs in an event loop
        else:
            await anyio.sleep(seconds)

    def setenv(self, name: str, value: str) -> None:
        assert self._monkeypatch is not None
        self._monkeypatch.setenv(name, value)

    def delenv(self, name: str) -> None:
        assert self._monkeypatch is not None
        self._monkeypatch.delenv(name, raising=False)

    def reset(self) -> None:
        for origin in self.origins.values():
            origin.reset()
        self.proxy.reset()


@contextlib.contextmanager
def world() -> Iterator[World]:
    origins = {"a": Origin("a"), "b": Origin("b")}
    with serve_wsgi(origins["a"]) as a, serve_wsgi(origins["b"]) as b:
        proxy = Proxy()
        try:
            yield World(a, b, origins, proxy, dead_proxy_url())
        finally:
            proxy.close()


# --- observing -------------------------------------------------------------------------------


@dataclass
class Observer:
    """What one run saw: strict observations, and the ones set aside under their own label."""

    strict: list[tuple[str, Any]] = field(default_factory=list)
    aside: list[tuple[str, Any]] = field(default_factory=list)

    def see(self, label: str, value: Any) -> None:
        self.strict.append((label, value))

    def note(self, label: str, value: Any) -> None:
        self.aside.append((label, value))

    def response(self, label: str, response: Any, *, aside: bool = False) -> None:
        (self.note if aside else self.see)(label, describe(response))

    async def outcome(self, label: str, call: Awaitable[Any], *, aside: bool = False) -> Any:
        """Await `call`; record the response it gave or the type of what it raised."""
        try:
            result = await call
        except Exception as exc:  # the exception's type is the observation
            (self.note if aside else self.see)(label, ("raised", type(exc).__name__))
            return None
        (self.note if aside else self.see)(label, describe(result))
        return result


def describe(response: Any) -> dict[str, Any]:
    """A response as the caller sees it, `extensions` and varying headers left out."""
    out: dict[str, Any] = {
        "status": response.status_code,
        "reason": response.reason_phrase,
        "version": response.http_version,
        "url": str(response.url),
        "headers": [
            (k, v) for k, v in response.headers.multi_items() if k.lower() not in VARYING_HEADERS
        ],
        "history": [(r.status_code, str(r.url)) for r in response.history],
        "next": None if response.next_request is None else str(response.next_request.url),
        "request": (response.request.method, str(response.request.url)),
    }
    with contextlib.suppress(Exception):  # a stream left unread has no content to show
        content = response.content
        out["content"] = (
            content if len(content) <= 4096 else (len(content), hashlib.sha256(content).hexdigest())
        )
    return out


# --- programs and the harness ----------------------------------------------------------------

ProgramFn = Callable[[Any, World, Observer], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class Program:
    name: str
    fn: ProgramFn
    aside_paths: frozenset[str]
    has_aside: bool

    def __repr__(self) -> str:
        return self.name


PROGRAMS: dict[str, Program] = {}


def program(*aside_paths: str, aside: bool = False) -> Callable[[ProgramFn], ProgramFn]:
    """Register a program; requests to `aside_paths` are counted as aside observations.

    `aside` says the program notes observations aside itself (`Observer.note`).
    """

    def register(fn: ProgramFn) -> ProgramFn:
        assert inspect.iscoroutinefunction(fn), "a program is an async def"
        has_aside = aside or bool(aside_paths)
        PROGRAMS[fn.__name__] = Program(fn.__name__, fn, frozenset(aside_paths), has_aside)
        return fn

    return register


def run(
    prog: Program,
    flavour: str,
    kind: str,
    w: World,
    *,
    installed: bool,
    store: sidestep.StateStore | None = None,
) -> Observer:
    """Run `prog` once with fresh server state; under a fresh `install()` when `installed`
    (over `store`, which the caller may then inspect; a new `MemoryStore` by default)."""
    w.reset()
    w.h = importlib.import_module(flavour)
    w.kind = kind
    o = Observer()
    with pytest.MonkeyPatch.context() as monkeypatch:
        w._monkeypatch = monkeypatch
        for name in PROXY_VARIABLES:
            monkeypatch.delenv(name, raising=False)
            monkeypatch.delenv(name.lower(), raising=False)
        if installed:
            sidestep.install(store=store if store is not None else sidestep.MemoryStore())
        try:
            if kind == "sync":
                drive(prog.fn(w.h, w, o))
            else:
                anyio.run(prog.fn, w.h, w, o, backend=kind)
        finally:
            if installed:
                sidestep.uninstall()
            w._monkeypatch = None
    for name, origin in w.origins.items():
        with origin._lock:
            received = list(origin.received)
        strict = [r for r in received if r.target.split("?")[0] not in prog.aside_paths]
        o.see(f"server {name} received", strict)
        o.note(f"server {name} received", [r for r in received if r not in strict])
    o.see("proxy received", list(w.proxy.seen))
    return o


def differences(plain: list[tuple[str, Any]], installed: list[tuple[str, Any]]) -> list[Any]:
    """Where two runs' observations part: (label, plain, installed) for each one that differs."""
    if [label for label, _ in plain] != [label for label, _ in installed]:
        return [("observations", plain, installed)]
    return [
        (label, mine, theirs)
        for (label, mine), (_, theirs) in zip(plain, installed, strict=True)
        if mine != theirs
    ]
