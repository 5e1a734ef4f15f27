"""The WSGI middleware on a Flask app through Werkzeug's test client, injected clock."""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

import pytest
from flask import Flask, request
from werkzeug.test import Client

from nanobucket._http import Counters, Route, client_address, header, route
from nanobucket.wsgi import RateLimitMiddleware

from http_checks import PROBLEM_429_1S

S = 1_000_000_000


def flask_app() -> Flask:
    app = Flask("nanobucket_test")

    @app.route("/")
    def index() -> tuple[str, int, dict[str, str]]:
        return "hello", 200, {"X-App": "1"}

    @app.route("/healthz")
    def healthz() -> str:
        return "ok"

    @app.route("/search", methods=["GET", "POST"])
    def search() -> str:
        return "found"

    @app.route("/remaining")
    def remaining() -> dict[str, Any]:
        decision = request.environ.get("nanobucket.decision")
        return {"remaining": None if decision is None else decision.remaining}

    return app


def wrap(limiter: Any, **kwargs: Any) -> tuple[Flask, RateLimitMiddleware]:
    app = flask_app()
    mw = RateLimitMiddleware(app.wsgi_app, limiter, **kwargs)
    app.wsgi_app = mw  # type: ignore[method-assign]
    return app, mw


def client(app: Flask, addr: str = "127.0.0.1") -> Client:
    """Flask's test client (a Werkzeug ``Client``) seen from *addr*."""
    c = app.test_client()
    c.environ_base["REMOTE_ADDR"] = addr
    return c


def test_admitted_then_429_with_exact_headers(impl: ModuleType, clock: Any) -> None:
    app, mw = wrap(impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock))
    c = client(app)
    r = c.get("/")
    assert (r.status_code, r.text, r.headers["X-App"]) == (200, "hello", "1")
    assert r.headers["RateLimit-Policy"] == '"default";q=2;w=2'
    assert r.headers["RateLimit"] == '"default";r=1;t=1'
    assert c.get("/").headers["RateLimit"] == '"default";r=0;t=2'

    r = c.get("/")
    assert r.status_code == 429
    assert r.status == "429 Too Many Requests"
    assert r.headers["Retry-After"] == "1"
    assert r.headers["Content-Type"] == "application/problem+json"
    assert r.headers["RateLimit"] == '"default";r=0;t=2'
    assert r.json == PROBLEM_429_1S
    clock.advance(S - 1)
    r = c.get("/")
    assert (r.status_code, r.headers["Retry-After"]) == (429, "1")
    clock.advance(1)
    assert c.get("/").status_code == 200
    assert mw.counters.snapshot() == {"admitted": 3, "limited": 2, "shadow_limited": 0, "exempt": 0}


def test_legacy_headers_and_off(impl: ModuleType, clock: Any) -> None:
    app, _ = wrap(impl.KeyedTokenBucket(rate=2, capacity=3, clock=clock), headers="legacy")
    r = client(app).get("/")
    assert [
        r.headers[h] for h in ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset")
    ] == ["3", "2", "1"]
    app, _ = wrap(impl.KeyedTokenBucket(rate=2, capacity=1, clock=clock), headers="off")
    c = client(app)
    assert "RateLimit" not in c.get("/").headers
    r = c.get("/")
    assert (r.status_code, r.headers["Retry-After"], "RateLimit" in r.headers) == (429, "1", False)


def test_spoofed_forwarded_for_does_not_change_the_key(impl: ModuleType, clock: Any) -> None:
    app, _ = wrap(impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock))
    c = client(app, "203.0.113.9")
    codes = [
        c.get("/", headers={"X-Forwarded-For": f"198.51.100.{i}"}).status_code for i in range(5)
    ]
    assert codes == [200, 200, 429, 429, 429]


def test_trusted_proxy_forwarded_for(impl: ModuleType, clock: Any) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock)
    app, _ = wrap(limiter, key=client_address(trusted_proxies=["10.0.0.0/8", "::1"]))
    proxy = client(app, "10.9.8.7")
    assert proxy.get("/", headers={"X-Forwarded-For": "198.51.100.1"}).status_code == 200
    assert proxy.get("/", headers={"X-Forwarded-For": "198.51.100.2"}).status_code == 200
    forged = {"X-Forwarded-For": "192.0.2.77, 198.51.100.1"}
    assert proxy.get("/", headers=forged).status_code == 429
    assert limiter.tokens_at("192.0.2.77", clock.now) == 1.0


def test_unkeyed_and_header_keys(impl: ModuleType, clock: Any) -> None:
    app, _ = wrap(impl.TokenBucket(rate=1, capacity=2, clock=clock))
    assert [client(app, a).get("/").status_code for a in ("1.1.1.1", "2.2.2.2", "3.3.3.3")] == [
        200,
        200,
        429,
    ]
    limiter = impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock)
    app, _ = wrap(limiter, key=header("X-API-Key"))
    c = client(app)
    assert c.get("/", headers={"X-API-Key": "alice"}).status_code == 200
    assert c.get("/", headers={"X-API-Key": "alice"}).status_code == 429
    assert c.get("/", headers={"X-API-Key": "bob"}).status_code == 200
    assert [c.get("/").status_code, c.get("/").status_code] == [200, 429]
    assert limiter.tokens_at("addr:127.0.0.1", clock.now) == 0.0


def test_routes_exempt_costs_and_route_key(impl: ModuleType, clock: Any) -> None:
    default = impl.KeyedTokenBucket(rate=1, capacity=10, clock=clock)
    search = impl.KeyedTokenBucket(rate=1, capacity=3, clock=clock)
    app, mw = wrap(
        default,
        exempt=["/healthz"],
        routes=[
            Route("/search", search, name="search"),
            Route("/search", search, cost=3, methods={"POST"}, name="search"),
            Route("/remaining", key=route(), cost=2),
        ],
    )
    c = client(app)
    for _ in range(15):
        assert c.get("/healthz").status_code == 200
    r = c.get("/search")
    assert (r.headers["RateLimit-Policy"], r.headers["RateLimit"]) == (
        '"search";q=3;w=3',
        '"search";r=2;t=1',
    )
    assert c.post("/search").status_code == 429
    assert c.get("/remaining").json == {"remaining": 8}
    assert default.tokens_at("/remaining", clock.now) == 8.0
    assert c.get("/").headers["RateLimit"] == '"default";r=9;t=1'
    assert mw.counters.snapshot() == {
        "admitted": 3,
        "limited": 1,
        "shadow_limited": 0,
        "exempt": 15,
    }


def test_shadow_mode(impl: ModuleType, clock: Any) -> None:
    counters = Counters()
    app, mw = wrap(
        impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock), shadow=True, counters=counters
    )
    c = client(app)
    responses = [c.get("/") for _ in range(4)]
    assert [r.status_code for r in responses] == [200] * 4
    assert all("RateLimit" not in r.headers for r in responses)
    assert mw.counters is counters
    assert counters.snapshot() == {"admitted": 1, "limited": 0, "shadow_limited": 3, "exempt": 0}


@pytest.mark.gil_atomic
def test_counters_are_exact_under_threads(impl: ModuleType, clock: Any) -> None:
    # 4 threads x 250 requests at one instant: exactly `capacity` admitted.
    app, mw = wrap(impl.TokenBucket(rate=1, capacity=300, clock=clock))
    codes: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        c = client(app)
        mine = [c.get("/").status_code for _ in range(250)]
        with lock:
            codes.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert (codes.count(200), codes.count(429)) == (300, 700)
    assert mw.counters.snapshot() == {
        "admitted": 300,
        "limited": 700,
        "shadow_limited": 0,
        "exempt": 0,
    }


def test_exc_info_is_passed_on(impl: ModuleType) -> None:
    calls: list[tuple[str, int, bool]] = []

    def app(environ: Any, start_response: Any) -> list[bytes]:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            import sys

            start_response(
                "500 Internal Server Error", [("Content-Type", "text/plain")], sys.exc_info()
            )
        return [b"err"]

    def start_response(status: str, headers: list[Any], exc_info: Any = None) -> None:
        calls.append((status, len(headers), exc_info is not None))

    mw = RateLimitMiddleware(app, impl.KeyedTokenBucket(rate=1, capacity=1))
    assert mw({"REMOTE_ADDR": "1.2.3.4", "PATH_INFO": "/"}, start_response) == [b"err"]
    assert calls == [
        ("500 Internal Server Error", 3, True)
    ]  # its header + the two RateLimit fields


def test_bad_arguments(impl: ModuleType) -> None:
    class AsyncLimiter:
        keyed = True

        async def check(self, key: Any, cost: int = 1) -> None: ...

    with pytest.raises(TypeError, match="synchronous limiter"):
        wrap(AsyncLimiter())
    with pytest.raises(TypeError, match="WSGI callable"):
        RateLimitMiddleware(42, impl.TokenBucket(rate=1, capacity=1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exceeds capacity"):
        wrap(impl.TokenBucket(rate=1, capacity=1), cost=2)
    with pytest.raises(ValueError, match="headers must be one of"):
        wrap(impl.TokenBucket(rate=1, capacity=1), headers=None)


def test_all_of_sends_the_binding_layers_policy(impl: ModuleType, clock: Any) -> None:
    from nanobucket import all_of

    per_client = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    instance = impl.TokenBucket(rate=10, capacity=3, clock=clock)
    app, _ = wrap(all_of(per_client, instance))
    seen = []
    for addr in ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"):
        r = client(app, addr).get("/")
        seen.append((r.status_code, r.headers["RateLimit-Policy"], r.headers["RateLimit"]))
    assert seen == [
        (200, '"default:per-key";q=2;w=2', '"default:per-key";r=1;t=1'),
        (200, '"default:per-key";q=2;w=2', '"default:per-key";r=1;t=1'),
        (200, '"default:shared";q=10;w=1', '"default:shared";r=0;t=1'),
        (429, '"default:shared";q=10;w=1', '"default:shared";r=0;t=1'),
    ]


def test_exempt_takes_one_path_as_a_string(impl: ModuleType, clock: Any) -> None:
    # exempt="/healthz" is that path (it was read as the paths "/", "h", ...).
    app, mw = wrap(impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock), exempt="/healthz")
    c = client(app)
    assert [c.get("/healthz").status_code for _ in range(3)] == [200, 200, 200]
    assert [c.get("/").status_code for _ in range(2)] == [200, 429]
    assert (mw.counters.exempt, mw.counters.admitted, mw.counters.limited) == (3, 1, 1)
