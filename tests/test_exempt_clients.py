"""``exempt_clients=``: clients that never spend a token and are never refused.

Every integration (ASGI, WSGI, the FastAPI dependency, the Django middleware
and decorator, the DRF throttle) through the gate: the exempt client's bucket
keeps every token, its answers carry no rate-limit fields, and the others are
limited as before. Each limiter has 2 tokens at a fixed clock, so a third
request of a client that is not exempt is refused.
"""

from __future__ import annotations

import ipaddress
from types import ModuleType
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.test.client import RequestFactory
from fastapi import Depends, FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route as StarletteRoute

from nanobucket import asgi, wsgi
from nanobucket._http import SCOPE, Gate
from nanobucket.django import NanobucketThrottle, limit
from nanobucket.fastapi import RateLimit, RateLimited, rate_limited_handler

import django_urls
from conftest import ManualClock
from http_checks import MakeClient, asgi_client, counts

__all__ = ("asgi_client",)  # a fixture, used by name

FIELDS = {"ratelimit", "ratelimit-policy", "retry-after"}


def bucket(impl: ModuleType, clock: ManualClock) -> Any:
    return impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)


def limit_fields(headers: Any) -> set[str]:
    return FIELDS & {k.lower() for k in headers}


# ---------------------------------------------------------------- validation


def test_bad_exempt_clients_are_clear_errors(impl: ModuleType, clock: ManualClock) -> None:
    limiter = bucket(impl, clock)
    with pytest.raises(ValueError, match=r"not an IP address or network: '10\.0\.0\.300'"):
        Gate(SCOPE, limiter, exempt_clients=["127.0.0.1", "10.0.0.300"])
    with pytest.raises(ValueError, match=r"'10\.0\.0\.0/8, 192\.168\.0\.0/16'"):
        Gate(SCOPE, limiter, exempt_clients="10.0.0.0/8, 192.168.0.0/16")
    with pytest.raises(TypeError, match="exempt_clients takes addresses or networks"):
        Gate(SCOPE, limiter, exempt_clients=[b"10.0.0.1"])
    with pytest.raises(TypeError, match="exempt_clients takes addresses or networks"):
        Gate(SCOPE, limiter, exempt_clients=True)

    async def staff(scope: Any) -> bool:
        return True

    with pytest.raises(TypeError, match="not a coroutine function"):
        Gate(SCOPE, limiter, exempt_clients=staff)
    with pytest.raises(ValueError, match=r"'10\.0\.0\.300'"):
        wsgi.RateLimitMiddleware(lambda e, s: [], limiter, exempt_clients="10.0.0.300")
    with pytest.raises(ValueError, match=r"'nope'"):
        RateLimit(limiter, exempt_clients=["nope"])


def test_a_predicate_that_returns_no_bool_is_a_clear_error(
    impl: ModuleType, clock: ManualClock
) -> None:
    # A truthy object (say a coroutine) would exempt everyone: refused instead.
    gate = Gate(SCOPE, bucket(impl, clock), exempt_clients=lambda scope: "yes")
    with pytest.raises(TypeError, match=r"must return a bool.*returned 'yes'"):
        gate.decide({"client": ("1.2.3.4", 5)})


def test_networks_addresses_ipv6_and_ipv4_mapped(impl: ModuleType, clock: ManualClock) -> None:
    limiter = bucket(impl, clock)
    allowed = [
        "10.0.0.0/8",
        ipaddress.ip_address("192.0.2.7"),
        ipaddress.ip_network("2001:db8::/32"),
    ]
    gate = Gate(SCOPE, limiter, exempt_clients=allowed)
    for peer in ("10.9.9.9", "::ffff:10.1.1.1", "192.0.2.7", "2001:db8:1:2::3"):
        for _ in range(3):
            assert gate.decide({"client": (peer, 5)}) == (True, None, (), None, None)
    assert len(limiter) == 0  # no bucket was touched
    assert [gate.decide({"client": ("192.0.2.8", 5)})[0] for _ in range(3)] == [True, True, False]
    assert gate.counters.snapshot() == counts(admitted=2, limited=1, shadow_limited=0, exempt=12)


# --------------------------------------------------------------------- ASGI


def _hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


def test_asgi_through_trusted_proxies_and_a_predicate(
    impl: ModuleType, clock: ManualClock, asgi_client: MakeClient
) -> None:
    limiter = bucket(impl, clock)
    app = asgi.RateLimitMiddleware(
        Starlette(routes=[StarletteRoute("/", _hello)]),
        limiter,
        key=asgi.client_address(trusted_proxies="127.0.0.0/8"),
        exempt_clients=["10.0.0.0/8", lambda scope: (b"x-probe", b"k8s") in scope["headers"]],
    )
    behind_proxy = asgi_client(app)  # from 127.0.0.1, a trusted proxy
    inside = [behind_proxy.get("/", headers={"x-forwarded-for": "10.1.2.3"}) for _ in range(3)]
    assert [r.status_code for r in inside] == [200, 200, 200]
    assert all(not limit_fields(r.headers) for r in inside)
    probes = [behind_proxy.get("/", headers={"x-probe": "k8s"}) for _ in range(3)]
    assert [r.status_code for r in probes] == [200, 200, 200]
    assert limiter.tokens("10.1.2.3") == limiter.tokens("127.0.0.1") == 2.0
    # An untrusted peer cannot claim an exempt address in X-Forwarded-For.
    outside = asgi_client(app, host="203.0.113.9")
    got = [outside.get("/", headers={"x-forwarded-for": "10.1.2.3"}) for _ in range(3)]
    assert [r.status_code for r in got] == [200, 200, 429]
    assert got[0].headers["ratelimit"] == '"default";r=1;t=1'
    assert limiter.tokens("203.0.113.9") == 0.0
    assert app.counters.snapshot() == counts(admitted=2, limited=1, shadow_limited=0, exempt=6)


# --------------------------------------------------------------------- WSGI


def test_wsgi_by_network_and_predicate(impl: ModuleType, clock: ManualClock) -> None:
    limiter = bucket(impl, clock)

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [b"ok"]

    mw = wsgi.RateLimitMiddleware(
        app,
        limiter,
        exempt=["/healthz"],
        exempt_clients=["192.168.0.0/16", lambda environ: "HTTP_X_INTERNAL" in environ],
    )
    seen: list[tuple[str, set[str]]] = []

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        seen.append((status[:3], limit_fields(dict(headers))))

    for environ in (
        {"REMOTE_ADDR": "192.168.4.4", "PATH_INFO": "/"},
        {"REMOTE_ADDR": "1.2.3.4", "PATH_INFO": "/", "HTTP_X_INTERNAL": "1"},
    ):
        for _ in range(3):
            mw(dict(environ), start_response)
    assert seen == [("200", set())] * 6
    assert limiter.tokens("192.168.4.4") == limiter.tokens("1.2.3.4") == 2.0
    for _ in range(3):
        mw({"REMOTE_ADDR": "1.2.3.4", "PATH_INFO": "/"}, start_response)
    assert [s for s, _ in seen[6:]] == ["200", "200", "429"]
    assert mw.counters.snapshot() == counts(admitted=2, limited=1, shadow_limited=0, exempt=6)


# ------------------------------------------------------------------ FastAPI


def test_fastapi_dependency(impl: ModuleType, clock: ManualClock, asgi_client: MakeClient) -> None:
    limiter = bucket(impl, clock)
    per_client = RateLimit(limiter, exempt_clients=["127.0.0.1"])
    app = FastAPI(exception_handlers={RateLimited: rate_limited_handler})

    @app.get("/", dependencies=[Depends(per_client)])
    async def root(request: Request) -> Any:
        return {"decided": request.scope["nanobucket.decision"] is not None}

    local = [asgi_client(app).get("/") for _ in range(3)]
    assert [r.status_code for r in local] == [200, 200, 200]
    assert [r.json() for r in local] == [{"decided": False}] * 3  # no limit was consulted
    assert all(not limit_fields(r.headers) for r in local)
    assert limiter.tokens("127.0.0.1") == 2.0
    remote = asgi_client(app, host="198.51.100.1")
    assert [remote.get("/").status_code for _ in range(3)] == [200, 200, 429]
    assert limiter.tokens("198.51.100.1") == 0.0


# ------------------------------------------------------------ Django and DRF


def test_django_middleware_from_settings(impl: ModuleType, clock: ManualClock) -> None:
    # The test client's address is 127.0.0.1; behind it as a trusted proxy, the client's.
    limiter = bucket(impl, clock)
    config = {
        "limiter": limiter,
        "trusted_proxies": ["127.0.0.1"],
        "exempt_clients": ["10.0.0.0/8", lambda request: request.headers.get("x-staff") == "1"],
    }
    with override_settings(MIDDLEWARE=["nanobucket.django.RateLimitMiddleware"], NANOBUCKET=config):
        client = Client()
        inside = [client.get("/hello", HTTP_X_FORWARDED_FOR="10.0.0.5") for _ in range(3)]
        staff = [client.get("/hello", HTTP_X_STAFF="1") for _ in range(3)]
        other = [client.get("/hello", HTTP_X_FORWARDED_FOR="192.0.2.1") for _ in range(3)]
    assert [r.status_code for r in inside + staff] == [200] * 6
    assert all(not limit_fields(r.headers) for r in inside + staff)
    assert [r.status_code for r in other] == [200, 200, 429]
    assert limiter.tokens("10.0.0.5") == limiter.tokens("127.0.0.1") == 2.0
    assert limiter.tokens("192.0.2.1") == 0.0


def test_django_decorator(impl: ModuleType, clock: ManualClock) -> None:
    limiter = bucket(impl, clock)

    @limit(limiter, exempt_clients="127.0.0.0/8")
    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("hi")

    factory = RequestFactory()
    local = [view(factory.get("/")) for _ in range(3)]
    assert [r.status_code for r in local] == [200] * 3
    assert all(not limit_fields(r.headers) for r in local)
    assert limiter.tokens("127.0.0.1") == 2.0
    remote = [view(factory.get("/", REMOTE_ADDR="192.0.2.9")).status_code for _ in range(3)]
    assert remote == [200, 200, 429]


def test_drf_throttle(impl: ModuleType, clock: ManualClock) -> None:
    class Staffed(NanobucketThrottle):
        limiter = bucket(impl, clock)
        key = "ip"
        exempt_clients = ("203.0.113.0/24", lambda request: request.META.get("HTTP_X_STAFF") == "1")

    limiter = Staffed.limiter
    view = django_urls.Api.as_view(throttle_classes=[Staffed])
    factory = RequestFactory()
    exempt = [factory.get("/api", REMOTE_ADDR="203.0.113.4"), factory.get("/api", HTTP_X_STAFF="1")]
    assert [view(r).status_code for r in exempt * 3] == [200] * 6
    assert limiter.tokens("203.0.113.4") == limiter.tokens("127.0.0.1") == 2.0
    assert [view(factory.get("/api")).status_code for _ in range(3)] == [200, 200, 429]
    assert limiter.tokens("127.0.0.1") == 0.0
