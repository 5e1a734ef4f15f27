"""aiohttp, both sides: a server middleware that answers 429 with the time to wait, for any
``aiohttp.web`` app, and a client middleware that paces each host a ``ClientSession`` calls
and learns its limit.

>>> import nanobucket as nb
>>> from aiohttp import web
>>> from nanobucket.aiohttp import RateLimitMiddleware
>>> limiter = nb.KeyedTokenBucket(rate=100, capacity=200)
>>> app = web.Application(middlewares=[RateLimitMiddleware(limiter)])  # per client address

The client side, `ClientRateLimit`, as `nanobucket.httpx.AsyncRateLimitedTransport`:
``aiohttp.ClientSession(middlewares=[ClientRateLimit(rate=100, capacity=10)])``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import idna
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from ._core._params import RateArg
from ._http import AiohttpView, Counters, Gate, Options, Route, client_address, header, route
from ._outbound.adapter import IDEMPOTENT, LimitTimeout, Outbound
from ._outbound.adapter import Options as ClientOptions
from ._outbound.pacer import KeyLimit

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = (
    "DECISION",
    "IDEMPOTENT",
    "ROUTE",
    "ClientRateLimit",
    "Counters",
    "KeyLimit",
    "RateLimitMiddleware",
    "RateLimitTimeout",
    "Route",
    "client_address",
    "header",
    "host_key",
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


# --------------------------------------------------------------------------
# The client side: pacing the hosts a ClientSession calls


class RateLimitTimeout(LimitTimeout, aiohttp.ServerTimeoutError):
    """The wait for a token would pass the timeout: raised at once, nothing sent.

    ``key``, ``retry_after`` (s) and ``retry_after_ns`` as in
    `nanobucket.httpx.RateLimitTimeout`; ``request_info`` is the request's, as
    aiohttp's errors carry it (None when raised without one). An
    ``aiohttp.ServerTimeoutError``: what ``except aiohttp.ClientError`` and
    ``except asyncio.TimeoutError`` (a session's ``ClientTimeout`` running out)
    already catch.

    >>> import asyncio
    >>> err = RateLimitTimeout("wait", key="api.example.com", retry_after_ns=1_500_000_000)
    >>> isinstance(err, (aiohttp.ClientError, asyncio.TimeoutError)), err.retry_after
    (True, 1.5)
    """

    def __init__(
        self,
        message: str,
        *,
        key: Hashable,
        retry_after_ns: int,
        request: aiohttp.ClientRequest | None = None,
    ) -> None:
        super().__init__(message, key=key, retry_after_ns=retry_after_ns)
        self.request_info = None if request is None else request.request_info


def host_key(request: aiohttp.ClientRequest) -> str:
    """The default key: the request's host, with its port when the URL names one other
    than its scheme's; the same text as `nanobucket.httpx.host_key` for the same URL, but
    for an IPv6 address (as yarl writes it: lower case, zeros compressed) and a default
    port after a scheme not in lower case (``HTTP://h:80/``: httpx keeps ``h:80``).

    >>> from yarl import URL
    >>> class Request:   # any object with aiohttp's ``url``: a ``yarl.URL``
    ...     def __init__(self, url): self.url = URL(url)
    >>> host_key(Request("https://API.example.com:443/x")), host_key(
    ...     Request("http://127.0.0.1:8000/"))
    ('api.example.com', '127.0.0.1:8000')
    """
    url = request.url
    host = url.raw_host or ""
    if host.startswith("xn--"):
        # Decoded as httpx's URL.host decodes it: yarl's own ``host`` leaves a name
        # ending in a digit encoded. One that is not IDNA after all stays as written.
        with contextlib.suppress(UnicodeError):
            host = idna.decode(host)
    return host if url.is_default_port() else f"{host}:{url.port}"


class _Answer:
    """A ``ClientResponse`` as the pacing loop reads an answer (`Outbound`'s ``Answer``)."""

    __slots__ = ("headers", "response", "status_code")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.status_code = response.status
        self.headers: CIMultiDictProxy[str] = response.headers

    def close(self) -> None:
        self.response.release()  # back to the pool: its body is not wanted

    async def aclose(self) -> None:
        self.response.release()


def _on_response(settle: Callable[[aiohttp.ClientResponse], Any]) -> Callable[[_Answer], Any]:
    """*settle*, called with the ``ClientResponse`` the pacing loop's answer holds."""
    return lambda answer: settle(answer.response)


class ClientRateLimit(Outbound):
    """An aiohttp client middleware that waits for each host's token and learns its limit.

    ``aiohttp.ClientSession(middlewares=[ClientRateLimit(rate=..., capacity=...)])``
    (or ``session.get(url, middlewares=[...])`` for one request). The keywords
    are those of `nanobucket.httpx.AsyncRateLimitedTransport`: *key* and
    *estimate* take the ``aiohttp.ClientRequest``, *settle* the
    ``aiohttp.ClientResponse`` (an ``async def`` may await ``response.json()``:
    the body stays readable), the default key is `host_key`, a wait past
    *timeout* raises `RateLimitTimeout`, and a cancelled waiter gives its place
    back. A 429 sent again (*retries*) goes through the middlewares after this
    one again; a streamed body (an async iterator, a file) is never sent twice.
    The wait counts against the session's ``ClientTimeout(total=...)``.

    >>> import asyncio, aiohttp
    >>> from aiohttp import web
    >>> from aiohttp.test_utils import TestServer
    >>> async def api(request):   # a server that allows 3 at once
    ...     return web.Response(headers={"X-RateLimit-Limit": "3"})
    >>> async def main():
    ...     app = web.Application()
    ...     app.router.add_get("/", api)
    ...     limit = ClientRateLimit(rate=10, capacity=5, key=lambda request: "api")
    ...     async with TestServer(app) as server:
    ...         async with aiohttp.ClientSession(middlewares=[limit]) as session:
    ...             async with session.get(server.make_url("/")) as response:
    ...                 return response.status, limit.limit("api")
    >>> asyncio.run(main())
    (200, KeyLimit(rate=10, capacity=3, paused_for=0.0, known=True))
    """

    _timeout_error = RateLimitTimeout
    _async = True

    def __init__(
        self,
        *,
        rate: RateArg,
        capacity: int | None = None,
        key: Callable[[aiohttp.ClientRequest], Hashable] | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        settle = options.get("settle")
        if callable(settle):  # anything else: refused by `_configure` as for httpx
            options["settle"] = _on_response(settle)
        self._configure(rate, capacity, key, host_key, options)

    @staticmethod
    def _retry_info(request: aiohttp.ClientRequest) -> tuple[str, bool]:
        body = request.body  # b"" when empty; bytes, str and JSON are a BytesPayload
        return request.method, isinstance(body, (bytes, aiohttp.BytesPayload))

    async def __call__(
        self, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        """Wait for the key's token, send, learn from the answer (and maybe retry)."""

        async def send(request: aiohttp.ClientRequest) -> _Answer:
            return _Answer(await handler(request))

        answer = await self._paced_async(request, send)
        return answer.response

    def __repr__(self) -> str:
        return f"ClientRateLimit(rate={self.pacer.rate!r}, capacity={self.pacer.capacity!r})"
