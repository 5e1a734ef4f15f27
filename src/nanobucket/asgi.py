"""ASGI middleware: answer 429 with the time to wait, for Starlette, FastAPI, any ASGI app.

>>> import nanobucket as nb
>>> from nanobucket.asgi import RateLimitMiddleware
>>> limiter = nb.KeyedTokenBucket(rate=100, capacity=200)
>>> async def app(scope, receive, send): ...
>>> app = RateLimitMiddleware(app, limiter)   # per client address, cost 1

FastAPI / Starlette: ``app.add_middleware(RateLimitMiddleware, limiter=limiter)``.
A websocket is counted at its handshake; `MessageLimit` limits its messages.
"""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Any

from ._http import (
    SCOPE,
    WS_SCOPE,
    Counters,
    Gate,
    HttpAnswer,
    MessageLimit,
    Options,
    Route,
    client_address,
    header,
    refuse_handshake,
    route,
)
from ._http.charge import Due

if TYPE_CHECKING:
    from typing_extensions import Unpack

# The middleware, and the names both middleware modules offer with it.
__all__ = (
    "Counters",
    "HttpAnswer",
    "MessageLimit",
    "RateLimitMiddleware",
    "Route",
    "client_address",
    "header",
    "route",
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class RateLimitMiddleware:
    """Rate-limit every HTTP request and websocket handshake of an ASGI app; 429 +
    ``Retry-After`` when limited.

    * *limiter*: any nanobucket limiter, keyed (``check(key, cost)``:
      `KeyedTokenBucket`, the shared-memory and Redis tables, ``all_of``) or
      unkeyed (``check(cost)``: `TokenBucket`, one limit for the whole app);
      told apart by the limiter's ``keyed`` attribute, or by *keyed* when given. An
      asyncio limiter (``async def check``) is awaited. A `RedisTokenBucket`
      (its verbs wait for Redis in the thread, here the event loop's) is
      refused with a `TypeError`: use an `AsyncRedisTokenBucket`. A rate
      written as text (``"100/minute"``) is a `KeyedTokenBucket` of it, its
      capacity the count.
    * *key*: ``client_address()`` (default), ``header("X-API-Key")``,
      ``route()``, a tuple of them (one composite key), or a callable taking
      the ASGI scope.
    * *cost*: tokens per request, an int or a callable taking the scope.
    * *routes*: `Route` rules with their own limiter, cost, key, or
      ``exempt=True``; *exempt*: paths never limited (``"/healthz"`` or a list).
    * *exempt_clients*: clients never limited: addresses and networks
      (``"10.0.0.0/8"``, ``"::1"``, `ipaddress` objects), read as the key
      reads the client's address (trusted proxies and all), and predicates
      taking the scope and returning a bool; a list of them. Their requests
      spend no token and get no rate-limit fields.
    * *headers*: ``"ietf"`` (``RateLimit-Policy`` and ``RateLimit``),
      ``"legacy"`` (``X-RateLimit-*``) or ``"off"``; *name* names the policy.
    * *shadow*: decide and count, never reject and add no headers (roll out
      a limit and watch ``counters.shadow_limited`` first).
    * *counters*: a `Counters` to count into (default: a new one, at
      ``.counters``).
    * *on_decision*, *on_limited*: hooks called with a `LimitEvent` for every
      decision / for refused ones (`nanobucket.hooks`); ``async def`` ones
      are awaited.
    * *charge*: ``charge(scope, status) -> int``, the request's real cost,
      settled against *cost* once the app has sent its response (a debit
      that may go into debt, or a refund; see the README); HTTP only.

    The decision is left in ``scope["nanobucket.decision"]`` for the app.
    A websocket connection is decided at its handshake as a ``GET`` of its
    path (the same routes, keys, exempt paths and clients), its fields
    added to the app's ``websocket.accept``; refused, it is answered the
    HTTP 429 where the server offers the ``websocket.http.response``
    extension (uvicorn, hypercorn, Starlette's TestClient), else closed with
    code 1008 before it is accepted (the server answers 403). Lifespan
    passes through.

    >>> import asyncio, nanobucket as nb
    >>> async def hello(scope, receive, send):
    ...     await send({"type": "http.response.start", "status": 200, "headers": []})
    ...     await send({"type": "http.response.body", "body": b"hello"})
    >>> app = RateLimitMiddleware(hello, nb.KeyedTokenBucket(rate=1, capacity=1))
    >>> async def send(message):
    ...     if message["type"] == "http.response.start":
    ...         print(message["status"], dict(message["headers"]).get(b"retry-after"))
    >>> scope = {"type": "http", "method": "GET", "path": "/", "client": ("1.2.3.4", 5678)}
    >>> asyncio.run(app(scope, None, send)); asyncio.run(app(scope, None, send))
    200 None
    429 b'1'
    """

    def __init__(
        self,
        app: ASGIApp,
        limiter: object,
        *,
        key: object = None,
        cost: int | Callable[[Any], int] = 1,
        routes: Iterable[Route] | None = None,
        exempt: str | Iterable[str] | None = None,
        **options: Unpack[Options],
    ) -> None:
        if not callable(app):
            raise TypeError(f"app must be an ASGI callable, not {type(app).__name__}")
        self.app = app
        self._gate = gate = Gate(
            SCOPE, limiter, key=key, cost=cost, routes=routes, exempt=exempt, **options
        )
        gate.refuse_blocking("an ASGI app")
        self.counters = gate.counters
        # Handshakes: the same configuration, read with the websocket scope's view
        # (its method is the handshake's GET), counted into the same counters.
        ws_options: dict[str, Any] = {**options, "counters": gate.counters, "charge": None}
        self._ws_gate = Gate(
            WS_SCOPE, limiter, key=key, cost=cost, routes=routes, exempt=exempt, **ws_options
        )
        self.headers, self.shadow = gate.headers, gate.shadow  # as configured
        # The root paths seen (a few: the server's, the mounts'), each checked
        # once against the routes (see `_new_root`); None: no routes to check.
        self._roots: set[str] | None = set() if gate.router.patterns() else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await self._websocket(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        gate = self._gate
        roots = self._roots
        path = None  # read here where the routes need it: most requests have no root path
        if roots is not None:
            root = scope.get("root_path")
            if not root:
                path = scope["path"]
            else:
                if root not in roots:
                    self._new_root(root)
                path = SCOPE.path(scope)
        if gate.awaits:
            admitted, decision, fields, body, due = await gate.decide_async(scope)
        else:  # the peer read here, where it costs least: every request's default key needs it
            client = scope.get("client")
            admitted, decision, fields, body, due = gate.decide(
                scope, client[0] if client else "", None, path
            )
        if decision is not None:  # None: an exempt route
            scope["nanobucket.decision"] = decision
        if not admitted:
            await send({"type": "http.response.start", "status": 429, "headers": fields})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        if not fields:
            to_app = send
        else:
            # Not a coroutine function: it hands back send's own awaitable, so
            # each message costs one call, not one more coroutine.
            def to_app(message: Message) -> Awaitable[None]:
                if message["type"] == "http.response.start":
                    # A new list: the app may reuse its own headers list.
                    message["headers"] = [*message.get("headers", ()), *fields]
                return send(message)

        if due is not None:
            await self._charged(scope, receive, to_app, due)
            return
        app = self.app  # a local name: a callable attribute is called faster from one
        await app(scope, receive, to_app)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Decide a websocket's handshake: refuse it, or run the app with the fields added."""
        root = scope.get("root_path")
        if root and self._roots is not None and root not in self._roots:
            self._new_root(root)
        gate = self._ws_gate
        if gate.awaits:
            admitted, decision, fields, body, _ = await gate.decide_async(scope)
        else:
            admitted, decision, fields, body, _ = gate.decide(scope)
        if decision is not None:  # None: an exempt route or client
            scope["nanobucket.decision"] = decision
        if not admitted:
            assert body is not None
            await refuse_handshake(scope, send, decision, fields, body)
            return
        if not fields:
            await self.app(scope, receive, send)
            return

        def to_app(message: Message) -> Awaitable[None]:
            # The handshake's answer: the 101 (accept), or the app's own HTTP refusal.
            if message["type"] in ("websocket.accept", "websocket.http.response.start"):
                message["headers"] = [*message.get("headers", ()), *fields]
            return send(message)

        await self.app(scope, receive, to_app)

    def _new_root(self, root: str) -> None:
        """Warn once if a route was written with the root path *root* in it.

        Rules match the path below the root path, as the app routes it, so
        ``Route("/api/login")`` under ``--root-path /api`` never applies.
        """
        roots = self._roots
        assert roots is not None
        if len(roots) >= 64:  # mounts are few: past that, stop looking
            return
        roots.add(root)
        written = [p for p in self._gate.router.patterns() if p == root or p.startswith(root + "/")]
        if written:
            warnings.warn(
                f"Route({written[0]!r}) begins with the root path {root!r}: routes are "
                f"matched against the path below it, as the app routes it, so write "
                f"Route({written[0][len(root) :] or '/'!r})",
                RuntimeWarning,
                stacklevel=2,
            )

    async def _charged(self, scope: Scope, receive: Receive, send: Send, due: Due) -> None:
        """Run the app, then settle ``charge(scope, status)`` against the up-front cost."""
        status = 500  # the app failed before it started a response

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            await due.settle_async(scope, status)

    def __repr__(self) -> str:
        return f"RateLimitMiddleware({self.app!r}, headers={self.headers!r}, shadow={self.shadow})"
