"""One adapter per framework for the reading differential suite (``test_reading_differential``).

Each adapter builds one small app of four handlers behind the framework's
nanobucket gate (middleware, dependency or throttle), configured alike
(`gate_options`), and sends it one request at a time (`Adapter.send`). A
handler records what the framework made of the request (its name, the
method it saw, the ``X-API-Key`` value it read through the framework's own
API); the gate's choice is read from its ``on_decision`` hook (the rule's
pattern and the key) and its exempt counter. The suite compares the two.

The app's routes, in every framework:

* ``/login`` (GET and POST): the rule ``Route("/login", methods={"POST"})``,
  so a GET takes the default;
* ``/items/<path>``: the rule ``Route("/items/*")``;
* ``/healthz``: exempt;
* ``/``: the default rule.

A new framework joins the suite with an `Adapter` here and its name in
``test_reading_differential.ADAPTERS``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import traceback
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from aiohttp import web
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponse
from django.test import Client as DjangoClient
from django.test import override_settings
from django.urls import path
from fastapi import Depends, FastAPI, Security
from fastapi import Request as FastAPIRequest
from fastapi.security import APIKeyHeader
from flask import Flask
from flask import request as flask_request
from litestar import Litestar, get, route
from litestar import Request as LitestarRequest
from quart import Quart
from quart import request as quart_request
from rest_framework.response import Response as DRFResponse
from rest_framework.views import APIView
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount
from starlette.routing import Route as StarletteRoute
from werkzeug.middleware.dispatcher import DispatcherMiddleware
from werkzeug.middleware.proxy_fix import ProxyFix
from werkzeug.serving import make_server
from werkzeug.test import Client as WerkzeugClient

import nanobucket
from nanobucket._http import Counters, Route, header
from nanobucket.aiohttp import RateLimitMiddleware as AiohttpMiddleware
from nanobucket.asgi import RateLimitMiddleware
from nanobucket.django import NanobucketThrottle
from nanobucket.fastapi import RateLimit
from nanobucket.hooks import LimitEvent
from nanobucket.wsgi import RateLimitMiddleware as WSGIMiddleware

API_KEY = "X-API-Key"
PEER = "127.0.0.1"  # every client below calls from here: the key's fallback is its address
FALLBACK = "addr:" + PEER
ROOT = "/api"  # a server's root path (ASGI), SCRIPT_NAME (WSGI, Django) above the app
MOUNTED = "/v1"  # where a mount (Starlette's Mount, Werkzeug's DispatcherMiddleware) puts it
NANOBUCKET_SRC = os.path.dirname(nanobucket.__file__)  # the package under test
BIG = 1 << 30  # every limiter's capacity: no request is ever refused, every one is compared

#: The rule each handler's route has: the pattern the gate should choose for
#: a request the app dispatched to it (by the method the handler saw).
EXPECTED: dict[str, Callable[[str], str]] = {
    "login": lambda method: "/login" if method.upper() == "POST" else "*",
    "items": lambda method: "/items/*",
    "healthz": lambda method: "exempt",
    "root": lambda method: "*",
}


@dataclass
class Seen:
    """What one request did: in the app (handler, method, read) and in the gate (events, exempt)."""

    status: int = 0
    handler: str | None = None  # the handler that ran, None when the app answered itself
    method: str | None = None  # the method as the handler saw it
    read: str | None = None  # the X-API-Key value the handler read (None: none)
    events: list[LimitEvent] = field(default_factory=list)
    exempt: int = 0  # requests the gate counted exempt

    def chosen(self) -> str | None:
        """The rule the gate chose: its pattern, ``"exempt"``, or None when it chose none."""
        if self.exempt:
            return "exempt"
        return self.events[0].route if self.events else None


def gate_options(impl: Any, events: list[LimitEvent], counters: Counters) -> dict[str, Any]:
    """The gate's configuration, the same in every framework (one limiter per rule)."""

    def big() -> Any:
        return impl.KeyedTokenBucket(rate=1000, capacity=BIG, clock=lambda: 0)

    return {
        "limiter": big(),
        "key": header(API_KEY),
        "routes": [Route("/login", big(), methods={"POST"}), Route("/items/*", big())],
        "exempt": ["/healthz"],
        "on_decision": events.append,
        "counters": counters,
        "headers": "off",
    }


class Adapter:
    """A framework's app behind its gate, and how to send it a request.

    ``mounts`` names where the app can sit: ``""`` (at the root), ``"mount"``
    (Starlette ``Mount`` / Werkzeug ``DispatcherMiddleware`` at `MOUNTED`),
    ``"root_path"`` (an ASGI server's root path, `ROOT`), ``"mount+root_path"``
    (both), ``"unprefixed_root_path"`` (a root path left out of ``path``, as
    hypercorn and daphne give it), ``"proxyfix"`` (Werkzeug's ``ProxyFix(x_prefix=1)`` with a
    client-set ``X-Forwarded-Prefix``), ``"script_name"`` and
    ``"force_script_name"`` (Django under a ``SCRIPT_NAME``, or its setting).
    ``routed``: the gate chooses a rule by path and method (a middleware);
    False when it only keys (a FastAPI dependency, a DRF throttle).
    """

    name: ClassVar[str]
    mounts: ClassVar[tuple[str, ...]] = ("",)
    routed: ClassVar[bool] = True

    def __init__(self, impl: Any) -> None:
        self.events: list[LimitEvent] = []
        self.counters = Counters()
        self.options = gate_options(impl, self.events, self.counters)
        self.seen = Seen()

    def record(self, handler: str, method: str, read: str | None) -> None:
        """Called by a handler: what the framework handed it."""
        self.seen.handler, self.seen.method, self.seen.read = handler, method, read

    def send(self, method: str, target: str, keys: list[tuple[str, str]], mount: str) -> Seen:
        """Send one request: *target* is the request target (percent-encoded) below
        the mount, *keys* its key header fields (name, value)."""
        self.seen = seen = Seen()
        self.events.clear()
        exempt = self.counters.exempt
        seen.status = self.deliver(method, target, keys, mount)
        seen.events = list(self.events)
        seen.exempt = self.counters.exempt - exempt
        return seen

    def deliver(self, method: str, target: str, headers: list[tuple[str, str]], mount: str) -> int:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the adapter holds (an event loop, a server, settings)."""


# ---------------------------------------------------------------------- ASGI


class ASGIDriver:
    """Calls an ASGI app as uvicorn does: the method and the headers as sent, the path
    percent-decoded, a root path put in front of ``path`` and ``raw_path`` (uvicorn >= 0.26;
    hypercorn and daphne leave it out: *prefixed* False)."""

    def __init__(self, app: Any, lifespan: bool = True) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self._shutdown = asyncio.Event()
        self._started = self.loop.create_future()
        self._lifespan: asyncio.Task[None] | None = None
        if lifespan:  # as uvicorn's "auto": the app's startup runs first
            self._lifespan = self.loop.create_task(self._run_lifespan())
            self.loop.run_until_complete(self._started)

    async def _run_lifespan(self) -> None:
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "lifespan.startup"}
            await self._shutdown.wait()
            return {"type": "lifespan.shutdown"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"].startswith("lifespan.startup") and not self._started.done():
                self._started.set_result(message["type"])

        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        try:
            await self.app(scope, receive, send)
        finally:
            if not self._started.done():
                self._started.set_result("unsupported")

    def call(
        self,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        root: str,
        prefixed: bool = True,
    ) -> int:
        raw_path, _, query = target.encode("ascii").partition(b"?")
        path = urllib.parse.unquote(raw_path.decode("ascii"))
        prefix = root if prefixed else ""
        fields = [(b"host", b"test")]
        fields += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "server": ("127.0.0.1", 8000),
            "client": (PEER, 40000),
            "scheme": "http",
            "method": method,
            "root_path": root,
            "path": prefix + path,
            "raw_path": prefix.encode("ascii") + raw_path,
            "query_string": query,
            "headers": fields,
            "state": {},
        }
        return self.loop.run_until_complete(self._request(scope))

    async def _request(self, scope: dict[str, Any]) -> int:
        status = 0
        done = asyncio.Event()
        body_sent = False

        async def receive() -> dict[str, Any]:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await done.wait()  # as a server does: a disconnect only after the response
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                done.set()

        try:
            await self.app(scope, receive, send)
        except Exception as exc:
            # The app's own failure is a server's 500 (Quart fails on an empty
            # path); one raised inside nanobucket is the test's.
            if NANOBUCKET_SRC in traceback.extract_tb(exc.__traceback__)[-1].filename:
                raise
            return 500
        finally:
            done.set()
        return status

    def close(self) -> None:
        self._shutdown.set()
        if self._lifespan is not None:
            self.loop.run_until_complete(self._lifespan)
        self.loop.close()


class ASGIAdapter(Adapter):
    """An ASGI app behind `nanobucket.asgi.RateLimitMiddleware`, at the root, in a
    Starlette ``Mount`` or under a server's root path."""

    mounts: ClassVar[tuple[str, ...]] = (
        *("", "mount", "root_path", "mount+root_path", "unprefixed_root_path"),
    )

    def __init__(self, impl: Any) -> None:
        super().__init__(impl)
        inner = RateLimitMiddleware(self.build(), **self.options)
        self.plain = ASGIDriver(inner)
        mounted = RateLimitMiddleware(self.build(), **self.options)
        self.mounted = ASGIDriver(Starlette(routes=[Mount(MOUNTED, app=mounted)]))

    def build(self) -> Any:
        """The framework's app (without the gate)."""
        raise NotImplementedError

    def deliver(self, method: str, target: str, headers: list[tuple[str, str]], mount: str) -> int:
        root = ROOT if mount.endswith("root_path") else ""
        if mount.startswith("mount"):
            return self.mounted.call(method, MOUNTED + target, headers, root)
        return self.plain.call(method, target, headers, root, mount != "unprefixed_root_path")

    def close(self) -> None:
        self.plain.close()
        self.mounted.close()


class StarletteAdapter(ASGIAdapter):
    name = "starlette"

    def build(self) -> Any:
        def handler(name: str) -> Any:
            async def run(request: Request) -> PlainTextResponse:
                self.record(name, request.method, request.headers.get(API_KEY))
                return PlainTextResponse(name)

            return run

        return Starlette(
            routes=[
                StarletteRoute("/login", handler("login"), methods=["GET", "POST"]),
                StarletteRoute("/items/{p:path}", handler("items")),
                StarletteRoute("/healthz", handler("healthz")),
                StarletteRoute("/", handler("root")),
            ]
        )


def fastapi_app(adapter: Adapter, dependencies: list[Any]) -> Any:
    """The FastAPI app: each handler reads the key through ``APIKeyHeader``."""
    api_key = APIKeyHeader(name=API_KEY, auto_error=False)
    app = FastAPI(dependencies=dependencies)

    @app.api_route("/login", methods=["GET", "POST"])
    async def login(request: FastAPIRequest, key: str | None = Security(api_key)) -> str:
        adapter.record("login", request.method, key)
        return "login"

    @app.get("/items/{p:path}")
    async def items(request: FastAPIRequest, p: str, key: str | None = Security(api_key)) -> str:
        adapter.record("items", request.method, key)
        return "items"

    @app.get("/healthz")
    async def healthz(request: FastAPIRequest, key: str | None = Security(api_key)) -> str:
        adapter.record("healthz", request.method, key)
        return "healthz"

    @app.get("/")
    async def root(request: FastAPIRequest, key: str | None = Security(api_key)) -> str:
        adapter.record("root", request.method, key)
        return "root"

    return app


class FastAPIAdapter(ASGIAdapter):
    name = "fastapi"

    def build(self) -> Any:
        return fastapi_app(self, [])


class FastAPIDependencyAdapter(Adapter):
    """`nanobucket.fastapi.RateLimit` as the app's dependency: it keys, routing is FastAPI's."""

    name = "fastapi-dependency"
    mounts = ASGIAdapter.mounts
    routed = False

    def __init__(self, impl: Any) -> None:
        super().__init__(impl)
        options = {k: v for k, v in self.options.items() if k not in ("routes", "exempt")}
        limit = RateLimit(options.pop("limiter"), **options)
        self.plain = ASGIDriver(fastapi_app(self, [Depends(limit)]))
        inner = fastapi_app(self, [Depends(limit)])
        self.mounted = ASGIDriver(Starlette(routes=[Mount(MOUNTED, app=inner)]))

    deliver = ASGIAdapter.deliver
    close = ASGIAdapter.close


class LitestarAdapter(ASGIAdapter):
    name = "litestar"

    def build(self) -> Any:
        adapter = self

        @route("/login", http_method=["GET", "POST"], status_code=200)
        async def login(request: LitestarRequest[Any, Any, Any]) -> str:
            adapter.record("login", request.method, request.headers.get(API_KEY))
            return "login"

        @get("/items/{p:path}")
        async def items(request: LitestarRequest[Any, Any, Any]) -> str:
            adapter.record("items", request.method, request.headers.get(API_KEY))
            return "items"

        @get("/healthz")
        async def healthz(request: LitestarRequest[Any, Any, Any]) -> str:
            adapter.record("healthz", request.method, request.headers.get(API_KEY))
            return "healthz"

        @get("/")
        async def root(request: LitestarRequest[Any, Any, Any]) -> str:
            adapter.record("root", request.method, request.headers.get(API_KEY))
            return "root"

        return Litestar(route_handlers=[login, items, healthz, root], openapi_config=None)


class QuartAdapter(ASGIAdapter):
    name = "quart"

    def build(self) -> Any:
        app = Quart("nanobucket_reading")

        def handler(name: str) -> Any:
            async def run(**kwargs: Any) -> str:
                self.record(name, quart_request.method, quart_request.headers.get(API_KEY))
                return name

            run.__name__ = name
            return run

        werkzeug_routes(app, handler)
        return app


# ------------------------------------------------------------------- aiohttp


class AiohttpAdapter(Adapter):
    """An aiohttp app behind `nanobucket.aiohttp.RateLimitMiddleware`, served by aiohttp's
    own server on 127.0.0.1 (``web.AppRunner``), each request sent byte for byte; the app
    at the root, or a sub-application at `MOUNTED` (``add_subapp``) holding the middleware."""

    name = "aiohttp"
    mounts = ("", "subapp")

    def __init__(self, impl: Any) -> None:
        super().__init__(impl)
        self.errors: list[BaseException] = []
        self.loop = asyncio.new_event_loop()
        plain = self.build([self.catch, AiohttpMiddleware(**self.options)])
        mounted = web.Application(middlewares=[self.catch])
        mounted.add_subapp(MOUNTED, self.build([AiohttpMiddleware(**self.options)]))
        self.runners = [web.AppRunner(plain), web.AppRunner(mounted)]
        self.ports = [self.loop.run_until_complete(self._start(r)) for r in self.runners]

    async def _start(self, runner: web.AppRunner) -> int:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return int(runner.addresses[0][1])

    @web.middleware
    async def catch(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Keep what failed inside the app (nanobucket's middleware included): aiohttp
        would answer it with a 500 the suite cannot tell from the app's own."""
        try:
            return await handler(request)  # type: ignore[no-any-return]
        except web.HTTPException:
            raise
        except Exception as exc:
            self.errors.append(exc)
            raise

    def build(self, middlewares: list[Any]) -> web.Application:
        def handler(name: str) -> Any:
            async def run(request: web.Request) -> web.Response:
                self.record(name, request.method, request.headers.get(API_KEY))
                return web.Response(text=name)

            return run

        app = web.Application(middlewares=middlewares)
        app.router.add_get("/login", handler("login"))
        app.router.add_post("/login", handler("login"))
        app.router.add_get("/items/{p:.+}", handler("items"))
        app.router.add_get("/healthz", handler("healthz"))
        app.router.add_get("/", handler("root"))
        return app

    def deliver(self, method: str, target: str, headers: list[tuple[str, str]], mount: str) -> int:
        port = self.ports[self.mounts.index(mount)]
        where = (MOUNTED if mount == "subapp" else "") + target
        status = self.loop.run_until_complete(self._request(port, method, where, headers))
        if self.errors:
            raise self.errors[0]
        return status

    async def _request(
        self, port: int, method: str, target: str, headers: list[tuple[str, str]]
    ) -> int:
        head = f"{method} {target} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(head.encode("latin-1") + b"\r\n")
            answer = await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
        return int(answer.split(b" ", 2)[1]) if answer else 0

    def close(self) -> None:
        for runner in self.runners:
            self.loop.run_until_complete(runner.cleanup())
        self.loop.close()


# ---------------------------------------------------------------------- WSGI


def werkzeug_routes(app: Any, handler: Callable[[str], Any]) -> None:
    """The four routes on a Werkzeug-routed app (Flask, Quart), each served by ``handler(name)``."""
    app.add_url_rule("/login", view_func=handler("login"), methods=["GET", "POST"])
    app.add_url_rule("/items/<path:p>", view_func=handler("items"))
    app.add_url_rule("/healthz", view_func=handler("healthz"))
    app.add_url_rule("/", view_func=handler("root"))


def flask_app(adapter: Adapter) -> Flask:

    app = Flask("nanobucket_reading")

    def handler(name: str) -> Any:
        def run(**kwargs: Any) -> str:
            adapter.record(name, flask_request.method, flask_request.headers.get(API_KEY))
            return name

        run.__name__ = name
        return run

    werkzeug_routes(app, handler)
    return app


def not_found(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("404 Not Found", [("Content-Type", "text/plain")])
    return [b"not mounted"]


def wsgi_stack(adapter: Adapter, mount: str) -> Any:
    """The Flask app behind `nanobucket.wsgi.RateLimitMiddleware`, placed as *mount* says."""
    app = flask_app(adapter)
    app.wsgi_app = WSGIMiddleware(app.wsgi_app, **adapter.options)  # type: ignore[method-assign]
    if mount == "mount":
        return DispatcherMiddleware(not_found, {MOUNTED: app})
    if mount == "proxyfix":
        app.wsgi_app = ProxyFix(app.wsgi_app, x_prefix=1)  # type: ignore[method-assign]
    return app


def wsgi_headers(headers: list[tuple[str, str]], target: str, mount: str) -> list[tuple[str, str]]:
    """The request's fields, with a client-set ``X-Forwarded-Prefix`` behind ProxyFix."""
    if mount == "proxyfix":
        return [*headers, ("X-Forwarded-Prefix", ROOT + "-" + str(len(target)))]
    return headers


class FlaskAdapter(Adapter):
    """Flask through Werkzeug's test client (the method as sent: ``environ_overrides``)."""

    name = "flask"
    mounts = ("", "mount", "proxyfix")

    def __init__(self, impl: Any) -> None:
        super().__init__(impl)
        self.clients = {mount: WerkzeugClient(wsgi_stack(self, mount)) for mount in self.mounts}

    def deliver(self, method: str, target: str, headers: list[tuple[str, str]], mount: str) -> int:
        if "://" in target:
            return 0  # the test client parses an absolute URL itself: werkzeug's server sends it
        where = (MOUNTED if mount == "mount" else "") + target
        environ = {"REQUEST_METHOD": method, "REMOTE_ADDR": PEER}
        if where.startswith("//"):
            # The test client reads "//x" as a host; a server passes the path on
            # decoded, as PEP 3333 spells it (bytes as latin-1).
            where, _, query = where.partition("#")[0].partition("?")
            environ["PATH_INFO"] = urllib.parse.unquote_to_bytes(where).decode("latin-1")
            environ["QUERY_STRING"] = query
            where = "/"
        response = self.clients[mount].open(
            where,
            method=method,
            headers=wsgi_headers(headers, target, mount),
            environ_overrides=environ,
        )
        response.close()
        return int(response.status_code)


class WerkzeugServer:
    """Werkzeug's own server on 127.0.0.1, port 0, in a thread; the app it serves can be swapped."""

    def __init__(self) -> None:
        self.app: Any = not_found
        self.server = make_server("127.0.0.1", 0, self._serve)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _serve(self, environ: dict[str, Any], start_response: Any) -> Any:
        return self.app(environ, start_response)

    def request(self, method: str, target: str, headers: list[tuple[str, str]]) -> int:
        """The status of one request, sent byte for byte (method, target and fields as given)."""
        head = f"{method} {target} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n".encode("latin-1")
        head += b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers)
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall(head + b"\r\n")
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        return int(answer.split(b" ", 2)[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


class WerkzeugServerAdapter(Adapter):
    """Flask on werkzeug's own server (`WerkzeugServer`), behind the mounts `FlaskAdapter` has."""

    name = "werkzeug-server"
    mounts = FlaskAdapter.mounts

    def __init__(self, impl: Any, server: WerkzeugServer) -> None:
        super().__init__(impl)
        self.server = server
        self.apps = {mount: wsgi_stack(self, mount) for mount in self.mounts}

    def deliver(self, method: str, target: str, headers: list[tuple[str, str]], mount: str) -> int:
        self.server.app = self.apps[mount]
        fields = wsgi_headers(headers, target, mount)
        where = (MOUNTED if mount == "mount" else "") + target
        return self.server.request(method, where, fields)

    def close(self) -> None:
        self.server.app = not_found


# -------------------------------------------------------------------- Django


class URLConf:
    """A URLconf given as an object (``ROOT_URLCONF`` takes one with ``urlpatterns``)."""

    def __init__(self, urlpatterns: list[Any]) -> None:
        self.urlpatterns = urlpatterns


class DjangoAdapter(Adapter):
    """The nanobucket Django middleware, through Django's test client; under a
    ``SCRIPT_NAME`` (a WSGI server's mount) or ``FORCE_SCRIPT_NAME`` too."""

    name = "django"
    mounts: ClassVar[tuple[str, ...]] = ("", "script_name", "force_script_name")

    def __init__(self, impl: Any) -> None:
        super().__init__(impl)
        self.settings = override_settings(
            ROOT_URLCONF=URLConf(self.urlpatterns()),
            MIDDLEWARE=["nanobucket.django.RateLimitMiddleware"],
            NANOBUCKET=self.options,
        )
        self.settings.enable()
        self.client = DjangoClient()

    def urlpatterns(self) -> list[Any]:
        def handler(name: str) -> Any:
            def run(request: HttpRequest, **kwargs: Any) -> HttpResponse:
                self.record(name, request.method or "", request.headers.get(API_KEY))
                return HttpResponse(name)

            return run

        return [
            path("login", handler("login")),
            path("items/<path:p>", handler("items")),
            path("healthz", handler("healthz")),
            path("", handler("root")),
        ]

    def deliver(self, method: str, target: str, headers: list[tuple[str, str]], mount: str) -> int:
        # One value per name in a WSGI environ: a server joins repeated fields.
        joined: dict[str, str] = {}
        for k, v in headers:
            k = k.replace("_", "-")  # noqa: PLW2901 - as the environ spells it (HTTP_X_API_KEY)
            joined[k] = joined[k] + "," + v if k in joined else v
        extra: dict[str, Any] = {"REQUEST_METHOD": method}
        if mount == "script_name":
            extra["SCRIPT_NAME"] = ROOT
        force = ROOT if mount == "force_script_name" else None
        with override_settings(FORCE_SCRIPT_NAME=force):
            response = self.client.generic(method, target, headers=joined, **extra)
        return int(response.status_code)

    def close(self) -> None:
        self.settings.disable()


class DjangoASGIAdapter(DjangoAdapter):
    """The nanobucket Django middleware on Django's async path (``ASGIHandler``), called as
    uvicorn calls it: repeated fields as sent, a root path, ``FORCE_SCRIPT_NAME``."""

    name = "django-asgi"
    mounts: ClassVar[tuple[str, ...]] = ("", "root_path", "force_script_name")

    def __init__(self, impl: Any) -> None:
        super().__init__(impl)
        self.driver = ASGIDriver(ASGIHandler(), lifespan=False)  # Django serves no lifespan

    def deliver(self, method: str, target: str, headers: list[tuple[str, str]], mount: str) -> int:
        force = ROOT if mount == "force_script_name" else None
        with override_settings(FORCE_SCRIPT_NAME=force):
            return self.driver.call(method, target, headers, ROOT if mount == "root_path" else "")

    def close(self) -> None:
        self.driver.close()
        super().close()


class DRFAdapter(DjangoAdapter):
    """A DRF API view per route, throttled by a ``NanobucketThrottle`` (it keys; Django routes)."""

    name = "drf"
    mounts: ClassVar[tuple[str, ...]] = ("", "script_name")
    routed = False

    def __init__(self, impl: Any) -> None:
        Adapter.__init__(self, impl)

        options = self.options
        self.throttle = type(
            "ReadingThrottle",
            (NanobucketThrottle,),
            {
                "limiter": options["limiter"],
                "key": options["key"],
                "on_decision": options["on_decision"],
            },
        )
        self.settings = override_settings(ROOT_URLCONF=URLConf(self.urlpatterns()), MIDDLEWARE=[])
        self.settings.enable()
        self.client = DjangoClient()

    def urlpatterns(self) -> list[Any]:
        adapter = self

        def view(name: str) -> Any:
            class Handler(APIView):  # type: ignore[misc]
                throttle_classes = [adapter.throttle]  # noqa: RUF012 - DRF's own attribute

                def get(self, request: Any, **kwargs: Any) -> Any:
                    adapter.record(name, request.method, request.headers.get(API_KEY))
                    return DRFResponse(name)

                post = get

            return Handler.as_view()

        return [
            path("login", view("login")),
            path("items/<path:p>", view("items")),
            path("healthz", view("healthz")),
            path("", view("root")),
        ]


def adapters() -> Iterator[type[Adapter]]:
    """Every adapter that needs no server of its own."""
    yield from (
        StarletteAdapter,
        FastAPIAdapter,
        FastAPIDependencyAdapter,
        LitestarAdapter,
        QuartAdapter,
        AiohttpAdapter,
        FlaskAdapter,
        DjangoAdapter,
        DjangoASGIAdapter,
        DRFAdapter,
    )
