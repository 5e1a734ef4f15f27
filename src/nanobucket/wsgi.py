"""WSGI middleware: answer 429 with the time to wait, for Flask, Django, any WSGI app.

>>> import nanobucket as nb
>>> from nanobucket.wsgi import RateLimitMiddleware
>>> def app(environ, start_response): ...
>>> app = RateLimitMiddleware(app, nb.KeyedTokenBucket(rate=100, capacity=200))

Flask: ``app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from . import _http
from ._charge import Charge, Settler
from ._http import *  # noqa: F403 - `_http.__all__`: the names both middleware modules offer
from ._http import Middleware, Rule, limit_headers, rejection, wsgi_path
from .hooks import LimitEvent

__all__ = ["RateLimitMiddleware"]
__all__ += _http.__all__

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]


def _str_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]


class RateLimitMiddleware(Middleware):
    """Rate-limit every request of a WSGI app; 429 + ``Retry-After`` when limited.

    The arguments are those of `nanobucket.asgi.RateLimitMiddleware`, with
    callables (``key``, ``cost``) taking the WSGI ``environ``. The limiter
    must be synchronous, and so must the hooks (*on_decision*,
    *on_limited*). *charge* (``charge(environ, status) -> int``) is settled
    when the server closes the response body. The decision is left in
    ``environ["nanobucket.decision"]``; counting is thread-safe.

    >>> import nanobucket as nb
    >>> def hello(environ, start_response):
    ...     start_response("200 OK", [("Content-Type", "text/plain")])
    ...     return [b"hello"]
    >>> app = RateLimitMiddleware(hello, nb.KeyedTokenBucket(rate=1, capacity=1))
    >>> def start_response(status, headers):
    ...     print(status, dict(headers).get("retry-after"))
    >>> environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "REMOTE_ADDR": "1.2.3.4"}
    >>> body = app(environ, start_response); body = app(environ, start_response)
    200 OK None
    429 Too Many Requests 1
    """

    app: WSGIApp
    _app_kind = "a WSGI callable"
    _async = False

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        counters = self.counters
        if self._simple:
            rule: Rule = self._router.default
        else:
            path = wsgi_path(environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", ""))
            rule = self._router.match(path or "/", environ.get("REQUEST_METHOD", "GET"))
            environ["nanobucket.route"] = rule.pattern
            if rule.exempt:
                counters.add("exempt")
                return self.app(environ, start_response)
        policy = rule.policy
        assert policy is not None
        cost = rule.cost if rule.cost_fn is None else rule.cost_fn(environ)
        key = rule.key.wsgi(environ)  # type: ignore[union-attr]
        decision = policy.check(key, cost)
        environ["nanobucket.decision"] = decision
        if self._hooks is not None:
            self._hooks.emit(LimitEvent(key, rule.pattern, cost, decision, self.shadow))
        if decision.allowed:
            counters.add("admitted")
            if self._quiet:
                if self._charge is not None:
                    return self._charged(environ, start_response, policy, key, cost)
                return self.app(environ, start_response)
            extra = _str_headers(limit_headers(self.headers, policy, decision))

            def start_with_headers(status: str, headers: list[Any], exc_info: Any = None) -> Any:
                headers = [*headers, *extra]  # a new list: the app may reuse its own
                if exc_info is None:
                    return start_response(status, headers)
                return start_response(status, headers, exc_info)

            if self._charge is not None:
                return self._charged(environ, start_with_headers, policy, key, cost)
            return self.app(environ, start_with_headers)
        if self.shadow:
            counters.add("shadow_limited")
            return self.app(environ, start_response)
        counters.add("limited")
        response_headers, body = rejection(self.headers, policy, decision)
        start_response("429 Too Many Requests", _str_headers(response_headers))
        return [body]

    def _charged(
        self, environ: Environ, start_response: StartResponse, policy: Any, key: Any, cost: int
    ) -> Iterable[bytes]:
        """Run the app; settle ``charge(environ, status)`` when its body is closed."""
        assert self._charge is not None
        body = _Settling(self._charge, self._settlers[id(policy)], environ, key, cost)

        def watch(status: str, headers: list[Any], exc_info: Any = None) -> Any:
            body.status = _status_code(status)
            if exc_info is None:
                return start_response(status, headers)
            return start_response(status, headers, exc_info)

        try:
            body.inner = self.app(environ, watch)
        except BaseException:
            body.close()  # the app failed before returning a body: settle now
            raise
        return body


def _status_code(status: str) -> int:
    """``"404 Not Found"`` -> 404 (500 for a status line that is not one)."""
    head = status[:3]
    return int(head) if head.isdigit() else 500


class _Settling:
    """The app's body, passed through; closing it settles the charge (PEP 3333 close())."""

    __slots__ = ("charge", "cost", "environ", "inner", "key", "settled", "settler", "status")

    def __init__(self, charge: Charge, settler: Settler, environ: Environ, key: Any, cost: int):
        self.charge = charge
        self.settler = settler
        self.environ = environ
        self.key = key
        self.cost = cost
        self.status = 500  # no response started (the app raised)
        self.inner: Iterable[bytes] = ()
        self.settled = False

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.inner)

    def close(self) -> None:
        try:
            close = getattr(self.inner, "close", None)
            if close is not None:
                close()
        finally:
            if not self.settled:
                self.settled = True
                self.settler.settle(self.charge, self.key, self.cost, self.environ, self.status)
