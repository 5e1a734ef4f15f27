"""The ASGI middleware through httpx's ASGI transport, under an injected clock.

Every test runs on both implementations (``impl``); the numbers are exact:
a limiter of rate 1/s and capacity 2 admits two requests at t=0, and the
third must wait exactly 1 s.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route as StarletteRoute

import nanobucket as nb
from nanobucket import redis as nbr
from nanobucket._http import (
    Counters,
    Policy,
    Route,
    client_address,
    header,
    keyed_of,
    retry_after_seconds,
    route,
)
from nanobucket.asgi import RateLimitMiddleware
from nanobucket.wsgi import RateLimitMiddleware as WsgiMiddleware

from http_checks import PROBLEM_429_1S, AsyncRecorder, MakeClient, asgi_client, counts

__all__ = ("asgi_client",)  # a fixture, used by name

S = 1_000_000_000


async def _hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello", headers={"x-app": "1"})


async def _remaining(request: Request) -> JSONResponse:
    decision = request.scope.get("nanobucket.decision")
    return JSONResponse({"remaining": None if decision is None else decision.remaining})


def starlette_app() -> Starlette:
    return Starlette(
        routes=[
            StarletteRoute("/", _hello),
            StarletteRoute("/healthz", _hello),
            StarletteRoute("/search", _hello, methods=["GET", "POST"]),
            StarletteRoute("/api/{rest:path}", _hello),
            StarletteRoute("/remaining", _remaining),
        ]
    )


KeyedApp = Callable[..., RateLimitMiddleware]  # the `keyed_app` fixture: (capacity, **options)


@pytest.fixture
def keyed_app(impl: ModuleType, clock: Any) -> KeyedApp:
    """Makes the Starlette app behind a per-client bucket of 1 token/s and *capacity*."""

    def make(capacity: int, **options: Any) -> RateLimitMiddleware:
        limiter = impl.KeyedTokenBucket(rate=1, capacity=capacity, clock=clock)
        return RateLimitMiddleware(starlette_app(), limiter, **options)

    return make


def test_admitted_then_429_with_exact_headers(
    keyed_app: KeyedApp, clock: Any, asgi_client: MakeClient
) -> None:
    app = keyed_app(2)
    c = asgi_client(app)

    r = c.get("/")
    assert r.status_code == 200 and r.text == "hello"
    assert r.headers["x-app"] == "1"  # the app's own headers survive
    assert r.headers["ratelimit-policy"] == '"default";q=2;w=2'
    assert r.headers["ratelimit"] == '"default";r=1;t=1'
    assert "retry-after" not in r.headers

    r = c.get("/")
    assert r.status_code == 200
    assert r.headers["ratelimit"] == '"default";r=0;t=2'

    r = c.get("/")
    assert r.status_code == 429
    assert r.headers["retry-after"] == "1"
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["ratelimit-policy"] == '"default";q=2;w=2'
    assert r.headers["ratelimit"] == '"default";r=0;t=2'
    assert r.json() == PROBLEM_429_1S
    assert int(r.headers["content-length"]) == len(r.content)

    clock.advance(S - 1)  # 1 ns short of the next token: still limited, never "0"
    r = c.get("/")
    assert (r.status_code, r.headers["retry-after"]) == (429, "1")
    assert r.headers["ratelimit"] == '"default";r=0;t=2'  # 1 s + 1 ns to full, rounded up

    clock.advance(1)
    r = c.get("/")
    assert r.status_code == 200
    assert r.headers["ratelimit"] == '"default";r=0;t=2'
    assert app.counters.snapshot() == counts(admitted=3, limited=2, shadow_limited=0, exempt=0)


def test_retry_after_rounds_up_whole_seconds(
    impl: ModuleType, clock: Any, asgi_client: MakeClient
) -> None:
    # 1 token per 4 s: after the one token is spent, the wait is 4 s, then 2.5 s -> "3".
    limiter = impl.KeyedTokenBucket(rate=0.25, capacity=1, clock=clock)
    c = asgi_client(RateLimitMiddleware(starlette_app(), limiter))
    assert c.get("/").status_code == 200
    assert c.get("/").headers["retry-after"] == "4"
    clock.advance(S * 3 // 2)
    r = c.get("/")
    assert (r.status_code, r.headers["retry-after"], r.json()["retry_after"]) == (429, "3", 3)
    assert r.headers["ratelimit-policy"] == '"default";q=1;w=4'


@pytest.mark.parametrize(
    ("rate", "capacity", "policy"),
    [(100, 200, "q=200;w=2"), (100, 100, "q=100;w=1"), (100, 1, "q=100;w=1"), (3, 10, "q=12;w=4")],
)
def test_policy_quota_and_window(impl: ModuleType, rate: int, capacity: int, policy: str) -> None:
    # w: seconds an empty bucket takes to fill (>= 1); q: what the rate admits in w.
    p = Policy(impl.KeyedTokenBucket(rate=rate, capacity=capacity), "default", None)
    assert p.policy_header == (b"ratelimit-policy", f'"default";{policy}'.encode())


def test_retry_after_never_zero() -> None:
    assert [retry_after_seconds(ns) for ns in (0, 1, S - 1, S, S + 1)] == [1, 1, 1, 1, 2]


def test_legacy_and_off_headers(keyed_app: KeyedApp, asgi_client: MakeClient) -> None:
    c = asgi_client(keyed_app(2, headers="legacy"))
    r = c.get("/")
    assert (r.headers["x-ratelimit-limit"], r.headers["x-ratelimit-remaining"]) == ("2", "1")
    assert r.headers["x-ratelimit-reset"] == "1"
    assert "ratelimit" not in r.headers
    c.get("/")
    r = c.get("/")
    assert r.status_code == 429
    assert (r.headers["x-ratelimit-remaining"], r.headers["retry-after"]) == ("0", "1")

    c = asgi_client(keyed_app(1, headers="off"))
    r = c.get("/")
    assert r.status_code == 200
    assert not [h for h in r.headers if "ratelimit" in h]
    r = c.get("/")
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert not [h for h in r.headers if "ratelimit" in h]


def test_unkeyed_bucket_is_one_limit_for_everyone(
    impl: ModuleType, clock: Any, asgi_client: MakeClient
) -> None:
    app = RateLimitMiddleware(starlette_app(), impl.TokenBucket(rate=1, capacity=2, clock=clock))
    a = asgi_client(app, "10.0.0.1")
    b = asgi_client(app, "10.0.0.2")
    assert [a.get("/").status_code, b.get("/").status_code, b.get("/").status_code] == [
        200,
        200,
        429,
    ]


def test_clients_have_their_own_buckets(keyed_app: KeyedApp, asgi_client: MakeClient) -> None:
    app = keyed_app(1)
    a = asgi_client(app, "10.0.0.1")
    b = asgi_client(app, "10.0.0.2")
    assert [a.get("/").status_code, a.get("/").status_code] == [200, 429]
    assert [b.get("/").status_code, b.get("/").status_code] == [200, 429]


def test_spoofed_forwarded_for_does_not_change_the_key(
    keyed_app: KeyedApp, asgi_client: MakeClient
) -> None:
    c = asgi_client(keyed_app(2), "203.0.113.9")
    codes = [
        c.get("/", headers={"X-Forwarded-For": f"198.51.100.{i}"}).status_code for i in range(5)
    ]
    assert codes == [200, 200, 429, 429, 429]


def test_trusted_proxy_forwarded_for(impl: ModuleType, clock: Any, asgi_client: MakeClient) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock)
    key = client_address(trusted_proxies=["10.0.0.0/8"])
    app = RateLimitMiddleware(starlette_app(), limiter, key=key)
    proxy = asgi_client(app, "10.1.2.3")
    # Behind the trusted proxy, each real client has its own bucket...
    assert proxy.get("/", headers={"X-Forwarded-For": "198.51.100.1"}).status_code == 200
    assert proxy.get("/", headers={"X-Forwarded-For": "198.51.100.2"}).status_code == 200
    assert proxy.get("/", headers={"X-Forwarded-For": "198.51.100.1"}).status_code == 429
    # ...and what a client writes left of the proxy's entry is never read.
    forged = {"X-Forwarded-For": "192.0.2.77, 198.51.100.1"}
    assert proxy.get("/", headers=forged).status_code == 429
    # A client that is not a trusted proxy cannot use the header at all.
    direct = asgi_client(app, "203.0.113.9")
    assert direct.get("/", headers={"X-Forwarded-For": "192.0.2.1"}).status_code == 200
    assert direct.get("/", headers={"X-Forwarded-For": "192.0.2.2"}).status_code == 429
    assert limiter.tokens_at("192.0.2.1", clock.now) == 1.0  # never charged


@pytest.mark.parametrize(
    ("peer", "xff", "key"),
    [
        ("10.0.0.1", None, "10.0.0.1"),
        ("10.0.0.1", "1.2.3.4", "1.2.3.4"),
        ("10.0.0.1", "1.2.3.4, 10.0.0.5", "1.2.3.4"),  # a chain of trusted proxies
        ("10.0.0.1", "6.6.6.6, 1.2.3.4, 10.0.0.5", "1.2.3.4"),
        ("10.0.0.1", "10.0.0.7, 10.0.0.5", "10.0.0.7"),  # all trusted: the leftmost
        ("10.0.0.1", "garbage, 10.0.0.5", "10.0.0.5"),  # stops at the last trusted hop
        ("10.0.0.1", "1.2.3.4:5678", "1.2.3.4"),
        ("10.0.0.1", "[2001:db8::1]:443", "2001:db8::/64"),
        ("1.2.3.4", "5.6.7.8", "1.2.3.4"),  # not from a trusted proxy: header ignored
    ],
)
def test_forwarded_for_walk(peer: str, xff: str | None, key: str) -> None:
    assert client_address(trusted_proxies=["10.0.0.0/8"]).resolve(peer, xff) == key
    assert client_address().resolve(peer, xff) == peer


def test_two_forwarded_for_fields_are_joined() -> None:
    scope = {
        "type": "http",
        "client": ("10.0.0.1", 1),
        "headers": [(b"x-forwarded-for", b"6.6.6.6"), (b"x-forwarded-for", b"1.2.3.4")],
    }
    assert client_address(trusted_proxies="10.0.0.0/8").asgi(scope) == "1.2.3.4"


def test_header_key_with_address_fallback(
    impl: ModuleType, clock: Any, asgi_client: MakeClient
) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock)
    app = RateLimitMiddleware(starlette_app(), limiter, key=header("X-API-Key"))
    c = asgi_client(app)
    assert c.get("/", headers={"X-API-Key": "alice"}).status_code == 200
    assert c.get("/", headers={"X-API-Key": "alice"}).status_code == 429
    assert c.get("/", headers={"X-API-Key": "bob"}).status_code == 200
    assert c.get("/").status_code == 200  # no key: the client address's bucket
    assert c.get("/").status_code == 429
    assert limiter.tokens_at("header:alice", clock.now) == 0.0
    assert limiter.tokens_at("addr:127.0.0.1", clock.now) == 0.0


def test_routes_costs_exempt_and_route_key(
    impl: ModuleType, clock: Any, asgi_client: MakeClient
) -> None:
    default = impl.KeyedTokenBucket(rate=1, capacity=10, clock=clock)
    search = impl.KeyedTokenBucket(rate=1, capacity=3, clock=clock)
    app = RateLimitMiddleware(
        starlette_app(),
        default,
        exempt=["/healthz"],
        routes=[
            Route("/search", search, name="search"),
            Route("/search", search, cost=3, methods={"POST"}, name="search"),
            Route("/api/*", cost=4),
            Route("/remaining", key=route()),
        ],
    )
    c = asgi_client(app)
    for _ in range(20):
        r = c.get("/healthz")
        assert r.status_code == 200 and "ratelimit" not in r.headers
    assert app.counters.exempt == 20

    r = c.get("/search")
    assert r.headers["ratelimit-policy"] == '"search";q=3;w=3'
    assert r.headers["ratelimit"] == '"search";r=2;t=1'
    assert c.post("/search").status_code == 429  # costs 3, 2 left
    assert c.get("/search").status_code == 200
    assert search.tokens_at("127.0.0.1", clock.now) == 1.0

    r = c.get("/api/v1/items")  # the default limiter, cost 4
    assert r.headers["ratelimit"] == '"default";r=6;t=4'
    assert c.get("/api").headers["ratelimit"] == '"default";r=2;t=8'
    assert c.get("/apix").headers["ratelimit"] == '"default";r=1;t=9'  # not below /api
    # A traversal does not borrow the exempt route, nor /api/*: the app
    # routes /healthz/../api/x as it is (httpx would resolve a literal "..";
    # "%2e%2e" arrives decoded, as from uvicorn), so the default, cost 1.
    r = c.get("/healthz/%2e%2e/api/x")
    assert (r.status_code, r.headers["ratelimit"]) == (404, '"default";r=0;t=10')
    # The route key: one bucket for the route, whoever calls.
    assert c.get("/remaining").json() == {"remaining": 9}
    assert default.tokens_at("/remaining", clock.now) == 9.0
    assert app.counters.snapshot() == counts(admitted=7, limited=1, shadow_limited=0, exempt=20)


def test_cost_callable_and_composite_key(
    impl: ModuleType, clock: Any, asgi_client: MakeClient
) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=10, clock=clock)

    def cost(scope: Any) -> int:
        return 5 if scope["method"] == "POST" else 1

    app = RateLimitMiddleware(
        starlette_app(),
        limiter,
        cost=cost,
        key=(client_address(), route()),
        routes=[Route("/search")],
    )
    c = asgi_client(app)
    assert c.post("/search").headers["ratelimit"] == '"default";r=5;t=5'
    assert c.get("/").headers["ratelimit"] == '"default";r=9;t=1'
    assert limiter.tokens_at("127.0.0.1\n/search", clock.now) == 5.0
    assert limiter.tokens_at("127.0.0.1\n*", clock.now) == 9.0


def test_shadow_mode_counts_and_never_rejects(
    impl: ModuleType, clock: Any, asgi_client: MakeClient
) -> None:
    counters = Counters()
    limiter = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    app = RateLimitMiddleware(starlette_app(), limiter, shadow=True, counters=counters)
    c = asgi_client(app)
    responses = [c.get("/") for _ in range(5)]
    assert [r.status_code for r in responses] == [200] * 5
    assert not [h for r in responses for h in r.headers if "ratelimit" in h]
    assert counters.snapshot() == counts(admitted=2, limited=0, shadow_limited=3, exempt=0)
    counters.reset()
    assert counters.limited == counters.admitted == 0


def test_decision_is_in_the_scope(keyed_app: KeyedApp, asgi_client: MakeClient) -> None:
    c = asgi_client(keyed_app(5))
    assert [c.get("/remaining").json()["remaining"] for _ in range(3)] == [4, 3, 2]


def test_async_limiter_is_awaited(impl: ModuleType, clock: Any, asgi_client: MakeClient) -> None:
    limiter = AsyncRecorder(impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock))
    c = asgi_client(RateLimitMiddleware(starlette_app(), limiter))
    r1, r2 = c.get("/"), c.get("/")
    assert (r1.status_code, r2.status_code, r2.headers["retry-after"]) == (200, 429, "1")
    assert len(limiter.keys) == 2


def test_lifespan_passes_through(impl: ModuleType) -> None:
    # (A websocket's handshake is limited: see test_websockets.)
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    limiter = impl.KeyedTokenBucket(rate=1, capacity=1)
    mw = RateLimitMiddleware(app, limiter)

    async def run() -> None:
        for _ in range(2):
            await mw({"type": "lifespan", "client": ("1.2.3.4", 1)}, None, None)  # type: ignore[arg-type]

    asyncio.run(run())
    assert seen == ["lifespan", "lifespan"]
    assert limiter.tokens("1.2.3.4") == 1.0


def test_keyed_detection(impl: ModuleType) -> None:
    assert keyed_of(impl.KeyedTokenBucket(rate=1, capacity=1), None) is True
    assert keyed_of(impl.TokenBucket(rate=1, capacity=1), None) is False

    class Layered:  # the all_of shape, check(key=None, cost=1): its class says it is keyed
        keyed = True

        def check(self, key: Any = None, cost: int = 1) -> None: ...

    class Unsaid:  # the same shape, but no signature is read
        def check(self, key: Any = None, cost: int = 1) -> None: ...

    assert keyed_of(Layered(), None) is True
    with pytest.raises(TypeError, match="Unsaid is not a limiter: its class declares no keyed"):
        keyed_of(Unsaid(), None)
    assert keyed_of(Unsaid(), False) is False


def _mw(limiter: Any, **kwargs: Any) -> RateLimitMiddleware:
    return RateLimitMiddleware(starlette_app(), limiter, **kwargs)


def test_bad_arguments(impl: ModuleType) -> None:
    keyed = impl.KeyedTokenBucket(rate=1, capacity=2)
    with pytest.raises(TypeError, match="check"):
        _mw(object())
    with pytest.raises(TypeError, match="limiter is required"):
        _mw(None)

    class Odd:
        def check(self, who: Any, n: int) -> None: ...

    with pytest.raises(TypeError, match="keyed=True/False"):
        _mw(Odd())
    assert _mw(Odd(), keyed=True).counters.admitted == 0
    with pytest.raises(ValueError, match="exceeds capacity"):
        _mw(keyed, cost=3)
    with pytest.raises(ValueError, match="exceeds capacity"):
        _mw(keyed, routes=[Route("/x", cost=5)])
    with pytest.raises(TypeError, match="cost must be an int"):
        _mw(keyed, cost=True)
    with pytest.raises(ValueError, match="headers must be one of"):
        _mw(keyed, headers="draft")
    with pytest.raises(TypeError, match="shadow"):
        _mw(keyed, shadow=1)
    with pytest.raises(ValueError, match="start with '/'"):
        Route("api/*")
    with pytest.raises(ValueError, match="wildcard"):
        Route("/api*")
    with pytest.raises(ValueError, match="exempt route"):
        Route("/x", keyed, exempt=True)
    with pytest.raises(TypeError, match="methods"):
        Route("/x", methods="POST")
    with pytest.raises(TypeError, match="routes must be Route"):
        _mw(keyed, routes=["/x"])
    with pytest.raises(ValueError, match="not an IP"):
        client_address(trusted_proxies=["proxy.local"])
    with pytest.raises(ValueError, match="header name"):
        header("X Bad")
    with pytest.raises(TypeError, match="key must be"):
        _mw(keyed, key=42)
    with pytest.raises(ValueError, match="policy name"):
        _mw(keyed, name='a"b')
    with pytest.raises(TypeError, match="counters"):
        _mw(keyed, counters={})
    with pytest.raises(TypeError, match="ASGI callable"):
        RateLimitMiddleware(None, keyed)  # type: ignore[arg-type]


def test_problem_body_is_json(impl: ModuleType, clock: Any, asgi_client: MakeClient) -> None:
    app = RateLimitMiddleware(starlette_app(), impl.TokenBucket(rate=2, capacity=1, clock=clock))
    c = asgi_client(app)
    c.get("/")
    r = c.get("/")
    assert json.loads(r.content)["detail"] == "Rate limit 'default' exceeded; retry after 1 s."
    assert r.headers["ratelimit-policy"] == '"default";q=2;w=1'


@pytest.mark.parametrize(
    ("path", "method", "pattern"),
    [
        ("/healthz", "GET", "/healthz"),
        ("/healthz/../admin", "GET", "*"),  # matched as it is, never exempt
        ("/healthz/./", "GET", "*"),
        ("//healthz", "GET", "*"),  # "//" is never exempt either
        ("/api", "GET", "/api/*"),
        ("/api/v1/../../admin", "GET", "/api/v1/*"),  # the app serves it under /api/v1
        ("/api/v1/x", "GET", "/api/v1/*"),  # the longest prefix wins
        ("/apix", "GET", "*"),
        ("/login", "GET", "*"),
        ("/login", "POST", "/login"),
        ("login", "POST", "/login"),  # a relative target: Werkzeug routes it as /login
        ("healthz", "GET", "*"),  # never exempt
        ("api/v1/x", "GET", "/api/v1/*"),
    ],
)
def test_router_match(impl: ModuleType, path: str, method: str, pattern: str) -> None:
    mw = _mw(
        impl.KeyedTokenBucket(rate=1, capacity=5),
        exempt=["/healthz"],
        routes=[Route("/api/*"), Route("/api/v1/*", cost=2), Route("/login", methods={"post"})],
    )
    assert mw._gate.router.match(path, method).pattern == pattern


def test_all_of_sends_the_binding_layers_policy(
    impl: ModuleType, clock: Any, asgi_client: MakeClient
) -> None:
    # The README's per-client and global limits: the policy field is the
    # binding layer's (it was missing from every response), named by what
    # the layer is so a client can tell the layers apart.
    from nanobucket import all_of

    per_client = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    instance = impl.TokenBucket(rate=10, capacity=3, clock=clock)
    app = RateLimitMiddleware(starlette_app(), all_of(per_client, instance))
    seen = []
    for host in ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"):
        r = asgi_client(app, host).get("/")
        seen.append((r.status_code, r.headers["ratelimit-policy"], r.headers["ratelimit"]))
    assert seen == [
        (
            200,
            '"default:per-key";q=2;w=2',
            '"default:per-key";r=1;t=1',
        ),  # the client's bucket binds
        (200, '"default:per-key";q=2;w=2', '"default:per-key";r=1;t=1'),
        (200, '"default:shared";q=10;w=1', '"default:shared";r=0;t=1'),  # the instance's, now empty
        (429, '"default:shared";q=10;w=1', '"default:shared";r=0;t=1'),
    ]
    assert (
        r.json()["detail"] == "Rate limit 'default:shared' exceeded; retry after 1 s."
    )  # as named


async def _bare(scope: Any, receive: Any, send: Any) -> None:
    """An ASGI app that is never called."""


def test_a_redis_limiter_that_blocks_the_event_loop_is_refused() -> None:
    # Built without reaching any server (the client connects on first use).
    blocking = nbr.RedisTokenBucket(redis.Redis(), rate=1, capacity=1)
    refused = r"RedisTokenBucket waits for Redis in the calling thread: in an ASGI app.*use nano"
    for limiter, routes in [
        (blocking, None),
        (nb.all_of(nb.KeyedTokenBucket(1, 1), blocking), None),
        (nb.tiered({"free": blocking}, tier=lambda key: "free"), None),
        (nb.KeyedTokenBucket(1, 1), [Route("/api/*", limiter=blocking)]),
    ]:
        with pytest.raises(TypeError, match=rf"{refused}bucket\.redis\.AsyncRedisTokenBucket"):
            RateLimitMiddleware(_bare, limiter, routes=routes)
    # Its asyncio twin is awaited; a WSGI app's worker thread may wait on Redis.
    awaited = nbr.AsyncRedisTokenBucket(redis.asyncio.Redis(), rate=1, capacity=1)
    assert RateLimitMiddleware(_bare, awaited)._gate.awaits
    assert WsgiMiddleware(lambda e, s: [], blocking).counters.snapshot()["admitted"] == 0
