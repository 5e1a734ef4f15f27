"""aiohttp server middleware: answer 429 with the time to wait, for any ``aiohttp.web`` app.

>>> import nanobucket as nb
>>> from aiohttp import web
>>> from nanobucket.aiohttp import RateLimitMiddleware
>>> limiter = nb.KeyedTokenBucket(rate=100, capacity=200)
>>> app = web.Application(middlewares=[RateLimitMiddleware(limiter)])  # per client address
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web
from multidict import CIMultiDict

from ._http import AiohttpView, Counters, Gate, Options, Route, client_address, header, route

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = (
    "DECISION",
    "ROUTE",
    "Counters",
    "RateLimitMiddleware",
    "Route",
    "client_address",
    "header",
    "route",
)

_R = TypeVar("_R", bound=web.StreamResponse)
_KEYS: dict[str, Any] = {}


def _request_key(name: str) -> Any:
    """The key a ``"nanobucket.*"`` entry takes in a request: a ``web.RequestKey``
    (aiohttp warns on plain-text keys where it has that type), else the name."""
    key = _KEYS.get(name)
    if key is None:
        make = getattr(web, "RequestKey", None)
        key = _KEYS[name] = name if make is None else make(name, object)
    return key


#: ``request[DECISION]``: the limiter's `Decision` for the request (absent on an exempt route).
DECISION = _request_key("nanobucket.decision")
#: ``request[ROUTE]``: the pattern of the rule the request took (when there are routes).
ROUTE = _request_key("nanobucket.route")


def _str_headers(fields: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    # aiohttp counts the body's length itself: the gate's content-length is left out.
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in fields if k != b"content-length"]


class RateLimitMiddleware:
    """Rate-limit every request of an aiohttp app; 429 + ``Retry-After`` when limited.

    ``web.Application(middlewares=[RateLimitMiddleware(limiter, ...)])``. The
    arguments are those of `nanobucket.asgi.RateLimitMiddleware` without the
    app, with callables (``key``, ``cost``, ``charge``) taking the
    ``web.Request``. Rules match the path as aiohttp's router does
    (``request.rel_url.path_safe``), below the prefix of a sub-application
    (``add_subapp``) when the middleware is that sub-application's; a key
    header is read as ``request.headers[name]`` reads it (its first field).

    A `RedisTokenBucket` (it waits for Redis in the event loop's thread) is
    refused with a `TypeError`: use an `AsyncRedisTokenBucket`. The decision
    is left in ``request[DECISION]``. The limit fields are added to the
    handler's response, and to a ``web.HTTPException`` it raises; a response
    the handler has already sent (``await response.prepare(request)``, a
    ``WebSocketResponse``) goes out without them. *charge*
    (``charge(request, status) -> int``) is settled once the handler has
    returned or raised.

    >>> import asyncio, nanobucket as nb
    >>> from aiohttp.test_utils import make_mocked_request
    >>> limit = RateLimitMiddleware(nb.KeyedTokenBucket(rate=1, capacity=1))
    >>> async def hello(request):
    ...     return web.Response(text="hello")
    >>> async def twice():
    ...     for _ in range(2):
    ...         request = make_mocked_request("GET", "/").clone(remote="1.2.3.4")
    ...         response = await limit(request, hello)
    ...         print(response.status, response.headers.get("Retry-After"))
    >>> asyncio.run(twice())
    200 None
    429 1
    """

    #: aiohttp calls ``middleware(request, handler)`` (its new-style middlewares).
    __middleware_version__ = 1

    def __init__(
        self,
        limiter: object,
        *,
        key: object = None,
        cost: int | Callable[[Any], int] = 1,
        routes: Iterable[Route] | None = None,
        exempt: str | Iterable[str] | None = None,
        **options: Unpack[Options],
    ) -> None:
        if isinstance(limiter, web.Application):
            raise TypeError(
                "RateLimitMiddleware takes a limiter, not the app: "
                "web.Application(middlewares=[RateLimitMiddleware(limiter)])"
            )
        self._gate = gate = Gate(
            AiohttpView(_request_key),
            limiter,
            key=key,
            cost=cost,
            routes=routes,
            exempt=exempt,
            **options,
        )
        gate.refuse_blocking("an aiohttp app")
        self.counters = gate.counters
        self.headers, self.shadow = gate.headers, gate.shadow  # as configured

    async def __call__(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        gate = self._gate
        if gate.awaits:
            admitted, decision, fields, body, due = await gate.decide_async(request)
        else:
            admitted, decision, fields, body, due = gate.decide(request)
        if decision is not None:  # None: an exempt route
            request[DECISION] = decision
        if not admitted:
            return web.Response(status=429, body=body, headers=CIMultiDict(_str_headers(fields)))
        if due is None:
            if not fields:
                return await handler(request)
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                _add(exc, fields)
                raise
            return _add(response, fields)
        status = 500  # the handler failed before it answered
        try:
            response = await handler(request)
            status = response.status
        except web.HTTPException as exc:
            status = exc.status
            _add(exc, fields)
            raise
        finally:
            await due.settle_async(request, status)
        return _add(response, fields)

    def __repr__(self) -> str:
        return f"RateLimitMiddleware(headers={self.headers!r}, shadow={self.shadow})"


def _add(response: _R, fields: Sequence[tuple[bytes, bytes]]) -> _R:
    """*response* with the limit *fields* added, unless it has been sent already."""
    if fields and not response.prepared:
        response.headers.extend(_str_headers(fields))
    return response
