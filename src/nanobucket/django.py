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
import threading
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

try:
    from asgiref.sync import iscoroutinefunction, markcoroutinefunction
    from django.conf import settings
    from django.http import HttpResponse
    from django.utils.module_loading import import_string
except ImportError as exc:  # pragma: no cover - tested in a subprocess without Django
    raise ImportError("nanobucket.django needs Django: pip install 'nanobucket[django]'") from exc

from ._charge import Charge, check_charge, settlers
from ._http import (
    Counters,
    KeyFunc,
    Route,
    Rule,
    build_router,
    check_counters,
    check_headers_mode,
    client_address,
    header,
    key_func,
    limit_headers,
    rejection,
    route,
)
from .hooks import Hook, LimitEvent, make_hooks

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
_SETTINGS = "NANOBUCKET"
_BUILDING = threading.RLock()  # the throttle's class and each subclass's gate, made once
_MIDDLEWARE_KEYS = frozenset(
    {
        "limiter",
        "key",
        "trusted_proxies",
        "cost",
        "routes",
        "exempt",
        "headers",
        "name",
        "shadow",
        "counters",
        "keyed",
        "on_decision",
        "on_limited",
        "charge",
        "throttle",  # NanobucketThrottle's own settings
    }
)


# --------------------------------------------------------------------------
# Keys: a request -> key, sync or awaited


_ADDRESS_KEYS = ("ip", "user")  # the keys that read the client address (trusted_proxies)


def _user_key(user: Any) -> str | None:
    """``user:<pk>`` for an authenticated user, else None (the address decides)."""
    if user is not None and getattr(user, "is_authenticated", False):
        return f"user:{user.pk}"
    return None


class _RequestKey(KeyFunc):
    """A key taken from the Django request (the others read ``request.META``).

    *sync* is None for an ``async def`` key function: such a key works on
    the async path only. *asynchronous* is None when *sync* serves both.
    """

    __slots__ = ("asynchronous", "sync")

    def __init__(
        self,
        sync: Callable[[Any], Hashable] | None,
        asynchronous: Callable[[Any], Awaitable[Hashable]] | None = None,
    ) -> None:
        self.sync = sync
        self.asynchronous = asynchronous


def _key(spec: object, trusted_proxies: Iterable[str] | str | None) -> _RequestKey:
    """``"ip"``, ``"user"``, a key function (or a tuple of them), a callable, a dotted path."""
    if isinstance(spec, str) and spec not in _ADDRESS_KEYS:
        spec = import_string(spec)
    if spec is None or spec in _ADDRESS_KEYS:
        address = client_address(trusted_proxies)
        if spec != "user":
            return _RequestKey(lambda request: address.wsgi(request.META))

        def by_user(request: Any) -> str:
            return _user_key(getattr(request, "user", None)) or address.wsgi(request.META)

        async def by_user_async(request: Any) -> str:
            auser = getattr(request, "auser", None)  # AuthenticationMiddleware's, for async
            user = await auser() if auser is not None else getattr(request, "user", None)
            return _user_key(user) or address.wsgi(request.META)

        return _RequestKey(by_user, by_user_async)
    if trusted_proxies is not None:
        raise ValueError(
            "trusted_proxies applies to the key 'ip' or 'user'; a key function of your own "
            "reads the address with client_address(trusted_proxies=...)"
        )
    if isinstance(spec, (KeyFunc, tuple, list)):
        keys = key_func(spec)  # client_address(), header(...), route(), tuples: on META
        return _RequestKey(lambda request: keys.wsgi(request.META))
    if callable(spec):
        if iscoroutinefunction(spec) or iscoroutinefunction(getattr(spec, "__call__", None)):  # noqa: B004
            return _RequestKey(None, spec)
        return _RequestKey(spec)
    raise TypeError(
        f"key must be 'ip', 'user', a key function, a callable taking the request "
        f"or a dotted path to one, not {spec!r}"
    )


def _resolve(value: object) -> Any:
    """A setting's value, importing it when it is a dotted path."""
    return import_string(value) if isinstance(value, str) else value


def _limiter(value: object) -> object:
    """A limiter, a dotted path to one, or a function that makes one."""
    value = _resolve(value)
    if value is not None and not hasattr(value, "check") and callable(value):
        value = value()
    return value


# --------------------------------------------------------------------------
# The engine every integration here shares


class _Gate:
    """One configuration: decides a request, and answers it (429) or marks the response."""

    def __init__(
        self,
        limiter: object,
        *,
        asynchronous: bool,
        key: object = "ip",
        trusted_proxies: Iterable[str] | str | None = None,
        cost: object = 1,
        routes: Iterable[Route] | None = None,
        exempt: str | Iterable[str] | None = None,
        headers: str = "ietf",
        name: str = "default",
        shadow: bool = False,
        counters: Counters | None = None,
        keyed: bool | None = None,
        on_decision: Hook | None = None,
        on_limited: Hook | None = None,
        charge: Charge | None = None,
    ) -> None:
        if not isinstance(shadow, bool):
            raise TypeError("shadow must be a bool")
        self.headers = check_headers_mode(headers)
        self.shadow = shadow
        self.quiet = shadow or self.headers == "off"
        self.counters = check_counters(counters)
        keys = [_key(key, trusted_proxies)]
        rules = []
        for r in routes or ():
            if not isinstance(r, Route):
                raise TypeError(f"routes must be Route objects, not {type(r).__name__}")
            if r.key is not None:  # the route's own key, read from the request too
                trusted = trusted_proxies if r.key in _ADDRESS_KEYS else None
                keys.append(_key(r.key, trusted))
                r = Route(  # noqa: PLW2901 - a copy, the caller's Route stays as given
                    r.path,
                    r.limiter,
                    cost=r.cost,
                    key=keys[-1],
                    exempt=r.exempt,
                    name=r.name,
                    methods=r.methods,
                )
            rules.append(r)
        self.router = build_router(limiter, keys[0], cost, name, keyed, rules, exempt)
        self.simple = not self.router.exact and not self.router.prefixes
        self.hooks = make_hooks(on_decision, on_limited, allow_async=asynchronous)
        self.charge = check_charge(charge)
        self.settlers = settlers(self.router) if charge is not None else {}
        if not asynchronous:
            for policy in self.router.policies():
                if policy.is_async:
                    raise TypeError(
                        "an asyncio limiter (async check()) needs an async view, or Django's "
                        "async path (ASGI with async-capable middleware); pass a sync limiter"
                    )
            if any(k.sync is None for k in keys):
                raise TypeError("an async key function needs an async view or ASGI")

    def rule(self, request: Any) -> Rule:
        """The request's rule; an exempt one is counted here."""
        if self.simple:
            return self.router.default
        # request.path is text already (decoded, SCRIPT_NAME included), as routes are written.
        rule = self.router.match(request.path or "/", request.method or "GET")
        request.META["nanobucket.route"] = rule.pattern
        if rule.exempt:
            with self.counters._lock:
                self.counters.exempt += 1
        return rule

    def cost_of(self, rule: Rule, request: Any) -> int:
        if rule.cost_fn is None:
            return rule.cost
        assert rule.policy is not None
        return rule.policy.validate_cost(rule.cost_fn(request))

    def decide(self, request: Any, rule: Rule, label: str) -> tuple[Any, Hashable, int]:
        """The sync decision for *request*: ``(decision, key, cost)``; hooks called."""
        policy = rule.policy
        assert policy is not None and rule.key is not None
        cost = self.cost_of(rule, request)
        key = rule.key.sync(request)  # type: ignore[attr-defined]
        decision = policy.check(key, cost)
        request.META["nanobucket.decision"] = decision
        if self.hooks is not None:
            self.hooks.emit(LimitEvent(key, label, cost, decision, self.shadow))
        return decision, key, cost

    async def decide_async(self, request: Any, rule: Rule, label: str) -> tuple[Any, Hashable, int]:
        """`decide`, awaiting an asyncio limiter, key function or hook."""
        policy = rule.policy
        assert policy is not None and rule.key is not None
        cost = self.cost_of(rule, request)
        keys: _RequestKey = rule.key  # type: ignore[assignment]
        if keys.asynchronous is not None:
            key = await keys.asynchronous(request)
        else:
            assert keys.sync is not None
            key = keys.sync(request)
        decision = policy.check(key, cost)
        if policy.is_async:
            decision = await decision
        request.META["nanobucket.decision"] = decision
        if self.hooks is not None:
            event = LimitEvent(key, label, cost, decision, self.shadow)
            if self.hooks.awaited:
                await self.hooks.emit_async(event)
            else:
                self.hooks.emit(event)
        return decision, key, cost

    def verdict(self, rule: Rule, decision: Any) -> HttpResponse | None:
        """The 429 for a refused *decision*, or None to run the view (counted here)."""
        counters = self.counters
        with counters._lock:
            if decision.allowed:
                counters.admitted += 1
                return None
            if self.shadow:
                counters.shadow_limited += 1
                return None
            counters.limited += 1
        assert rule.policy is not None
        fields, body = rejection(self.headers, rule.policy, decision)
        response = HttpResponse(body, status=429)
        for field, value in fields:
            response.headers[field.decode("latin-1")] = value.decode("latin-1")
        return response

    def mark(self, response: Any, rule: Rule, decision: Any) -> Any:
        """*response* with the limit's fields, when the view ran on an admitted request."""
        if not self.quiet and decision.allowed:
            assert rule.policy is not None
            for field, value in limit_headers(self.headers, rule.policy, decision):
                response.headers[field.decode("latin-1")] = value.decode("latin-1")
        return response

    def charged(self, decision: Any) -> bool:
        return self.charge is not None and decision.allowed

    def settle(self, request: Any, rule: Rule, key: Hashable, cost: int, status: int) -> None:
        assert self.charge is not None and rule.policy is not None
        self.settlers[id(rule.policy)].settle(self.charge, key, cost, request, status)

    async def settle_async(
        self, request: Any, rule: Rule, key: Hashable, cost: int, status: int
    ) -> None:
        assert self.charge is not None and rule.policy is not None
        settler = self.settlers[id(rule.policy)]
        if settler.awaited:
            await settler.settle_async(self.charge, key, cost, request, status)
        else:
            settler.settle(self.charge, key, cost, request, status)

    def run(self, request: Any, call: Callable[[], Any], label: str | None) -> Any:
        """The sync path: decide, then answer 429 or run *call* (the view, the next handler).

        *label* is the hooks' ``route``; None for the matched rule's pattern.
        """
        rule = self.rule(request)
        if rule.exempt:
            return call()
        decision, key, cost = self.decide(request, rule, label or rule.pattern)
        refused = self.verdict(rule, decision)
        if refused is not None:
            return refused
        try:
            response = call()
        except BaseException:
            if self.charged(decision):
                self.settle(request, rule, key, cost, 500)  # the view raised
            raise
        if inspect.isawaitable(response):
            _close(response)
            raise TypeError(
                "limit() on the dispatch() of an async class-based view: decorate its "
                "handler instead, method_decorator(limit(...), name='get')"
            )
        if self.charged(decision):
            self.settle(request, rule, key, cost, response.status_code)
        return self.mark(response, rule, decision)

    async def _finish(
        self, pending: Awaitable[Any], request: Any, rule: Rule, decision: Any, key: Any, cost: int
    ) -> Any:
        """An awaitable response: await it, then mark (and settle) as the sync path would."""
        status = 500
        try:
            response = await pending
            status = response.status_code
        finally:
            if self.charged(decision):
                await self.settle_async(request, rule, key, cost, status)
        return self.mark(response, rule, decision)

    async def run_async(
        self, request: Any, call: Callable[[], Awaitable[Any]], label: str | None
    ) -> Any:
        """The async path of `run`."""
        rule = self.rule(request)
        if rule.exempt:
            return await call()
        decision, key, cost = await self.decide_async(request, rule, label or rule.pattern)
        refused = self.verdict(rule, decision)
        if refused is not None:
            return refused
        return await self._finish(call(), request, rule, decision, key, cost)


# --------------------------------------------------------------------------
# The middleware


class RateLimitMiddleware:
    """Rate-limit every request; configured by ``NANOBUCKET`` in ``settings.py``.

    Add ``"nanobucket.django.RateLimitMiddleware"`` to ``MIDDLEWARE`` (after
    ``AuthenticationMiddleware`` to key by user). ``NANOBUCKET`` is a dict:

    * ``"limiter"`` (required): a limiter, a dotted path to one, or a
      function that makes one;
    * ``"key"``: ``"ip"`` (default: the client address), ``"user"``
      (``user:<pk>`` when authenticated, else the address), a key function
      (``header("X-API-Key")``, ``route()``, a tuple of them), a callable
      taking the request (``async def`` on the async path), or a dotted
      path to one;
    * ``"trusted_proxies"``: the proxies whose ``X-Forwarded-For`` is read
      (as ``client_address(trusted_proxies=...)``);
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
        config = getattr(settings, _SETTINGS, None)
        if not isinstance(config, Mapping) or "limiter" not in config:
            raise TypeError(
                f"settings.{_SETTINGS} must be a dict with a 'limiter', "
                f"e.g. {{'limiter': nanobucket.KeyedTokenBucket(rate=100, capacity=200)}}"
            )
        unknown = set(config) - _MIDDLEWARE_KEYS
        if unknown:
            raise ValueError(f"settings.{_SETTINGS}: unknown keys {sorted(unknown)}")
        options = {k: v for k, v in config.items() if k not in ("limiter", "throttle")}
        for name in ("cost", "on_decision", "on_limited", "charge", "counters"):
            if isinstance(options.get(name), str):
                options[name] = import_string(options[name])
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        self._gate = _Gate(_limiter(config["limiter"]), asynchronous=self.async_mode, **options)
        self.counters = self._gate.counters
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request: Any) -> Any:
        if self.async_mode:
            return self._acall(request)
        return self._gate.run(request, lambda: self.get_response(request), None)

    async def _acall(self, request: Any) -> Any:
        return await self._gate.run_async(request, lambda: self.get_response(request), None)

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
    headers: str = "ietf",
    name: str = "default",
    shadow: bool = False,
    counters: Counters | None = None,
    keyed: bool | None = None,
    on_decision: Hook | None = None,
    on_limited: Hook | None = None,
    charge: Charge | None = None,
) -> Callable[[View], View]:
    """Rate-limit one view, sync or ``async def``; 429 as the middleware answers.

    The arguments are the middleware's settings (`RateLimitMiddleware`),
    given here; a `LimitEvent`'s ``route`` is the view's qualified name.
    On a class-based view: ``@method_decorator(limit(...), name="get")``
    (or ``name="dispatch"`` for a sync view).

    >>> import nanobucket as nb
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
    options: dict[str, Any] = {
        "key": key,
        "cost": cost,
        "trusted_proxies": trusted_proxies,
        "headers": headers,
        "name": name,
        "shadow": shadow,
        "counters": counters,
        "keyed": keyed,
        "on_decision": on_decision,
        "on_limited": on_limited,
        "charge": charge,
    }
    options["counters"] = check_counters(counters)  # one count for every view decorated
    resolved = _limiter(limiter)
    # Checked now, not at the first request; the sync one when a sync view needs it.
    # Built once: method_decorator applies a decorator again at every request.
    gates = {True: _Gate(resolved, asynchronous=True, **options)}

    def decorate(view: View) -> View:
        if not callable(view):
            raise TypeError(f"limit() decorates a view, not {view!r}")
        label = getattr(view, "__qualname__", None) or repr(view)
        if iscoroutinefunction(view):
            gate = gates[True]

            @functools.wraps(view)
            async def limited_async(request: Any, *args: Any, **kwargs: Any) -> Any:
                return await gate.run_async(request, lambda: view(request, *args, **kwargs), label)

            return limited_async
        if False not in gates:
            gates[False] = _Gate(resolved, asynchronous=False, **options)
        sync_gate = gates[False]

        @functools.wraps(view)
        def limited(request: Any, *args: Any, **kwargs: Any) -> Any:
            return sync_gate.run(request, lambda: view(request, *args, **kwargs), label)

        return limited

    return decorate


# --------------------------------------------------------------------------
# The DRF throttle. Importing DRF reads Django's settings, so the class is
# made at its first use (by then settings exist), not when this module loads.


class _Throttle:
    """``NanobucketThrottle``: a DRF throttle, one atomic decision of a limiter per request.

    Keyed by user (``user:<pk>``) when authenticated, else by client
    address. Configure it by subclassing, with class attributes, or, for
    the class itself, with ``NANOBUCKET["throttle"]`` in settings (a
    dict of the same names):

    * ``limiter``: a limiter, a dotted path to one, or a function that makes one;
    * ``key`` (``"user"`` by default, or as for the middleware),
      ``trusted_proxies``, ``cost``, ``on_decision``, ``on_limited``.

    ``allow_request`` spends the tokens in the limiter's one atomic
    step (no read-then-write of a cache, so concurrent requests can
    never all pass), and ``wait()`` is the refusal's exact
    ``retry_after`` in seconds (DRF rounds it up for ``Retry-After``).

    >>> import nanobucket as nb
    >>> from nanobucket.django import NanobucketThrottle
    >>> class Burst(NanobucketThrottle):
    ...     limiter = nb.KeyedTokenBucket(rate=1, capacity=1, clock=lambda: 0)
    >>> from django.test.client import RequestFactory
    >>> request = RequestFactory().get("/")
    >>> [(t.allow_request(request, None), t.wait()) for t in (Burst(), Burst())]
    [(True, None), (False, 1.0)]
    """

    limiter: object = None
    key: object = "user"
    trusted_proxies: Iterable[str] | str | None = None
    cost: object = 1
    on_decision: Hook | None = None
    on_limited: Hook | None = None
    decision: Any = None

    @classmethod
    def gate(cls) -> _Gate:
        """The class's configuration, built and checked once, at its first request.

        >>> import nanobucket as nb
        >>> from nanobucket.django import NanobucketThrottle
        >>> class Burst(NanobucketThrottle):
        ...     limiter = nb.KeyedTokenBucket(rate=1, capacity=1)
        >>> Burst.gate() is Burst.gate()
        True
        """
        gate = cls.__dict__.get("_nanobucket_gate")
        if gate is not None:
            return gate  # type: ignore[no-any-return]
        with _BUILDING:  # the first requests may come at once: one gate (one made limiter)
            gate = cls.__dict__.get("_nanobucket_gate")
            if gate is None:
                gate = cls._build_gate()
                setattr(cls, "_nanobucket_gate", gate)  # noqa: B010 - in this class's own __dict__
            return gate

    @classmethod
    def _build_gate(cls) -> _Gate:
        names = ("limiter", "key", "trusted_proxies", "cost", "on_decision", "on_limited")
        config: dict[str, Any] = {n: _unwrap(inspect.getattr_static(cls, n)) for n in names}
        if config["limiter"] is None:
            fallback = getattr(settings, _SETTINGS, {}).get("throttle")
            if not isinstance(fallback, Mapping) or "limiter" not in fallback:
                raise TypeError(
                    f"{cls.__name__} has no limiter: set limiter = ... on a subclass, "
                    f"or settings.{_SETTINGS}['throttle'] = {{'limiter': ...}}"
                )
            unknown = set(fallback) - set(names)
            if unknown:
                raise ValueError(f"settings.{_SETTINGS}['throttle']: unknown {sorted(unknown)}")
            config.update(fallback)
        for n in ("cost", "on_decision", "on_limited"):
            config[n] = _resolve(config[n])
        limiter = _limiter(config.pop("limiter"))
        # DRF throttles run synchronously: an asyncio limiter is refused here.
        return _Gate(limiter, asynchronous=False, headers="off", **config)

    def allow_request(self, request: Any, view: Any) -> bool:
        """Spend ``cost`` tokens of the request's key; False when refused.

        >>> import nanobucket as nb
        >>> from django.test.client import RequestFactory
        >>> from nanobucket.django import NanobucketThrottle
        >>> class One(NanobucketThrottle):
        ...     limiter = nb.KeyedTokenBucket(rate=1, capacity=1)
        >>> One().allow_request(RequestFactory().get("/"), None)
        True
        """
        gate = self.gate()
        rule = gate.router.default
        label = type(view).__qualname__ if view is not None else type(self).__qualname__
        self.decision = gate.decide(request, rule, label)[0]
        return gate.verdict(rule, self.decision) is None

    def wait(self) -> float | None:
        """Seconds until the refused request would be admitted, exactly; None if admitted.

        >>> import nanobucket as nb
        >>> from django.test.client import RequestFactory
        >>> from nanobucket.django import NanobucketThrottle
        >>> class Slow(NanobucketThrottle):
        ...     limiter = nb.KeyedTokenBucket(rate=3, capacity=1, clock=lambda: 0)
        >>> t = Slow(); t.allow_request(RequestFactory().get("/"), None)
        True
        >>> t = Slow(); t.allow_request(RequestFactory().get("/"), None), t.wait()
        (False, 0.333333334)
        """
        d = self.decision
        if d is None or d.allowed:
            return None
        return d.retry_after  # type: ignore[no-any-return]


if TYPE_CHECKING:
    NanobucketThrottle = _Throttle  # at run time, made on DRF's BaseThrottle by __getattr__


def _throttle_class() -> type:
    """``NanobucketThrottle``: `_Throttle` on DRF's ``BaseThrottle``, made at its first use."""
    try:
        from rest_framework.throttling import BaseThrottle
    except ImportError as exc:  # pragma: no cover - tested in a subprocess without DRF
        raise ImportError(
            "nanobucket.django.NanobucketThrottle needs Django REST framework: "
            "pip install djangorestframework"
        ) from exc
    namespace = {"__module__": __name__, "__doc__": _Throttle.__doc__}
    return type("NanobucketThrottle", (_Throttle, BaseThrottle), namespace)


def _close(awaitable: object) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()  # never awaited: no "coroutine was never awaited" warning


def _unwrap(value: object) -> object:
    return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value


def __getattr__(name: str) -> Any:
    if name == "NanobucketThrottle":
        with _BUILDING:
            cls = globals().get(name)
            if cls is None:
                cls = globals()[name] = _throttle_class()  # once: every import gets one class
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
