"""The gate reads the method, the path and a key header as the app under it does.

Each test sends the request a client would send to pick another rule or a
fresh bucket, and counts what the rule admits, exactly. The frameworks'
own readings (Starlette, FastAPI, Flask, Django, Litestar, Quart) are
compared with the gate's, on generated requests, in
``test_reading_differential.py``; these pin each reading down at the gate.
"""

from __future__ import annotations

import asyncio
from types import ModuleType
from typing import Any

import pytest

from nanobucket._http import Route
from nanobucket._http.views import ENVIRON, SCOPE
from nanobucket.asgi import RateLimitMiddleware
from nanobucket.wsgi import RateLimitMiddleware as WSGIMiddleware

# A rule of 2 on /login (POST only where a test says so), a default of 1000.
CAPACITY = 2


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _asgi_statuses(app: Any, scopes: list[dict[str, Any]]) -> list[int]:
    statuses: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def run() -> None:
        for scope in scopes:
            await app(
                {"type": "http", "client": ("1.2.3.4", 5), "headers": [], **scope}, None, send
            )

    asyncio.run(run())
    return statuses


def _wsgi_statuses(app: Any, environs: list[dict[str, Any]]) -> list[int]:
    statuses: list[int] = []

    def start_response(status: str, headers: Any, exc_info: Any = None) -> None:
        statuses.append(int(status.split(maxsplit=1)[0]))

    for environ in environs:
        app({"REMOTE_ADDR": "1.2.3.4", "REQUEST_METHOD": "GET", **environ}, start_response)
    return statuses


def _wsgi_ok(environ: Any, start_response: Any) -> list[bytes]:
    start_response("200 OK", [])
    return [b"ok"]


def _login_rule(impl: ModuleType, **kw: Any) -> Route:
    return Route("/login", impl.KeyedTokenBucket(rate=1e-6, capacity=CAPACITY), **kw)


@pytest.mark.parametrize("method", ["post", "Post", "pOST"])
def test_a_method_in_any_case_takes_its_rule_wsgi(impl: ModuleType, method: str) -> None:
    app = WSGIMiddleware(
        _wsgi_ok,
        impl.KeyedTokenBucket(rate=1e-6, capacity=1000),
        routes=[_login_rule(impl, methods={"POST"})],
    )
    environ = {"REQUEST_METHOD": method, "PATH_INFO": "/login"}
    assert _wsgi_statuses(app, [environ] * 5) == [200, 200, 429, 429, 429]


def test_a_method_in_any_case_takes_its_rule_asgi(impl: ModuleType) -> None:
    app = RateLimitMiddleware(
        _ok,
        impl.KeyedTokenBucket(rate=1e-6, capacity=1000),
        routes=[_login_rule(impl, methods={"POST"})],
    )
    scopes = [{"method": m, "path": "/login"} for m in ("post", "POST", "pOsT", "get")]
    assert _asgi_statuses(app, scopes) == [200, 200, 429, 200]


def test_a_repeated_key_header_is_keyed_on_its_first_field_asgi(impl: ModuleType) -> None:
    from nanobucket.asgi import header

    app = RateLimitMiddleware(
        _ok, impl.KeyedTokenBucket(rate=1e-6, capacity=3), key=header("X-API-Key")
    )
    scopes = [
        {"method": "GET", "path": "/", "headers": [(b"x-api-key", b"k1"), (b"x-api-key", j)]}
        for j in (b"junk-1", b"junk-2", b"junk-3", b"junk-4", b"junk-5")
    ]
    assert _asgi_statuses(app, scopes) == [200, 200, 200, 429, 429]


@pytest.mark.parametrize(
    ("path", "root_path"),
    [
        ("/v1/login", "/v1"),  # Starlette's Mount, uvicorn's --root-path
        ("/api/login", "/api"),
        ("/v1login", "/v1"),  # Quart and Litestar strip it however it ends
    ],
)
def test_an_asgi_rule_applies_below_the_root_path(
    impl: ModuleType, path: str, root_path: str
) -> None:
    app = RateLimitMiddleware(
        _ok, impl.KeyedTokenBucket(rate=1e-6, capacity=1000), routes=[_login_rule(impl)]
    )
    scopes = [{"method": "GET", "path": path, "root_path": root_path}] * 6
    assert _asgi_statuses(app, scopes) == [200, 200, 429, 429, 429, 429]


def test_a_path_read_below_the_root_path_mid_segment_is_never_exempt(impl: ModuleType) -> None:
    # Quart and Litestar serve "/v1healthz" (a target "healthz" under --root-path /v1)
    # as "/healthz", Starlette as itself: neither may take the exempt rule.
    app = RateLimitMiddleware(_ok, impl.KeyedTokenBucket(rate=1e-6, capacity=2), exempt="/healthz")
    scope = {"method": "GET", "path": "/v1healthz", "root_path": "/v1"}
    assert _asgi_statuses(app, [scope] * 3) == [200, 200, 429]
    assert SCOPE.path({"path": "/v1/x", "root_path": "/v1"}) == "/x"


def test_a_rule_written_with_the_root_path_warns_once(impl: ModuleType) -> None:
    app = RateLimitMiddleware(
        _ok,
        impl.KeyedTokenBucket(rate=1e-6, capacity=1000),
        routes=[Route("/api/login", impl.KeyedTokenBucket(rate=1e-6, capacity=CAPACITY))],
    )
    scope = {"method": "GET", "path": "/api/login", "root_path": "/api"}
    with pytest.warns(RuntimeWarning, match=r"Route\('/api/login'\) begins with the root path"):
        statuses = _asgi_statuses(app, [scope] * 3)
    assert statuses == [200, 200, 200]  # the path below the root is /login: the default's
    assert _asgi_statuses(app, [scope]) == [200]  # once per root path: no second warning


@pytest.mark.parametrize(
    "environ",
    [
        {"SCRIPT_NAME": "/v1", "PATH_INFO": "/login"},  # DispatcherMiddleware's mount
        {"SCRIPT_NAME": "/x-17", "PATH_INFO": "/login"},  # ProxyFix from X-Forwarded-Prefix
    ],
)
def test_a_wsgi_rule_matches_path_info_whatever_the_script_name(
    impl: ModuleType, environ: dict[str, str]
) -> None:
    app = WSGIMiddleware(
        _wsgi_ok, impl.KeyedTokenBucket(rate=1e-6, capacity=1000), routes=[_login_rule(impl)]
    )
    prefixes = [{**environ, "SCRIPT_NAME": f"{environ['SCRIPT_NAME']}-{i}"} for i in range(5)]
    assert _wsgi_statuses(app, prefixes) == [200, 200, 429, 429, 429]


@pytest.mark.parametrize("path", ["/login/", "/login"])
def test_an_exact_rule_takes_one_trailing_slash_more_or_less(impl: ModuleType, path: str) -> None:
    rule = Route("/login/" if path == "/login" else "/login", impl.KeyedTokenBucket(1e-6, 2))
    app = WSGIMiddleware(_wsgi_ok, impl.KeyedTokenBucket(rate=1e-6, capacity=1000), routes=[rule])
    assert _wsgi_statuses(app, [{"PATH_INFO": path}] * 3) == [200, 200, 429]


def test_an_exempt_rule_takes_no_trailing_slash_twin(impl: ModuleType) -> None:
    app = WSGIMiddleware(_wsgi_ok, impl.KeyedTokenBucket(rate=1e-6, capacity=2), exempt="/healthz")
    assert _wsgi_statuses(app, [{"PATH_INFO": "/healthz"}] * 3) == [200, 200, 200]
    assert _wsgi_statuses(app, [{"PATH_INFO": "/healthz/"}] * 3) == [200, 200, 429]


def test_a_trailing_slash_form_with_a_rule_of_its_own_keeps_it(impl: ModuleType) -> None:
    routes = [
        Route("/a", impl.KeyedTokenBucket(1e-6, 1)),
        Route("/a/", impl.KeyedTokenBucket(1e-6, 3)),
    ]
    app = WSGIMiddleware(_wsgi_ok, impl.KeyedTokenBucket(1e-6, 1000), routes=routes)
    assert _wsgi_statuses(app, [{"PATH_INFO": "/a/"}] * 4) == [200, 200, 200, 429]
    assert _wsgi_statuses(app, [{"PATH_INFO": "/a"}] * 2) == [200, 429]


def test_the_views_read_as_the_frameworks_do() -> None:
    assert SCOPE.path({"path": "/v1", "root_path": "/v1"}) == "/"
    assert SCOPE.path({"path": "/other", "root_path": "/v1"}) == "/other"
    assert SCOPE.path({"path": "/v1/a", "root_path": ""}) == "/v1/a"
    headers = [(b"X-Api-Key", b""), (b"x-api-key", b"k2")]
    assert SCOPE.app_header({"headers": headers}, "x-api-key") == ""  # the first, empty
    assert SCOPE.header({"headers": headers}, "x-api-key") == ", k2"  # joined: addresses
    assert ENVIRON.path({"SCRIPT_NAME": "/app", "PATH_INFO": ""}) == "/"
    assert ENVIRON.app_header({"HTTP_X_API_KEY": "k1,k2"}, "x-api-key") == "k1,k2"


@pytest.mark.parametrize(
    ("target", "statuses"),
    [
        ("http://t/login", [200, 200, 429]),  # absolute form: Quart routes its path
        ("login;x=1", [200, 200, 429]),  # Quart: urlparse drops the ;parameters
        ("login", [200, 200, 429]),  # Werkzeug routes a relative target below /
    ],
)
def test_a_target_without_a_leading_slash_takes_the_rule_of_its_path(
    impl: ModuleType, target: str, statuses: list[int]
) -> None:
    app = RateLimitMiddleware(
        _ok, impl.KeyedTokenBucket(rate=1e-6, capacity=1000), routes=[_login_rule(impl)]
    )
    assert _asgi_statuses(app, [{"method": "POST", "path": target}] * 3) == statuses


def test_a_relative_target_with_a_dot_segment_takes_its_prefix_rule(impl: ModuleType) -> None:
    # Werkzeug's server passes "GET items/a/." on, and Flask serves it from /items/<path:p>.
    app = WSGIMiddleware(
        _wsgi_ok,
        impl.KeyedTokenBucket(rate=1e-6, capacity=1000),
        routes=[Route("/items/*", impl.KeyedTokenBucket(rate=1e-6, capacity=2))],
        exempt="/items/a",
    )
    assert _wsgi_statuses(app, [{"PATH_INFO": "items/a/."}] * 3) == [200, 200, 429]
    # The exempt /items/a's relative form takes the same spent rule: never exempt.
    assert _wsgi_statuses(app, [{"PATH_INFO": "items/a"}] * 2) == [429, 429]
    assert _wsgi_statuses(app, [{"PATH_INFO": "/items/a"}] * 3) == [200, 200, 200]


def test_an_absolute_form_target_under_a_root_path_takes_the_rule_of_its_path(
    impl: ModuleType,
) -> None:
    # hypercorn --root-path /api passes "GET http://t/api/login" on as scope["path"];
    # Quart serves it from /login. Read so, and never exempt.
    app = RateLimitMiddleware(
        _ok,
        impl.KeyedTokenBucket(rate=1e-6, capacity=1000),
        routes=[_login_rule(impl)],
        exempt="/healthz",
    )
    scopes = [{"method": "GET", "path": "http://t/api/login", "root_path": "/api"}] * 3
    assert _asgi_statuses(app, scopes) == [200, 200, 429]
    assert SCOPE.path({"path": "http://t/api/healthz", "root_path": "/api"}) == "//healthz"
