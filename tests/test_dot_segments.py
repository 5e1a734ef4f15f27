"""Paths with dot segments or ``//``: the rule is that of the path the app routes.

uvicorn and gunicorn hand a path over percent-decoded (``%2e%2e`` is ``..``,
``%2F`` is ``/``) with its dot segments, and Starlette, Flask and Django
route it as it is: a ``/files/{p:path}`` route serves ``/files/../healthz``.
Such a request must take the rule of ``/files/*`` (or the default), never
that of the exempt ``/healthz``. Werkzeug routes ``//login`` as ``/login``,
so a run of ``/`` counts as one; and a path with a dot segment or ``//``
never takes an exempt rule.

The in-process ASGI client is httpx's ``ASGITransport``: it resolves a
literal ``..`` itself, but passes ``%2e%2e`` on decoded, as uvicorn does.
"""

from __future__ import annotations

import socket
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from django.test import Client as DjangoClient
from django.test import override_settings
from flask import Flask
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route as StarletteRoute
from test_http_servers import ONE_PER_HOUR, Server, gunicorn, uvicorn

import nanobucket as nb
from nanobucket._http import Counters, Route, suspect_path
from nanobucket.asgi import RateLimitMiddleware
from nanobucket.wsgi import RateLimitMiddleware as WSGIMiddleware

from http_checks import MakeClient, asgi_client, counts

__all__ = ("asgi_client",)  # a fixture, used by name

# The package under test, for the servers' processes (they run in tests/apps).
SRC = str(Path(nb.__file__).resolve().parent.parent)


async def _files(request: Request) -> PlainTextResponse:
    return PlainTextResponse("files:" + request.path_params["p"])


async def _api(request: Request) -> PlainTextResponse:
    return PlainTextResponse("api:" + request.path_params["p"])


async def _page(request: Request) -> PlainTextResponse:
    return PlainTextResponse("page:" + request.path_params["p"])


async def _healthz(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


def starlette_app(catch_all: bool = False) -> Starlette:
    routes = [
        StarletteRoute("/files/{p:path}", _files),
        StarletteRoute("/api/{p:path}", _api),
        StarletteRoute("/healthz", _healthz),
    ]
    if catch_all:  # a single-page app's fallback, after the others
        routes.append(StarletteRoute("/{p:path}", _page))
    return Starlette(routes=routes)


# ------------------------------------------------------------------ Starlette


def test_starlette_dot_dot_is_not_the_exempt_route(
    impl: ModuleType, clock: Any, asgi_client: MakeClient
) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    app = RateLimitMiddleware(starlette_app(), limiter, exempt=["/healthz"])
    c = asgi_client(app)
    first = [c.get("/files/a").status_code for _ in range(4)]
    dotted = [c.get("/files/%2e%2e/healthz") for _ in range(20)]
    healthz = c.get("/healthz")
    assert first == [200, 200, 429, 429]
    # Served by /files/{p:path} (the app never resolves the dots): the same
    # client's empty bucket, 20 times.
    assert [r.status_code for r in dotted] == [429] * 20
    assert dotted[0].headers["ratelimit"] == '"default";r=0;t=2'
    assert (healthz.status_code, healthz.text) == (200, "ok")
    assert app.counters.snapshot() == counts(admitted=2, limited=22, shadow_limited=0, exempt=1)


def test_starlette_dot_dot_is_served_and_charged_as_files(
    impl: ModuleType, clock: Any, asgi_client: MakeClient
) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    app = RateLimitMiddleware(starlette_app(), limiter, exempt=["/healthz"])
    c = asgi_client(app)
    dotted = [c.get("/files/%2e%2e/healthz") for _ in range(4)]
    assert [r.status_code for r in dotted] == [200, 200, 429, 429]
    assert dotted[0].text == "files:../healthz"
    assert [r.headers["ratelimit"] for r in dotted[:2]] == [
        '"default";r=1;t=1',
        '"default";r=0;t=2',
    ]
    assert app.counters.snapshot() == counts(admitted=2, limited=2, shadow_limited=0, exempt=0)


def test_starlette_prefix_rule_holds_below_its_prefix(
    impl: ModuleType, clock: Any, asgi_client: MakeClient
) -> None:
    # A strict /api/* over a lenient default: /api/../x is served by
    # /api/{p:path}, so it is /api/*'s, not the default's for /x.
    lenient = impl.KeyedTokenBucket(rate=1, capacity=100, clock=clock)
    strict = impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock)
    app = RateLimitMiddleware(starlette_app(), lenient, routes=[Route("/api/*", strict)])
    c = asgi_client(app)
    got = [c.get("/api/%2e%2e/x") for _ in range(50)]
    assert [r.status_code for r in got] == [200] + [429] * 49
    assert got[0].text == "api:../x"
    assert got[1].headers["ratelimit-policy"] == '"/api/*";q=1;w=1'
    assert strict.tokens_at("127.0.0.1", clock.now) == 0.0
    assert lenient.tokens_at("127.0.0.1", clock.now) == 100.0  # never charged


def test_starlette_catch_all_does_not_serve_exempt(
    impl: ModuleType, clock: Any, asgi_client: MakeClient
) -> None:
    # //healthz (sent as /%2Fhealthz) and /healthz/. are the catch-all's
    # pages in Starlette, not /healthz: charged by the default.
    limiter = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    app = RateLimitMiddleware(starlette_app(catch_all=True), limiter, exempt=["/healthz"])
    c = asgi_client(app)
    got = [c.get(path) for path in ("/%2Fhealthz", "/healthz/%2e", "/%2Fhealthz", "/healthz")]
    assert [(r.status_code, r.text) for r in got[:2]] == [
        (200, "page:/healthz"),
        (200, "page:healthz/."),
    ]
    assert [r.status_code for r in got] == [200, 200, 429, 200]
    assert app.counters.snapshot() == counts(admitted=2, limited=1, shadow_limited=0, exempt=1)


# ---------------------------------------------------------------------- Flask


def flask_app(limiter: object, **kwargs: Any) -> Flask:
    app = Flask("nanobucket_dots")

    @app.route("/files/<path:p>")
    def files(p: str) -> str:
        return "files:" + p

    @app.route("/healthz")
    def healthz() -> str:
        return "ok"

    @app.route("/login", methods=["GET", "POST"])
    def login() -> str:
        return "login"

    app.wsgi_app = WSGIMiddleware(app.wsgi_app, limiter, **kwargs)  # type: ignore[method-assign]
    return app


def test_flask_dot_dot_is_not_the_exempt_route(impl: ModuleType, clock: Any) -> None:
    counters = Counters()
    limiter = impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock)
    c = flask_app(limiter, exempt=["/healthz"], counters=counters).test_client()
    got = [c.get("/files/../healthz") for _ in range(4)]  # PATH_INFO as sent
    assert [r.status_code for r in got] == [200, 200, 429, 429]
    assert got[0].text == "files:../healthz"
    assert c.get("/healthz").status_code == 200
    assert counters.snapshot() == counts(admitted=2, limited=2, shadow_limited=0, exempt=1)


def test_flask_leading_slashes_are_one(impl: ModuleType, clock: Any) -> None:
    # A server decodes /%2Flogin into PATH_INFO //login, which Werkzeug
    # serves as /login: it takes /login's strict rule; //healthz is served
    # by /healthz but, a suspect path, is not exempt.
    lenient = impl.KeyedTokenBucket(rate=1, capacity=100, clock=clock)
    strict = impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock)
    counters = Counters()
    app = flask_app(
        lenient, exempt=["/healthz"], routes=[Route("/login", strict)], counters=counters
    )
    c = app.test_client()
    logins = [c.post("/%2Flogin") for _ in range(3)]
    health = c.get("/%2Fhealthz")
    assert [(r.status_code, r.text) for r in logins[:1]] == [(200, "login")]
    assert [r.status_code for r in logins] == [200, 429, 429]
    assert (health.status_code, health.text) == (200, "ok")
    assert health.headers.get("ratelimit") == '"default";r=99;t=1'
    assert counters.snapshot() == counts(admitted=2, limited=2, shadow_limited=0, exempt=0)


# --------------------------------------------------------------------- Django


def test_django_dot_dot_is_not_the_exempt_route() -> None:
    counters = Counters()
    limiter = nb.KeyedTokenBucket(rate=ONE_PER_HOUR, capacity=2)
    middleware = ["django_auth.HeaderUser", "nanobucket.django.RateLimitMiddleware"]
    config = {"limiter": limiter, "exempt": ["/bare"], "counters": counters}
    with override_settings(MIDDLEWARE=middleware, NANOBUCKET=config):
        client = DjangoClient()
        got = [client.get("/files/../bare") for _ in range(4)]
        bare = client.get("/bare")
    assert [r.status_code for r in got] == [200, 200, 429, 429]
    assert got[0].content == b"files:../bare"
    assert got[0].wsgi_request.META["nanobucket.route"] == "*"
    assert (bare.status_code, bare.content) == (200, b"bare")
    assert counters.snapshot() == counts(admitted=2, limited=2, shadow_limited=0, exempt=1)


# --------------------------------------------------------------------- Router


EXEMPT = True


@pytest.mark.parametrize(
    ("path", "method", "pattern", "exempt"),
    [
        ("/files/../healthz", "GET", "/files/*", False),
        ("/files/./x", "GET", "/files/*", False),
        ("/healthz/..", "GET", "*", False),  # below the exempt /healthz/*: not exempt
        ("/healthz/./x", "GET", "*", False),
        ("/./healthz/x", "GET", "*", False),
        ("/healthz/x/..", "HEAD", "*", False),
        ("/healthz/x/..", "POST", "/healthz/*", False),  # the rule that is not exempt
        ("/api/v1/../../admin", "GET", "/api/v1/*", False),  # served under /api/v1
        ("/api/..", "GET", "/api/*", False),
        ("//healthz/x", "GET", "*", False),
        ("//api//v1//x", "GET", "/api/v1/*", False),
        ("/healthz//", "GET", "*", False),
        ("/healthz/...", "GET", "/healthz/*", EXEMPT),  # "..." is a name, not a dot segment
        ("/healthz/.x", "GET", "/healthz/*", EXEMPT),
        ("/.well-known/x", "GET", "/.well-known/*", EXEMPT),
        ("/healthz/x", "GET", "/healthz/*", EXEMPT),
        ("/healthz/x", "POST", "/healthz/*", False),  # a rule naming the method goes first
        ("/api/v1/public/x", "GET", "/api/v1/public/*", EXEMPT),
        ("/api/v1/public/../x", "GET", "/api/v1/*", False),  # the next, shorter prefix
    ],
)
def test_router_match(impl: ModuleType, path: str, method: str, pattern: str, exempt: bool) -> None:
    limiter = impl.KeyedTokenBucket(rate=1, capacity=5)
    mw = RateLimitMiddleware(
        starlette_app(),
        limiter,
        exempt=["/healthz/*", "/.well-known/*", "/api/v1/public/*"],
        routes=[
            Route("/healthz/*", cost=2, methods={"POST"}),
            Route("/files/*", cost=3),
            Route("/api/*"),
            Route("/api/v1/*", cost=2),
        ],
    )
    rule = mw._gate.router.match(path, method)
    assert (rule.pattern, rule.exempt) == (pattern, exempt)


@pytest.mark.parametrize(
    ("path", "suspect"),
    [
        ("/", None),
        ("/a/b.c", None),
        ("/a/.b", None),
        ("/a/...", None),
        ("/.", "/."),
        ("/a/..", "/a/.."),
        ("/a/./b/", "/a/./b/"),
        ("//", "/"),
        ("///a////b", "/a/b"),
        ("/a//../b", "/a/../b"),
    ],
)
def test_suspect_path(path: str, suspect: str | None) -> None:
    assert suspect_path(path) == suspect


# --------------------------------------------------------------- real servers


def raw_get(port: int, target: bytes) -> tuple[int, bytes]:
    """Status and body of ``GET <target> HTTP/1.1``, sent byte for byte on a socket."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def dotted_then_healthz(server: Server) -> list[tuple[int, bytes]]:
    """Four ``GET /files/../healthz`` (the limiter holds 2), then ``GET /healthz``."""
    assert isinstance(server.port, int)
    got = [raw_get(server.port, b"/files/../healthz") for _ in range(4)]
    return [*got, raw_get(server.port, b"/healthz")]


def check_served_by_files(answers: list[tuple[int, bytes]]) -> None:
    assert [status for status, _ in answers] == [200, 200, 429, 429, 200]
    assert [body for _, body in answers[:2]] == [b"files:../healthz"] * 2


def test_uvicorn_dot_dot_is_not_the_exempt_route(tmp_path: Path) -> None:
    server = uvicorn(tmp_path, ONE_PER_HOUR, 2, env={"PYTHONPATH": SRC})
    try:
        check_served_by_files(dotted_then_healthz(server))
    finally:
        server.close()


def test_gunicorn_dot_dot_is_not_the_exempt_route(tmp_path: Path) -> None:
    server = gunicorn(tmp_path, {"NB_CAPACITY": "2", "PYTHONPATH": SRC})
    try:
        check_served_by_files(dotted_then_healthz(server))
    finally:
        server.close()
