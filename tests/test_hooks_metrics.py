"""Hooks, metrics and charging after the response, on every integration and backend.

* ``on_decision`` / ``on_limited`` get a `LimitEvent` with exact fields
  (key, route pattern, cost, decision, shadow) from the ASGI and WSGI
  middlewares, the FastAPI dependency and ``limit``; async hooks are awaited
  where the integration is async; a hook that raises is logged and the
  request goes on as decided.
* `PrometheusMetrics` and `OpenTelemetryMetrics` against the real libraries:
  exact sample values (``registry.get_sample_value``) and data points
  (``InMemoryMetricReader``), the scrape text, and the breaker state
  flipping when a real redis-server is stopped.
* ``charge=``: the exact tokens owed after responses of each kind (refund,
  debit, debt, clamp, failing charge) on the in-process, shared-memory and
  Redis (sync and asyncio) backends.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest, make_asgi_app
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import PlainTextResponse
from starlette.routing import Mount
from starlette.routing import Route as StarletteRoute

import nanobucket as nb
from nanobucket import asgi, wsgi
from nanobucket import redis as nbr
from nanobucket._core import _bucket_py
from nanobucket.fastapi import RateLimit, RateLimited, rate_limited_handler
from nanobucket.metrics import OpenTelemetryMetrics, PrometheusMetrics

from conftest import ManualClock, shared_c
from http_checks import MakeClient, asgi_client
from redis_server import RedisServer, own_redis_server, redis_session_server, redis_url

__all__ = ("asgi_client", "own_redis_server", "redis_session_server", "redis_url")  # fixtures

S = 1_000_000_000
PEER = "127.0.0.1"  # the address http_checks.Client connects from


# -- apps -------------------------------------------------------------------------------------


async def _ok(request: StarletteRequest) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def _fail(request: StarletteRequest) -> PlainTextResponse:
    return PlainTextResponse("broken", status_code=500)


async def _llm(request: StarletteRequest) -> PlainTextResponse:
    request.scope["llm_tokens"] = int(request.query_params["n"])  # what the call used
    return PlainTextResponse("answer")


async def _crash(request: StarletteRequest) -> PlainTextResponse:
    raise RuntimeError("the handler fails before it answers")


def starlette_app() -> Starlette:
    return Starlette(
        routes=[
            StarletteRoute("/ok", _ok),
            StarletteRoute("/fail", _fail),
            StarletteRoute("/llm", _llm),
            StarletteRoute("/crash", _crash),
            StarletteRoute("/api/{item}", _ok),
        ]
    )


def wsgi_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    path = environ["PATH_INFO"]
    if path == "/crash":
        raise RuntimeError("the handler fails before it answers")
    if path == "/llm":
        environ["llm_tokens"] = int(environ["QUERY_STRING"].removeprefix("n="))
    status = "500 Internal Server Error" if path == "/fail" else "200 OK"
    start_response(status, [("Content-Type", "text/plain")])
    return [b"body"]


class WsgiServer:
    """What a WSGI server does: call, iterate the body, close it (PEP 3333)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.closed = 0

    def get(self, path: str, addr: str = PEER) -> int:
        path, _, query = path.partition("?")
        environ = {
            "REQUEST_METHOD": "GET",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "REMOTE_ADDR": addr,
        }
        status: list[str] = []
        body = self.app(environ, lambda s, h, e=None: status.append(s))
        try:
            b"".join(body)
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
                self.closed += 1
        return int(status[-1][:3])


def fields(e: nb.LimitEvent) -> tuple[Any, ...]:
    return (e.key, e.route, e.cost, e.decision.allowed, e.decision.remaining, e.shadow, e.outcome)


# -- the event --------------------------------------------------------------------------------


def test_event_is_read_only_and_names_its_outcome() -> None:
    b = nb.TokenBucket(rate=1, capacity=1, clock=lambda: 0)
    admitted, refused = b.check(), b.check()
    e = nb.LimitEvent("alice", "/api/*", 1, admitted)
    assert (e.outcome, e.limited, e.plan, e.shadow) == ("admitted", False, None, False)
    with pytest.raises(AttributeError):
        e.route = "/other"  # type: ignore[misc]
    assert nb.LimitEvent("a", "*", 1, refused).outcome == "limited"
    assert nb.LimitEvent("a", "*", 1, refused, shadow=True).outcome == "shadow-limited"
    assert repr(e).startswith("LimitEvent(key='alice', route='/api/*', cost=1, decision=")
    assert nb.LimitEvent("a", "*", 1, PlanDecision(True, "free")).plan == "free"
    assert nb.LimitEvent("a", "*", 1, PlanDecision(True, 3)).plan is None  # not a name


class PlanDecision:
    """A decision from a limiter that names the caller's plan."""

    def __init__(self, allowed: bool, plan: object) -> None:
        self.allowed, self.plan = allowed, plan


def test_bad_hooks_and_charges_fail_at_construction() -> None:
    limiter = nb.KeyedTokenBucket(rate=1, capacity=1)
    app = starlette_app()

    async def later(event: nb.LimitEvent) -> None: ...

    with pytest.raises(TypeError, match="on_decision must be a callable"):
        asgi.RateLimitMiddleware(app, limiter, on_decision="print")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="on_limited is async"):
        wsgi.RateLimitMiddleware(wsgi_app, limiter, on_limited=later)
    with pytest.raises(TypeError, match="charge must be a callable"):
        asgi.RateLimitMiddleware(app, limiter, charge=3)  # type: ignore[arg-type]

    class CheckOnly:  # a limiter that can neither refund nor debit
        keyed = True

        def check(self, key: str, cost: int = 1) -> Any:
            return limiter.check(key, cost)

    with pytest.raises(TypeError, match="cannot"):
        asgi.RateLimitMiddleware(app, CheckOnly(), charge=lambda scope, status: 1)
    with pytest.raises(TypeError, match="cannot"):
        RateLimit(CheckOnly(), charge=lambda request, status: 1)
    with pytest.raises(TypeError, match="need wait=False"):
        nb.limit(nb.TokenBucket(1, 1), wait=True, on_decision=print)
    with pytest.raises(TypeError, match="is not async"):
        nb.limit(nb.TokenBucket(1, 1), on_decision=later)(lambda: None)


# -- hooks on each integration ----------------------------------------------------------------


def test_asgi_hooks_get_exact_events(
    impl: ModuleType, clock: ManualClock, asgi_client: MakeClient
) -> None:
    every: list[nb.LimitEvent] = []
    refused: list[nb.LimitEvent] = []
    limiter = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    mw = asgi.RateLimitMiddleware(
        starlette_app(),
        limiter,
        routes=[asgi.Route("/api/*", cost=2)],
        on_decision=every.append,
        on_limited=refused.append,
    )
    http = asgi_client(mw)
    assert [http.get(p).status_code for p in ("/api/a", "/api/b", "/ok")] == [200, 429, 429]
    assert [fields(e) for e in every] == [
        (PEER, "/api/*", 2, True, 0, False, "admitted"),
        (PEER, "/api/*", 2, False, 0, False, "limited"),
        (PEER, "*", 1, False, 0, False, "limited"),  # a path no Route names: "*"
    ]
    assert refused == every[1:]
    assert every[1].decision.retry_after_ns == 2 * S
    assert mw.counters.snapshot()["limited"] == 2


def test_asgi_async_hooks_are_awaited_and_shadow_is_told_apart(
    impl: ModuleType, clock: ManualClock, asgi_client: MakeClient
) -> None:
    seen: list[tuple[str, str]] = []

    async def on_decision(event: nb.LimitEvent) -> None:
        await asyncio.sleep(0)
        seen.append(("decision", event.outcome))

    class OnLimited:  # an object whose __call__ is async is awaited too
        async def __call__(self, event: nb.LimitEvent) -> None:
            seen.append(("limited", event.outcome))

    limiter = impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock)
    mw = asgi.RateLimitMiddleware(
        starlette_app(), limiter, shadow=True, on_decision=on_decision, on_limited=OnLimited()
    )
    http = asgi_client(mw)
    assert [http.get("/ok").status_code for _ in range(2)] == [200, 200]  # shadow: never 429
    assert seen == [
        ("decision", "admitted"),
        ("decision", "shadow-limited"),
        ("limited", "shadow-limited"),
    ]
    assert mw.counters.snapshot()["shadow_limited"] == 1


def test_a_raising_hook_is_logged_and_the_request_goes_on(
    impl: ModuleType,
    clock: ManualClock,
    asgi_client: MakeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(event: nb.LimitEvent) -> None:
        raise ValueError("the metrics pipeline is down")

    async def broken_async(event: nb.LimitEvent) -> None:
        raise ValueError("so is this one")

    limiter = impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock)
    mw = asgi.RateLimitMiddleware(
        starlette_app(), limiter, on_decision=broken, on_limited=broken_async
    )
    http = asgi_client(mw)
    with caplog.at_level(logging.ERROR, logger="nanobucket"):
        assert [http.get("/ok").status_code for _ in range(2)] == [200, 429]
    assert mw.counters.snapshot()["admitted"] == 1 and mw.counters.limited == 1
    assert [str(r.exc_info[1]) for r in caplog.records if r.exc_info] == [
        "the metrics pipeline is down",
        "the metrics pipeline is down",
        "so is this one",
    ]
    assert "the request goes on" in caplog.records[0].getMessage()

    # WSGI: the same (a raising hook never costs a response, nor its decision)
    wmw = wsgi.RateLimitMiddleware(
        wsgi_app, impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock), on_limited=broken
    )
    server = WsgiServer(wmw)
    assert [server.get("/ok") for _ in range(2)] == [200, 429]
    assert wmw.counters.snapshot()["limited"] == 1


def test_wsgi_hooks_get_exact_events(impl: ModuleType, clock: ManualClock) -> None:
    every: list[nb.LimitEvent] = []
    refused: list[nb.LimitEvent] = []
    limiter = impl.KeyedTokenBucket(rate=1, capacity=3, clock=clock)
    mw = wsgi.RateLimitMiddleware(
        wsgi_app,
        limiter,
        key=wsgi.header("X-API-Key"),
        routes=[wsgi.Route("/llm", cost=3)],
        on_decision=every.append,
        on_limited=refused.append,
    )
    server = WsgiServer(mw)
    assert [server.get(p) for p in ("/ok", "/llm?n=1", "/ok", "/ok", "/ok")] == [
        200,
        429,
        200,
        200,
        429,
    ]
    assert [fields(e) for e in every] == [
        ("addr:" + PEER, "*", 1, True, 2, False, "admitted"),
        ("addr:" + PEER, "/llm", 3, False, 2, False, "limited"),
        ("addr:" + PEER, "*", 1, True, 1, False, "admitted"),
        ("addr:" + PEER, "*", 1, True, 0, False, "admitted"),
        ("addr:" + PEER, "*", 1, False, 0, False, "limited"),
    ]
    assert refused == [every[1], every[4]]

    shadowed: list[nb.LimitEvent] = []
    quiet = wsgi.RateLimitMiddleware(
        wsgi_app, impl.KeyedTokenBucket(1, 1, clock=clock), shadow=True, on_limited=shadowed.append
    )
    assert [WsgiServer(quiet).get("/ok") for _ in range(2)] == [200, 200]
    assert [(e.outcome, e.shadow) for e in shadowed] == [("shadow-limited", True)]


def test_fastapi_hooks_name_the_route_pattern(
    impl: ModuleType, clock: ManualClock, asgi_client: MakeClient
) -> None:
    every: list[nb.LimitEvent] = []
    refused: list[nb.LimitEvent] = []

    async def on_limited(event: nb.LimitEvent) -> None:
        refused.append(event)

    limit = RateLimit(
        impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock),
        key=lambda item_id: f"item:{item_id}",
        cost=2,
        on_decision=every.append,
        on_limited=on_limited,
    )
    app = FastAPI(exception_handlers={RateLimited: rate_limited_handler})

    @app.get("/items/{item_id}", dependencies=[Depends(limit)])
    async def item(item_id: int) -> int:
        return item_id

    http = asgi_client(app)
    assert [http.get(p).status_code for p in ("/items/7", "/items/7", "/items/8")] == [
        200,
        429,
        200,
    ]
    assert [fields(e) for e in every] == [
        ("item:7", "/items/{item_id}", 2, True, 0, False, "admitted"),
        ("item:7", "/items/{item_id}", 2, False, 0, False, "limited"),
        ("item:8", "/items/{item_id}", 2, True, 0, False, "admitted"),
    ]
    assert refused == [every[1]]


def test_decorator_hooks_name_the_function(impl: ModuleType, clock: ManualClock) -> None:
    every: list[nb.LimitEvent] = []

    @nb.limit(
        impl.KeyedTokenBucket(1, 1, clock=clock), key=lambda user: user, on_decision=every.append
    )
    def upload(user: str) -> str:
        return user

    assert upload("alice") == "alice"
    with pytest.raises(nb.RateLimited):
        upload("alice")
    assert [fields(e) for e in every] == [
        ("alice", upload.__qualname__, 1, True, 0, False, "admitted"),
        ("alice", upload.__qualname__, 1, False, 0, False, "limited"),
    ]

    refused: list[nb.LimitEvent] = []

    async def on_limited(event: nb.LimitEvent) -> None:
        refused.append(event)

    @nb.limit(impl.TokenBucket(1, 1, clock=clock), cost=1, on_limited=on_limited)
    async def ping() -> str:
        return "pong"

    sync_seen: list[nb.LimitEvent] = []

    @nb.limit(impl.TokenBucket(1, 1, clock=clock), on_decision=sync_seen.append)
    async def pong() -> str:
        return "ping"

    async def calls() -> list[str]:
        out = [await ping(), await pong()]
        for fn in (ping, pong):
            try:
                await fn()
            except nb.RateLimited:
                out.append("refused")
        return out

    assert asyncio.run(calls()) == ["pong", "ping", "refused", "refused"]
    assert [(e.key, e.route, e.outcome) for e in refused] == [(None, ping.__qualname__, "limited")]
    assert [e.outcome for e in sync_seen] == ["admitted", "limited"]


# -- Prometheus and OpenTelemetry --------------------------------------------------------------


@pytest.fixture
def otel_provider() -> Iterator[tuple[MeterProvider, InMemoryMetricReader]]:
    """A meter provider reading into memory, shut down after the test: one left alive
    re-detects its resource on a thread in every forked child of later tests."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    yield provider, reader
    provider.shutdown()


def _otel_points(reader: InMemoryMetricReader, name: str) -> dict[tuple[Any, ...], Any]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        tuple(sorted((p.attributes or {}).items())): getattr(p, "value", None)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
        for p in m.data.data_points
    }


def test_prometheus_and_otel_count_exactly_by_route_and_outcome(
    impl: ModuleType,
    clock: ManualClock,
    asgi_client: MakeClient,
    otel_provider: tuple[MeterProvider, InMemoryMetricReader],
) -> None:
    registry = CollectorRegistry()
    prom = PrometheusMetrics(registry=registry)
    provider, reader = otel_provider
    otel = OpenTelemetryMetrics(meter_provider=provider)

    def both(event: nb.LimitEvent) -> None:
        prom.hook(event)
        otel.hook(event)

    limiter = impl.KeyedTokenBucket(rate=1, capacity=3, clock=clock)
    mw = asgi.RateLimitMiddleware(
        starlette_app(),
        limiter,
        routes=[asgi.Route("/api/*", impl.KeyedTokenBucket(1, 2, clock=clock))],
        on_decision=both,
    )
    http = asgi_client(mw)
    statuses = [http.get(f"/api/{i}").status_code for i in range(5)]  # 5 raw paths, 1 pattern
    statuses += [http.get("/ok").status_code for _ in range(4)]
    assert statuses == [200, 200, 429, 429, 429, 200, 200, 200, 429]

    def prom_value(route: str, outcome: str) -> float | None:
        labels = {"route": route, "outcome": outcome, "plan": ""}
        return registry.get_sample_value("nanobucket_decisions_total", labels)

    assert prom_value("/api/*", "admitted") == 2.0
    assert prom_value("/api/*", "limited") == 3.0
    assert prom_value("*", "admitted") == 3.0
    assert prom_value("*", "limited") == 1.0
    assert prom_value("/api/0", "admitted") is None  # never a raw path
    assert prom.value("*", "shadow-limited") == 0.0
    assert _otel_points(reader, "nanobucket.decisions") == {
        (("outcome", "admitted"), ("route", "/api/*")): 2,
        (("outcome", "limited"), ("route", "/api/*")): 3,
        (("outcome", "admitted"), ("route", "*")): 3,
        (("outcome", "limited"), ("route", "*")): 1,
    }

    # shadow-limited is its own outcome; a plan, when named, is a label
    shadow = asgi.RateLimitMiddleware(
        starlette_app(), impl.KeyedTokenBucket(1, 1, clock=clock), shadow=True, on_decision=both
    )
    http = asgi_client(shadow)
    assert [http.get("/ok").status_code for _ in range(3)] == [200, 200, 200]
    assert prom.value("*", "shadow-limited") == 2.0
    assert prom.value("*", "admitted") == 4.0
    both(nb.LimitEvent("k", "/login", 1, PlanDecision(True, "pro")))
    assert prom.value("/login", "admitted", plan="pro") == 1.0
    points = _otel_points(reader, "nanobucket.decisions")
    assert points[(("outcome", "shadow-limited"), ("route", "*"))] == 2
    assert points[(("outcome", "admitted"), ("plan", "pro"), ("route", "/login"))] == 1


def test_prometheus_scrape_text_and_asgi_endpoint(
    impl: ModuleType, clock: ManualClock, asgi_client: MakeClient
) -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry=registry)
    limited = asgi.RateLimitMiddleware(
        starlette_app(), impl.KeyedTokenBucket(1, 1, clock=clock), on_decision=metrics.hook
    )
    app = Starlette(routes=[Mount("/metrics", make_asgi_app(registry)), Mount("/", limited)])
    http = asgi_client(app)
    assert [http.get("/ok").status_code for _ in range(3)] == [200, 429, 429]
    scraped = http.get("/metrics/").text
    assert 'nanobucket_decisions_total{outcome="admitted",plan="",route="*"} 1.0' in scraped
    assert 'nanobucket_decisions_total{outcome="limited",plan="",route="*"} 2.0' in scraped
    assert scraped.encode() == generate_latest(registry)  # the same text, either way
    with pytest.raises(ValueError, match="Prometheus name"):
        PrometheusMetrics(registry=registry, namespace="not a name")
    with pytest.raises(TypeError, match="a Redis limiter or a CircuitBreaker"):
        metrics.watch_breaker(object())
    with pytest.raises(TypeError, match="non-empty str"):
        metrics.watch_breaker(nbr.CircuitBreaker(), "")


def test_breaker_state_and_fallbacks_when_redis_stops(
    own_redis_server: RedisServer,
    asgi_client: MakeClient,
    otel_provider: tuple[MeterProvider, InMemoryMetricReader],
) -> None:
    registry = CollectorRegistry()
    prom = PrometheusMetrics(registry=registry)
    provider, reader = otel_provider
    otel = OpenTelemetryMetrics(meter_provider=provider)
    limiter = nbr.AsyncRedisTokenBucket.from_url(  # an ASGI app refuses the blocking one
        own_redis_server.url,
        rate=100,
        capacity=200,
        prefix=f"m-{uuid.uuid4().hex}",
        fallback=nb.KeyedTokenBucket(rate=10, capacity=20),
        breaker=nbr.CircuitBreaker(backoff=60.0, max_backoff=60.0),  # stays open for the test
    )
    prom.watch_breaker(limiter, "sessions")
    otel.watch_breaker(limiter, "sessions")
    otel.watch_breaker(nbr.CircuitBreaker(), "other")  # one gauge, every watched breaker

    def both(event: nb.LimitEvent) -> None:
        prom.hook(event)
        otel.hook(event)

    def states() -> tuple[dict[str, float | None], dict[tuple[Any, ...], Any]]:
        p = {
            s: registry.get_sample_value(
                "nanobucket_breaker_state", {"breaker": "sessions", "state": s}
            )
            for s in ("closed", "open", "half-open")
        }
        return p, _otel_points(reader, "nanobucket.breaker.state")

    http = asgi_client(asgi.RateLimitMiddleware(starlette_app(), limiter, on_decision=both))
    try:
        assert http.get("/ok").status_code == 200
        p, o = states()
        assert p == {"closed": 1.0, "open": 0.0, "half-open": 0.0}
        assert o[(("breaker", "sessions"), ("state", "closed"))] == 1
        own_redis_server.stop()
        assert [http.get("/ok").status_code for _ in range(3)] == [200, 200, 200]  # the fallback
        p, o = states()
        assert p == {"closed": 0.0, "open": 1.0, "half-open": 0.0}
        assert o[(("breaker", "sessions"), ("state", "open"))] == 1
        assert o[(("breaker", "sessions"), ("state", "closed"))] == 0
        assert o[(("breaker", "other"), ("state", "closed"))] == 1
        # the first call failed on the connection, the next two found the breaker open
        fb = {"route": "*", "source": "fallback"}
        value = registry.get_sample_value
        assert value("nanobucket_redis_fallback_total", {**fb, "reason": "connection"}) == 1.0
        assert value("nanobucket_redis_fallback_total", {**fb, "reason": "breaker-open"}) == 2.0
        assert prom.value("*", "admitted") == 4.0
        assert _otel_points(reader, "nanobucket.redis.fallback") == {
            (("reason", "connection"), ("route", "*"), ("source", "fallback")): 1,
            (("reason", "breaker-open"), ("route", "*"), ("source", "fallback")): 2,
        }
    finally:
        http.loop.run_until_complete(limiter.aclose())


# -- charging after the response ----------------------------------------------------------------

RATE = 0.001  # one token per 1000 s: refill is nothing over a test, on any clock
INTERVAL = 1000 * S
CAPACITY = 5


def failures_only(request: Any, status: int) -> int:
    """Count only the requests the handler failed."""
    return 1 if status >= 500 else 0


def llm_tokens(request: Any, status: int) -> int:
    """What the handler says the call used (in the scope, the environ, or request.state)."""
    mapping = request.scope if hasattr(request, "scope") else request
    return int(mapping.get("llm_tokens", 1))


class Backend:
    """A keyed limiter and how many tokens a key owes (``capacity - tokens``, debt included)."""

    def __init__(self, limiter: Any, run: Callable[[Any], Any] | None = None) -> None:
        self.limiter = limiter
        self._run = run

    def owed(self, key: str) -> int:
        d = self.limiter.peek(key, 0)
        if self._run is not None:
            d = self._run(d)
        return int(-(-d.reset_after_ns // INTERVAL))  # whole tokens: the refill is < 1 token


@pytest.fixture(
    params=[
        pytest.param("c", marks=pytest.mark.c_extension),
        "py",
        pytest.param("shared", marks=pytest.mark.c_extension),
        "redis",
    ]
)
def sync_backend(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> Iterator[Backend]:
    if request.param in ("c", "py"):
        impl = (
            _bucket_py
            if request.param == "py"
            else pytest.importorskip("nanobucket._core._bucket_c")
        )
        yield Backend(impl.KeyedTokenBucket(RATE, CAPACITY, clock=clock))
    elif request.param == "shared":
        if shared_c is None:
            pytest.skip("the shared table needs the Cython extension")
        table = nb.SharedKeyedTokenBucket.create(
            path=tmp_path / f"t-{uuid.uuid4().hex}", rate=RATE, capacity=CAPACITY
        )
        yield Backend(table)
        table.unlink()
    else:
        url = request.getfixturevalue("redis_url")
        limiter = nbr.RedisTokenBucket.from_url(
            url, RATE, CAPACITY, prefix=f"c-{uuid.uuid4().hex}", socket_timeout=2.0
        )
        yield Backend(limiter)
        limiter.close()


def _charge_script(get: Callable[[str], int], owed: Callable[[], int]) -> list[tuple[int, int]]:
    """Responses of each kind, with the tokens owed after each: (status, owed)."""
    out = []
    for path in ("/ok", "/fail", "/fail", "/crash", "/ok"):
        out.append((get(path), owed()))
    return out


# Under failures_only with cost=1 up front: /ok refunds the 1, a failure keeps it;
# an app that crashes before answering is a 500 (and a failure).
FAILURES_ONLY = [(200, 0), (500, 1), (500, 2), (500, 3), (200, 3)]


def _llm_script(get: Callable[[str], int], owed: Callable[[], int]) -> list[tuple[int, int]]:
    out = []
    for path in ("/llm?n=4", "/llm?n=0", "/llm?n=3", "/llm?n=4", "/llm?n=1", "/llm?n=99"):
        out.append((get(path), owed()))
    return out


# cost=1 up front, then the tokens used: 4 (owes 4), 0 (refund: 4), 3 (owes 7, past empty:
# 2 in debt), then refused while in debt (a 429 is never charged after).
LLM = [(200, 4), (200, 4), (200, 7), (429, 7), (429, 7), (429, 7)]


def test_asgi_charge_after_the_response(sync_backend: Backend, asgi_client: MakeClient) -> None:
    limiter = sync_backend.limiter
    if isinstance(limiter, nbr.RedisTokenBucket):
        # Refused: it would block the event loop (test_async_redis_charge_on_asgi_and_fastapi
        # charges through its asyncio twin).
        with pytest.raises(TypeError, match=r"use nanobucket\.redis\.AsyncRedisTokenBucket"):
            asgi.RateLimitMiddleware(starlette_app(), limiter, charge=failures_only)
        return
    crash_safe = asgi_client(
        asgi.RateLimitMiddleware(starlette_app(), limiter, key=lambda s: "f", charge=failures_only)
    )

    def get(path: str) -> int:
        try:
            return crash_safe.get(path).status_code
        except RuntimeError:  # the app's own exception, re-raised past the middleware
            return 500

    assert _charge_script(get, lambda: sync_backend.owed("f")) == FAILURES_ONLY

    llm = asgi_client(
        asgi.RateLimitMiddleware(starlette_app(), limiter, key=lambda s: "l", charge=llm_tokens)
    )
    assert _llm_script(lambda p: llm.get(p).status_code, lambda: sync_backend.owed("l")) == LLM
    r = llm.get("/ok")
    assert (r.status_code, r.headers["retry-after"]) == (429, str(3 * 1000))  # 2 owed + 1


def test_wsgi_charge_after_the_response(sync_backend: Backend) -> None:
    limiter = sync_backend.limiter
    server = WsgiServer(
        wsgi.RateLimitMiddleware(wsgi_app, limiter, key=lambda e: "f", charge=failures_only)
    )

    def get(path: str) -> int:
        try:
            return server.get(path)
        except RuntimeError:
            return 500

    assert _charge_script(get, lambda: sync_backend.owed("f")) == FAILURES_ONLY
    llm = WsgiServer(
        wsgi.RateLimitMiddleware(wsgi_app, limiter, key=lambda e: "l", charge=llm_tokens)
    )
    assert _llm_script(llm.get, lambda: sync_backend.owed("l")) == LLM
    assert llm.closed == 3  # the server closed every charged body (a 429's is a plain list)


def test_charge_in_quiet_modes_and_clamped(clock: ManualClock, asgi_client: MakeClient) -> None:
    limiter = nb.KeyedTokenBucket(RATE, CAPACITY, clock=clock)
    owed = Backend(limiter).owed
    off = asgi.RateLimitMiddleware(
        starlette_app(), limiter, key=lambda s: "a", headers="off", charge=llm_tokens
    )
    r = asgi_client(off).get("/llm?n=99")  # more than one request can cost: capacity
    assert (r.status_code, "ratelimit" in r.headers, owed("a")) == (200, False, CAPACITY)
    shadow = asgi.RateLimitMiddleware(
        starlette_app(), limiter, key=lambda s: "a", shadow=True, charge=llm_tokens
    )
    http = asgi_client(shadow)
    assert http.get("/llm?n=3").status_code == 200  # shadow-limited: served, never charged
    assert owed("a") == CAPACITY
    wsgi_off = WsgiServer(
        wsgi.RateLimitMiddleware(
            wsgi_app, limiter, key=lambda e: "w", shadow=True, charge=failures_only
        )
    )
    assert (wsgi_off.get("/fail"), owed("w")) == (500, 1)


def test_a_failing_charge_keeps_the_up_front_cost(
    clock: ManualClock, asgi_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = nb.KeyedTokenBucket(RATE, CAPACITY, clock=clock)
    owed = Backend(limiter).owed

    def raises(request: Any, status: int) -> int:
        raise KeyError("usage")

    bad: list[Any] = [raises, lambda r, s: "3", lambda r, s: -1, lambda r, s: True]
    for i, charge in enumerate(bad):
        mw = asgi.RateLimitMiddleware(
            starlette_app(), limiter, key=lambda s, i=i: f"k{i}", cost=2, charge=charge
        )
        with caplog.at_level(logging.ERROR, logger="nanobucket"):
            assert asgi_client(mw).get("/ok").status_code == 200
        assert owed(f"k{i}") == 2
    assert len(caplog.records) == 4
    assert "charge= raised" in caplog.records[0].getMessage()
    assert "not an int >= 0" in caplog.records[1].getMessage()

    class BrokenRefund:  # a backend failing while settling
        keyed, capacity = True, 2

        def check(self, key: Any, cost: int = 1) -> Any:
            return limiter.check(key, cost)

        def refund(self, key: Any, cost: int = 1) -> None:
            raise ConnectionError("gone")

        def refund_at(self, key: Any, now: int, cost: int = 1) -> None:  # pragma: no cover
            raise ConnectionError("gone")

        def reserve(self, *key: Any, **options: Any) -> int:  # pragma: no cover - not reached
            return 0

    mw = asgi.RateLimitMiddleware(
        starlette_app(), BrokenRefund(), key=lambda s: "x", charge=lambda r, s: 0
    )
    with caplog.at_level(logging.ERROR, logger="nanobucket"):
        assert asgi_client(mw).get("/ok").status_code == 200
    assert "settling a charge of -1" in caplog.records[-1].getMessage()


def test_unkeyed_limiters_and_all_of_are_charged(
    clock: ManualClock, asgi_client: MakeClient
) -> None:
    one = nb.TokenBucket(RATE, CAPACITY, clock=clock)
    per_key = nb.KeyedTokenBucket(RATE, CAPACITY, clock=clock)
    for limiter in (one, nb.all_of(per_key, one)):
        mw = asgi.RateLimitMiddleware(starlette_app(), limiter, charge=llm_tokens)
        assert asgi_client(mw).get("/llm?n=3").status_code == 200
    # 3 each time on the one bucket; 3 on the per-key layer of the all_of
    assert (one.peek(0).reset_after_ns // INTERVAL, per_key.tokens(PEER)) == (6, 2.0)


def _fastapi_app(limit: RateLimit) -> FastAPI:
    app = FastAPI(exception_handlers={RateLimited: rate_limited_handler})

    @app.get("/ok", dependencies=[Depends(limit)])
    async def ok() -> str:
        return "ok"

    @app.get("/fail", dependencies=[Depends(limit)])
    async def fail() -> str:
        raise HTTPException(503, "the model is overloaded")

    @app.get("/crash", dependencies=[Depends(limit)])
    async def crash() -> str:
        raise RuntimeError("the handler fails")

    @app.post("/made", status_code=201, dependencies=[Depends(limit)])
    async def made() -> str:
        return "made"

    @app.get("/set", dependencies=[Depends(limit)])
    async def set_status(response: Response) -> str:
        response.status_code = 502
        return "upstream failed"

    @app.get("/llm", dependencies=[Depends(limit)])
    async def llm(request: Request, n: int) -> str:
        request.state.llm_tokens = n
        return "answer"

    return app


def _state_tokens(request: Request, status: int) -> int:
    return int(getattr(request.state, "llm_tokens", 1))


def test_fastapi_charge_after_the_route(sync_backend: Backend, asgi_client: MakeClient) -> None:
    limiter = sync_backend.limiter
    if isinstance(limiter, nbr.RedisTokenBucket):
        # Refused, as by the ASGI middleware (its asyncio twin: the test below).
        with pytest.raises(TypeError, match="a FastAPI dependency"):
            RateLimit(limiter, charge=failures_only)
        return
    statuses: list[int] = []

    def failures(request: Request, status: int) -> int:
        statuses.append(status)
        return failures_only(request, status)

    limit = RateLimit(limiter, key=lambda: "f", charge=failures)
    assert type(limit) is RateLimit  # one class, with charge= or without
    http = asgi_client(_fastapi_app(limit))
    owed = []
    for method, path in (("GET", "/ok"), ("GET", "/fail"), ("GET", "/crash"), ("POST", "/made")):
        with contextlib.suppress(RuntimeError):  # /crash: the app's own error, re-raised
            http.loop.run_until_complete(http.http.request(method, path))
        owed.append(sync_backend.owed("f"))
    http.get("/set")
    owed.append(sync_backend.owed("f"))
    assert statuses == [200, 503, 500, 201, 502]
    assert owed == [0, 1, 2, 2, 3]

    llm = asgi_client(_fastapi_app(RateLimit(limiter, key=lambda: "l", charge=_state_tokens)))
    got = [(llm.get(f"/llm?n={n}").status_code, sync_backend.owed("l")) for n in (4, 0, 3, 4)]
    assert got == [(200, 4), (200, 4), (200, 7), (429, 7)]


def test_fastapi_charge_shadow_is_never_charged(
    clock: ManualClock, asgi_client: MakeClient
) -> None:
    limiter = nb.KeyedTokenBucket(RATE, 1, clock=clock)
    limit = RateLimit(limiter, key=lambda: "s", shadow=True, charge=_state_tokens)
    http = asgi_client(_fastapi_app(limit))
    assert [http.get("/llm?n=1").status_code for _ in range(3)] == [200, 200, 200]
    assert Backend(limiter).owed("s") == 1  # the first only; the others were shadow-limited
    assert limit.counters.snapshot()["shadow_limited"] == 2


def test_async_redis_charge_on_asgi_and_fastapi(redis_url: str, asgi_client: MakeClient) -> None:
    def limiter() -> nbr.AsyncRedisTokenBucket:  # one per event loop (its connections are)
        return nbr.AsyncRedisTokenBucket.from_url(
            redis_url, RATE, CAPACITY, prefix=f"a-{uuid.uuid4().hex}", socket_timeout=2.0
        )

    first = limiter()
    mw = asgi.RateLimitMiddleware(starlette_app(), first, key=lambda s: "l", charge=llm_tokens)
    http = asgi_client(mw)
    backend = Backend(first, http.loop.run_until_complete)
    assert _llm_script(lambda p: http.get(p).status_code, lambda: backend.owed("l")) == LLM
    http.loop.run_until_complete(first.aclose())
    second = limiter()
    fast = asgi_client(_fastapi_app(RateLimit(second, key=lambda: "f", charge=_state_tokens)))
    backend = Backend(second, fast.loop.run_until_complete)
    got = [(fast.get(f"/llm?n={n}").status_code, backend.owed("f")) for n in (4, 0, 3, 4)]
    assert got == [(200, 4), (200, 4), (200, 7), (429, 7)]
    fast.loop.run_until_complete(second.aclose())


def test_shared_table_refund_and_reserve_exactly(tmp_path: Path) -> None:
    if shared_c is None:
        pytest.skip("the shared table needs the Cython extension")
    t = nb.SharedKeyedTokenBucket.create(path=tmp_path / "t", rate=1, capacity=4, max_keys=16)
    try:
        t.refund_at("new", 0)  # a missing key is full: nothing to give back, nothing stored
        assert (len(t), t.tokens_at("new", 0)) == (0, 4.0)
        assert t.allow_at("a", 0, cost=4)
        t.refund_at("a", 0, cost=3)
        assert t.tokens_at("a", 0) == 3.0
        t.refund_at("a", 0, cost=4)  # never above capacity
        assert t.tokens_at("a", 0) == 4.0
        assert t.reserve("a", cost=4, now=0) == 0
        assert (
            t.reserve("a", cost=2, max_wait_ns=2 * S - 1, now=0) == -1
        )  # a wait of 2 s: past the bound
        assert (
            t.reserve("a", cost=2, max_wait_ns=2 * S, now=0) == 2 * S
        )  # into debt: 2 tokens owed past 0
        assert t.check_at("a", 0, cost=0).retry_after_ns == 2 * S
        assert t.peek_at("a", 0).reset_after_ns == 6 * S
        assert t.reserve("a", cost=0, now=0) == -1  # a probe is refused while in debt
        assert t.reserve("b", cost=0, now=0) == 0  # a missing key admits a probe
        assert t.reserve("b", cost=1, shape=True, now=0) == 0  # shaped: the first slot is now
        assert (
            t.reserve("b", cost=1, max_wait_ns=S, shape=True, now=0) == S
        )  # the next starts one interval later
        assert (
            t.reserve("b", cost=1, max_wait_ns=10**30, now=0) == 0
        )  # any bound beyond int64 is clamped
        t.refund("a", cost=4)  # the monotonic clock is far past 0: a full bucket
        assert t.tokens("a") == 4.0
    finally:
        t.unlink()


def test_small_parts(
    clock: ManualClock,
    asgi_client: MakeClient,
    otel_provider: tuple[MeterProvider, InMemoryMetricReader],
) -> None:
    assert (wsgi._status_code("404 Not Found"), wsgi._status_code("nonsense")) == (404, 500)
    provider, reader = otel_provider
    otel = OpenTelemetryMetrics(meter=provider.get_meter("mine"))
    with pytest.raises(TypeError, match="not both"):
        OpenTelemetryMetrics(meter_provider=provider, meter=otel.meter)

    # a sync hook on the FastAPI dependency; a WSGI body with close() of its own
    seen: list[nb.LimitEvent] = []
    limit = RateLimit(
        nb.KeyedTokenBucket(1, 1, clock=clock), key=lambda: "k", on_decision=seen.append
    )
    app = FastAPI()

    @app.get("/", dependencies=[Depends(limit)])
    async def root() -> str:
        return "ok"

    assert asgi_client(app).get("/").status_code == 200
    assert [(e.route, e.outcome) for e in seen] == [("/", "admitted")]
    otel.hook(seen[0])
    assert _otel_points(reader, "nanobucket.decisions") == {
        (("outcome", "admitted"), ("route", "/")): 1
    }

    closed: list[str] = []

    def streaming(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
        start_response("500 Internal Server Error", [])
        try:
            yield b"partial"
        finally:
            closed.append("app")

    limiter = nb.KeyedTokenBucket(RATE, CAPACITY, clock=clock)
    server = WsgiServer(
        wsgi.RateLimitMiddleware(streaming, limiter, key=lambda e: "s", charge=failures_only)
    )
    assert (server.get("/"), closed, Backend(limiter).owed("s")) == (500, ["app"], 1)


def test_no_meter_provider_outlives_its_test() -> None:
    # A live MeterProvider re-detects its resource on a thread in every forked child
    # (OpenTelemetry's at-fork hook), and under coverage's line tracing such a thread
    # crashed the child of a later test. Its atexit shutdown keeps one alive for good:
    # the tests and doctests before this one (test_doctests) shut theirs down.
    gc.collect()
    # type(), not isinstance(): that reads __class__, which wakes lazy proxies (Django's).
    assert [o for o in gc.get_objects() if issubclass(type(o), MeterProvider)] == []
