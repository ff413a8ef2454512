"""Under `sidestep.install()`, ordinary httpx programs observe exactly what they observe plain.

Each program below is run twice against the same real servers on 127.0.0.1 —
plain, then under a fresh `install()` with its defaults — for each flavour
(httpx, httpx2) and kind (sync, asyncio, trio); see tests/differential.py for
the harness. Responses (status, headers, body, history), exception types,
event-hook calls, auth-flow steps, transport calls, what each server and the
proxy received, and the program's stdout must be identical. Two kinds of
observation are set aside and checked by tests of their own: an endpoint
that never answers within the caller's timeout (a hung endpoint, which
sidestep fails fast, at that budget only), and requests through a proxy
that is down (which must fail exactly as plain).
"""

from __future__ import annotations

import socket
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from differential import (
    FLAVOURS,
    KINDS,
    PASSWORD,
    PROGRAMS,
    USER,
    Observer,
    World,
    differences,
    program,
    run,
    world,
)

# --- the programs ----------------------------------------------------------------------------


@program()
async def basic_auth(h: Any, w: World, o: Observer) -> None:
    """HTTP Basic: a 401 challenge without credentials, wrong passwords, then the right one."""
    async with w.client() as c:
        await o.outcome("no credentials", c.get(w.a + "/basic"))
        for n in range(4):
            await o.outcome(
                f"wrong password {n}", c.get(w.a + "/basic", auth=h.BasicAuth(USER, "no"))
            )
        await o.outcome("right password", c.get(w.a + "/basic", auth=h.BasicAuth(USER, PASSWORD)))
        await o.outcome("public, no credentials", c.get(w.a + "/public"))
    async with w.client(auth=(USER, PASSWORD)) as c:
        await o.outcome("client-wide auth", c.get(w.a + "/basic"))


@program()
async def digest_auth(h: Any, w: World, o: Observer) -> None:
    """HTTP Digest: each attempt is a 401 challenge and an answer; wrong passwords, then the right one."""
    async with w.client() as c:
        for n in range(4):
            await o.outcome(
                f"wrong password {n}",
                c.get(w.a + "/digest", auth=h.DigestAuth(USER, "no")),
            )
        for n in range(2):
            await o.outcome(
                f"right password {n}",
                c.get(w.a + "/digest", auth=h.DigestAuth(USER, PASSWORD)),
            )


def _token_auth(h: Any, base: str, steps: list[Any]) -> Any:
    class TokenAuth(h.Auth):  # type: ignore[misc]
        """Sends a cached bearer token; on a 401 fetches a fresh one and retries once."""

        requires_response_body = True

        def __init__(self) -> None:
            self.token = "stale"

        def auth_flow(self, request: Any) -> Generator[Any, Any, None]:
            request.headers["Authorization"] = f"Bearer {self.token}"
            steps.append(("send", request.method, request.url.path))
            response = yield request
            steps.append(("answer", response.status_code))
            if response.status_code == 401:
                refreshed = yield h.Request("POST", base + "/token")
                steps.append(("refresh", refreshed.status_code))
                self.token = refreshed.json()["token"]
                request.headers["Authorization"] = f"Bearer {self.token}"
                retried = yield request
                steps.append(("retry", retried.status_code))

    return TokenAuth()


@program()
async def token_refresh(h: Any, w: World, o: Observer) -> None:
    """A custom auth flow refreshes an expired token on 401 and retries, in several clients in turn."""
    steps: list[Any] = []
    for n in range(4):  # workers that each start from the same stale cached token
        async with w.client(auth=_token_auth(h, w.a, steps)) as c:
            await o.outcome(f"worker {n} first call", c.get(w.a + "/api"))
            await o.outcome(f"worker {n} second call", c.get(w.a + "/api"))
    o.see("auth-flow steps", steps)


@program()
async def login_required(h: Any, w: World, o: Observer) -> None:
    """A 401 "login required" page on one path leaves the origin's other paths answering."""
    async with w.client() as c:
        await o.outcome("login required", c.get(w.a + "/login-required"))
        await o.outcome("public", c.get(w.a + "/public"))
        for n in range(3):
            await o.outcome(f"login required {n}", c.get(w.a + "/login-required"))
    async with w.client() as other:
        await o.outcome("public from another client", other.get(w.a + "/public"))


@program()
async def forbidden_and_rate_limited(h: Any, w: World, o: Observer) -> None:
    """The caller handles 403 itself, and a 429 by honouring Retry-After and retrying."""
    async with w.client(headers={"Authorization": "Bearer caller-token"}) as c:
        for n in range(4):
            await o.outcome(f"forbidden {n}", c.get(w.a + "/forbidden"))
        await o.outcome("public, same token", c.get(w.a + "/public"))
    async with w.client() as c:
        limited = await o.outcome("rate limited", c.get(w.a + "/rate-limited"))
        if limited is not None and limited.status_code == 429:
            await w.pause(float(limited.headers["Retry-After"]))
        await o.outcome("retried after Retry-After", c.get(w.a + "/rate-limited"))


@program()
async def plain_4xx(h: Any, w: World, o: Observer) -> None:
    """Client errors come back as they are, and a long Retry-After stops nothing: the next request is sent."""
    async with w.client() as c:
        for code in (400, 402, 403, 404, 409, 422):
            await o.outcome(f"status {code}", c.get(f"{w.a}/status/{code}"))
        await o.outcome("busy: 429, Retry-After 3600", c.get(w.a + "/busy"))
        await o.outcome("busy again, at once", c.get(w.a + "/busy"))
    async with w.client(headers={"Authorization": "Bearer k"}) as c:
        for code in (401, 402, 403, 429):
            for n in range(4):
                await o.outcome(f"credential, {code} #{n}", c.get(f"{w.a}/status/{code}"))
        await o.outcome("credential, public", c.get(w.a + "/public"))


@program()
async def redirects(h: Any, w: World, o: Observer) -> None:
    """Redirects of each code, relative and across origins, followed or not, as httpx handles them."""
    async with w.client(follow_redirects=True) as c:
        for code in (301, 302, 303, 307, 308):
            await o.outcome(
                f"POST through {code}",
                c.post(f"{w.a}/redirect/{code}?to=/echo", content=b"payload"),
            )
        await o.outcome("relative Location", c.get(w.a + "/relative/redirect"))
        await o.outcome(
            "same origin keeps Authorization",
            c.get(f"{w.a}/redirect/307?to=/whoami", auth=h.BasicAuth(USER, PASSWORD)),
        )
        await o.outcome(
            "other origin loses Authorization",
            c.get(f"{w.a}/redirect/302?to={w.b}/whoami", auth=h.BasicAuth(USER, PASSWORD)),
        )
    async with w.client() as c:
        moved = await o.outcome("not followed", c.get(f"{w.a}/redirect/302?to={w.b}/public"))
        if moved is not None:
            await o.outcome("next_request sent", c.send(moved.next_request))


@program()
async def cookies(h: Any, w: World, o: Observer) -> None:
    """Cookies set by a response are kept in the jar and sent back."""
    async with w.client() as c:
        await o.outcome("set", c.get(w.a + "/set-cookie"))
        await o.outcome("sent back", c.get(w.a + "/whoami"))
        o.see("jar", sorted((k.name, k.value, k.domain, k.path) for k in c.raw.cookies.jar))
        c.raw.cookies.delete("theme")
        await o.outcome("after delete", c.get(w.a + "/whoami"))
    async with w.client(cookies={"preset": "1"}) as c:
        await o.outcome("preset cookie", c.get(w.a + "/whoami"))


@program()
async def event_hooks(h: Any, w: World, o: Observer) -> None:
    """Request and response hooks see every request and response, redirects and auth included."""
    calls: list[Any] = []

    def on_request(request: Any) -> None:
        calls.append(("request", request.method, str(request.url)))

    def on_response(response: Any) -> None:
        calls.append(("response", response.status_code, str(response.url)))

    def raise_for_status(response: Any) -> None:
        calls.append(("raise_for_status", response.status_code))
        response.raise_for_status()

    hooks: dict[str, list[Any]]
    raising: dict[str, list[Any]]
    if w.sync:
        hooks = {"request": [on_request], "response": [on_response]}
        raising = {"response": [raise_for_status]}
    else:

        async def a_on_request(request: Any) -> None:
            on_request(request)

        async def a_on_response(response: Any) -> None:
            on_response(response)

        async def a_raise_for_status(response: Any) -> None:
            raise_for_status(response)

        hooks = {"request": [a_on_request], "response": [a_on_response]}
        raising = {"response": [a_raise_for_status]}
    async with w.client(event_hooks=hooks, follow_redirects=True) as c:
        await o.outcome("public", c.get(w.a + "/public"))
        await o.outcome("redirected", c.get(f"{w.a}/redirect/302?to={w.b}/public"))
        await o.outcome("404", c.get(w.a + "/status/404"))
        await o.outcome("login required", c.get(w.a + "/login-required"))
        await o.outcome("digest", c.get(w.a + "/digest", auth=h.DigestAuth(USER, PASSWORD)))
    async with w.client(event_hooks=raising) as c:
        for n in range(4):
            await o.outcome(f"raising hook, 404 #{n}", c.get(w.a + "/status/404"))
        await o.outcome("raising hook, public", c.get(w.a + "/public"))
    o.see("hook calls", calls)


@program()
async def streaming(h: Any, w: World, o: Observer) -> None:
    """Streamed bodies read by bytes, lines, text and raw, a long stream closed early, a large body."""
    async with w.client() as c:
        async with c.stream("GET", w.a + "/chunks") as r:
            o.see("iter_bytes(chunk_size=5)", await c.collect(r, "bytes", chunk_size=5))
            o.response("chunks response", r)
        async with c.stream("GET", w.a + "/chunks") as r:
            o.see("iter_lines", await c.collect(r, "lines"))
        async with c.stream("GET", w.a + "/chunks") as r:
            o.see("iter_text", "".join(await c.collect(r, "text")))
        async with c.stream("GET", w.a + "/chunks") as r:
            o.see("iter_raw", b"".join(await c.collect(r, "raw")))
        async with c.stream("GET", w.a + "/long") as r:
            first = await c.first(r, "bytes")
            o.see("long stream: first chunk", (len(first) > 0, set(first)))
        o.see("long stream: closed after the block", r.is_closed)
        await o.outcome("after the early close", c.get(w.a + "/public"))
        await o.outcome("large body", c.get(w.a + "/big"))


@program("/slow")
async def caller_timeouts(h: Any, w: World, o: Observer) -> None:
    """The caller's own short timeout on a slow endpoint leaves the origin's fast endpoints answering."""
    async with w.client() as c:
        for n in range(5):
            await o.outcome(
                f"/slow with timeout=0.05, try {n}",
                # a short read budget; connecting is not what is timed
                c.get(w.a + "/slow?hold=long", timeout=h.Timeout(5.0, read=0.05)),
                aside=True,
            )
        await o.outcome("/fast", c.get(w.a + "/fast"))
        await o.outcome("/public", c.get(w.a + "/public"))
        await o.outcome(
            "/slow with a generous timeout", c.get(w.a + "/slow", timeout=5), aside=True
        )
    async with w.client() as other:
        await o.outcome("/fast from another client", other.get(w.a + "/fast"))


@program("/slow")
async def caller_timeouts_in_fresh_clients(h: Any, w: World, o: Observer) -> None:
    """Five new clients in turn time out on one slow endpoint, each with its own short budget, before anything else is asked of the origin: its fast endpoints then answer."""
    for n in range(5):
        async with w.client() as c:
            short = h.Timeout(5.0, read=0.05)  # a short read budget; connecting is not timed
            slow = c.get(w.a + "/slow?hold=long", timeout=short)
            await o.outcome(f"client {n}: /slow", slow, aside=True)
    async with w.client() as other:
        await o.outcome("/fast from another client", other.get(w.a + "/fast"))
        await o.outcome("/public from it", other.get(w.a + "/public"))


@program()
async def server_errors_retried_by_the_caller(h: Any, w: World, o: Observer) -> None:
    """An SDK-like retry loop gets through an endpoint that answers 500 four times, then 200; every 5xx comes back as it came, as often as asked."""
    async with w.client() as c:
        for n in range(6):
            answer = await o.outcome(f"/recovers, try {n}", c.get(w.a + "/recovers"))
            if answer is not None and answer.status_code < 500:
                break
        for code in (500, 502, 503, 504):
            for n in range(4):
                await o.outcome(f"status {code}, try {n}", c.get(f"{w.a}/status/{code}"))
    async with w.client() as later:
        await o.outcome("/recovers from a new client", later.get(w.a + "/recovers"))
        await o.outcome("status 503 from a new client", later.get(w.a + "/status/503"))


@program()
async def doubles_beside_the_network(h: Any, w: World, o: Observer) -> None:
    """A MockTransport answering 503 for an origin's URL, five times, then the network: each gets its own answers, neither learns from the other."""
    seen: list[str] = []

    def handler(request: Any) -> Any:
        seen.append(request.url.path)
        return h.Response(503, text="double says no")

    async with w.client(transport=h.MockTransport(handler)) as double:
        for n in range(5):
            await o.outcome(f"double {n}", double.get(w.a + "/public"))
    async with w.client() as network:
        await o.outcome("network", network.get(w.a + "/public"))
        await o.outcome("network, 503", network.get(w.a + "/status/503"))
    async with w.client(transport=h.MockTransport(handler)) as again:
        await o.outcome("double again", again.get(w.a + "/public"))
    o.see("double saw", seen)


def _forwarding(w: World, to: Any) -> Any:
    """A transport of the run's kind that hands every request to another client's transport."""
    if w.sync:

        class Forward(w.h.BaseTransport):  # type: ignore[misc,name-defined]
            def handle_request(self, request: Any) -> Any:
                return to._transport.handle_request(request)

        return Forward()

    class AsyncForward(w.h.AsyncBaseTransport):  # type: ignore[misc,name-defined]
        async def handle_async_request(self, request: Any) -> Any:
            return await to._transport.handle_async_request(request)

    return AsyncForward()


@program()
async def forwarding_to_another_client(h: Any, w: World, o: Observer) -> None:
    """A client whose transport forwards to another client's: 5xx answers and successes come back through both as they came."""
    async with w.client() as inner:
        async with w.client(transport=_forwarding(w, inner.raw)) as outer:
            for n in range(4):
                await o.outcome(f"forwarded 503, try {n}", outer.get(w.a + "/status/503"))
            await o.outcome("forwarded /public", outer.get(w.a + "/public"))
        await o.outcome("inner /public", inner.get(w.a + "/public"))


@program(aside=True)
async def dead_explicit_proxy(h: Any, w: World, o: Observer) -> None:
    """A dead `proxy=` fails its own requests only: the origin stays reachable directly, by a mount, or a live proxy."""
    async with w.client(proxy=w.dead_proxy) as c:
        for n in range(5):
            await o.outcome(f"through the dead proxy {n}", c.get(w.a + "/public"), aside=True)
    async with w.client() as direct:
        await o.outcome("direct", direct.get(w.a + "/public"))
    async with w.client(proxy=w.dead_proxy, mounts={w.a: w.transport()}) as mounted:
        await o.outcome("mount without proxy", mounted.get(w.a + "/public"))
    async with w.client(proxy=w.live_proxy) as via:
        await o.outcome("through the live proxy", via.get(w.a + "/public"))
        await o.outcome("POST through the live proxy", via.post(w.a + "/echo", json={"k": 1}))


@program(aside=True)
async def dead_environment_proxy(h: Any, w: World, o: Observer) -> None:
    """A dead HTTP_PROXY fails the clients that trust it only; NO_PROXY, trust_env=False and ALL_PROXY clients are served."""
    w.setenv("HTTP_PROXY", w.dead_proxy)
    async with w.client() as c:
        for n in range(5):
            await o.outcome(f"through HTTP_PROXY {n}", c.get(w.a + "/public"), aside=True)
    async with w.client(trust_env=False) as direct:
        await o.outcome("trust_env=False", direct.get(w.a + "/public"))
    w.setenv("NO_PROXY", "127.0.0.1")
    async with w.client() as excepted:
        await o.outcome("NO_PROXY", excepted.get(w.a + "/public"))
    w.delenv("HTTP_PROXY")
    w.delenv("NO_PROXY")
    w.setenv("ALL_PROXY", w.live_proxy)
    async with w.client() as via:
        await o.outcome("through ALL_PROXY", via.get(w.a + "/public"))
        await o.outcome("through ALL_PROXY, other origin", via.get(w.b + "/public"))


@program()
async def mounts(h: Any, w: World, o: Observer) -> None:
    """Mounted transports serve their origins, and a None mount falls back to the default transport."""
    async with w.client(mounts={w.a: w.transport(retries=1)}) as c:
        await o.outcome("mounted origin", c.get(w.a + "/public"))
        await o.outcome("mounted origin, 404", c.get(w.a + "/status/404"))
        await o.outcome("other origin", c.get(w.b + "/public"))
    async with w.client(mounts={"all://": w.transport(), w.b: None}) as c:
        await o.outcome("all:// mount", c.get(w.a + "/public"))
        await o.outcome("None mount", c.get(w.b + "/public"))


def _counting(w: World, calls: list[Any]) -> Any:
    """A transport class of the run's flavour and kind that logs its lifecycle calls."""
    if w.sync:

        class Counting(w.h.HTTPTransport):  # type: ignore[misc,name-defined]
            def __init__(self, name: str) -> None:
                super().__init__()
                self.name = name

            def __enter__(self) -> Any:
                calls.append((self.name, "__enter__"))
                return super().__enter__()

            def __exit__(self, *exc: Any) -> None:
                calls.append((self.name, "__exit__"))
                super().__exit__(*exc)

            def close(self) -> None:
                calls.append((self.name, "close"))
                super().close()

        return Counting

    class AsyncCounting(w.h.AsyncHTTPTransport):  # type: ignore[misc,name-defined]
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        async def __aenter__(self) -> Any:
            calls.append((self.name, "__aenter__"))
            return await super().__aenter__()

        async def __aexit__(self, *exc: Any) -> None:
            calls.append((self.name, "__aexit__"))
            await super().__aexit__(*exc)

        async def aclose(self) -> None:
            calls.append((self.name, "aclose"))
            await super().aclose()

    return AsyncCounting


@program()
async def transports_as_context_managers(h: Any, w: World, o: Observer) -> None:
    """A client used as a context manager enters and exits its transport and each mount exactly once."""
    calls: list[Any] = []
    counting = _counting(w, calls)
    async with w.client(transport=counting("main"), mounts={w.b: counting("mount b")}) as c:
        await o.outcome("main transport", c.get(w.a + "/public"))
        await o.outcome("mounted transport", c.get(w.b + "/public"))
    o.see("calls, client as context manager", calls[:])
    calls.clear()
    c = w.client(transport=counting("main"), mounts={w.b: counting("mount b")})
    await o.outcome("main transport, no with", c.get(w.a + "/public"))
    await c.close()
    o.see("calls, client closed", calls)


@program()
async def head_204_304(h: Any, w: World, o: Observer) -> None:
    """HEAD, 204 No Content and a conditional GET answered 304 come back as they are."""
    async with w.client() as c:
        await o.outcome("HEAD", c.request("HEAD", w.a + "/public"))
        await o.outcome("HEAD, large", c.request("HEAD", w.a + "/big"))
        await o.outcome("204", c.get(w.a + "/empty"))
        await o.outcome("tagged", c.get(w.a + "/etag"))
        await o.outcome("304", c.get(w.a + "/etag", headers={"If-None-Match": '"v1"'}))


@program()
async def request_bodies(h: Any, w: World, o: Observer) -> None:
    """Bodies of every kind — bytes, generator, form, multipart, JSON, large — reach the server unchanged."""

    def parts() -> Iterator[bytes]:
        yield b"part one, "
        yield b"part two"

    async def aparts() -> Any:
        yield b"part one, "
        yield b"part two"

    async with w.client() as c:
        echo = w.a + "/echo"
        await o.outcome("bytes", c.post(echo, content=b"raw bytes"))
        await o.outcome("generator", c.post(echo, content=parts() if w.sync else aparts()))
        await o.outcome("form", c.post(echo, data={"a": "1", "b": ["2", "3"]}))
        await o.outcome(
            "multipart",
            c.post(
                echo,
                data={"field": "v"},
                files={"upload": ("notes.txt", b"file body", "text/plain")},
            ),
        )
        await o.outcome("json", c.post(echo, json={"k": [1, 2, {"n": None}]}))
        await o.outcome("large", c.put(echo, content=b"z" * 2_000_000))
        await o.outcome("PATCH", c.request("PATCH", echo, content=b"p"))
        await o.outcome("DELETE", c.request("DELETE", echo))


# --- the tests -------------------------------------------------------------------------------

# httpx itself leaves the inner async generators of a stream closed early to the garbage
# collector, and trio warns about each (plain httpx as much as under sidestep)
_TRIO_EARLY_CLOSE = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <async_generator object:pytest.PytestUnraisableExceptionWarning"
)
CASES = [
    pytest.param(
        prog,
        flavour,
        kind,
        id=f"{prog.name}-{flavour}-{kind}",
        marks=[_TRIO_EARLY_CLOSE] if (prog.name, kind) == ("streaming", "trio") else [],
    )
    for prog in PROGRAMS.values()
    for flavour in FLAVOURS
    for kind in KINDS
]
ASIDE_CASES = [case for case in CASES if PROGRAMS[str(case.id).split("-")[0]].has_aside]
# Both runs of each case, kept for the set-aside test, which otherwise runs them itself.
_RUNS: dict[tuple[str, str, str], tuple[Observer, Observer]] = {}


def _both_runs(prog: Any, flavour: str, kind: str, w: World) -> tuple[Observer, Observer]:
    key = (prog.name, flavour, kind)
    if key not in _RUNS:
        plain = run(prog, flavour, kind, w, installed=False)
        _RUNS[key] = (plain, run(prog, flavour, kind, w, installed=True))
    return _RUNS[key]


@pytest.fixture(scope="module")
def servers() -> Iterator[World]:
    """Two origins and a forward proxy on 127.0.0.1, shared by the module; each run resets them."""
    with world() as w:
        yield w


@pytest.mark.parametrize(("prog", "flavour", "kind"), CASES)
def test_installed_program_observes_what_plain_does(
    prog: Any, flavour: str, kind: str, servers: World, capfd: pytest.CaptureFixture[str]
) -> None:
    """Under install() a program sees the same responses, exceptions, hooks, auth steps, upstream requests and stdout as plain."""
    capfd.readouterr()
    plain = run(prog, flavour, kind, servers, installed=False)
    plain_stdout = capfd.readouterr().out
    installed = run(prog, flavour, kind, servers, installed=True)
    installed_stdout = capfd.readouterr().out
    _RUNS[prog.name, flavour, kind] = (plain, installed)
    found = differences(
        [*plain.strict, ("stdout", plain_stdout)],
        [*installed.strict, ("stdout", installed_stdout)],
    )
    assert found == []


PROXY_CASES = [case for case in ASIDE_CASES if "proxy" in str(case.id)]
TIMEOUT_CASES = [case for case in ASIDE_CASES if str(case.id).startswith("caller_timeouts-")]
THRESHOLD = 3  # the default breaker.failure_threshold


@pytest.mark.parametrize(("prog", "flavour", "kind"), PROXY_CASES)
def test_a_dead_proxy_fails_as_plain(prog: Any, flavour: str, kind: str, servers: World) -> None:
    """Requests through a dead proxy raise what plain httpx raises, every time: a proxy that is down is not an upstream outage."""
    plain, installed = _both_runs(prog, flavour, kind, servers)
    assert differences(plain.aside, installed.aside) == []


@pytest.mark.parametrize(("prog", "flavour", "kind"), TIMEOUT_CASES)
def test_an_endpoint_silent_within_the_callers_budget_fails_fast_at_that_budget_only(
    prog: Any, flavour: str, kind: str, servers: World
) -> None:
    """An endpoint that never answers within the caller's timeout fails fast after failure_threshold timeouts, and only for that budget: a generous timeout is still sent and answered."""
    plain, installed = _both_runs(prog, flavour, kind, servers)
    found = differences(plain.aside, installed.aside)
    fast = [f"/slow with timeout=0.05, try {n}" for n in range(THRESHOLD, 5)]
    assert [label for label, *_ in found] == [*fast, "server a received"]
    for _, was, now in found[:-1]:
        assert (was, now) == (("raised", "ReadTimeout"), ("raised", "AllCandidatesSuspended"))
    _, was_received, now_received = found[-1]
    assert len(was_received) - len(now_received) == len(fast)  # never sent: failed fast
    generous = "/slow with a generous timeout"
    assert dict(plain.aside)[generous] == dict(installed.aside)[generous]
    assert dict(installed.aside)[generous]["status"] == 200


def test_proxy_tunnels_connect(servers: World) -> None:
    """The test proxy tunnels a CONNECT to an origin, carrying bytes both ways until the origin closes."""
    target = servers.a.removeprefix("http://")
    proxy_host, proxy_port = servers.live_proxy.removeprefix("http://").split(":")
    with socket.create_connection((proxy_host, int(proxy_port)), timeout=5) as sock:
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        reader = sock.makefile("rb")
        assert reader.readline().startswith(b"HTTP/1.1 200")
        assert reader.readline() == b"\r\n"
        sock.sendall(b"GET /public HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        answer = reader.read()
        reader.close()
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"public from a")
    assert servers.proxy.seen[-1] == ("CONNECT", target)
