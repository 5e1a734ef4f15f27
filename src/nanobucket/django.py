"""Django: a middleware, a view decorator and a DRF throttle over any nanobucket limiter.

The 429 is the other integrations' (``Retry-After``, ``RateLimit-Policy`` /
``RateLimit``, an ``application/problem+json`` body), and so are the
admitted responses' fields. Sync and async views both work: an asyncio
limiter (`AsyncRedisTokenBucket`) is awaited on Django's async path, so the
event loop never waits on Redis.

* `RateLimitMiddleware`: every request, configured by ``NANOBUCKET`` in
  ``settings.py`` (see its docstring for the keys);
* `limit`: one view, ``@limit(limiter, key="user")`` (class-based views
  through ``method_decorator``);
* ``NanobucketThrottle``: a Django REST framework throttle that takes one
  decision per request, atomically, and whose ``wait()`` is exact.

>>> import nanobucket as nb
>>> from nanobucket.django import limit
>>> @limit(nb.KeyedTokenBucket(rate=10, capacity=20), key="user")
... def reports(request): ...
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

try:
    import django  # noqa: F401 - here only to name the extra when it is missing
except ImportError as exc:  # pragma: no cover - tested in a subprocess without Django
    raise ImportError("nanobucket.django needs Django: pip install 'nanobucket[django]'") from exc

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpResponse, HttpResponseBase
from django.utils.module_loading import import_string

from ._http import Counters, Gate, Options, Route, client_address, counters_or_new, header, route
from ._http import drf as _drf
from ._http.django import DECISION, SETTINGS, decide, django_gate, make_limiter

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = (
    "Counters",
    "NanobucketThrottle",
    "RateLimitMiddleware",
    "Route",
    "client_address",
    "header",
    "limit",
    "route",
)

View = Callable[..., Any]
# The shared options (`Options`), the middleware's own, and NanobucketThrottle's settings.
_MIDDLEWARE_KEYS = Options.__optional_keys__ | {
    "limiter",
    "key",
    "trusted_proxies",
    "cost",
    "routes",
    "exempt",
    "throttle",
}


# --------------------------------------------------------------------------
# The middleware


class RateLimitMiddleware:
    """Rate-limit every request; configured by ``NANOBUCKET`` in ``settings.py``.

    Add ``"nanobucket.django.RateLimitMiddleware"`` to ``MIDDLEWARE`` (after
    ``AuthenticationMiddleware`` to key by user). ``NANOBUCKET`` is a dict:

    * ``"limiter"`` (required): a limiter, a rate written as text
      (``"100/minute"``: a `KeyedTokenBucket` of it, its capacity the
      count), a dotted path to a limiter, or a function that makes one;
    * ``"key"``: ``"ip"`` (default: the client address), ``"user"``
      (``user:<pk>`` when authenticated, else the address), a key function
      (``header("X-API-Key")``, ``route()``, a tuple of them), a callable
      taking the request (``async def`` on the async path), or a dotted
      path to one;
    * ``"trusted_proxies"``: the proxies whose ``X-Forwarded-For`` is read
      (as ``client_address(trusted_proxies=...)``);
    * ``"exempt_clients"``: clients never limited: addresses and networks
      (``"10.0.0.0/8"``, read as the key ``"ip"`` reads the address) and
      predicates taking the request (functions, not dotted paths: a text
      is an address);
    * ``"cost"`` (an int or a callable taking the request), ``"routes"``
      (`Route` objects: per-path and per-method rules), ``"exempt"``
      (paths never limited), ``"headers"``, ``"name"``, ``"shadow"``,
      ``"counters"``, ``"keyed"``, ``"on_decision"``, ``"on_limited"``,
      ``"charge"`` (``charge(request, status) -> int``, settled when the
      view has answered): as for `nanobucket.wsgi.RateLimitMiddleware`;
      callables may be dotted paths.

    The middleware runs sync or async, as Django calls it; an asyncio
    limiter needs the async path (ASGI). The decision is left in
    ``request.META["nanobucket.decision"]``.

    >>> from django.http import HttpResponse
    >>> from django.test import override_settings
    >>> from django.test.client import RequestFactory
    >>> import nanobucket as nb
    >>> limits = {"limiter": nb.KeyedTokenBucket(rate=1, capacity=1)}
    >>> with override_settings(NANOBUCKET=limits):
    ...     mw = RateLimitMiddleware(lambda request: HttpResponse("hi"))
    >>> request = RequestFactory().get("/")
    >>> mw(request).status_code, mw(request).status_code, mw(request)["Retry-After"]
    (200, 429, '1')
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        if not callable(get_response):
            raise TypeError("get_response must be callable")
        config = getattr(settings, SETTINGS, None)
        if not isinstance(config, Mapping) or "limiter" not in config:
            raise TypeError(
                f"settings.{SETTINGS} must be a dict with a 'limiter', "
                f"e.g. {{'limiter': nanobucket.KeyedTokenBucket(rate=100, capacity=200)}}"
            )
        unknown = set(config) - _MIDDLEWARE_KEYS
        if unknown:
            raise ValueError(f"settings.{SETTINGS}: unknown keys {sorted(unknown)}")
        options = {k: v for k, v in config.items() if k not in ("limiter", "throttle")}
        for name in ("cost", "on_decision", "on_limited", "charge", "counters"):
            if isinstance(options.get(name), str):
                options[name] = import_string(options[name])
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        self._gate = django_gate(
            make_limiter(config["limiter"]), asynchronous=self.async_mode, **options
        )
        self.counters = self._gate.counters
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request: Any) -> Any:
        if self.async_mode:
            return _respond_async(self._gate, request, lambda: self.get_response(request), None)
        return _respond(self._gate, request, lambda: self.get_response(request), None)

    def __repr__(self) -> str:
        mode = "async" if self.async_mode else "sync"
        return f"RateLimitMiddleware({mode}, headers={self._gate.headers!r})"


# --------------------------------------------------------------------------
# The decorator


def limit(
    limiter: object,
    *,
    key: object = "ip",
    cost: int | Callable[[Any], int] = 1,
    trusted_proxies: Iterable[str] | str | None = None,
    **options: Unpack[Options],
) -> Callable[[View], View]:
    """Rate-limit one view, sync or ``async def``; 429 as the middleware answers.

    The arguments are the middleware's settings (`RateLimitMiddleware`),
    given here; a `LimitEvent`'s ``route`` is the view's qualified name.
    On a class-based view: ``@method_decorator(limit(...), name="get")``
    (or ``name="dispatch"`` for a sync view).

    >>> import nanobucket as nb
    >>> from django.http import HttpResponse
    >>> from django.test.client import RequestFactory
    >>> @limit(nb.KeyedTokenBucket(rate=1, capacity=2), key="ip")
    ... def hello(request):
    ...     return HttpResponse("hello")
    >>> request = RequestFactory().get("/")
    >>> [hello(request).status_code for _ in range(3)]
    [200, 200, 429]
    >>> hello(request)["RateLimit"]
    '"default";r=0;t=2'
    """
    options["counters"] = counters_or_new(options.get("counters"))  # one count for every view
    gate_for = functools.partial(
        django_gate,
        make_limiter(limiter),
        key=key,
        cost=cost,
        trusted_proxies=trusted_proxies,
        **options,
    )
    # Checked now, not at the first request; the sync one when a sync view needs it.
    # Built once: method_decorator applies a decorator again at every request.
    gates = {True: gate_for(asynchronous=True)}

    def decorate(view: View) -> View:
        if not callable(view):
            raise TypeError(f"limit() decorates a view, not {view!r}")
        label = getattr(view, "__qualname__", None) or repr(view)
        if iscoroutinefunction(view):
            gate = gates[True]

            @functools.wraps(view)
            async def limited_async(request: Any, *args: Any, **kwargs: Any) -> Any:
                return await _respond_async(
                    gate, request, lambda: view(request, *args, **kwargs), label
                )

            return limited_async
        if False not in gates:
            gates[False] = gate_for(asynchronous=False)
        sync_gate = gates[False]

        @functools.wraps(view)
        def limited(request: Any, *args: Any, **kwargs: Any) -> Any:
            return _respond(sync_gate, request, lambda: view(request, *args, **kwargs), label)

        return limited

    return decorate


# --------------------------------------------------------------------------
# The response


def _respond(gate: Gate, request: Any, call: Callable[[], Any], label: str | None) -> Any:
    """The sync path: decide, then answer 429 or run *call* (the view, the next handler)
    and settle its charge. *label* is the hooks' ``route``; None for the matched
    rule's pattern."""
    admitted, _, fields, body, due = decide(gate, request, label)
    if not admitted:
        return _refusal(fields, body)
    try:
        response = call()
    except BaseException:
        if due is not None:
            due.settle(request, 500)  # the view raised
        raise
    if not isinstance(response, HttpResponseBase) and inspect.isawaitable(response):
        close = getattr(response, "close", None)
        if close is not None:
            close()  # never awaited: no "coroutine was never awaited" warning
        raise TypeError(
            "limit() on the dispatch() of an async class-based view: decorate its "
            "handler instead, method_decorator(limit(...), name='get')"
        )
    if due is not None:
        due.settle(request, response.status_code)
    return _mark(response, fields)


async def _respond_async(
    gate: Gate, request: Any, call: Callable[[], Awaitable[Any]], label: str | None
) -> Any:
    """The async path of `_respond`."""
    admitted, decision, fields, body, due = await gate.decide_async(request, label)
    if decision is not None:
        request.META[DECISION] = decision
    if not admitted:
        return _refusal(fields, body)
    status = 500
    try:
        response = await call()
        status = response.status_code
    finally:
        if due is not None:
            await due.settle_async(request, status)
    return _mark(response, fields)


def _refusal(fields: Iterable[tuple[bytes, bytes]], body: bytes | None) -> HttpResponse:
    """The 429 of a refused request."""
    return _mark(HttpResponse(body, status=429), fields)


def _mark(response: Any, fields: Iterable[tuple[bytes, bytes]]) -> Any:
    """*response* with the fields of its `Outcome`."""
    for field, value in fields:
        response.headers[field.decode("latin-1")] = value.decode("latin-1")
    return response


if TYPE_CHECKING:
    from ._http.drf import (
        _Throttle as NanobucketThrottle,  # at run time, made on DRF's BaseThrottle
    )


def __getattr__(name: str) -> Any:
    if name == "NanobucketThrottle":
        with _drf.BUILDING:
            cls = globals().get(name)
            if cls is None:
                cls = globals()[name] = _drf.throttle_class()  # once: every import gets one class
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
