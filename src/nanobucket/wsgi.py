"""WSGI middleware: answer 429 with the time to wait, for Flask, Django, any WSGI app.

>>> import nanobucket as nb
>>> from nanobucket.wsgi import RateLimitMiddleware
>>> def app(environ, start_response): ...
>>> app = RateLimitMiddleware(app, nb.KeyedTokenBucket(rate=100, capacity=200))

Flask: ``app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ._http import (
    ENVIRON,
    Counters,
    Gate,
    HttpAnswer,
    Options,
    Route,
    client_address,
    header,
    route,
)
from ._http.charge import Due

if TYPE_CHECKING:
    from typing_extensions import Unpack

# The middleware, and the names both middleware modules offer with it.
__all__ = (
    "Counters",
    "HttpAnswer",
    "RateLimitMiddleware",
    "Route",
    "client_address",
    "header",
    "route",
)

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]


def _str_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]


class RateLimitMiddleware:
    """Rate-limit every request of a WSGI app; 429 + ``Retry-After`` when limited.

    The arguments are those of `nanobucket.asgi.RateLimitMiddleware`, with
    callables (``key``, ``cost``, ``exempt_clients`` predicates) taking the
    WSGI ``environ``. The limiter
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

    def __init__(
        self,
        app: WSGIApp,
        limiter: object,
        *,
        key: object = None,
        cost: int | Callable[[Any], int] = 1,
        routes: Iterable[Route] | None = None,
        exempt: str | Iterable[str] | None = None,
        **options: Unpack[Options],
    ) -> None:
        if not callable(app):
            raise TypeError(f"app must be a WSGI callable, not {type(app).__name__}")
        self.app = app
        self._gate = gate = Gate(
            ENVIRON,
            limiter,
            key=key,
            cost=cost,
            routes=routes,
            exempt=exempt,
            locked=True,
            asynchronous=False,
            **options,
        )
        if gate.awaits:
            raise TypeError("a WSGI app needs a synchronous limiter (check() is async here)")
        self.counters = gate.counters
        self.headers, self.shadow = gate.headers, gate.shadow  # as configured

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        # The peer read here, where it costs least: every request's default key needs it.
        peer = environ.get("REMOTE_ADDR") or ""
        admitted, decision, fields, body, due = self._gate.decide(environ, peer)
        if decision is not None:  # None: an exempt route
            environ["nanobucket.decision"] = decision
        if not admitted:
            start_response("429 Too Many Requests", _str_headers(fields))
            return [body]  # type: ignore[list-item]
        if not fields:
            to_app = start_response
        else:
            extra = _str_headers(fields)

            def to_app(status: str, headers: list[Any], exc_info: Any = None) -> Any:
                headers = [*headers, *extra]  # a new list: the app may reuse its own
                if exc_info is None:
                    return start_response(status, headers)
                return start_response(status, headers, exc_info)

        if due is not None:
            return self._charged(environ, to_app, due)
        app = self.app  # a local name: a callable attribute is called faster from one
        return app(environ, to_app)

    def _charged(
        self, environ: Environ, start_response: StartResponse, due: Due
    ) -> Iterable[bytes]:
        """Run the app; settle ``charge(environ, status)`` when its body is closed."""
        body = _Settling(due, environ)

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

    def __repr__(self) -> str:
        return f"RateLimitMiddleware({self.app!r}, headers={self.headers!r}, shadow={self.shadow})"


def _status_code(status: str) -> int:
    """``"404 Not Found"`` -> 404 (500 for a status line that is not one)."""
    head = status[:3]
    return int(head) if head.isdigit() else 500


class _Settling:
    """The app's body, passed through; closing it settles the charge (PEP 3333 close())."""

    __slots__ = ("due", "environ", "inner", "settled", "status")

    def __init__(self, due: Due, environ: Environ):
        self.due = due
        self.environ = environ
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
                self.due.settle(self.environ, self.status)
