"""The rate-limit header fields: built once, rebuilt when a limiter is reconfigured.

The ``RateLimit-Policy`` bytes of a limiter are made when the middleware is
built; a ``reconfigure()`` of its rate or capacity (or of one layer of an
``all_of``) must show in the very next response, on the ASGI inline path,
the WSGI middleware and the FastAPI dependency alike. The formatting of the
varying fields is checked byte for byte against the plain ``str`` form.
"""

from __future__ import annotations

import asyncio
from types import ModuleType
from typing import Any

from fastapi import Depends, FastAPI
from hypothesis import given
from hypothesis import strategies as st

import nanobucket as nb
from nanobucket import wsgi
from nanobucket._http import Policy, limit_headers, rejection
from nanobucket.asgi import RateLimitMiddleware
from nanobucket.fastapi import RateLimit

from fuzz_values import fuzz
from http_checks import Client

S = 1_000_000_000


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x-app", b"1")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _asgi_get(app: Any, host: str = "10.0.0.1") -> tuple[int, dict[bytes, bytes]]:
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/", "client": (host, 5000), "headers": []}
    asyncio.run(app(scope, None, send))
    return sent[0]["status"], dict(sent[0]["headers"])


def test_asgi_policy_follows_reconfigure(impl: ModuleType, clock: Any) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    app = RateLimitMiddleware(_ok, limiter)
    status, h = _asgi_get(app)
    assert (status, h[b"ratelimit-policy"], h[b"ratelimit"]) == (
        200,
        b'"default";q=2;w=2',
        b'"default";r=1;t=1',
    )
    assert h[b"x-app"] == b"1"
    limiter.reconfigure(rate=5, now=clock())  # the rate alone: w = 2/5 s -> 1 s, q = 5
    status, h = _asgi_get(app)
    assert (h[b"ratelimit-policy"], h[b"ratelimit"]) == (b'"default";q=5;w=1', b'"default";r=0;t=1')
    limiter.reconfigure(capacity=10, now=clock())  # the capacity alone
    # A key not in the table keeps the old capacity's 2 tokens: 9 to refill at 5/s.
    status, h = _asgi_get(app, "10.0.0.2")
    assert h[b"ratelimit-policy"] == b'"default";q=10;w=2'
    assert h[b"ratelimit"] == b'"default";r=1;t=2'
    status, h = _asgi_get(app, "10.0.0.2")  # unchanged since: the same fields
    assert h[b"ratelimit-policy"] == b'"default";q=10;w=2'


def test_asgi_429_and_legacy_follow_reconfigure(impl: ModuleType, clock: Any) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock)
    app = RateLimitMiddleware(_ok, limiter)
    legacy = RateLimitMiddleware(_ok, limiter, headers="legacy")
    assert _asgi_get(app)[0] == 200
    limiter.reconfigure(rate=1, capacity=3, now=clock())  # the empty bucket stays empty
    clock.advance(S)
    status, h = _asgi_get(app)
    assert status == 200 and h[b"ratelimit-policy"] == b'"default";q=3;w=3'
    status, h = _asgi_get(app)
    assert (status, h[b"retry-after"], h[b"ratelimit-policy"]) == (429, b"1", b'"default";q=3;w=3')
    status, h = _asgi_get(legacy)
    assert (status, h[b"x-ratelimit-limit"], h[b"x-ratelimit-reset"]) == (429, b"3", b"3")


def test_all_of_layer_policy_follows_reconfigure(impl: ModuleType, clock: Any) -> None:
    per_client = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    instance = impl.TokenBucket(rate=10, capacity=30, clock=clock)
    app = RateLimitMiddleware(_ok, nb.all_of(per_client, instance))
    assert (
        _asgi_get(app)[1][b"ratelimit-policy"] == b'"default:per-key";q=2;w=2'
    )  # the client's binds
    per_client.reconfigure(rate=2, capacity=4, now=clock())
    assert _asgi_get(app, "10.0.0.2")[1][b"ratelimit-policy"] == b'"default:per-key";q=4;w=2'
    instance.reconfigure(capacity=1, now=clock())  # the instance binds now, empty
    status, h = _asgi_get(app, "10.0.0.3")
    assert (status, h[b"ratelimit-policy"]) == (200, b'"default:shared";q=10;w=1')


def test_tiered_plan_policy_follows_reconfigure(impl: ModuleType, clock: Any) -> None:
    free = impl.KeyedTokenBucket(rate=10, capacity=20, clock=clock)
    pro = impl.KeyedTokenBucket(rate=100, capacity=200, clock=clock)
    plan_of = {"10.0.0.1": "free", "10.0.0.2": "pro"}
    limiter = nb.tiered({"free": free, "pro": pro}, tier=plan_of.__getitem__)
    app = RateLimitMiddleware(_ok, nb.all_of(limiter, impl.TokenBucket(1000, 5000, clock=clock)))
    assert _asgi_get(app)[1][b"ratelimit-policy"] == b'"free";q=20;w=2'
    free.reconfigure(rate=20, capacity=20, now=clock())
    assert _asgi_get(app)[1][b"ratelimit-policy"] == b'"free";q=20;w=1'
    assert _asgi_get(app, "10.0.0.2")[1][b"ratelimit-policy"] == b'"pro";q=200;w=2'
    alone = RateLimitMiddleware(_ok, limiter)  # the tiered limiter itself, no all_of
    pro.reconfigure(capacity=100, now=clock())
    assert _asgi_get(alone, "10.0.0.2")[1][b"ratelimit-policy"] == b'"pro";q=100;w=1'


def test_wsgi_policy_follows_reconfigure(impl: ModuleType, clock: Any) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    seen: list[Any] = []

    def app(environ: Any, start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]

    mw = wsgi.RateLimitMiddleware(app, limiter)
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "REMOTE_ADDR": "10.0.0.1"}
    mw(environ, lambda status, headers, exc_info=None: seen.append(dict(headers)))
    limiter.reconfigure(rate=4, capacity=8, now=clock())
    mw(environ, lambda status, headers, exc_info=None: seen.append(dict(headers)))
    policies = [h["ratelimit-policy"] for h in seen]
    assert policies == ['"default";q=2;w=2', '"default";q=8;w=2']


def test_fastapi_dependency_policy_follows_reconfigure(impl: ModuleType, clock: Any) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    api = FastAPI()

    @api.get("/", dependencies=[Depends(RateLimit(limiter))])
    async def root() -> str:  # not a Response: FastAPI merges the dependency's fields
        return "ok"

    c = Client(api, ("10.0.0.1", 5000))
    try:
        assert c.get("/").headers["ratelimit-policy"] == '"default";q=2;w=2'
        limiter.reconfigure(rate=3, capacity=3, now=clock())
        r = c.get("/")
        # Full in 1 s + 2 ns (a token every 333,333,334 ns), rounded up to 2 s.
        assert (r.headers["ratelimit-policy"], r.headers["ratelimit"]) == (
            '"default";q=3;w=1',
            '"default";r=0;t=2',
        )
    finally:
        c.close()


class _NoRate:
    """A limiter with no rate or capacity to show: no policy field, nothing to watch."""

    keyed = True

    def __init__(self) -> None:
        self.inner = nb.KeyedTokenBucket(rate=1, capacity=5)

    def check(self, key: Any, cost: int = 1) -> Any:
        return self.inner.check(key, cost)


def test_stale_until_refreshed(impl: ModuleType) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=2)
    policy = Policy(limiter, "default", None)
    assert not policy.stale()
    limiter.reconfigure(capacity=4)
    assert policy.stale() and policy.policy_header == (b"ratelimit-policy", b'"default";q=2;w=2')
    policy.refresh()
    assert not policy.stale()
    assert policy.ietf_extra == ((b"ratelimit-policy", b'"default";q=4;w=4'),)


def test_a_limiter_without_rate_has_no_policy_field() -> None:
    policy = Policy(_NoRate(), "default", None)
    assert policy.watched is None and policy.leaves == () and not policy.stale()
    status, h = _asgi_get(RateLimitMiddleware(_ok, _NoRate()))
    assert (
        status == 200
        and b"ratelimit-policy" not in h
        and h[b"ratelimit"].startswith(b'"default";r=4;t=')
    )


class _D:
    def __init__(self, remaining: int, reset_ns: int, retry_ns: int, limit: int) -> None:
        self.remaining, self.reset_after_ns = remaining, reset_ns
        self.retry_after_ns, self.limit = retry_ns, limit


@fuzz(100)  # no deadline: one slow example on a loaded machine is not a failure
@given(
    st.integers(0, 2**62),
    st.integers(0, 2**62),
    st.integers(0, 2**62),
    st.integers(1, 2**62),
)
def test_fields_match_the_str_form_byte_for_byte(
    remaining: int, reset_ns: int, retry_ns: int, limit: int
) -> None:
    policy = Policy(nb.KeyedTokenBucket(rate=3, capacity=7), "p", None)
    d = _D(remaining, reset_ns, retry_ns, limit)
    t = str(-(-reset_ns // S))
    assert limit_headers("ietf", policy, d) == [
        (b"ratelimit-policy", b'"p";q=9;w=3'),
        (b"ratelimit", f'"p";r={remaining};t={t}'.encode()),
    ]
    assert limit_headers("legacy", policy, d) == [
        (b"x-ratelimit-limit", str(limit).encode()),
        (b"x-ratelimit-remaining", str(remaining).encode()),
        (b"x-ratelimit-reset", t.encode()),
    ]
    headers, body = rejection("off", policy, d)
    assert headers == [
        (b"content-type", b"application/problem+json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(max(1, -(-retry_ns // S))).encode()),
    ]
