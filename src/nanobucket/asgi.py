"""ASGI middleware: answer 429 with the time to wait, for Starlette, FastAPI, any ASGI app.

>>> import nanobucket as nb
>>> from nanobucket.asgi import RateLimitMiddleware
>>> limiter = nb.KeyedTokenBucket(rate=100, capacity=200)
>>> async def app(scope, receive, send): ...
>>> app = RateLimitMiddleware(app, limiter)   # per client address, cost 1

FastAPI / Starlette: ``app.add_middleware(RateLimitMiddleware, limiter=limiter)``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from . import _http
from ._http import *  # noqa: F403 - `_http.__all__`: the names both middleware modules offer
from ._http import Middleware, Rule, limit_headers, rejection
from .hooks import LimitEvent

__all__ = ["RateLimitMiddleware"]
__all__ += _http.__all__

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class RateLimitMiddleware(Middleware):
    """Rate-limit every HTTP request of an ASGI app; 429 + ``Retry-After`` when limited.

    * *limiter*: any nanobucket limiter, keyed (``check(key, cost)``:
      `KeyedTokenBucket`, the shared-memory and Redis tables, ``all_of``) or
      unkeyed (``check(cost)``: `TokenBucket`, one limit for the whole app);
      told apart by the limiter's ``keyed`` attribute, or by *keyed* when given. An
      asyncio limiter (``async def check``) is awaited.
    * *key*: ``client_address()`` (default), ``header("X-API-Key")``,
      ``route()``, a tuple of them (one composite key), or a callable taking
      the ASGI scope.
    * *cost*: tokens per request, an int or a callable taking the scope.
    * *routes*: `Route` rules with their own limiter, cost, key, or
      ``exempt=True``; *exempt*: paths never limited (``"/healthz"`` or a list).
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
      that may go into debt, or a refund; see the README).

    The decision is left in ``scope["nanobucket.decision"]`` for the app.
    Only ``http`` requests are limited; websocket and lifespan pass through.

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

    app: ASGIApp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._simple:
            rule: Rule = self._router.default
        else:
            rule = self._router.match(scope["path"], scope["method"])
            scope["nanobucket.route"] = rule.pattern
            if rule.exempt:
                self.counters.exempt += 1
                await self.app(scope, receive, send)
                return
        policy = rule.policy
        assert policy is not None  # only exempt rules have none
        cost = rule.cost if rule.cost_fn is None else rule.cost_fn(scope)
        if rule.peer_key:  # the default key, inlined for IPv4: the peer address
            client = scope.get("client")
            key = client[0] if client else ""
            if not key or ":" in key:  # IPv6, or no address (a unix socket)
                key = rule.key.peer_key(key)  # type: ignore[union-attr]
        else:
            key = rule.key.asgi(scope)  # type: ignore[union-attr]
        decision = policy.check(key, cost)
        if policy.is_async:
            decision = await decision
        scope["nanobucket.decision"] = decision
        if self._hooks is not None:
            await self._hooks.emit_async(LimitEvent(key, rule.pattern, cost, decision, self.shadow))
        if decision.allowed:
            self.counters.admitted += 1
            if self._quiet:
                if self._charge is not None:
                    await self._charged(scope, receive, send, policy, key, cost)
                    return
                await self.app(scope, receive, send)
                return
            if self._ietf and policy.layer_headers is None:  # inlined limit_headers()
                w = policy.watched
                if w is not None and (
                    w.rate is not policy.rate_seen or w.capacity != policy.capacity_seen
                ):
                    policy.refresh()  # the limiter was reconfigured: new RateLimit-Policy
                extra: tuple[tuple[bytes, bytes], ...] | list[tuple[bytes, bytes]] = (
                    *policy.ietf_extra,
                    (
                        b"ratelimit",
                        b"%b%d;t=%d"
                        % (
                            policy.r_prefix,
                            decision.remaining,
                            -(-decision.reset_after_ns // 1_000_000_000),
                        ),
                    ),
                )
            else:
                extra = limit_headers(self.headers, policy, decision)

            # Not a coroutine function: it hands back send's own awaitable, so
            # each message costs one call, not one more coroutine.
            def send_with_headers(message: Message) -> Awaitable[None]:
                if message["type"] == "http.response.start":
                    # A new list: the app may reuse its own headers list.
                    message["headers"] = [*message.get("headers", ()), *extra]
                return send(message)

            if self._charge is not None:
                await self._charged(scope, receive, send_with_headers, policy, key, cost)
                return
            await self.app(scope, receive, send_with_headers)
            return
        if self.shadow:
            self.counters.shadow_limited += 1
            await self.app(scope, receive, send)
            return
        self.counters.limited += 1
        response_headers, body = rejection(self.headers, policy, decision)
        await send({"type": "http.response.start", "status": 429, "headers": response_headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _charged(
        self, scope: Scope, receive: Receive, send: Send, policy: Any, key: Any, cost: int
    ) -> None:
        """Run the app, then settle ``charge(scope, status)`` against *cost*."""
        status = 500  # the app failed before it started a response

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            settler = self._settlers[id(policy)]
            assert self._charge is not None
            if settler.awaited:
                await settler.settle_async(self._charge, key, cost, scope, status)
            else:
                settler.settle(self._charge, key, cost, scope, status)
