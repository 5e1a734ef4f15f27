"""The aiohttp middleware through aiohttp's own test client, under an injected clock.

Every test runs on both implementations (``impl``); the numbers are exact:
a limiter of rate 1/s and capacity 2 admits two requests at t=0, and the
third must wait exactly 1 s. One test serves the app with ``web.AppRunner``
on loopback, as an application does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from fractions import Fraction
from types import ModuleType
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

import nanobucket as nb
from nanobucket.aiohttp import (
    DECISION,
    ROUTE,
    Counters,
    RateLimitMiddleware,
    Route,
    client_address,
    header,
    route,
)
from nanobucket.asgi import HttpAnswer

from http_checks import PROBLEM_429_1S, AsyncRecorder, Recorder, counts

S = 1_000_000_000
PER_MINUTE = Fraction(1, 60)

Reply = tuple[int, dict[str, str], bytes]
Send = Callable[[TestClient[Any, Any]], Awaitable[list[Reply]]]


async def _hello(request: web.Request) -> web.Response:
    return web.Response(text="hello", headers={"X-App": "1"})


def make_app(middleware: RateLimitMiddleware, extra: list[Any] | None = None) -> web.Application:
    app = web.Application(middlewares=[middleware])
    app.router.add_get("/", _hello)
    app.router.add_get("/healthz", _hello)
    app.router.add_route("*", "/login", _hello)
    app.router.add_get("/items/{p:.*}", _hello)
    for method, path, handler in extra or ():
        app.router.add_route(method, path, handler)
    return app


async def _reply(response: aiohttp.ClientResponse) -> Reply:
    body = await response.read()
    return response.status, {k.lower(): v for k, v in response.headers.items()}, body


def serve(app: web.Application, requests: list[tuple[str, str, dict[str, Any]]]) -> list[Reply]:
    """Send *requests* (method, path, client keyword arguments) in turn; their replies."""

    async def run() -> list[Reply]:
        async with TestClient(TestServer(app)) as client:
            replies = []
            for method, path, kwargs in requests:
                async with client.request(method, path, **kwargs) as response:
                    replies.append(await _reply(response))
            return replies

    return asyncio.run(run())


def gets(n: int, path: str = "/", **kwargs: Any) -> list[tuple[str, str, dict[str, Any]]]:
    return [("GET", path, kwargs)] * n


def posts(n: int, path: str) -> list[tuple[str, str, dict[str, Any]]]:
    return [("POST", path, {})] * n


def test_third_request_gets_429_with_exact_retry_after_and_fields(
    impl: ModuleType, clock: Any
) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    limit = RateLimitMiddleware(limiter)
    replies = serve(make_app(limit), gets(3))
    assert [r[0] for r in replies] == [200, 200, 429]
    ok, _, refused = replies
    assert ok[1]["ratelimit-policy"] == '"default";q=2;w=2'
    assert ok[1]["ratelimit"] == '"default";r=1;t=1'
    assert ok[1]["x-app"] == "1" and ok[2] == b"hello"
    _, fields, body = refused
    assert fields["retry-after"] == "1"
    assert fields["content-type"] == "application/problem+json"
    assert fields["ratelimit"] == '"default";r=0;t=2'
    assert fields["content-length"] == str(len(body))
    assert json.loads(body) == PROBLEM_429_1S
    assert limit.counters.snapshot() == counts(admitted=2, limited=1, shadow_limited=0, exempt=0)
    assert limiter.tokens_at("127.0.0.1", clock.now) == 0.0


def test_routes_methods_and_exempt_paths(impl: ModuleType, clock: Any) -> None:
    strict = impl.KeyedTokenBucket(rate=PER_MINUTE, capacity=2, clock=clock)
    lenient = impl.KeyedTokenBucket(rate=100, capacity=1000, clock=clock)
    limit = RateLimitMiddleware(
        lenient,
        routes=[Route("/login", strict, methods={"POST"}), Route("/items/*", cost=10)],
        exempt="/healthz",
    )
    requests: list[tuple[str, str, dict[str, Any]]] = (
        [("POST", "/login", {})] * 3 + gets(2, "/login") + gets(3, "/healthz")
    )
    requests += gets(1, "/items/a/b")
    replies = serve(make_app(limit), requests)
    assert [r[0] for r in replies] == [200, 200, 429, 200, 200, 200, 200, 200, 200]
    assert replies[2][1]["ratelimit-policy"] == '"/login";q=2;w=120'
    assert replies[2][1]["retry-after"] == "60"
    assert "ratelimit" not in replies[5][1]  # exempt: nothing added
    assert replies[8][1]["ratelimit"] == '"default";r=988;t=1'  # 1000 - 2 GETs - cost 10
    assert limit.counters.snapshot() == counts(admitted=5, limited=1, shadow_limited=0, exempt=3)


def test_repeated_key_header_is_keyed_on_the_first_field_as_aiohttp_reads_it(
    impl: ModuleType, clock: Any
) -> None:
    read: list[str] = []

    async def whoami(request: web.Request) -> web.Response:
        read.append(request.headers["X-API-Key"])
        return web.Response(text="ok")

    limiter = impl.KeyedTokenBucket(rate=PER_MINUTE, capacity=3, clock=clock)
    limit = RateLimitMiddleware(limiter, key=header("X-API-Key"))
    app = make_app(limit, [("GET", "/whoami", whoami)])
    requests = [
        ("GET", "/whoami", {"headers": [("X-API-Key", "k1"), ("X-API-Key", f"junk-{n}")]})
        for n in range(6)
    ]
    assert [r[0] for r in serve(app, requests)] == [200] * 3 + [429] * 3
    assert read == ["k1"] * 3
    assert limiter.tokens_at("header:k1", clock.now) == 0.0
    assert len(limiter) == 1


def test_handler_reads_the_decision_and_the_route(impl: ModuleType, clock: Any) -> None:
    async def remaining(request: web.Request) -> web.Response:
        return web.json_response([request[DECISION].remaining, request[ROUTE]])

    limiter = impl.KeyedTokenBucket(rate=1, capacity=5, clock=clock)
    events: list[nb.LimitEvent] = []
    limit = RateLimitMiddleware(
        limiter,
        routes=[Route("/r", cost=2)],
        key=(client_address(), route()),
        on_decision=events.append,
    )
    replies = serve(make_app(limit, [("GET", "/r", remaining)]), gets(2, "/r"))
    assert [json.loads(r[2]) for r in replies] == [[3, "/r"], [1, "/r"]]
    key = str(events[0].key)
    assert "127.0.0.1" in key and "/r" in key  # the address and the route the gate noted
    assert limiter.tokens_at(key, clock.now) == 1.0


def test_fields_are_added_to_a_raised_http_exception(impl: ModuleType, clock: Any) -> None:
    async def missing(request: web.Request) -> web.Response:
        raise web.HTTPNotFound(text="gone")

    limiter = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    limit = RateLimitMiddleware(limiter, headers="legacy")
    replies = serve(make_app(limit, [("GET", "/gone", missing)]), gets(2, "/gone") + gets(1, "/no"))
    assert [r[0] for r in replies] == [404, 404, 429]
    assert [r[1]["x-ratelimit-remaining"] for r in replies] == ["1", "0", "0"]
    assert replies[1][2] == b"gone"
    assert replies[2][1]["x-ratelimit-limit"] == "2"


def test_shadow_mode_admits_counts_and_adds_nothing(impl: ModuleType, clock: Any) -> None:
    limit = RateLimitMiddleware(impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock), shadow=True)
    replies = serve(make_app(limit), gets(3))
    assert [r[0] for r in replies] == [200, 200, 200]
    assert all("ratelimit" not in r[1] for r in replies)
    assert limit.counters.snapshot() == counts(admitted=1, limited=0, shadow_limited=2, exempt=0)


def test_middleware_of_a_sub_application_routes_below_its_prefix(
    impl: ModuleType, clock: Any
) -> None:
    strict = impl.KeyedTokenBucket(rate=PER_MINUTE, capacity=2, clock=clock)
    lenient = impl.KeyedTokenBucket(rate=100, capacity=1000, clock=clock)
    sub = make_app(
        RateLimitMiddleware(lenient, routes=[Route("/login", strict)], exempt="/healthz")
    )
    app = web.Application()
    app.add_subapp("/v1", sub)
    replies = serve(app, posts(3, "/v1/login") + gets(2, "/v1/healthz"))
    assert [r[0] for r in replies] == [200, 200, 429, 200, 200]
    assert replies[2][1]["ratelimit-policy"] == '"/login";q=2;w=120'
    assert "ratelimit" not in replies[4][1]


def test_async_limiter_is_awaited_and_hooks_see_the_route(impl: ModuleType, clock: Any) -> None:
    recorder = AsyncRecorder(impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock))
    events: list[nb.LimitEvent] = []
    limit = RateLimitMiddleware(
        recorder, routes=[Route("/items/*")], on_decision=events.append, counters=Counters()
    )
    replies = serve(make_app(limit), gets(2, "/items/a"))
    assert [r[0] for r in replies] == [200, 429]
    assert recorder.keys == ["127.0.0.1", "127.0.0.1"]
    assert [(e.route, e.outcome) for e in events] == [
        ("/items/*", "admitted"),
        ("/items/*", "limited"),
    ]


def test_charge_settles_the_real_cost_by_status(impl: ModuleType, clock: Any) -> None:
    async def missing(request: web.Request) -> web.Response:
        raise web.HTTPNotFound()

    limiter = impl.KeyedTokenBucket(rate=1, capacity=10, clock=clock)
    statuses: list[int] = []

    def charge(request: web.Request, status: int) -> int:
        statuses.append(status)
        return 5 if status == 200 else 0

    limit = RateLimitMiddleware(limiter, charge=charge)
    serve(make_app(limit, [("GET", "/gone", missing)]), gets(1) + gets(1, "/gone"))
    assert statuses == [200, 404]
    assert limiter.tokens_at("127.0.0.1", clock.now) == 5.0  # 10 - 5 (charged) - 0 (refunded)


def test_sync_blocking_limiter_and_an_app_are_refused(impl: ModuleType) -> None:
    class Blocking(Recorder):
        blocking = True

    with pytest.raises(TypeError, match="block the event loop"):
        RateLimitMiddleware(Blocking(impl.KeyedTokenBucket(rate=1, capacity=1)))
    with pytest.raises(TypeError, match="takes a limiter, not the app"):
        RateLimitMiddleware(web.Application())
    with pytest.raises(ValueError, match="headers must be one of"):
        RateLimitMiddleware(impl.KeyedTokenBucket(rate=1, capacity=1), headers="none")


def test_served_by_app_runner_on_loopback(impl: ModuleType, clock: Any) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    limit = RateLimitMiddleware(limiter)

    async def run() -> list[tuple[int, str | None]]:
        runner = web.AppRunner(make_app(limit))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            timeout = aiohttp.ClientTimeout(total=10)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                got = []
                for _ in range(3):
                    async with session.get(f"http://127.0.0.1:{port}/") as response:
                        await response.read()
                        got.append((response.status, response.headers.get("Retry-After")))
                return got
        finally:
            await runner.cleanup()

    assert asyncio.run(run()) == [(200, None), (200, None), (429, "1")]
    assert limiter.tokens_at("127.0.0.1", clock.now) == 0.0
    clock.advance(S)
    assert limiter.tokens_at("127.0.0.1", clock.now) == 1.0


def test_encoded_slash_is_read_as_the_router_matches_it(impl: ModuleType, clock: Any) -> None:
    # aiohttp's router matches request.rel_url.path_safe: "/status%2Flive" is one
    # segment, served by "/{name}", never by the exempt "/status/live".
    served: list[str] = []

    async def named(request: web.Request) -> web.Response:
        served.append(request.match_info["name"])
        return web.Response(text="named")

    limiter = impl.KeyedTokenBucket(rate=PER_MINUTE, capacity=2, clock=clock)
    limit = RateLimitMiddleware(limiter, exempt="/status/live")
    app = make_app(limit, [("GET", "/{name}", named), ("GET", "/status/live", _hello)])
    replies = serve(app, gets(4, "/status%2Flive") + gets(1, "/status/live"))
    assert [r[0] for r in replies] == [200, 200, 429, 429, 200]
    assert served == ["status/live"] * 2
    assert limit.counters.snapshot() == counts(admitted=2, limited=2, shadow_limited=0, exempt=1)


def test_http_answer_is_the_middlewares_answer(impl: ModuleType, clock: Any) -> None:
    # A hand-written integration answers with the fields and body the middleware sends.
    limit = RateLimitMiddleware(impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock), name="api")
    served = serve(make_app(limit), gets(3))
    own = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    answer = HttpAnswer(own, name="api")
    admitted = answer.admitted(own.check("127.0.0.1"))
    own.check("127.0.0.1")
    status, fields, body = answer.refused(own.check("127.0.0.1"))
    assert admitted == [("ratelimit-policy", '"api";q=2;w=2'), ("ratelimit", '"api";r=1;t=1')]
    assert all(served[0][1][k] == v for k, v in admitted)
    assert (status, body) == (served[2][0], served[2][2])
    assert all(served[2][1][k] == v for k, v in fields)
    assert [k for k, _ in fields] == [
        "content-type",
        "content-length",
        "retry-after",
        "ratelimit-policy",
        "ratelimit",
    ]
    with pytest.raises(ValueError, match="headers must be one of"):
        HttpAnswer(own, headers="x")
