"""What the Django middleware, view decorator and DRF throttle share.

Keys read from the Django request (``"ip"``, ``"user"``, the other
integrations' key functions on ``request.META``, callables), the settings'
dotted paths, and `Gate`: one configuration that decides a request and
answers it (429) or marks the response, on Django's sync or async path.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any

from asgiref.sync import iscoroutinefunction
from django.http import HttpResponse, HttpResponseBase
from django.utils.module_loading import import_string

from ._charge import settlers
from ._http import (
    Integration,
    KeyFunc,
    Options,
    Route,
    Rule,
    build_router,
    client_address,
    key_func,
    limit_headers,
    rejection,
)
from .hooks import LimitEvent

if TYPE_CHECKING:
    from typing_extensions import Unpack

SETTINGS = "NANOBUCKET"  # the settings' name


ADDRESS_KEYS = ("ip", "user")  # the keys that read the client address (trusted_proxies)


def user_key(user: Any) -> str | None:
    """``user:<pk>`` for an authenticated user, else None (the address decides)."""
    if user is not None and getattr(user, "is_authenticated", False):
        return f"user:{user.pk}"
    return None


class RequestKey(KeyFunc):
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


def request_key(spec: object, trusted_proxies: Iterable[str] | str | None) -> RequestKey:
    """``"ip"``, ``"user"``, a key function (or a tuple of them), a callable, a dotted path."""
    if isinstance(spec, str) and spec not in ADDRESS_KEYS:
        spec = import_string(spec)
    if spec is None or spec in ADDRESS_KEYS:
        address = client_address(trusted_proxies)
        if spec != "user":
            return RequestKey(lambda request: address.wsgi(request.META))

        def by_user(request: Any) -> str:
            return user_key(getattr(request, "user", None)) or address.wsgi(request.META)

        async def by_user_async(request: Any) -> str:
            auser = getattr(request, "auser", None)  # AuthenticationMiddleware's, for async
            user = await auser() if auser is not None else getattr(request, "user", None)
            return user_key(user) or address.wsgi(request.META)

        return RequestKey(by_user, by_user_async)
    if trusted_proxies is not None:
        raise ValueError(
            "trusted_proxies applies to the key 'ip' or 'user'; a key function of your own "
            "reads the address with client_address(trusted_proxies=...)"
        )
    if isinstance(spec, (KeyFunc, tuple, list)):
        keys = key_func(spec)  # client_address(), header(...), route(), tuples: on META
        return RequestKey(lambda request: keys.wsgi(request.META))
    if callable(spec):
        if iscoroutinefunction(spec) or iscoroutinefunction(getattr(spec, "__call__", None)):  # noqa: B004
            return RequestKey(None, spec)
        return RequestKey(spec)
    raise TypeError(
        f"key must be 'ip', 'user', a key function, a callable taking the request "
        f"or a dotted path to one, not {spec!r}"
    )


def resolve(value: object) -> Any:
    """A setting's value, importing it when it is a dotted path."""
    return import_string(value) if isinstance(value, str) else value


def make_limiter(value: object) -> object:
    """A limiter, a dotted path to one, or a function that makes one."""
    value = resolve(value)
    if value is not None and not hasattr(value, "check") and callable(value):
        value = value()
    return value


class Gate(Integration):
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
        **options: Unpack[Options],
    ) -> None:
        name, keyed = self._options(options, asynchronous)
        keys = [request_key(key, trusted_proxies)]
        rules = []
        for r in routes or ():
            if not isinstance(r, Route):
                raise TypeError(f"routes must be Route objects, not {type(r).__name__}")
            if r.key is not None:  # the route's own key, read from the request too
                trusted = trusted_proxies if r.key in ADDRESS_KEYS else None
                keys.append(request_key(r.key, trusted))
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
        self.settlers = settlers(self.router) if self._charge is not None else {}
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
        return rule.policy.validated_cost(rule.cost_fn(request))

    def decide(self, request: Any, rule: Rule, label: str) -> tuple[Any, Hashable, int]:
        """The sync decision for *request*: ``(decision, key, cost)``; hooks called."""
        policy = rule.policy
        assert policy is not None and rule.key is not None
        cost = self.cost_of(rule, request)
        key = rule.key.sync(request)  # type: ignore[attr-defined]
        decision = policy.check(key, cost)
        request.META["nanobucket.decision"] = decision
        if self._hooks is not None:
            self._hooks.emit(LimitEvent(key, label, cost, decision, self.shadow))
        return decision, key, cost

    async def decide_async(self, request: Any, rule: Rule, label: str) -> tuple[Any, Hashable, int]:
        """`decide`, awaiting an asyncio limiter, key function or hook."""
        policy = rule.policy
        assert policy is not None and rule.key is not None
        cost = self.cost_of(rule, request)
        keys: RequestKey = rule.key  # type: ignore[assignment]
        if keys.asynchronous is not None:
            key = await keys.asynchronous(request)
        else:
            assert keys.sync is not None
            key = keys.sync(request)
        decision = policy.check(key, cost)
        if policy.is_async:
            decision = await decision
        request.META["nanobucket.decision"] = decision
        if self._hooks is not None:
            event = LimitEvent(key, label, cost, decision, self.shadow)
            if self._hooks.awaited:
                await self._hooks.emit_async(event)
            else:
                self._hooks.emit(event)
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
        if not self._quiet and decision.allowed:
            assert rule.policy is not None
            for field, value in limit_headers(self.headers, rule.policy, decision):
                response.headers[field.decode("latin-1")] = value.decode("latin-1")
        return response

    def charged(self, decision: Any) -> bool:
        return self._charge is not None and decision.allowed

    def settle(self, request: Any, rule: Rule, key: Hashable, cost: int, status: int) -> None:
        assert self._charge is not None and rule.policy is not None
        self.settlers[id(rule.policy)].settle(self._charge, key, cost, request, status)

    async def settle_async(
        self, request: Any, rule: Rule, key: Hashable, cost: int, status: int
    ) -> None:
        assert self._charge is not None and rule.policy is not None
        settler = self.settlers[id(rule.policy)]
        if settler.awaited:
            await settler.settle_async(self._charge, key, cost, request, status)
        else:
            settler.settle(self._charge, key, cost, request, status)

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
        if not isinstance(response, HttpResponseBase) and inspect.isawaitable(response):
            close_awaitable(response)
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


def close_awaitable(awaitable: object) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()  # never awaited: no "coroutine was never awaited" warning
