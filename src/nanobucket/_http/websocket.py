"""WebSockets: the refused handshake, and a limit on the messages of an open connection.

A connection is counted once, at its handshake, by the ASGI middleware (with
the routes, keys and exempt paths of its HTTP requests); `refuse_handshake`
answers a refused one. `MessageLimit` limits what a client sends once the
connection is open, closing it with 1008 (policy violation) when over.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from .keys import key_func
from .policy import Policy, retry_after_seconds
from .views import WS_SCOPE, KeyFunc

__all__ = ("POLICY_VIOLATION", "MessageLimit", "refuse_handshake")

#: The close code of a refused connection or message (RFC 6455: policy violation).
POLICY_VIOLATION = 1008
#: The ASGI extension with which a server lets an app answer a handshake with HTTP.
HTTP_RESPONSE = "websocket.http.response"

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def close_reason(decision: Any) -> str:
    """The reason sent with a 1008 close: the seconds to wait, as ``Retry-After`` says them.

    >>> import nanobucket as nb
    >>> bucket = nb.TokenBucket(rate=1, capacity=1, clock=lambda: 0)
    >>> bucket.allow()
    True
    >>> close_reason(bucket.check())
    'rate limit exceeded; retry after 1 s'
    """
    return f"rate limit exceeded; retry after {retry_after_seconds(decision.retry_after_ns)} s"


async def refuse_handshake(
    scope: MutableMapping[str, Any],
    send: Send,
    decision: Any,
    headers: Sequence[tuple[bytes, bytes]],
    body: bytes,
) -> None:
    """Refuse a websocket handshake: the HTTP 429 (*headers*, *body*) when the server
    offers the ``websocket.http.response`` extension, else a close with 1008 before
    accepting (which the server turns into a 403).

    >>> import asyncio, nanobucket as nb
    >>> async def send(message): print(message["type"], message.get("status", message.get("code")))
    >>> d = nb.TokenBucket(rate=1, capacity=1, clock=lambda: 0).check(cost=1)
    >>> scope = {"type": "websocket", "extensions": {"websocket.http.response": {}}}
    >>> asyncio.run(refuse_handshake(scope, send, d, [(b"retry-after", b"1")], b"{}"))
    websocket.http.response.start 429
    websocket.http.response.body None
    >>> asyncio.run(refuse_handshake({"type": "websocket"}, send, d, [], b"{}"))
    websocket.close 1008
    """
    extensions = scope.get("extensions") or {}
    if HTTP_RESPONSE in extensions:
        await send(
            {"type": "websocket.http.response.start", "status": 429, "headers": list(headers)}
        )
        await send({"type": "websocket.http.response.body", "body": body, "more_body": False})
        return
    await send(
        {"type": "websocket.close", "code": POLICY_VIOLATION, "reason": close_reason(decision)}
    )


class MessageLimit:
    """Limit the messages a client sends on an open websocket (Starlette, FastAPI).

    ``await per_message(websocket)`` spends *cost* tokens of the client's
    bucket for one message: True when admitted; when refused, the connection
    is closed with code 1008 (policy violation) and the reason ``"rate limit
    exceeded; retry after N s"``, and the answer is False, so the handler
    returns.

    * *limiter*: any nanobucket limiter, keyed (one bucket per client) or
      not (one for everyone; or a `TokenBucket` made per connection, for a
      limit per connection); an asyncio one is awaited;
    * *key*: ``client_address()`` (default), ``header(...)``, a tuple of
      them (read from the connection's ASGI scope, trusted proxies and
      all), or a callable taking the websocket object;
    * *cost*: tokens per message (an int; ``per_message(ws, cost=n)`` for one).

    The connection's own handshake is limited by the middleware, apart.

    >>> import asyncio, nanobucket as nb
    >>> class Socket:   # the part of a Starlette WebSocket it uses
    ...     scope = {"type": "websocket", "client": ("1.2.3.4", 5)}
    ...     async def close(self, code, reason=None): print("closed", code, reason)
    >>> per_message = MessageLimit(nb.KeyedTokenBucket(rate=1, capacity=2, clock=lambda: 0))
    >>> [asyncio.run(per_message(Socket())) for _ in range(3)]
    closed 1008 rate limit exceeded; retry after 1 s
    [True, True, False]
    """

    __slots__ = ("_cost", "_func", "_key", "_policy")

    def __init__(self, limiter: object, *, key: object = None, cost: int = 1) -> None:
        self._policy = policy = Policy(limiter, "messages", None)
        for bucket in (limiter, *policy.leaves):
            if getattr(bucket, "blocking", False) is True:
                raise TypeError(
                    f"{type(bucket).__name__} waits for Redis in the calling thread, here "
                    "the event loop: use nanobucket.redis.AsyncRedisTokenBucket"
                )
        if callable(key) and not isinstance(key, KeyFunc):
            self._func: Callable[[Any], Any] | None = key
            self._key: KeyFunc | None = None
        else:
            self._func, self._key = None, key_func(key)
        self._cost = policy.validated_cost(cost)

    async def __call__(self, websocket: Any, cost: int | None = None) -> bool:
        """Spend the tokens of one message: True, or close the connection with 1008 and False."""
        policy = self._policy
        spend = self._cost if cost is None else policy.validated_cost(cost)
        if self._func is not None:
            key = self._func(websocket)
        else:
            assert self._key is not None
            key = self._key.read(WS_SCOPE, websocket.scope)
        decision = policy.check(key, spend)
        if policy.is_async:
            decision = await decision
        if decision.allowed:
            return True
        await websocket.close(code=POLICY_VIOLATION, reason=close_reason(decision))
        return False

    def __repr__(self) -> str:
        return f"MessageLimit({self._policy.limiter!r}, cost={self._cost})"
