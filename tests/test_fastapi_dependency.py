"""`nanobucket.fastapi.RateLimit`: a limit as a FastAPI dependency, keyed after authentication.

FastAPI's own test client drives the app; one test runs it under real
uvicorn on loopback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import pytest
from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Request
from test_http_servers import Server, connect, free_port, get

import nanobucket as nb
from nanobucket import redis as nbr
from nanobucket.fastapi import RateLimit, RateLimited, header, rate_limited_handler, route

from conftest import ManualClock
from http_checks import PROBLEM_429_1S, MakeClient, asgi_client
from redis_server import redis_session_server, redis_url

__all__ = ("asgi_client", "redis_session_server", "redis_url")  # fixtures, re-exported

S = 1_000_000_000


def current_user(authorization: Annotated[str | None, Header()] = None) -> str:
    """The app's own authentication: a bearer token names the user."""
    if not authorization or not authorization.startswith("Bearer "):
        raise HTTPException(401, "who are you?")
    return authorization.removeprefix("Bearer ")


User = Annotated[str, Depends(current_user)]


def user_key(user: User) -> str:
    """A key function with a dependency of its own: the authenticated user."""
    return user


def bearer(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {user}"}


def test_keyed_by_the_authenticated_user_with_exact_headers(
    clock: ManualClock, asgi_client: MakeClient
) -> None:
    limiter = nb.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    per_user = RateLimit(limiter, key=user_key)
    app = FastAPI(exception_handlers={RateLimited: rate_limited_handler})

    @app.get("/items", dependencies=[Depends(per_user)])
    async def items() -> list[str]:
        return ["a"]

    http = asgi_client(app)
    first = http.get("/items", headers=bearer("alice"))
    assert first.status_code == 200 and first.json() == ["a"]
    assert first.headers["ratelimit-policy"] == '"default";q=2;w=2'
    assert first.headers["ratelimit"] == '"default";r=1;t=1'
    assert http.get("/items", headers=bearer("alice")).headers["ratelimit"] == ('"default";r=0;t=2')
    refused = http.get("/items", headers=bearer("alice"))
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert refused.headers["ratelimit"] == '"default";r=0;t=2'
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json() == PROBLEM_429_1S
    # Another user has a bucket of their own; no user is a 401 before any token.
    assert http.get("/items", headers=bearer("bob")).status_code == 200
    assert http.get("/items").status_code == 401
    assert limiter.tokens_at("alice", clock.now) == 0.0
    clock.advance(S)
    assert http.get("/items", headers=bearer("alice")).status_code == 200


def test_without_the_handler_the_429_is_fastapis_own_body_with_the_same_headers(
    asgi_client: MakeClient,
) -> None:
    app = FastAPI()
    limit = RateLimit(nb.TokenBucket(rate=1, capacity=1, clock=lambda: 0))

    @app.get("/", dependencies=[Depends(limit)])
    def root() -> str:
        return "ok"

    http = asgi_client(app)
    assert http.get("/").status_code == 200
    refused = http.get("/")
    assert (refused.status_code, refused.json()) == (429, {"detail": "Too Many Requests"})
    assert refused.headers["retry-after"] == "1"
    assert refused.headers["ratelimit-policy"] == '"default";q=1;w=1'


def test_with_charge_it_is_still_one_rate_limit_whose_value_is_the_decision(
    clock: ManualClock, asgi_client: MakeClient
) -> None:
    limiter = nb.KeyedTokenBucket(rate=1, capacity=5, clock=clock)
    charged = RateLimit(limiter, key=lambda: "k", charge=lambda request, status: 3)
    assert type(charged) is RateLimit and isinstance(charged, RateLimit)
    app = FastAPI()

    @app.get("/")
    async def root(decision: nb.Decision = Depends(charged)) -> int:  # noqa: B008
        return decision.remaining

    http = asgi_client(app)
    assert http.get("/").json() == 4  # the decision, taken at cost 1
    assert limiter.tokens_at("k", clock.now) == 2.0  # settled to 3 after the route


# Annotated aliases are read from the module (the annotations are strings).
USER_CLOCK = ManualClock()
PER_USER = RateLimit(
    nb.KeyedTokenBucket(rate=1, capacity=1, clock=USER_CLOCK),
    key=user_key,
    name="user",
)
UserLimited = Annotated[nb.Decision, Depends(PER_USER)]


def test_annotated_router_and_two_limits_on_one_route(
    clock: ManualClock, asgi_client: MakeClient
) -> None:
    # One limit for the whole router by API key, one for the route by user:
    # both fields are sent, each under its own name.
    by_key = RateLimit(
        nb.KeyedTokenBucket(rate=10, capacity=10, clock=clock), key=header("X-API-Key"), name="key"
    )
    router = APIRouter(dependencies=[Depends(by_key)])

    @router.get("/me")
    async def me(decision: UserLimited, user: User) -> Any:
        return {"user": user, "remaining": decision.remaining}

    app = FastAPI(exception_handlers={RateLimited: rate_limited_handler})
    app.include_router(router)
    http = asgi_client(app)
    ok = http.get("/me", headers={**bearer("alice"), "X-API-Key": "k1"})
    assert ok.json() == {"user": "alice", "remaining": 0}
    assert ok.headers.get_list("ratelimit-policy") == ['"key";q=10;w=1', '"user";q=1;w=1']
    assert ok.headers.get_list("ratelimit") == ['"key";r=9;t=1', '"user";r=0;t=1']
    refused = http.get("/me", headers={**bearer("alice"), "X-API-Key": "k1"})
    assert refused.status_code == 429 and refused.json()["detail"].startswith("Rate limit 'user'")
    # The router's limit spent a token on the refused request too: it ran first.
    bob = http.get("/me", headers={**bearer("bob"), "X-API-Key": "k1"})
    assert bob.headers.get_list("ratelimit") == ['"key";r=7;t=1', '"user";r=0;t=1']


def test_cost_from_a_query_parameter_and_the_decision_in_the_scope(
    clock: ManualClock, asgi_client: MakeClient
) -> None:
    limiter = nb.KeyedTokenBucket(rate=1, capacity=10, clock=clock)
    seen: list[Any] = []

    def size(n: int = 1) -> int:  # FastAPI fills n from the query string
        return n

    limit = RateLimit(limiter, key=route(), cost=size)
    app = FastAPI()

    @app.get("/batch/{name}", dependencies=[Depends(limit)])
    async def batch(name: str, request: Request) -> str:
        seen.append(request.scope["nanobucket.decision"])
        return name

    http = asgi_client(app)
    assert http.get("/batch/x?n=7").status_code == 200
    assert http.get("/batch/y?n=3").headers["ratelimit"] == '"default";r=0;t=10'
    assert http.get("/batch/z?n=1").status_code == 429
    assert [d.remaining for d in seen] == [3, 0]
    assert limiter.tokens_at("/batch/{name}", clock.now) == 0.0  # keyed by the pattern


def test_a_cost_over_capacity_is_a_clear_error(clock: ManualClock, asgi_client: MakeClient) -> None:
    def cost(n: int = 1) -> int:
        return n

    limit = RateLimit(nb.KeyedTokenBucket(rate=1, capacity=10, clock=clock), cost=cost)
    app = FastAPI()

    @app.get("/", dependencies=[Depends(limit)])
    async def root() -> str:
        return "ok"

    with pytest.raises(ValueError, match="cost"):
        asgi_client(app).get("/?n=11")
    with pytest.raises(ValueError, match="cost"):
        RateLimit(nb.KeyedTokenBucket(rate=1, capacity=10), cost=11)
    with pytest.raises(TypeError, match=r"\*args"):
        RateLimit(nb.KeyedTokenBucket(rate=1, capacity=10), key=lambda *a: 1)
    with pytest.raises(TypeError, match="shadow"):
        RateLimit(nb.KeyedTokenBucket(rate=1, capacity=10), shadow=1)  # type: ignore[arg-type]


def test_shadow_counts_and_never_refuses(clock: ManualClock, asgi_client: MakeClient) -> None:
    limit = RateLimit(nb.TokenBucket(rate=1, capacity=1, clock=clock), shadow=True)
    app = FastAPI()

    @app.get("/", dependencies=[Depends(limit)])
    async def root() -> str:
        return "ok"

    http = asgi_client(app)
    responses = [http.get("/") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert all("ratelimit" not in r.headers for r in responses)
    assert limit.counters.snapshot() == {
        "admitted": 1,
        "limited": 0,
        "shadow_limited": 2,
        "exempt": 0,
    }


def test_an_async_key_function_and_legacy_headers(
    clock: ManualClock, asgi_client: MakeClient
) -> None:
    async def tenant(request: Request) -> str:
        return request.headers.get("x-tenant", "anonymous")

    limit = RateLimit(
        nb.KeyedTokenBucket(rate=2, capacity=4, clock=clock), key=tenant, headers="legacy"
    )
    app = FastAPI()

    @app.get("/", dependencies=[Depends(limit)])
    async def root() -> str:
        return "ok"

    r = asgi_client(app).get("/", headers={"x-tenant": "acme"})
    assert (r.headers["x-ratelimit-limit"], r.headers["x-ratelimit-remaining"]) == ("4", "3")
    assert r.headers["x-ratelimit-reset"] == "1"
    assert "ratelimit" not in r.headers


def test_a_function_in_a_tuple_of_keys_gets_the_request(
    clock: ManualClock, asgi_client: MakeClient
) -> None:
    seen: list[object] = []

    def tenant(request: Request) -> str:
        seen.append(request)
        return request.headers.get("x-tenant", "anonymous")

    table = nb.KeyedTokenBucket(rate=1, capacity=1, clock=clock)
    limit = RateLimit(table, key=(header("x-tenant"), tenant))
    app = FastAPI()

    @app.get("/", dependencies=[Depends(limit)])
    async def root() -> str:
        return "ok"

    client = asgi_client(app)
    statuses = [client.get("/", headers={"x-tenant": t}).status_code for t in ("a", "a", "b")]
    assert statuses == [200, 429, 200]
    assert all(isinstance(r, Request) for r in seen) and len(seen) == 3
    assert table.peek_at(("a", "a"), clock()).remaining == 0


def test_an_asyncio_redis_limiter_is_awaited(redis_url: str, asgi_client: MakeClient) -> None:
    # Redis's own clock: a rate of one an hour keeps the counts exact.
    limiter = nbr.AsyncRedisTokenBucket.from_url(
        redis_url, rate=1 / 3600, capacity=2, prefix="fastapi-dep"
    )
    limit = RateLimit(limiter, key=user_key)
    app = FastAPI(exception_handlers={RateLimited: rate_limited_handler})

    @app.get("/", dependencies=[Depends(limit)])
    async def root() -> str:
        return "ok"

    http = asgi_client(app)
    got = [http.get("/", headers=bearer("carol")) for _ in range(3)]
    assert [r.status_code for r in got] == [200, 200, 429]
    assert got[1].headers["ratelimit"] == '"default";r=0;t=7200'
    assert got[2].headers["retry-after"] == "3600"
    assert got[2].json()["retry_after"] == 3600
    http.loop.run_until_complete(limiter.aclose())


def test_under_real_uvicorn(tmp_path: Path) -> None:
    # The README's example app: 2 requests per user, then 429 with Retry-After.
    app_file = tmp_path / "fastapi_app.py"
    app_file.write_text(
        "from typing import Annotated\n"
        "from fastapi import Depends, FastAPI, Header, HTTPException\n"
        "import nanobucket as nb\n"
        "from nanobucket.fastapi import RateLimit, RateLimited, rate_limited_handler\n"
        "def current_user(authorization: Annotated[str, Header()]) -> str:\n"
        "    return authorization.removeprefix('Bearer ')\n"
        "def user_key(user: Annotated[str, Depends(current_user)]) -> str:\n"
        "    return user\n"
        "per_user = RateLimit(nb.KeyedTokenBucket(rate=1 / 3600, capacity=2), key=user_key)\n"
        "app = FastAPI(exception_handlers={RateLimited: rate_limited_handler})\n"
        "@app.get('/items', dependencies=[Depends(per_user)])\n"
        "async def items() -> list[str]:\n"
        "    return ['a']\n"
    )
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "fastapi_app:app", "--app-dir", str(tmp_path)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    server = Server(argv, {}, port, tmp_path / "uvicorn.log")
    try:
        conn = connect(port)
        got = [get(conn, "/items", bearer("alice")) for _ in range(3)]
        got.append(get(conn, "/items", bearer("bob")))
        conn.close()
    finally:
        server.close()
    assert [status for status, _, _ in got] == [200, 200, 429, 200]
    assert got[0][1]["ratelimit-policy"] == '"default";q=2;w=7200'
    assert got[1][1]["ratelimit"] == '"default";r=0;t=7200'
    assert got[2][1]["retry-after"] == "3600"
    assert json.loads(got[2][2])["retry_after"] == 3600


def test_a_redis_limiter_that_blocks_the_event_loop_is_refused() -> None:
    import redis

    blocking = nbr.RedisTokenBucket(redis.Redis(), rate=1, capacity=1)  # connects on first use
    refused = r"RedisTokenBucket waits for Redis .* a FastAPI dependency"
    with pytest.raises(TypeError, match=refused):
        RateLimit(blocking)
    with pytest.raises(TypeError, match=r"use nanobucket\.redis\.AsyncRedisTokenBucket"):
        RateLimit(nb.all_of(nb.KeyedTokenBucket(1, 1), blocking), charge=lambda r, s: 1)
    assert RateLimit(nbr.AsyncRedisTokenBucket(redis.asyncio.Redis(), rate=1, capacity=1))
