"""Calling a limited API with httpx: a transport that paces each host and learns its limit.

Each request waits, first in first out and at most *timeout* seconds, for a
token of its key's bucket (the host, or your *key* function), then goes to
the wrapped transport; the answer's ``Retry-After``, ``RateLimit-Policy`` /
``RateLimit`` and ``X-RateLimit-*`` fields lower that key's rate and
capacity to the server's, never above yours (see `nanobucket._outbound`).

>>> import httpx
>>> from nanobucket.httpx import RateLimitedTransport
>>> api = httpx.MockTransport(lambda request: httpx.Response(200, headers={
...     "RateLimit-Policy": '"default";q=10;w=1', "RateLimit": '"default";r=9;t=1'}))
>>> client = httpx.Client(transport=RateLimitedTransport(api, rate=500, capacity=50))
>>> client.get("https://api.example.com/items").status_code
200
>>> client._transport.limit("api.example.com")   # the server's 10/s, at most 10 at once
KeyLimit(rate=Fraction(10, 1), capacity=10, paused_for=0.0)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any

import httpx

from ._outbound import IDEMPOTENT, KeyLimit, Pacer, Retries, WaitTooLong
from ._params import NS_PER_S, RateLike
from .waiting import DEFAULT_MAX_WAITERS

__all__ = (
    "IDEMPOTENT",
    "AsyncRateLimitedTransport",
    "KeyLimit",
    "RateLimitTimeout",
    "RateLimitedTransport",
    "host_key",
)

KeyFunc = Callable[[httpx.Request], Hashable]


class RateLimitTimeout(httpx.TimeoutException):
    """The wait for a token would pass the timeout: raised at once, nothing sent.

    ``key`` is the request's key; ``retry_after`` (s) and ``retry_after_ns``
    say when a request of that key may start, as far as is known now.

    >>> import httpx
    >>> err = RateLimitTimeout("wait", key="api.example.com", retry_after_ns=1_500_000_000)
    >>> isinstance(err, httpx.TimeoutException), err.retry_after
    (True, 1.5)
    """

    def __init__(
        self,
        message: str,
        *,
        key: Hashable,
        retry_after_ns: int,
        request: httpx.Request | None = None,
    ) -> None:
        super().__init__(message, request=request)
        self.key = key
        self.retry_after_ns = retry_after_ns

    @property
    def retry_after(self) -> float:
        """Seconds until a request of the key may start.

        >>> RateLimitTimeout("wait", key="h", retry_after_ns=250_000_000).retry_after
        0.25
        """
        return self.retry_after_ns / NS_PER_S


def host_key(request: httpx.Request) -> str:
    """The default key: the request's host, with its port when the URL names one.

    >>> import httpx
    >>> host_key(httpx.Request("GET", "https://API.example.com/x")), host_key(
    ...     httpx.Request("GET", "http://127.0.0.1:8000/"))
    ('api.example.com', '127.0.0.1:8000')
    """
    url = request.url
    return url.host if url.port is None else f"{url.host}:{url.port}"


class _Limited:
    """What both transports share: the pacer, the key, the retry rule."""

    def __init__(
        self,
        rate: RateLike,
        capacity: int,
        key: KeyFunc | None,
        timeout: float | None,
        retries: int,
        retry_budget: float,
        retry_methods: Iterable[str] | None,
        max_keys: int,
        max_waiters: int,
        clock: Callable[[], int] | None,
        sleep: Callable[[float], object] | None,
        async_sleep: Callable[[float], Any] | None,
    ) -> None:
        if key is not None and not callable(key):
            raise TypeError(f"key must be a callable taking the request, not {key!r}")
        self.pacer = Pacer(
            rate,
            capacity,
            timeout=timeout,
            max_keys=max_keys,
            max_waiters=max_waiters,
            clock=clock,
            sleep=sleep,
            async_sleep=async_sleep,
        )
        self._key: KeyFunc = key if key is not None else host_key
        self.retry = Retries(retries, retry_budget, retry_methods)

    def limit(self, key: Hashable) -> KeyLimit:
        """*key*'s rate and capacity now, and the seconds left of its pause.

        >>> RateLimitedTransport(rate=5, capacity=10).limit("api.example.com")
        KeyLimit(rate=5, capacity=10, paused_for=0.0)
        """
        return self.pacer.limit(key)

    def _error(self, err: WaitTooLong, request: httpx.Request) -> RateLimitTimeout:
        return RateLimitTimeout(
            str(err), key=err.key, retry_after_ns=err.retry_after_ns, request=request
        )

    def _again(
        self,
        request: httpx.Request,
        response: httpx.Response,
        replayable: bool,
        tries: int,
        pause: int,
        end: int,
    ) -> bool:
        return self.retry.again(
            self.pacer, response.status_code, request.method, replayable, tries, pause, end
        )


class RateLimitedTransport(_Limited, httpx.BaseTransport):
    """An httpx transport that waits for each host's token and learns its limit.

    * *transport*: the one that sends (default ``httpx.HTTPTransport()``).
    * *rate*, *capacity*: your limit per key; the server's may only lower it.
    * *key*: ``request -> key`` (default `host_key`).
    * *timeout*: the longest wait for a token, in seconds (None: no limit);
      a longer one raises `RateLimitTimeout` at once, nothing sent.
    * *retries*: how many times a 429 is sent again once its pause is over
      (default 0), for *retry_methods* (default the idempotent ones) and
      only while all its waits fit in *retry_budget* seconds; otherwise the
      429 is returned.
    * *max_keys*, *max_waiters*: bounds on the keys remembered and on the
      requests waiting per key (past it: `RateLimitTimeout`).
    * *clock* (int ns) and *sleep* serve tests.

    >>> import httpx
    >>> api = httpx.MockTransport(lambda request: httpx.Response(204))
    >>> slept = []   # with a clock that stands still, the second request waits 0.1 s
    >>> t = RateLimitedTransport(api, rate=10, capacity=1, clock=lambda: 0, sleep=slept.append)
    >>> [httpx.Client(transport=t).get("http://h/").status_code for _ in range(2)], slept
    ([204, 204], [0.1])
    """

    def __init__(
        self,
        transport: httpx.BaseTransport | None = None,
        *,
        rate: RateLike,
        capacity: int,
        key: KeyFunc | None = None,
        timeout: float | None = 30.0,
        retries: int = 0,
        retry_budget: float = 60.0,
        retry_methods: Iterable[str] | None = None,
        max_keys: int = 1024,
        max_waiters: int = DEFAULT_MAX_WAITERS,
        clock: Callable[[], int] | None = None,
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        if transport is not None and not isinstance(transport, httpx.BaseTransport):
            raise TypeError(f"transport must be an httpx.BaseTransport, not {transport!r}")
        super().__init__(
            rate, capacity, key, timeout, retries, retry_budget, retry_methods,
            max_keys, max_waiters, clock, sleep, None,
        )  # fmt: skip
        self.transport = transport if transport is not None else httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Wait for the key's token, send, learn from the answer (and maybe retry).

        >>> import httpx
        >>> t = RateLimitedTransport(httpx.MockTransport(lambda r: httpx.Response(200)),
        ...                          rate=1, capacity=1)
        >>> t.handle_request(httpx.Request("GET", "http://h/")).status_code
        200
        """
        key = self._key(request)
        pacer = self.pacer
        end = self.retry.deadline(pacer)
        replayable = isinstance(request.stream, httpx.ByteStream)  # a stream cannot go twice
        tries = 0
        while True:
            try:
                state = pacer.start(key)
            except WaitTooLong as err:
                raise self._error(err, request) from None
            try:
                response = self.transport.handle_request(request)
            except BaseException:
                pacer.failed(state)
                raise
            pause = pacer.done(state, response.status_code, response.headers.get)
            if not self._again(request, response, replayable, tries, pause, end):
                return response
            response.close()
            tries += 1

    def close(self) -> None:
        """Close the wrapped transport.

        >>> import httpx
        >>> RateLimitedTransport(httpx.MockTransport(lambda r: None), rate=1, capacity=1).close()
        """
        self.transport.close()


class AsyncRateLimitedTransport(_Limited, httpx.AsyncBaseTransport):
    """`RateLimitedTransport` for ``httpx.AsyncClient``: waits in asyncio.

    *transport* defaults to ``httpx.AsyncHTTPTransport()``; *async_sleep*
    replaces ``asyncio.sleep`` in tests. A cancelled waiter gives its place back.

    >>> import asyncio, httpx
    >>> api = httpx.MockTransport(lambda request: httpx.Response(200))
    >>> async def main():
    ...     transport = AsyncRateLimitedTransport(api, rate=100, capacity=10)
    ...     async with httpx.AsyncClient(transport=transport) as client:
    ...         return (await client.get("https://api.example.com/")).status_code
    >>> asyncio.run(main())
    200
    """

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        rate: RateLike,
        capacity: int,
        key: KeyFunc | None = None,
        timeout: float | None = 30.0,
        retries: int = 0,
        retry_budget: float = 60.0,
        retry_methods: Iterable[str] | None = None,
        max_keys: int = 1024,
        max_waiters: int = DEFAULT_MAX_WAITERS,
        clock: Callable[[], int] | None = None,
        async_sleep: Callable[[float], Any] | None = None,
    ) -> None:
        if transport is not None and not isinstance(transport, httpx.AsyncBaseTransport):
            raise TypeError(f"transport must be an httpx.AsyncBaseTransport, not {transport!r}")
        super().__init__(
            rate, capacity, key, timeout, retries, retry_budget, retry_methods,
            max_keys, max_waiters, clock, None, async_sleep,
        )  # fmt: skip
        self.transport = transport if transport is not None else httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """`RateLimitedTransport.handle_request` for asyncio.

        >>> import asyncio, httpx
        >>> t = AsyncRateLimitedTransport(httpx.MockTransport(lambda r: httpx.Response(200)),
        ...                               rate=1, capacity=1)
        >>> asyncio.run(t.handle_async_request(httpx.Request("GET", "http://h/"))).status_code
        200
        """
        key = self._key(request)
        pacer = self.pacer
        end = self.retry.deadline(pacer)
        replayable = isinstance(request.stream, httpx.ByteStream)  # a stream cannot go twice
        tries = 0
        while True:
            try:
                state = await pacer.start_async(key)
            except WaitTooLong as err:
                raise self._error(err, request) from None
            try:
                response = await self.transport.handle_async_request(request)
            except BaseException:
                pacer.failed(state)
                raise
            pause = pacer.done(state, response.status_code, response.headers.get)
            if not self._again(request, response, replayable, tries, pause, end):
                return response
            await response.aclose()
            tries += 1

    async def aclose(self) -> None:
        """Close the wrapped transport.

        >>> import asyncio, httpx
        >>> t = AsyncRateLimitedTransport(httpx.MockTransport(lambda r: None), rate=1, capacity=1)
        >>> asyncio.run(t.aclose())
        """
        await self.transport.aclose()
