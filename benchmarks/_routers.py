"""The contenders of the spread benchmark, each built as its users build it, behind one call.

Every contender answers ``await router.call(session)`` with the name of the
deployment that served the request (its ``system_fingerprint``), or raises
what its caller would see. sidestep and the even split sit under the real
``openai`` SDK (``AsyncOpenAI`` over an httpx2 client, ``max_retries=0`` so
that what the routing layer lets through reaches the caller as it is);
LiteLLM's Router runs in process with its own defaults (two retries, a
deployment cooled down after failures), since retrying on another
deployment is how it fails over.

- **even split**: the p99 yardstick; each request goes to the member with
  the fewest requests in flight from this client (ties in turn).
- **sidestep, ranked**: today's route, the recommended LLM settings
  (``avoid_rate_limits``, ``retry_ambiguous``).
- **sidestep pools**: the same route with ``balance`` (and ``weight``,
  ``affinity``) as the pools feature defines them; a build whose
  configuration refuses those keys is reported, not run.
- **LiteLLM**: ``Router(model_list=..., routing_strategy=...)``,
  ``await router.acompletion(...)``; each deployment has its own key.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import sidestep

MODEL = "bench"
SESSION_HEADER = "x-session-id"
TIMEOUT = 30.0  # per request: every load loop stays bounded
# Breaker windows scaled down with the runs (the defaults are 30 s): a member lost
# and back is tried again within the affinity scenario.
BREAKER = {"failure_threshold": 3, "cooldown": 0.5, "max_cooldown": 2.0}
LITELLM_STRATEGIES = (
    "simple-shuffle",
    "least-busy",
    "latency-based-routing",
    "usage-based-routing-v2",
)
POOL_BALANCES = ("weighted", "least_in_flight", "latency")


@dataclass(slots=True)
class Router:
    """One contender, ready: `call(session)` serves one request and names the member."""

    name: str
    call: Callable[[str | None], Awaitable[str]]
    close: Callable[[], Awaitable[None]]
    noisy: bool = False  # warns as it runs (LiteLLM): run it with warnings ignored


def caller_status(exc: BaseException) -> int | None:
    """The HTTP status an exception that reached the caller carries (429: rate limited)."""
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def messages(session: str | None) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": f"Hello from {session or 'nobody'}."},
    ]


# -- sidestep ------------------------------------------------------------------------------


def _targets(urls: Mapping[str, str], weights: Mapping[str, float] | None) -> list[dict[str, Any]]:
    targets = []
    for name, url in urls.items():
        target: dict[str, Any] = {
            "name": name,
            "url": url,
            "headers": {"authorization": f"Bearer key-{name}"},
        }
        if weights and name in weights:
            target["weight"] = weights[name]
        targets.append(target)
    return targets


def ranked_config(urls: Mapping[str, str]) -> dict[str, Any]:
    """Today's route over `urls`, in their order, with the SDK page's recommended settings."""
    route = {
        "name": "chat",
        "avoid_rate_limits": True,
        "failover": {"retry_ambiguous": True},
        "targets": _targets(urls, None),
    }
    return {"breaker": BREAKER, "routes": [route]}


def pool_config(
    urls: Mapping[str, str],
    balance: str,
    *,
    weights: Mapping[str, float] | None = None,
    affinity: bool = False,
) -> dict[str, Any]:
    """A route whose targets form one pool (no tiers), as the pools feature spells it.

    The ranked route's settings but `avoid_rate_limits`: a pool steers by the
    rate-limit headers itself, and that setting would hold a key back until
    its full reset.
    """
    config = ranked_config(urls)
    route = config["routes"][0]
    del route["avoid_rate_limits"]
    route["balance"] = balance
    route["targets"] = _targets(urls, weights)
    if affinity:
        route["affinity"] = {"header": SESSION_HEADER}
    return config


def refused(config: Mapping[str, Any]) -> str | None:
    """Why this build's `sidestep.Config` refuses `config`, or None when it takes it."""
    try:
        sidestep.Config.model_validate(config)
    except ValueError as exc:  # ConfigError and pydantic's ValidationError alike
        errors = exc.errors() if hasattr(exc, "errors") else []
        reasons = {f"{e['loc'][-1]}: {e['msg']}" for e in errors if e.get("loc")}
        return ", ".join(sorted(reasons)) or str(exc).splitlines()[0][:120]
    return None


def sidestep_router(name: str, urls: Mapping[str, str], config: Mapping[str, Any]) -> Router:
    """The openai SDK with sidestep under its own httpx2 client, its base URL the first target's."""
    import openai

    http_client = sidestep.wrap(openai.DefaultAsyncHttpx2Client(), dict(config))
    return _openai_router(name, next(iter(urls.values())), http_client)


def _openai_router(name: str, base_url: str, http_client: Any) -> Router:
    import openai

    client = openai.AsyncOpenAI(
        base_url=base_url,
        api_key="sk-caller",
        http_client=http_client,
        max_retries=0,
        timeout=TIMEOUT,
    )

    async def call(session: str | None) -> str:
        headers = {SESSION_HEADER: session} if session else None
        answer = await client.chat.completions.create(
            model=MODEL, messages=messages(session), extra_headers=headers
        )
        return answer.system_fingerprint or "?"

    return Router(name, call, client.close)


# -- the even split ------------------------------------------------------------------------


def even_router(urls: Mapping[str, str]) -> Router:
    """The openai SDK over a transport that sends each request to the least busy member."""
    import httpx2
    import openai

    class LeastInFlight(httpx2.AsyncBaseTransport):
        """Each request to the member with the fewest in flight (ties: the next in turn)."""

        def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
            self._inner = inner
            self._members = [httpx2.URL(url) for url in urls.values()]
            self._inflight = [0] * len(self._members)
            self._turn = 0

        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            count = len(self._members)
            self._turn = (self._turn + 1) % count
            order = [(self._turn + i) % count for i in range(count)]
            pick = min(order, key=self._inflight.__getitem__)
            member = self._members[pick]
            request.url = request.url.copy_with(host=member.host, port=member.port)
            request.headers["host"] = member.netloc.decode()
            self._inflight[pick] += 1
            try:
                response = await self._inner.handle_async_request(request)
                await response.aread()  # in flight until the whole answer is in
            finally:
                self._inflight[pick] -= 1
            return response

        async def aclose(self) -> None:
            await self._inner.aclose()

    inner = httpx2.AsyncHTTPTransport(limits=httpx2.Limits(max_connections=1000))
    http_client = openai.DefaultAsyncHttpx2Client(transport=LeastInFlight(inner))
    return _openai_router("even split (least in flight)", next(iter(urls.values())), http_client)


# -- LiteLLM -------------------------------------------------------------------------------


def litellm_module() -> Any | None:
    """LiteLLM, or None when it is not installed.

    Imported offline: it reads its model price map and tokenizers from the
    package instead of fetching them, so the run stays on loopback.
    """
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import litellm
    except ImportError:
        return None
    litellm.suppress_debug_info = True
    litellm.telemetry = False
    return litellm


def litellm_router(
    strategy: str,
    urls: Mapping[str, str],
    *,
    weights: Mapping[str, float] | None = None,
    rpm: int | None = None,
) -> Router:
    """LiteLLM's Router over `urls` with `strategy`; `rpm`: each deployment's known limit."""
    litellm = litellm_module()
    assert litellm is not None, "built only when LiteLLM is installed"
    deployments = []
    for name, url in urls.items():
        params: dict[str, Any] = {
            "model": f"openai/{MODEL}",
            "api_base": url,
            "api_key": f"key-{name}",
        }
        if rpm is not None:
            params["rpm"] = rpm
        if weights and name in weights:
            params["weight"] = weights[name]
        deployments.append(
            {"model_name": MODEL, "litellm_params": params, "model_info": {"id": name}}
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        router = litellm.Router(model_list=deployments, routing_strategy=strategy, timeout=TIMEOUT)

    async def call(session: str | None) -> str:
        answer = await router.acompletion(model=MODEL, messages=messages(session))
        return answer.system_fingerprint or "?"

    async def close() -> None:
        return None  # the Router has nothing to close; its clients go with the process

    return Router(f"LiteLLM {strategy}", call, close, noisy=True)
