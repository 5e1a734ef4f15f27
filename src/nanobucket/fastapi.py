"""FastAPI: a rate limit as a dependency, so it can key on what other dependencies found.

The middleware (`nanobucket.asgi`) sees a request before routing and
authentication; a dependency runs after them, on the routes that declare it,
and its key function may itself take dependencies (the authenticated user):

>>> import nanobucket as nb
>>> from fastapi import Depends, FastAPI
>>> from nanobucket.fastapi import RateLimit, rate_limited_handler, RateLimited
>>> per_user = RateLimit(nb.KeyedTokenBucket(rate=10, capacity=20),
...                      key=lambda user=Depends(lambda: "alice"): user)
>>> app = FastAPI(exception_handlers={RateLimited: rate_limited_handler})
>>> @app.get("/items", dependencies=[Depends(per_user)])
... async def items(): return ["a", "b"]

An admitted request gets the same ``RateLimit-Policy`` / ``RateLimit`` (or
``X-RateLimit-*``) fields as under the middleware, on the response FastAPI
builds from the route's return value (FastAPI leaves a ``Response`` that a
route returns itself alone); a refused one raises `RateLimited`, a 429
``HTTPException`` with ``Retry-After`` and those fields. With
`rate_limited_handler` installed its body is the middleware's
``application/problem+json``; without it, FastAPI's ``{"detail": ...}``.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException, Request, Response
from starlette.responses import Response as StarletteResponse

from ._compose import switch
from ._http import (
    READ,
    SCOPE,
    Counters,
    Gate,
    KeyFunc,
    Options,
    client_address,
    header,
    route,
)
from ._http.charge import Due
from .tiered import AsyncTiered, Tiered, using_plan

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = (
    "Counters",
    "RateLimit",
    "RateLimited",
    "client_address",
    "header",
    "rate_limited_handler",
    "route",
)


# The request and response, as the dependency asks FastAPI for them (by type;
# the names only need to stay clear of the key and cost functions' own).
_OURS = ("nanobucket_request", "nanobucket_response")


class RateLimited(HTTPException):
    """A 429 from a `RateLimit` dependency: ``Retry-After`` and the limit's fields.

    ``decision`` is the limiter's `Decision`; ``body`` the middleware's
    problem document, which `rate_limited_handler` sends.

    >>> import asyncio, nanobucket as nb
    >>> from starlette.requests import Request as Req
    >>> from fastapi import Response
    >>> limit = RateLimit(nb.TokenBucket(rate=1, capacity=1))
    >>> request = Req({"type": "http", "headers": [], "client": ("1.2.3.4", 1)})
    >>> ok = asyncio.run(limit(nanobucket_request=request, nanobucket_response=Response()))
    >>> try:
    ...     asyncio.run(limit(nanobucket_request=request, nanobucket_response=Response()))
    ... except RateLimited as exc:
    ...     print(exc.status_code, exc.headers["retry-after"], exc.decision.allowed)
    429 1 False
    """

    def __init__(self, decision: Any, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        fields = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers}
        fields.pop("content-type", None)
        fields.pop("content-length", None)
        super().__init__(429, "Too Many Requests", fields)
        self.decision = decision
        self.body = body

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its own arguments (Exception's pickling would pass the
        # status code as the decision).
        headers = [
            (k.encode("latin-1"), v.encode("latin-1")) for k, v in (self.headers or {}).items()
        ]
        return type(self), (self.decision, headers, self.body)


async def rate_limited_handler(request: Request, exc: Exception) -> StarletteResponse:
    """Answer a `RateLimited` as the middleware does: problem+json, the same headers.

    ``FastAPI(exception_handlers={RateLimited: rate_limited_handler})``.

    >>> import asyncio, nanobucket as nb
    >>> d = nb.TokenBucket(rate=1, capacity=1, clock=lambda: 0).check(cost=0)
    >>> exc = RateLimited(d, [(b"retry-after", b"1")], b"{}")
    >>> r = asyncio.run(rate_limited_handler(None, exc))  # type: ignore[arg-type]
    >>> r.status_code, r.headers["retry-after"], r.headers["content-type"]
    (429, '1', 'application/problem+json')
    """
    assert isinstance(exc, RateLimited)
    return StarletteResponse(
        exc.body, 429, headers=exc.headers, media_type="application/problem+json"
    )


class _RequestView:
    """A Starlette `Request`, read through its ASGI scope (see `nanobucket._http.View`)."""

    __slots__ = ()

    def method(self, request: Request) -> str:
        return SCOPE.method(request.scope)  # type: ignore[no-any-return]

    def path(self, request: Request) -> str:
        return SCOPE.path(request.scope)

    def peer(self, request: Request) -> str:
        return SCOPE.peer(request.scope)

    def header(self, request: Request, name: str) -> str | None:
        return SCOPE.header(request.scope, name)

    def app_header(self, request: Request, name: str) -> str | None:
        return SCOPE.app_header(request.scope, name)

    def note(self, request: Request, name: str, value: object) -> None:
        request.scope[name] = value

    def noted(self, request: Request, name: str) -> Any:
        return request.scope.get(name)


_VIEW = _RequestView()


def _dependency(
    func: object,
) -> tuple[Callable[..., Any] | None, list[inspect.Parameter], bool, bool]:
    """A plain callable's parameters for FastAPI to fill (by their own names: a
    query or header parameter is named by it), whether it takes ``request``
    itself, and whether it is a coroutine function."""
    if not callable(func) or isinstance(func, KeyFunc):
        return None, [], False, False
    try:
        # Evaluated: FastAPI reads string annotations (``from __future__ import
        # annotations``) in the namespace of the callable it is given, ours.
        params = list(inspect.signature(func, eval_str=True).parameters.values())
    except (TypeError, ValueError, NameError):
        raise TypeError(f"cannot read the parameters of {func!r}") from None
    wants_request = False
    renamed = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"{func!r}: *args and **kwargs cannot be filled by FastAPI")
        if p.name == "request" and p.default is p.empty:
            wants_request = True
            continue
        if p.name in _OURS:
            raise TypeError(f"{func!r}: the parameter name {p.name!r} is the dependency's own")
        renamed.append(p.replace(kind=p.KEYWORD_ONLY))
    is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004 - an object with async __call__
    )
    return func, renamed, wants_request, is_async


async def _call(
    func: Callable[..., Any], wants_request: bool, is_async: bool, request: Request, kw: Any
) -> Any:
    value = func(request, **kw) if wants_request else func(**kw)
    return await value if is_async else value


class RateLimit:
    """A FastAPI dependency that admits a request or raises `RateLimited` (429).

    * *limiter*: any nanobucket limiter, keyed or not, or a rate written
      as text (as the middleware takes it); an asyncio one
      (`AsyncRedisTokenBucket`) is awaited, so the event loop never blocks
      on Redis. A `RedisTokenBucket`, which would block it on every
      decision, is refused with a `TypeError`.
    * *key*: ``client_address()`` (default), ``header(...)``, ``route()``
      (the matched route pattern), a tuple of them, or any function: its
      ``request`` parameter gets the request and its other parameters are
      filled by FastAPI (``user=Depends(current_user)``, a query, a header).
    * *cost*: tokens per request, an int or such a function.
    * *plan*: with a `tiered` limiter, a function filled by FastAPI like
      the key function, returning the request's plan name
      (``plan=lambda user=Depends(current_user): user.plan``): the limiter
      decides on that plan (see `nanobucket.tiered.using_plan`), not on what
      its ``tier`` says; None leaves it to ``tier`` (or ``default``).
    * *headers* (``"ietf"``, ``"legacy"``, ``"off"``), *name*, *shadow*,
      *counters*, *keyed*, *on_decision*, *on_limited*, *exempt_clients*
      (predicates take the request): as for the middleware; a
      `LimitEvent`'s ``route`` is the route's path pattern. An exempt
      client's dependency value is None.
    * *charge*: ``charge(request, status) -> int``, the request's real
      cost, settled against *cost* when the route has answered (the
      dependency then has a ``yield``). *status* is the ``HTTPException``'s
      status code when the route raised one, 500 for another exception,
      else the status the route set on the ``Response`` parameter or its
      declared ``status_code`` (200 by default); a ``Response`` object the
      route returns itself is not seen.

    The decision is left in ``request.scope["nanobucket.decision"]`` (the
    last one, when a route has several limits), and is the dependency's value.

    >>> import nanobucket as nb
    >>> from fastapi import Depends, FastAPI
    >>> def by_user(user: str = "alice") -> str: return user   # a query parameter here
    >>> limit = RateLimit(nb.KeyedTokenBucket(rate=10, capacity=20), key=by_user)
    >>> app = FastAPI()
    >>> @app.get("/", dependencies=[Depends(limit)])
    ... async def root(): return "ok"
    >>> list(__import__("inspect").signature(limit).parameters)
    ['nanobucket_request', 'nanobucket_response', 'user']
    """

    def __init__(
        self,
        limiter: object,
        *,
        key: object = None,
        cost: object = 1,
        plan: Callable[..., Any] | None = None,
        **options: Unpack[Options],
    ) -> None:
        self._key_fn, key_params, self._key_request, self._key_async = _dependency(key)
        self._cost_fn, cost_params, self._cost_request, self._cost_async = _dependency(cost)
        # Not a request reader (``header(...)``): a plan is what the server knows of a
        # caller, never what the client says.
        if plan is not None and (not callable(plan) or isinstance(plan, KeyFunc)):
            raise TypeError(f"plan must be a function returning a plan name, not {plan!r}")
        if plan is not None and not isinstance(limiter, (Tiered, AsyncTiered)):
            raise TypeError(
                f"plan= picks a plan of a tiered limiter, not of {type(limiter).__name__}"
            )
        self._plan_fn, plan_params, self._plan_request, self._plan_async = _dependency(plan)
        self._gate = Gate(
            _VIEW,
            limiter,
            key=None if self._key_fn is not None else key,
            cost=0 if self._cost_fn is not None else cost,
            **options,
        )
        self._gate.refuse_blocking("a FastAPI dependency")
        self.counters = self._gate.counters
        self.headers, self.shadow = self._gate.headers, self._gate.shadow  # as configured
        # What FastAPI fills: the request, the response, and the parameters of
        # the key and cost functions (one parameter where both take one name).
        params = {
            "nanobucket_request": inspect.Parameter(
                "nanobucket_request", inspect.Parameter.KEYWORD_ONLY, annotation=Request
            ),
            "nanobucket_response": inspect.Parameter(
                "nanobucket_response", inspect.Parameter.KEYWORD_ONLY, annotation=Response
            ),
        }
        for p in (*key_params, *cost_params, *plan_params):
            params.setdefault(p.name, p)
        self.__signature__ = inspect.Signature(list(params.values()))
        self._key_names = tuple(p.name for p in key_params)
        self._cost_names = tuple(p.name for p in cost_params)
        self._plan_names = tuple(p.name for p in plan_params)
        # With charge= the dependency has a yield (code after the route), else it is
        # a coroutine. FastAPI tells them apart by ``getattr(dependency, "__call__")``,
        # which finds this instance attribute before the class's method; a call of the
        # instance goes through the class's `__call__` to the same one.
        self._run = self._settled if options.get("charge") is not None else self._admitted
        vars(self)["__call__"] = self._run

    def __call__(
        self, *, nanobucket_request: Request, nanobucket_response: Response, **deps: Any
    ) -> Any:
        """Decide the request: a coroutine of the decision, or with ``charge=`` an async
        generator that yields it and settles the charge when the route has answered."""
        return self._run(
            nanobucket_request=nanobucket_request, nanobucket_response=nanobucket_response, **deps
        )

    async def _admitted(
        self, *, nanobucket_request: Request, nanobucket_response: Response, **deps: Any
    ) -> Any:
        return (await self._decide(nanobucket_request, nanobucket_response, deps))[0]

    async def _decide(
        self, request: Request, response: Response, deps: dict[str, Any]
    ) -> tuple[Any, Due | None]:
        """Decide one request: ``(decision, due)`` with its fields added, or raise `RateLimited`."""
        if switch.off:  # limits turned off: no key or cost function is called either
            return None, None
        scope = request.scope
        matched = getattr(scope.get("route"), "path", None)  # FastAPI's route pattern
        if "nanobucket.route" not in scope and matched is not None:
            scope["nanobucket.route"] = matched  # route() keys by it
        key: Any = READ
        if self._key_fn is not None:
            kw = {name: deps[name] for name in self._key_names}
            key = await _call(self._key_fn, self._key_request, self._key_async, request, kw)
        cost = None
        if self._cost_fn is not None:
            kw = {name: deps[name] for name in self._cost_names}
            cost = await _call(self._cost_fn, self._cost_request, self._cost_async, request, kw)
        if self._plan_fn is None:
            admitted, decision, fields, body, due = await self._gate.decide_async(
                request, matched or "*", key=key, cost=cost
            )
        else:
            kw = {name: deps[name] for name in self._plan_names}
            name = await _call(self._plan_fn, self._plan_request, self._plan_async, request, kw)
            with using_plan(name):
                admitted, decision, fields, body, due = await self._gate.decide_async(
                    request, matched or "*", key=key, cost=cost
                )
        scope["nanobucket.decision"] = decision
        if not admitted:
            assert body is not None
            raise RateLimited(decision, list(fields), body)
        for field, value in fields:
            response.headers.append(field.decode("latin-1"), value.decode("latin-1"))
        return decision, due

    async def _settled(
        self, *, nanobucket_request: Request, nanobucket_response: Response, **deps: Any
    ) -> AsyncIterator[Any]:
        request, response = nanobucket_request, nanobucket_response
        decision, due = await self._decide(request, response, deps)
        if due is None:  # shadow-limited: it was never charged
            yield decision
            return
        status: int | None = None
        try:
            yield decision
        except HTTPException as exc:
            status = exc.status_code
            raise
        except Exception:
            status = 500
            raise
        finally:
            if status is None:
                declared = getattr(request.scope.get("route"), "status_code", None)
                status = response.status_code or declared or 200
            await due.settle_async(request, status)

    def __repr__(self) -> str:
        return f"RateLimit(headers={self.headers!r}, shadow={self.shadow})"
