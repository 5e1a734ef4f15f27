"""The gate reads a request as the application under it does: a differential suite.

For every framework (`reading_adapters`), requests are generated (method
spellings, path forms, repeated / empty / huge key headers, mounts and root
paths) and sent to one small app behind the framework's nanobucket gate.
For every request the app dispatched to a handler:

* the rule the gate chose is the rule configured for that handler's route
  (by the method the handler saw), and an exempt rule never reaches a
  handler that is not exempt;
* the key is ``bounded("header", value)`` of the ``X-API-Key`` value the
  handler read through the framework's own API, or the address fallback
  when it read none.

Then the regression tests of the holes this suite is about, by what they
prove, and the divergences it found that the gate leaves open (strict
xfails, left out of the property by `open_divergence`).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from fractions import Fraction
from types import ModuleType
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client as DjangoClient
from django.test import override_settings
from django.urls import path
from fastapi import Depends, FastAPI, Security
from fastapi.security import APIKeyHeader
from flask import Flask
from flask import request as flask_request
from hypothesis import assume, example, given
from hypothesis import strategies as st
from litestar import Litestar
from litestar import route as litestar_route
from quart import Quart
from quart import request as quart_request
from reading_adapters import (
    API_KEY,
    EXPECTED,
    FALLBACK,
    MOUNTED,
    ROOT,
    Adapter,
    ASGIDriver,
    Seen,
    URLConf,
    WerkzeugServer,
    WerkzeugServerAdapter,
    adapters,
    not_found,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount
from starlette.routing import Route as StarletteRoute
from werkzeug.middleware.dispatcher import DispatcherMiddleware
from werkzeug.middleware.proxy_fix import ProxyFix
from werkzeug.test import Client as WerkzeugClient

from nanobucket._http import Route, bounded, header
from nanobucket.asgi import RateLimitMiddleware
from nanobucket.fastapi import RateLimit, RateLimited, rate_limited_handler
from nanobucket.wsgi import RateLimitMiddleware as WSGIMiddleware

from fuzz_values import fuzz
from http_checks import MakeClient, asgi_client

__all__ = ("asgi_client",)  # a fixture, used by name

# Other threads run here (Litestar's logging listener, werkzeug's server), and
# a collection in one of them traverses the C tables: under Cython line tracing
# the GIL can pass to it in the middle of a table's insertion (a coverage run
# segfaulted so). Deselected there (.ci/coverage.sh); run everywhere else.
pytestmark = pytest.mark.gil_atomic

# ----------------------------------------------------------------- strategies

# Method spellings: the routes' own (most often, so most requests reach a
# handler) and their case variants, and methods no route takes.
METHODS = st.sampled_from(
    [
        *("GET", "GET", "GET", "POST", "POST", "POST", "HEAD"),
        *("get", "Get", "gEt", "post", "Post", "pOsT", "head", "hEAD"),
        *("PUT", "put", "DELETE", "OPTIONS", "options", "PATCH"),
    ]
)

# A route's path, as a client may dress it: something before it (a path the
# app serves, dot segments, "//", the root path's or the mount's text), its
# letters encoded or upper-cased, something after it (a slash, dot segments,
# a ";" parameter, a query, a fragment, unicode, bytes that are not UTF-8),
# and the other request-target forms (relative, absolute) a server may pass
# on as sent. Each part is most often left out.
BASES = st.sampled_from(["/login", "/items/a", "/items/a/b", "/healthz", "/"])


def maybe(*parts: str) -> st.SearchStrategy[str]:
    return st.one_of(st.just(""), st.sampled_from(parts))


BEFORE = maybe("/items", "/x", "/.", "/x/..", "/%2e", "/", "/items/%2E%2E", "/items/")
INSIDE = maybe(ROOT, MOUNTED)  # the text of the root path or the mount, inside the path
AFTER = maybe("/", "/.", "/..", "//", ";x=1", "?next=/healthz", "#f", "%20", "/caf%C3%A9", "%FF")
SPELLING = maybe("encoded", "upper")
FORM = maybe("relative", "absolute")


def dressed(before: str, inside: str, base: str, spelling: str, after: str, form: str) -> str:
    if spelling == "encoded" and len(base) > 1:  # "/login" as "/%6Cogin"
        base = base[:1] + "%" + format(ord(base[1]), "02X") + base[2:]
    elif spelling == "upper":
        base = base.upper()
    target = before + inside + base + after
    if form == "relative":
        return target.lstrip("/") or "*"
    return "http://t" + target if form == "absolute" else target


DRESSED = st.builds(dressed, BEFORE, INSIDE, BASES, SPELLING, AFTER, FORM)
# Free-form paths from segments: the routes' own, dot segments, encoded
# slashes and letters, ";" parameters, unicode and empty ones ("//").
SEGMENTS = st.sampled_from(
    [
        *("login", "items", "healthz", "a", "b.c", "", ".", "..", "%2e", "%2E%2e", ".%2e", "api"),
        *("%2F", "login%2F", "items%2Fa", "%6Cogin", "%2Flogin", "LOGIN", "Healthz"),
        *("login;x=1", "healthz;", "items;a", "caf%C3%A9", "%C3%A9", "%FF", "%20", "login%00"),
    ]
)
FREE = st.builds(
    lambda segs, slash: "/" + "/".join(segs) + ("/" if slash else ""),
    st.lists(SEGMENTS, min_size=1, max_size=4),
    st.booleans(),
)
TARGETS = st.one_of(BASES, DRESSED, FREE)
KEY_VALUES = st.sampled_from(
    ["k1", "k2", "", "junk-1", "junk-2", "x" * 8192, "a, b", "k1,k2", "caf\xe9"]
)
# The key header's fields (none, one, repeated), its name spelled as clients may.
KEYS = st.lists(
    st.tuples(st.sampled_from(["X-API-Key", "x-api-key", "X_API_KEY"]), KEY_VALUES), max_size=3
)
MOUNT = st.integers(0, 4)  # an index into the adapter's mounts


def check_reading(adapter: Adapter, seen: Seen) -> None:
    """The shared property: what the gate chose is what the app dispatched and read."""
    if seen.handler is None:
        return  # the app answered itself (404, 405, a redirect): nothing was dispatched
    assert seen.status < 400, seen
    assert len(seen.events) + seen.exempt == 1, seen  # the gate decided it, once
    if adapter.routed:
        assert seen.method is not None
        chosen, expected = seen.chosen(), EXPECTED[seen.handler](seen.method)
        if expected == "exempt":
            # Defence in depth: a suspect path (dot segments, "//") may take
            # a stricter rule than the exempt handler's; never the reverse.
            assert chosen in ("exempt", "*"), (chosen, seen)
        else:
            assert chosen == expected, (seen.handler, seen.method, chosen, seen)
    if seen.events:
        key = bounded("header", seen.read) if seen.read else FALLBACK
        assert seen.events[0].key == key, (seen.read, seen.events[0].key)


# ------------------------------------------------------------------- adapters

ADAPTERS = [cls.name for cls in adapters()]


@pytest.fixture(params=ADAPTERS)
def adapter(request: pytest.FixtureRequest, impl: ModuleType) -> Iterator[Adapter]:
    """One framework's app behind its gate (see `reading_adapters`)."""
    made = next(cls for cls in adapters() if cls.name == request.param)(impl)
    yield made
    made.close()


@pytest.fixture(scope="module")
def werkzeug_server() -> Iterator[WerkzeugServer]:
    """Werkzeug's own server, once for the module (its app is swapped per test)."""
    server = WerkzeugServer()
    yield server
    server.close()


# The known holes, always tried: a lower-case method (Werkzeug routes it
# upper-cased), a repeated key header (Starlette reads the first field), a
# mount or root path above the app.
KNOWN = [
    ("post", "/login", [(API_KEY, "k1")], 0),
    ("POST", "/login", [(API_KEY, "k1"), (API_KEY, "junk-1")], 0),
    ("POST", "/login", [(API_KEY, "k1")], 1),
    ("POST", "/login", [(API_KEY, "k1")], 2),
    ("GET", "/items/a", [(API_KEY, "k1"), (API_KEY, "junk-2")], 3),
]


def open_divergence(adapter: Adapter, target: str, mount: str) -> str | None:
    """The divergence, found by this suite, that the gate does not close yet and
    *target* would meet, else None; each has a strict xfail test below (it
    fails once the gate closes it: then its line goes here)."""
    path = urllib.parse.unquote(target.partition("?")[0].partition("#")[0])
    if adapter.name == "litestar" and mount == "unprefixed_root_path" and ROOT in path:
        return "the root path's text inside a path without it: Litestar cuts the path there"
    return None


def _examples(test: Any) -> Any:
    for method, target, keys, mount in KNOWN:
        test = example(method=method, target=target, keys=keys, mount=mount)(test)
    return test


@_examples
@fuzz(600)
@given(method=METHODS, target=TARGETS, keys=KEYS, mount=MOUNT)
def test_gate_reads_the_request_as_the_app(
    adapter: Adapter, method: str, target: str, keys: list[tuple[str, str]], mount: int
) -> None:
    where = adapter.mounts[mount % len(adapter.mounts)]
    assume(open_divergence(adapter, target, where) is None)
    check_reading(adapter, adapter.send(method, target, keys, where))


@_examples
@fuzz(150)
@given(method=METHODS, target=TARGETS, keys=KEYS, mount=MOUNT)
def test_gate_reads_the_request_as_flask_on_werkzeugs_server(
    impl: ModuleType,
    werkzeug_server: WerkzeugServer,
    method: str,
    target: str,
    keys: list[tuple[str, str]],
    mount: int,
) -> None:
    adapter = WerkzeugServerAdapter(impl, werkzeug_server)
    where = adapter.mounts[mount % len(adapter.mounts)]
    assume(open_divergence(adapter, target, where) is None)
    try:
        seen = adapter.send(method, target, keys, where)
    finally:
        adapter.close()
    check_reading(adapter, seen)


ROUTES = [("login", "POST", "/login"), ("items", "GET", "/items/a"), ("healthz", "GET", "/healthz")]
ROUTES += [("root", "GET", "/")]


def test_every_adapter_dispatches_each_handler(adapter: Adapter) -> None:
    # The property compares only dispatched requests: each handler must be reachable.
    got = {h: adapter.send(method, target, [(API_KEY, "k1")], "") for h, method, target in ROUTES}
    assert {h: s.handler for h, s in got.items()} == {h: h for h in got}
    keys = [e.key for s in got.values() for e in s.events]
    if adapter.routed:
        assert {h: s.chosen() for h, s in got.items()} == {
            "login": "/login",
            "items": "/items/*",
            "healthz": "exempt",
            "root": "*",
        }
        assert keys == ["header:k1"] * 3
    else:
        assert keys == ["header:k1"] * 4


# ---------------------------------------------------------------- regressions
# A strict rule over a lenient default; rates of one token a minute on an
# injected clock that never moves: the counts are exact.

PER_MINUTE = Fraction(1, 60)


def strict_and_lenient(impl: ModuleType, clock: Any, capacity: int) -> tuple[Any, Any]:
    """(a strict limiter of *capacity*, a lenient default): one token a minute."""
    strict = impl.KeyedTokenBucket(rate=PER_MINUTE, capacity=capacity, clock=clock)
    return strict, impl.KeyedTokenBucket(rate=100, capacity=1000, clock=clock)


def flask_login(impl: ModuleType, clock: Any, capacity: int, runs: list[str]) -> Flask:
    """Flask with ``POST /login`` (it appends to *runs*) behind the WSGI middleware,
    ``Route("/login", methods={"POST"})`` holding *capacity*."""
    app = Flask("nanobucket_login")

    @app.route("/login", methods=["POST"])
    def login() -> str:
        runs.append(flask_request.method)
        return "login"

    strict, lenient = strict_and_lenient(impl, clock, capacity)
    routes = [Route("/login", strict, methods={"POST"})]
    app.wsgi_app = WSGIMiddleware(app.wsgi_app, lenient, routes=routes)  # type: ignore[method-assign]
    return app


def test_flask_lower_case_post_takes_the_post_rule(impl: ModuleType, clock: Any) -> None:
    # Werkzeug routes "post" as POST: the login view is bound by the POST rule.
    runs: list[str] = []
    c = flask_login(impl, clock, 3, runs).test_client()
    lower = {"REQUEST_METHOD": "post"}
    got = [c.open("/login", method="POST", environ_overrides=lower) for _ in range(50)]
    assert [r.status_code for r in got] == [200] * 3 + [429] * 47
    assert runs == ["POST"] * 3
    assert got[3].headers["ratelimit-policy"] == '"/login";q=3;w=180'


def test_flask_lower_case_post_takes_the_post_rule_on_werkzeugs_server(
    impl: ModuleType, clock: Any, werkzeug_server: WerkzeugServer
) -> None:
    runs: list[str] = []
    werkzeug_server.app = flask_login(impl, clock, 3, runs)
    try:
        got = [werkzeug_server.request("post", "/login", []) for _ in range(10)]
    finally:
        werkzeug_server.app = not_found
    assert got == [200] * 3 + [429] * 7
    assert runs == ["POST"] * 3


def repeated_keys(n: int) -> list[tuple[str, str]]:
    """The fields of a client that repeats its key header with junk after its own key."""
    return [("X-API-Key", "k1"), ("X-API-Key", f"junk-{n}")]


def test_repeated_key_header_is_keyed_on_the_first_field_as_starlette_reads_it(
    impl: ModuleType, clock: Any, asgi_client: MakeClient
) -> None:
    served: list[str] = []

    async def whoami(request: Request) -> PlainTextResponse:
        served.append(request.headers["x-api-key"])
        return PlainTextResponse("ok")

    limiter = impl.KeyedTokenBucket(rate=PER_MINUTE, capacity=5, clock=clock)
    app = RateLimitMiddleware(
        Starlette(routes=[StarletteRoute("/", whoami)]), limiter, key=header("X-API-Key")
    )
    c = asgi_client(app)
    got = [c.get("/", headers=repeated_keys(n)).status_code for n in range(20)]
    assert got == [200] * 5 + [429] * 15
    assert served == ["k1"] * 5
    assert limiter.tokens_at("header:k1", clock.now) == 0.0


def test_repeated_key_header_is_keyed_on_the_first_field_as_api_key_header_reads_it(
    impl: ModuleType, clock: Any, asgi_client: MakeClient
) -> None:
    served: list[str] = []
    limiter = impl.KeyedTokenBucket(rate=PER_MINUTE, capacity=5, clock=clock)
    limit = RateLimit(limiter, key=header("X-API-Key"))
    app = FastAPI(exception_handlers={RateLimited: rate_limited_handler})
    api_key = APIKeyHeader(name="X-API-Key")

    @app.get("/", dependencies=[Depends(limit)])
    async def whoami(key: str = Security(api_key)) -> str:
        served.append(key)
        return "ok"

    c = asgi_client(app)
    got = [c.get("/", headers=repeated_keys(n)).status_code for n in range(20)]
    assert got == [200] * 5 + [429] * 15
    assert served == ["k1"] * 5
    assert limiter.tokens_at("header:k1", clock.now) == 0.0


def starlette_login(impl: ModuleType, clock: Any, runs: list[str]) -> Any:
    """Starlette's ``POST /login`` behind the middleware, ``Route("/login")`` holding 2."""

    async def login(request: Request) -> PlainTextResponse:
        runs.append(request.url.path)
        return PlainTextResponse("login")

    strict, lenient = strict_and_lenient(impl, clock, 2)
    inner = Starlette(routes=[StarletteRoute("/login", login, methods=["POST"])])
    return RateLimitMiddleware(inner, lenient, routes=[Route("/login", strict)])


def test_route_rule_holds_below_a_starlette_mount(
    impl: ModuleType, clock: Any, asgi_client: MakeClient
) -> None:
    runs: list[str] = []
    app = Starlette(routes=[Mount("/v1", app=starlette_login(impl, clock, runs))])
    got = [asgi_client(app).post("/v1/login").status_code for _ in range(6)]
    assert got == [200, 200, 429, 429, 429, 429]
    assert runs == ["/v1/login"] * 2


def test_route_rule_holds_under_a_servers_root_path(
    impl: ModuleType, clock: Any, asgi_client: MakeClient
) -> None:
    runs: list[str] = []
    c = asgi_client(starlette_login(impl, clock, runs), root_path="/api")
    got = [c.post("/api/login").status_code for _ in range(6)]
    assert got == [200, 200, 429, 429, 429, 429]
    assert runs == ["/api/login"] * 2


PEER_ENVIRON = {"REMOTE_ADDR": "127.0.0.1"}


def test_route_rule_holds_below_a_dispatcher_mount(impl: ModuleType, clock: Any) -> None:
    runs: list[str] = []
    app = DispatcherMiddleware(not_found, {"/v1": flask_login(impl, clock, 2, runs)})
    c = WerkzeugClient(app)
    got = [c.post("/v1/login", environ_overrides=PEER_ENVIRON).status_code for _ in range(6)]
    assert got == [200, 200, 429, 429, 429, 429]
    assert runs == ["POST"] * 2


def test_client_set_forwarded_prefix_chooses_no_rule(impl: ModuleType, clock: Any) -> None:
    # ProxyFix(x_prefix=1) puts the client's X-Forwarded-Prefix into SCRIPT_NAME;
    # Flask routes PATH_INFO, and so must the gate.
    runs: list[str] = []
    app = flask_login(impl, clock, 2, runs)
    app.wsgi_app = ProxyFix(app.wsgi_app, x_prefix=1)  # type: ignore[method-assign]
    c = app.test_client()
    got = [
        c.post("/login", headers={"X-Forwarded-Prefix": f"/x-{n}"}).status_code for n in range(20)
    ]
    assert got == [200, 200] + [429] * 18
    assert runs == ["POST"] * 2


def django_login(impl: ModuleType, clock: Any, runs: list[str]) -> Any:
    """Settings with one view at ``login`` behind the nanobucket middleware,
    ``Route("/login")`` holding 2."""

    def login(request: HttpRequest) -> HttpResponse:
        runs.append(request.path)
        return HttpResponse("login")

    strict, lenient = strict_and_lenient(impl, clock, 2)
    return override_settings(
        ROOT_URLCONF=URLConf([path("login", login)]),
        MIDDLEWARE=["nanobucket.django.RateLimitMiddleware"],
        NANOBUCKET={"limiter": lenient, "routes": [Route("/login", strict)]},
    )


def test_route_rule_holds_below_djangos_script_name(impl: ModuleType, clock: Any) -> None:
    runs: list[str] = []
    with django_login(impl, clock, runs):
        c = DjangoClient()
        got = [c.post("/login", SCRIPT_NAME="/app").status_code for _ in range(6)]
    assert got == [200, 200, 429, 429, 429, 429]
    assert runs == ["/app/login"] * 2


def test_route_rule_holds_below_djangos_force_script_name(impl: ModuleType, clock: Any) -> None:
    runs: list[str] = []
    with django_login(impl, clock, runs), override_settings(FORCE_SCRIPT_NAME="/app"):
        c = DjangoClient()
        got = [c.post("/login").status_code for _ in range(6)]
    assert got == [200, 200, 429, 429, 429, 429]
    assert runs == ["/app/login"] * 2


# ------------------------------------------ found by the differential suite


@pytest.mark.parametrize("target", ["http://t/login", "login;x=1"])
def test_quart_target_not_starting_with_a_slash_takes_the_rule_of_its_path(
    impl: ModuleType, clock: Any, target: str
) -> None:
    # hypercorn (Quart's server) and uvicorn's h11 pass "POST http://t/login"
    # on with scope["path"] "http://t/login"; Quart routes urlparse(path).path,
    # /login (urlparse, not urlsplit: "login;x=1" is "login" with a parameter).
    runs: list[str] = []
    app = Quart("nanobucket_absolute")

    @app.route("/login", methods=["POST"])
    async def login() -> str:
        runs.append(quart_request.path)
        return "login"

    strict, lenient = strict_and_lenient(impl, clock, 2)
    asgi: Any = app  # Quart's own ASGI types, narrower than the middleware's
    driver = ASGIDriver(RateLimitMiddleware(asgi, lenient, routes=[Route("/login", strict)]))
    try:
        got = [driver.call("POST", target, [], "") for _ in range(6)]
    finally:
        driver.close()
    assert runs[:1] == ["/login"]
    assert got == [200, 200, 429, 429, 429, 429]


def test_relative_target_with_a_dot_segment_takes_the_prefix_rule(
    impl: ModuleType, clock: Any, werkzeug_server: WerkzeugServer
) -> None:
    # Werkzeug's server passes "GET items/a/. HTTP/1.1" on as PATH_INFO
    # "items/a/.", and Flask serves it from /items/<path:p>.
    runs: list[str] = []
    app = Flask("nanobucket_relative")

    @app.route("/items/<path:p>")
    def items(p: str) -> str:
        runs.append(p)
        return "items"

    strict, lenient = strict_and_lenient(impl, clock, 2)
    app.wsgi_app = WSGIMiddleware(app.wsgi_app, lenient, routes=[Route("/items/*", strict)])  # type: ignore[method-assign]
    werkzeug_server.app = app
    try:
        got = [werkzeug_server.request("GET", "items/a/.", []) for _ in range(6)]
    finally:
        werkzeug_server.app = not_found
    assert runs[:1] == ["a/."]
    assert got == [200, 200, 429, 429, 429, 429]


def test_root_path_text_inside_an_unprefixed_path_is_read_whole(
    impl: ModuleType, clock: Any
) -> None:
    # hypercorn and daphne leave the root path out of scope["path"]; Starlette
    # then routes /items/api/healthz whole, from /items/{p:path}: not exempt.
    runs: list[str] = []

    async def items(request: Request) -> PlainTextResponse:
        runs.append(request.path_params["p"])
        return PlainTextResponse("items")

    async def healthz(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    routes = [StarletteRoute("/items/{p:path}", items), StarletteRoute("/healthz", healthz)]
    limiter = impl.KeyedTokenBucket(rate=PER_MINUTE, capacity=2, clock=clock)
    app = RateLimitMiddleware(Starlette(routes=routes), limiter, exempt=["/healthz"])
    driver = ASGIDriver(app)
    try:
        got = [driver.call("GET", "/items/api/healthz", [], "/api", False) for _ in range(4)]
    finally:
        driver.close()
    assert runs[:1] == ["api/healthz"]
    assert got == [200, 200, 429, 429]


# ------------------------------------------- divergences the gate leaves open
# Found by the property above; each is a strict xfail until the gate closes
# it (then it passes, fails as XPASS, and its line in `open_divergence` goes).


@pytest.mark.xfail(strict=True, reason="Litestar cuts the path at the root path's text")
def test_litestar_root_path_text_inside_an_unprefixed_path_takes_the_rule_it_serves(
    impl: ModuleType, clock: Any
) -> None:
    # Under hypercorn or daphne (the root path left out of scope["path"]),
    # Litestar serves POST /x/api/login from its /login route.
    runs: list[str] = []

    @litestar_route("/login", http_method=["POST"], status_code=200)
    async def login() -> str:
        runs.append("login")
        return "login"

    strict, lenient = strict_and_lenient(impl, clock, 2)
    app: Any = Litestar(route_handlers=[login], openapi_config=None)  # its own ASGI types
    driver = ASGIDriver(RateLimitMiddleware(app, lenient, routes=[Route("/login", strict)]))
    try:
        got = [driver.call("POST", "/x/api/login", [], "/api", False) for _ in range(6)]
    finally:
        driver.close()
    assert runs[:1] == ["login"]
    assert got == [200, 200, 429, 429, 429, 429]


def test_quart_absolute_form_target_under_a_root_path_takes_the_rule_it_serves(
    impl: ModuleType, clock: Any
) -> None:
    # hypercorn --root-path /api passes "GET http://t/api/items/a" on with
    # scope["path"] "http://t/api/items/a"; Quart takes its path, strips the
    # root path and serves /items/<path:p>.
    runs: list[str] = []
    app = Quart("nanobucket_absolute_root")

    @app.route("/items/<path:p>")
    async def items(p: str) -> str:
        runs.append(p)
        return "items"

    strict, lenient = strict_and_lenient(impl, clock, 2)
    asgi: Any = app  # Quart's own ASGI types, narrower than the middleware's
    driver = ASGIDriver(RateLimitMiddleware(asgi, lenient, routes=[Route("/items/*", strict)]))
    try:
        got = [driver.call("GET", "http://t/api/items/a", [], "/api", False) for _ in range(6)]
    finally:
        driver.close()
    assert runs[:1] == ["a"]
    assert got == [200, 200, 429, 429, 429, 429]
