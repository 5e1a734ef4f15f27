"""Calling a limited API with requests: an ``HTTPAdapter`` that paces each host and learns.

The same pacing and learning as `nanobucket.httpx`, for ``requests``: mount
it on a session and every request through it waits for its host's token.

>>> import requests
>>> from nanobucket.requests import RateLimitedAdapter
>>> session = requests.Session()
>>> adapter = RateLimitedAdapter(rate=500, capacity=50)
>>> session.mount("https://", adapter); session.mount("http://", adapter)
>>> adapter.limit("api.example.com")
KeyLimit(rate=500, capacity=50, paused_for=0.0)
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import requests
import requests.adapters

from ._outbound import IDEMPOTENT, KeyLimit, Pacer, Retries, WaitTooLong
from ._params import NS_PER_S, RateLike
from .waiting import DEFAULT_MAX_WAITERS

__all__ = ("IDEMPOTENT", "KeyLimit", "RateLimitTimeout", "RateLimitedAdapter", "host_key")

KeyFunc = Callable[[requests.PreparedRequest], Hashable]


class RateLimitTimeout(requests.exceptions.Timeout):
    """The wait for a token would pass the timeout: raised at once, nothing sent.

    ``key``, ``retry_after`` (s) and ``retry_after_ns`` as in
    `nanobucket.httpx.RateLimitTimeout`.

    >>> err = RateLimitTimeout("wait", key="api.example.com", retry_after_ns=2_000_000_000)
    >>> isinstance(err, requests.exceptions.Timeout), err.retry_after
    (True, 2.0)
    """

    def __init__(
        self,
        message: str,
        *,
        key: Hashable,
        retry_after_ns: int,
        request: requests.PreparedRequest | None = None,
    ) -> None:
        super().__init__(message, request=request)
        self.key = key
        self.retry_after_ns = retry_after_ns

    @property
    def retry_after(self) -> float:
        """Seconds until a request of the key may start.

        >>> RateLimitTimeout("wait", key="h", retry_after_ns=500_000_000).retry_after
        0.5
        """
        return self.retry_after_ns / NS_PER_S


def host_key(request: requests.PreparedRequest) -> str:
    """The default key: the request's host, with its port when the URL names one.

    >>> host_key(requests.Request("GET", "https://API.example.com:8443/x").prepare())
    'api.example.com:8443'
    """
    parts = urllib.parse.urlsplit(request.url or "")
    host = parts.hostname or ""
    return host if parts.port is None else f"{host}:{parts.port}"


class RateLimitedAdapter(requests.adapters.HTTPAdapter):
    """A ``requests`` transport adapter that waits for each host's token and learns its limit.

    The arguments are those of `nanobucket.httpx.RateLimitedTransport` (*key*
    takes the ``PreparedRequest``); *adapter_kwargs* go to ``HTTPAdapter``
    (``pool_maxsize=``, ...). A wait past *timeout* raises `RateLimitTimeout`.

    >>> a = RateLimitedAdapter(rate=10, capacity=5, retries=2, pool_maxsize=8)
    >>> a.retry.retries, a.limit("h")
    (2, KeyLimit(rate=10, capacity=5, paused_for=0.0))
    """

    def __init__(
        self,
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
        **adapter_kwargs: Any,
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
        )
        self.retry = Retries(retries, retry_budget, retry_methods)
        self._key: KeyFunc = key if key is not None else host_key
        super().__init__(**adapter_kwargs)

    def limit(self, key: Hashable) -> KeyLimit:
        """*key*'s rate and capacity now, and the seconds left of its pause.

        >>> RateLimitedAdapter(rate=1, capacity=2).limit("h")
        KeyLimit(rate=1, capacity=2, paused_for=0.0)
        """
        return self.pacer.limit(key)

    def send(
        self, request: requests.PreparedRequest, *args: Any, **kwargs: Any
    ) -> requests.Response:
        """Wait for the key's token, send, learn from the answer (and maybe retry).

        >>> class Canned(requests.adapters.HTTPAdapter):   # answers without a network
        ...     def send(self, request, *args, **kwargs):
        ...         response = requests.Response()
        ...         response.status_code, response.headers["X-RateLimit-Limit"] = 200, "3"
        ...         return response
        >>> class Limited(RateLimitedAdapter, Canned): pass
        >>> a = Limited(rate=10, capacity=5)
        >>> a.send(requests.Request("GET", "http://h/").prepare()).status_code, a.limit("h")
        (200, KeyLimit(rate=10, capacity=3, paused_for=0.0))
        """
        key = self._key(request)
        pacer = self.pacer
        end = self.retry.deadline(pacer)
        tries = 0
        while True:
            try:
                state = pacer.start(key)
            except WaitTooLong as err:
                raise RateLimitTimeout(
                    str(err), key=err.key, retry_after_ns=err.retry_after_ns, request=request
                ) from None
            try:
                response = super().send(request, *args, **kwargs)
            except BaseException:
                pacer.failed(state)
                raise
            pause = pacer.done(state, response.status_code, response.headers.get)
            replayable = request.body is None or isinstance(request.body, (bytes, str))
            method = request.method or "GET"
            if not self.retry.again(
                pacer, response.status_code, method, replayable, tries, pause, end
            ):
                return response
            response.close()
            tries += 1
