"""Keys a client cannot multiply, on both middlewares.

An attacker picks its source address inside its /64, its ``X-Forwarded-For``,
its header values, its path and its method; none of them may buy a fresh
bucket, a stricter route's escape, or unbounded memory per key. Requests are
driven straight through the middleware (exact scopes and environs) and,
where the framework's own decoding matters, through its test client.
"""

from __future__ import annotations

import asyncio
import hashlib
import warnings
from collections.abc import Hashable
from types import ModuleType
from typing import Any

import httpx
import pytest
from flask import Flask
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route as StarletteRoute

from nanobucket import asgi, wsgi
from nanobucket._http import Route, bounded, client_address, header, route

from fuzz_values import fuzz
from http_checks import Recorder

S = 1_000_000_000


async def _asgi_ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _wsgi_ok(environ: Any, start_response: Any) -> list[bytes]:
    start_response("200 OK", [])
    return [b"ok"]


def asgi_status(app: Any, scope: dict[str, Any]) -> int:
    """The status the ASGI *app* answers to one request of *scope*."""
    full = {"type": "http", "method": "GET", "path": "/", "headers": [], **scope}
    statuses: list[int] = []

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    asyncio.run(app(full, None, send))
    return statuses[0]


def wsgi_status(app: Any, environ: dict[str, Any]) -> int:
    environ.setdefault("REQUEST_METHOD", "GET")  # in place: the test reads what was left
    environ.setdefault("PATH_INFO", "/")
    statuses: list[int] = []
    app(environ, lambda status, headers, exc_info=None: statuses.append(int(status[:3])))
    return statuses[0]


def asgi_scope(peer: str | None, xff: str | None = None, **extra: Any) -> dict[str, Any]:
    headers = [(b"x-forwarded-for", xff.encode("latin-1"))] if xff is not None else []
    return {"client": None if peer is None else (peer, 5000), "headers": headers, **extra}


def wsgi_environ(peer: str | None, xff: str | None = None, **extra: Any) -> dict[str, Any]:
    environ: dict[str, Any] = dict(extra)
    if peer is not None:
        environ["REMOTE_ADDR"] = peer
    if xff is not None:
        environ["HTTP_X_FORWARDED_FOR"] = xff
    return environ


# -------------------------------------------------------------- addresses


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        ("1.2.3.4", "1.2.3.4"),
        ("::ffff:1.2.3.4", "1.2.3.4"),  # a dual-stack listener's IPv4 client
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2::ffff", "2001:db8:1:2::/64"),  # the same host, another address
        ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        ("::1", "::/64"),
    ],
)
def test_peer_key(peer: str, key: str) -> None:
    kf = client_address()
    assert kf.asgi(asgi_scope(peer)) == key
    assert kf.wsgi(wsgi_environ(peer)) == key


@pytest.mark.parametrize(
    ("prefix", "peer", "key"),
    [
        (128, "2001:db8::1", "2001:db8::1"),
        (128, "fe80::1%eth0", "fe80::1"),  # a zone never makes a key
        (48, "2001:db8:1:2::1", "2001:db8:1::/48"),
        (1, "ffff::1", "8000::/1"),
        (56, "::ffff:1.2.3.4", "1.2.3.4"),
    ],
)
def test_ipv6_prefix(prefix: int, peer: str, key: str) -> None:
    assert client_address(ipv6_prefix=prefix).wsgi(wsgi_environ(peer)) == key


@pytest.mark.parametrize(
    ("prefix", "error"),
    [(0, ValueError), (129, ValueError), (64.0, TypeError), (True, TypeError), ("64", TypeError)],
)
def test_ipv6_prefix_bad(prefix: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="ipv6_prefix"):
        client_address(ipv6_prefix=prefix)


def test_one_host_one_bucket_on_both_middlewares(impl: ModuleType, clock: Any) -> None:
    a_limiter = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    w_limiter = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    a = asgi.RateLimitMiddleware(_asgi_ok, a_limiter)
    w = wsgi.RateLimitMiddleware(_wsgi_ok, w_limiter)
    # One IPv6 host walking its /64, and an IPv4 client seen both ways.
    v6 = [f"2001:db8:aa:bb::{i:x}" for i in range(1, 6)]
    v4 = ["198.51.100.7", "::ffff:198.51.100.7", "::ffff:c633:6407"]
    assert [asgi_status(a, asgi_scope(p)) for p in v6] == [200, 200, 429, 429, 429]
    assert [wsgi_status(w, wsgi_environ(p)) for p in v6] == [200, 200, 429, 429, 429]
    assert [asgi_status(a, asgi_scope(p)) for p in v4] == [200, 200, 429]
    assert [wsgi_status(w, wsgi_environ(p)) for p in v4] == [200, 200, 429]
    # The next /64 is someone else.
    assert asgi_status(a, asgi_scope("2001:db8:aa:bc::1")) == 200
    for limiter in (a_limiter, w_limiter):
        assert limiter.tokens_at("2001:db8:aa:bb::/64", clock.now) == 0.0
        assert limiter.tokens_at("198.51.100.7", clock.now) == 0.0
    assert len(a_limiter) == 3 and len(w_limiter) == 2


# ---------------------------------------------------------- X-Forwarded-For

TRUSTED = ["10.0.0.0/8", "2001:db8:ffff::/48"]


@pytest.mark.parametrize(
    ("peer", "xff", "key"),
    [
        # The rightmost untrusted entry is the client, mapped and /64 rules applied.
        ("10.0.0.1", "6.6.6.6, ::ffff:1.2.3.4", "1.2.3.4"),
        ("10.0.0.1", "2001:db8:5:6::77", "2001:db8:5:6::/64"),
        ("10.0.0.1", "[2001:db8:5:6::78]:443, 10.0.0.9", "2001:db8:5:6::/64"),
        ("10.0.0.1", "fe80::1%zone-a", "fe80::/64"),
        ("::ffff:10.0.0.1", "1.2.3.4", "1.2.3.4"),  # a mapped proxy is still trusted
        ("2001:db8:ffff::1", "1.2.3.4", "1.2.3.4"),
        # Garbage, or addresses in another spelling, never name a new client.
        ("10.0.0.1", "1.2.3.4, garbage", "10.0.0.1"),
        ("10.0.0.1", "1.2.3.4, 10.0.0.9, 01.2.3.4", "10.0.0.1"),
        ("10.0.0.1", "01.2.3.4, 10.0.0.9", "10.0.0.9"),
        ("10.0.0.1", "1.2.3.4, " + "9" * 5000, "10.0.0.1"),
        ("10.0.0.1", ", , ", "10.0.0.1"),
        ("10.0.0.1", "", "10.0.0.1"),
        # An untrusted peer's header is never read, however long.
        (
            "203.0.113.5",
            ", ".join(f"10.0.{i // 256}.{i % 256}" for i in range(5000)),
            "203.0.113.5",
        ),
        ("2001:db8:9:9::1", "1.2.3.4", "2001:db8:9:9::/64"),
    ],
)
def test_forwarded_for(peer: str, xff: str, key: str) -> None:
    kf = client_address(trusted_proxies=TRUSTED)
    assert kf.asgi(asgi_scope(peer, xff)) == key
    assert kf.wsgi(wsgi_environ(peer, xff)) == key


def test_forwarded_for_long_chain_of_trusted_hops() -> None:
    # 10,000 trusted hops are walked in one pass (no split), to the client.
    chain = "7.7.7.7, " + ", ".join(
        f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(10_000)
    )
    assert client_address(trusted_proxies="10.0.0.0/8").resolve("10.0.0.1", chain) == "7.7.7.7"


def test_forwarded_for_attacker_behind_an_appending_proxy(impl: ModuleType, clock: Any) -> None:
    # The proxy (10.0.0.1) appends the address it saw; the attacker
    # (203.0.113.9, or any address of its /64) writes whatever it likes left of it.
    limiter = impl.KeyedTokenBucket(rate=1, capacity=3, clock=clock)
    key = client_address(trusted_proxies=TRUSTED)
    a = asgi.RateLimitMiddleware(_asgi_ok, limiter, key=key)
    w = wsgi.RateLimitMiddleware(_wsgi_ok, limiter, key=key)
    forged = [
        "garbage",
        "1.1.1.1, 2.2.2.2, 3.3.3.3",
        ", ".join(f"192.0.2.{i}" for i in range(200)),
        "::ffff:1.1.1.1, [2001:db8:1::1]:80, unknown",
    ]
    codes = []
    for i, f in enumerate(forged):
        codes.append(asgi_status(a, asgi_scope("10.0.0.1", f + ", 203.0.113.9")))
        xff = f + f", 2001:db8:77:1::{i + 1:x}"  # the same attacker over IPv6
        codes.append(wsgi_status(w, wsgi_environ("::ffff:10.0.0.1", xff)))
    assert codes == [200, 200, 200, 200, 200, 200, 429, 429]
    assert limiter.tokens_at("203.0.113.9", clock.now) == 0.0
    assert limiter.tokens_at("2001:db8:77:1::/64", clock.now) == 0.0
    assert len(limiter) == 2


# ---------------------------------------------------------------- unix sockets


def test_unix_peer_trusted_reads_forwarded_for(impl: ModuleType, clock: Any) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock)
    key = client_address(trusted_proxies=["unix:"])
    a = asgi.RateLimitMiddleware(_asgi_ok, limiter, key=key)
    w = wsgi.RateLimitMiddleware(_wsgi_ok, limiter, key=key)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # trusted: never a warning
        # uvicorn --uds gives no client; gunicorn on unix: an empty REMOTE_ADDR.
        assert asgi_status(a, asgi_scope(None, "1.2.3.4")) == 200
        assert wsgi_status(w, wsgi_environ("", "1.2.3.5")) == 200
        assert asgi_status(a, asgi_scope(None, "6.6.6.6, 1.2.3.4")) == 429
        assert wsgi_status(w, wsgi_environ("", "::ffff:1.2.3.5")) == 429
        # A proxy that names no client, or garbage: the one shared key "".
        assert wsgi_status(w, wsgi_environ("")) == 200
        assert asgi_status(a, asgi_scope(None, "garbage")) == 429
    assert [limiter.tokens_at(k, clock.now) for k in ("1.2.3.4", "1.2.3.5", "")] == [0.0] * 3
    # An address peer is not trusted by "unix:": its header is not read.
    assert key.wsgi(wsgi_environ("10.0.0.1", "1.2.3.4")) == "10.0.0.1"
    assert repr(key) == "client_address(trusted_proxies=['unix:'])"


@pytest.mark.parametrize("side", ["asgi", "wsgi"])
def test_no_peer_address_warns_once(impl: ModuleType, clock: Any, side: str) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    if side == "asgi":
        app: Any = asgi.RateLimitMiddleware(_asgi_ok, limiter)

        def status(xff: str) -> int:
            return asgi_status(app, asgi_scope(None, xff))
    else:
        app = wsgi.RateLimitMiddleware(_wsgi_ok, limiter)

        def status(xff: str) -> int:
            return wsgi_status(app, wsgi_environ("", xff))

    with pytest.warns(RuntimeWarning, match=r"no peer address.*trusted_proxies=\['unix:'\]") as rec:
        codes = [status(f"1.2.3.{i}") for i in range(4)]
    assert len(rec) == 1
    assert codes == [200, 200, 429, 429]  # one shared bucket: the header is not read
    assert limiter.tokens_at("", clock.now) == 0.0


def test_no_peer_address_warns_once_for_a_header_fallback_and_trusted_networks() -> None:
    kf = client_address(trusted_proxies="10.0.0.0/8")
    with pytest.warns(RuntimeWarning, match="no peer address") as rec:
        keys = [kf.wsgi(wsgi_environ("", "1.2.3.4")) for _ in range(3)]
        keys.append(header("X-API-Key", kf).asgi(asgi_scope(None)))
    assert len(rec) == 1
    assert keys == ["", "", "", "addr:"]


def test_trusted_mapped_network_is_its_ipv4_network() -> None:
    kf = client_address(trusted_proxies=["::ffff:10.0.0.0/104"])
    assert repr(kf) == "client_address(trusted_proxies=['10.0.0.0/8'])"
    assert kf.wsgi(wsgi_environ("10.1.2.3", "1.2.3.4")) == "1.2.3.4"
    assert kf.wsgi(wsgi_environ("::ffff:10.1.2.3", "1.2.3.4")) == "1.2.3.4"
    assert kf.wsgi(wsgi_environ("11.1.2.3", "1.2.3.4")) == "11.1.2.3"


def test_bound_unix_client_path_warns_too() -> None:
    # gunicorn gives a unix client's own path when it bound one.
    kf = client_address()
    with pytest.warns(RuntimeWarning, match="no peer address") as rec:
        keys = [kf.wsgi(wsgi_environ("/tmp/proxy.sock")) for _ in range(2)]
    assert (len(rec), keys) == (1, ["/tmp/proxy.sock"] * 2)


def test_trusted_proxies_bad() -> None:
    with pytest.raises(ValueError, match=r"or 'unix:'"):
        client_address(trusted_proxies=["unix"])
    with pytest.raises(TypeError, match="trusted proxies"):
        client_address(trusted_proxies=[b"unix:"])  # type: ignore[list-item]


# ---------------------------------------------------------------- key size


def test_bounded_keys() -> None:
    assert bounded("header", "k" * 64) == "header:" + "k" * 64
    long = bounded("header", "k" * 65)
    assert long.startswith("header#") and len(long) == 7 + 32
    assert bounded("header", "k" * 65) == long  # no secret: every process agrees
    assert bounded("header", "k" * 66) != long
    # A short value cannot spell a digest key: ':' against '#'.
    assert bounded("header", long[7:]) == "header:" + long[7:]


def test_digest_is_the_same_in_every_process() -> None:
    # Workers of a shared table and machines sharing Redis derive this same key.
    assert bounded("header", "x" * 8192) == "header#8c8140441c8eee6544e1e91ff00ed109"


@pytest.mark.parametrize("side", ["asgi", "wsgi"])
def test_header_keys_are_bounded(impl: ModuleType, clock: Any, side: str) -> None:
    rec = Recorder(impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock))
    values = [f"{i:04d}" + "x" * 8188 for i in range(100)] + ["short-key", "é" * 64]
    if side == "asgi":
        a = asgi.RateLimitMiddleware(_asgi_ok, rec, key=header("X-API-Key"))
        codes = [
            asgi_status(a, {"headers": [(b"x-api-key", v.encode("latin-1"))]})
            for v in values + values
        ]
    else:
        w = wsgi.RateLimitMiddleware(_wsgi_ok, rec, key=header("X-API-Key"))
        codes = [wsgi_status(w, {"HTTP_X_API_KEY": v}) for v in values + values]
    assert codes == [200] * 102 + [429] * 102  # one bucket per value, however long
    assert max(len(str(k)) for k in rec.keys) == 71
    assert len(set(rec.keys)) == 102
    assert rec.keys[100:102] == ["header:short-key", "header:" + "é" * 64]
    assert all(str(k).startswith("header#") and len(str(k)) == 39 for k in rec.keys[:100])


def test_header_key_is_the_same_under_asgi_and_wsgi() -> None:
    value = "ü" + "k" * 200
    kf = header("X-API-Key")
    a = kf.asgi({"headers": [(b"x-api-key", value.encode("latin-1"))]})
    assert a == kf.wsgi({"HTTP_X_API_KEY": value}) == bounded("header", value)


def test_composite_key_is_bounded() -> None:
    kf = (client_address(trusted_proxies="unix:"), header("X-API-Key"), route())
    rec = Recorder(_Always())
    mw = wsgi.RateLimitMiddleware(_wsgi_ok, rec, key=kf, routes=[Route("/api/*")])
    environ = {
        "REMOTE_ADDR": "",
        "HTTP_X_FORWARDED_FOR": "garbage" * 1000 + ", " + "2001:db8:1:2:3:4:5:6%" + "z" * 30,
        "HTTP_X_API_KEY": "k" * 100_000,
        "PATH_INFO": "/api/" + "p" * 100_000,
    }
    wsgi_status(mw, environ)
    assert rec.keys == [f"2001:db8:1:2::/64\nheader#{bounded('header', 'k' * 100_000)[7:]}\n/api/*"]


class _Always:
    """A keyed limiter that admits everything (only keys matter here)."""

    capacity = 1
    rate = 1.0
    keyed = True

    def check(self, key: Hashable, cost: int = 1) -> Any:
        class D:
            allowed = True
            remaining = 1
            reset_after_ns = 0
            limit = 1

        return D()


# --------------------------------------------------------------- non-ASCII paths


def _starlette_cafe() -> Starlette:
    async def ok(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(routes=[StarletteRoute("/café", ok), StarletteRoute("/", ok)])


def _flask_cafe() -> Flask:
    app = Flask("nanobucket_keys")
    app.add_url_rule("/café", "cafe", lambda: "ok")
    app.add_url_rule("/", "index", lambda: "ok")
    return app


def test_non_ascii_route_asgi(impl: ModuleType, clock: Any) -> None:
    default = impl.KeyedTokenBucket(rate=1, capacity=10, clock=clock)
    strict = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    app = asgi.RateLimitMiddleware(_starlette_cafe(), default, routes=[Route("/café", strict)])

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return [await c.get(p) for p in ("/café", "/caf%C3%A9", "/café", "/")]

    r = asyncio.run(run())
    assert [x.status_code for x in r] == [200, 200, 429, 200]
    assert r[0].text == "ok"
    assert r[0].headers["ratelimit-policy"] == '"/caf%C3%A9";q=2;w=2'
    assert r[2].json()["detail"] == "Rate limit '/caf%C3%A9' exceeded; retry after 1 s."
    assert r[3].headers["ratelimit"] == '"default";r=9;t=1'


def test_non_ascii_route_wsgi(impl: ModuleType, clock: Any) -> None:
    default = impl.KeyedTokenBucket(rate=1, capacity=10, clock=clock)
    strict = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    app = _flask_cafe()
    app.wsgi_app = wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, default, routes=[Route("/café", strict)], key=(client_address(), route())
    )
    c = app.test_client()
    r = [c.get(p) for p in ("/café", "/caf%C3%A9", "/café", "/")]
    assert [x.status_code for x in r] == [200, 200, 429, 200]
    assert r[0].text == "ok"
    assert r[0].headers["RateLimit-Policy"] == '"/caf%C3%A9";q=2;w=2'
    assert strict.tokens_at("127.0.0.1\n/café", clock.now) == 0.0
    assert default.tokens_at("127.0.0.1\n*", clock.now) == 9.0


@pytest.mark.parametrize(
    ("path_info", "pattern"),
    [
        ("/caf\xc3\xa9", "/café"),  # PEP 3333: the UTF-8 bytes, decoded as latin-1
        ("/caf\xc3\xa9/x", "/café/*"),
        ("/€", "/€"),  # not latin-1: a server that decoded it already
        ("/caf\xe9", "*"),  # latin-1 bytes on the wire: not UTF-8, not the route
        ("/\xe2\x82\xac", "/€"),
    ],
)
def test_wsgi_path_decoding(impl: ModuleType, path_info: str, pattern: str) -> None:
    mw = wsgi.RateLimitMiddleware(
        _wsgi_ok,
        impl.KeyedTokenBucket(rate=1, capacity=5),
        routes=[Route("/café"), Route("/café/*"), Route("/€")],
    )
    environ: dict[str, Any] = {"PATH_INFO": path_info, "REMOTE_ADDR": "1.2.3.4"}
    wsgi_status(mw, environ)
    assert environ["nanobucket.route"] == pattern


def test_policy_names() -> None:
    limiter = _Always()
    mw: Any
    for mw in (asgi.RateLimitMiddleware, wsgi.RateLimitMiddleware):
        # A name given for a route must fit a header field as it stands.
        with pytest.raises(ValueError, match="printable ASCII"):
            mw(_wsgi_ok, limiter, routes=[Route("/café", limiter, name="café")])
        with pytest.raises(ValueError, match="printable ASCII"):
            mw(_wsgi_ok, limiter, name='a"b')
        ok = mw(_wsgi_ok, limiter, routes=[Route('/a"b\\c d%', limiter)])
        assert ok._gate.router.exact['/a"b\\c d%'][0][1].policy.name == "/a%22b%5Cc%20d%25"


# ---------------------------------------------------------------- HEAD and OPTIONS


def test_head_and_options_are_charged_by_default(impl: ModuleType, clock: Any) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=3, clock=clock)
    a = asgi.RateLimitMiddleware(_asgi_ok, limiter)
    w = wsgi.RateLimitMiddleware(_wsgi_ok, limiter)
    peer = "1.2.3.4"
    codes = [
        asgi_status(a, asgi_scope(peer, method="HEAD")),
        wsgi_status(w, wsgi_environ(peer, REQUEST_METHOD="OPTIONS")),
        asgi_status(a, asgi_scope(peer, method="OPTIONS")),
        wsgi_status(w, wsgi_environ(peer, REQUEST_METHOD="HEAD")),
    ]
    assert codes == [200, 200, 200, 429]


@pytest.mark.parametrize("side", ["asgi", "wsgi"])
def test_route_methods(impl: ModuleType, clock: Any, side: str) -> None:
    default = impl.KeyedTokenBucket(rate=1, capacity=100, clock=clock)
    strict = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    files = impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock)
    probe = impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock)
    routes = [
        Route("/search", strict, methods=["get", "post"], name="search"),  # HEAD too, not OPTIONS
        Route("/files/*", files, methods={"GET"}, name="files"),
        Route("/files/*", probe, methods={"HEAD"}, name="probe"),  # names HEAD: its own rule
    ]
    if side == "asgi":
        a = asgi.RateLimitMiddleware(_asgi_ok, default, routes=routes)

        def status(method: str, path: str) -> int:
            return asgi_status(a, asgi_scope("1.2.3.4", method=method, path=path))
    else:
        w = wsgi.RateLimitMiddleware(_wsgi_ok, default, routes=routes)

        def status(method: str, path: str) -> int:
            return wsgi_status(w, wsgi_environ("1.2.3.4", REQUEST_METHOD=method, PATH_INFO=path))

    # HEAD cannot dodge the GET rule: the app answers it with the GET handler.
    assert [status("HEAD", "/search"), status("GET", "/search"), status("HEAD", "/search")] == [
        200,
        200,
        429,
    ]
    # OPTIONS is not in the rule: the default limiter charges it.
    assert [status("OPTIONS", "/search") for _ in range(3)] == [200, 200, 200]
    assert default.tokens_at("1.2.3.4", clock.now) == 97.0
    assert [status("GET", "/files/a"), status("HEAD", "/files/a"), status("HEAD", "/files/b")] == [
        200,
        200,
        429,
    ]
    assert [status("GET", "/files/b"), status("POST", "/files/b")] == [429, 200]  # POST: default
    assert default.tokens_at("1.2.3.4", clock.now) == 96.0


def test_exempt_options_route(impl: ModuleType, clock: Any) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock)
    mw = wsgi.RateLimitMiddleware(
        _wsgi_ok, limiter, routes=[Route("/*", exempt=True, methods={"OPTIONS"})]
    )
    codes = [wsgi_status(mw, wsgi_environ("1.2.3.4", REQUEST_METHOD="OPTIONS")) for _ in range(3)]
    codes += [wsgi_status(mw, wsgi_environ("1.2.3.4")) for _ in range(2)]
    assert codes == [200, 200, 200, 200, 429]
    assert mw.counters.snapshot()["exempt"] == 3


def test_cors_preflight_answered_outside_the_limiter(impl: ModuleType, clock: Any) -> None:
    # The README's recipe: CORS outermost answers preflights itself (the app
    # never sees them, no token is spent) and its headers reach a 429 too;
    # any other OPTIONS goes through the limiter and is charged.
    limiter = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    inner = asgi.RateLimitMiddleware(_starlette_cafe(), limiter)
    app = CORSMiddleware(inner, allow_origins=["https://a.example"], allow_methods=["*"])
    origin = {"Origin": "https://a.example"}
    preflight = {**origin, "Access-Control-Request-Method": "PUT"}

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app, client=("1.2.3.4", 1))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            out = [await c.options("/", headers=preflight) for _ in range(5)]
            out.append(await c.options("/", headers=origin))  # not a preflight
            out += [await c.get("/", headers=origin) for _ in range(2)]
            return out

    r = asyncio.run(run())
    assert [x.status_code for x in r] == [200] * 5 + [405, 200, 429]
    assert all("ratelimit" not in x.headers for x in r[:5])
    assert r[5].headers["ratelimit"] == '"default";r=1;t=1'
    assert r[7].headers["access-control-allow-origin"] == "https://a.example"
    assert inner.counters.snapshot()["admitted"] == 2


# ---------------------------------------------------------------- properties

# What a client may write in X-Forwarded-For: addresses of every form, with
# ports, brackets, zones, garbage and separators.
_entry = st.one_of(
    st.ip_addresses().map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]:{443}"),
    st.ip_addresses(v=4).map(lambda a: f"::ffff:{a}"),
    st.ip_addresses(v=6).map(lambda a: f"{a}%" + "z" * 3),
    st.text(alphabet=" ,:[]%.0123456789abcdefx", max_size=30),
)
_forged = st.lists(_entry, max_size=20).map(", ".join)


# Any address but a trusted proxy's.
_is_trusted = client_address(trusted_proxies=TRUSTED)._is_trusted
_untrusted = st.ip_addresses().filter(lambda a: not _is_trusted(a)).map(str)


@fuzz(300)
@given(forged=_forged, peer=_untrusted)
def test_untrusted_peer_key_is_its_own_whatever_it_writes(forged: str, peer: str) -> None:
    kf = client_address(trusted_proxies=TRUSTED)
    assert kf.wsgi(wsgi_environ(peer, forged)) == client_address().wsgi(wsgi_environ(peer))


@fuzz(300)
@given(forged=_forged, attacker=_untrusted)
def test_behind_an_appending_proxy_the_key_is_the_attackers(forged: str, attacker: str) -> None:
    kf = client_address(trusted_proxies=TRUSTED)
    key = kf.asgi(asgi_scope("10.0.0.1", f"{forged}, {attacker}"))
    assert key == client_address().wsgi(wsgi_environ(attacker))


@fuzz(300)
@given(xff=_forged, peer=st.one_of(st.just(""), st.ip_addresses().map(str)))
def test_address_keys_are_short(xff: str, peer: str) -> None:
    kf = client_address(trusted_proxies=[*TRUSTED, "unix:"])
    assert len(kf.wsgi(wsgi_environ(peer, xff))) <= 39  # a full IPv6 address at most


@fuzz(300)
@given(value=st.text(min_size=1, max_size=300))
def test_header_keys_are_short(value: str) -> None:
    key = header("X-API-Key").wsgi({"HTTP_X_API_KEY": value})
    if len(value) <= 64:
        assert key == "header:" + value
    else:
        assert (
            key
            == "header#"
            + hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
        )
