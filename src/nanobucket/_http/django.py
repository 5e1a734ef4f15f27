"""Django's requests as the gate reads them: what the middleware, view decorator and
DRF throttle share.

The `View` of a Django request, the keys read from it (``"ip"``, ``"user"``,
the other integrations' key functions, callables), the settings' dotted
paths, and `django_gate`: a `nanobucket._http.Gate` over Django's requests,
checked for the path (sync or async) Django calls it on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any

from asgiref.sync import iscoroutinefunction
from django.utils.module_loading import import_string

from .._core._bucket import limiter_or_text
from .._core._limiter import traits
from .._core._params import is_rate_text
from . import (
    Gate,
    KeyFunc,
    Options,
    Outcome,
    Route,
    View,
    cgi_name,
    client_address,
    key_func,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

SETTINGS = "NANOBUCKET"  # the settings' name
DECISION = "nanobucket.decision"  # where the decision is left in request.META


ADDRESS_KEYS = ("ip", "user")  # the keys that read the client address (trusted_proxies)


class RequestView:
    """A Django ``HttpRequest``: its path and method, ``request.META`` for the rest."""

    __slots__ = ()

    def method(self, request: Any) -> str:
        return request.method or "GET"  # upper case: Django upper-cases what was sent

    def path(self, request: Any) -> str:
        # What the URL resolver routes: below SCRIPT_NAME (or FORCE_SCRIPT_NAME,
        # or an ASGI root_path), decoded text.
        return request.path_info or "/"

    def peer(self, request: Any) -> str:
        return request.META.get("REMOTE_ADDR") or ""

    def header(self, request: Any, name: str) -> str | None:
        return request.META.get(cgi_name(name))  # type: ignore[no-any-return]

    # As the view reads it: Django joins repeated fields (ASGI) as the WSGI servers do.
    app_header = header

    def note(self, request: Any, name: str, value: object) -> None:
        request.META[name] = value

    def noted(self, request: Any, name: str) -> Any:
        return request.META.get(name)


VIEW: View = RequestView()


def user_key(user: Any) -> str | None:
    """``user:<pk>`` for an authenticated user, else None (the address decides)."""
    if user is not None and getattr(user, "is_authenticated", False):
        return f"user:{user.pk}"
    return None


class UserKey(KeyFunc):
    """``"user"``: ``user:<pk>`` when authenticated, else the client address.

    On the async path the user comes from ``request.auser()``
    (AuthenticationMiddleware's), so no database query blocks the loop.
    """

    __slots__ = ("_address",)

    awaits = True

    def __init__(self, address: client_address) -> None:
        self._address = address

    def read(self, view: View, request: Any) -> str:
        user = getattr(request, "user", None)
        return user_key(user) or self._address.read(view, request)

    async def read_async(self, view: View, request: Any) -> str:
        auser = getattr(request, "auser", None)
        user = await auser() if auser is not None else getattr(request, "user", None)
        return user_key(user) or self._address.read(view, request)

    def client(self) -> client_address:
        return self._address


class AsyncKey(KeyFunc):
    """An ``async def`` key function: on the async path only."""

    __slots__ = ("_func",)

    awaits = True

    def __init__(self, func: Callable[[Any], Awaitable[Hashable]]) -> None:
        self._func = func

    def read(self, view: View, request: Any) -> Any:  # pragma: no cover - refused up front
        raise TypeError("an async key function needs an async view or ASGI")

    async def read_async(self, view: View, request: Any) -> Any:
        return await self._func(request)


def request_key(spec: object, trusted_proxies: Iterable[str] | str | None) -> KeyFunc:
    """``"ip"``, ``"user"``, a key function (or a tuple of them), a callable, a dotted path."""
    if isinstance(spec, str) and spec not in ADDRESS_KEYS:
        spec = import_string(spec)
    if spec is None or spec in ADDRESS_KEYS:
        address = client_address(trusted_proxies)
        return UserKey(address) if spec == "user" else address
    if trusted_proxies is not None:
        raise ValueError(
            "trusted_proxies applies to the key 'ip' or 'user'; a key function of your own "
            "reads the address with client_address(trusted_proxies=...)"
        )
    if isinstance(spec, (KeyFunc, tuple, list)):
        return key_func(spec)  # client_address(), header(...), route(), tuples
    if callable(spec):
        if iscoroutinefunction(spec) or iscoroutinefunction(getattr(spec, "__call__", None)):  # noqa: B004
            return AsyncKey(spec)
        return key_func(spec)  # it gets the request
    raise TypeError(
        f"key must be 'ip', 'user', a key function, a callable taking the request "
        f"or a dotted path to one, not {spec!r}"
    )


def resolve(value: object) -> Any:
    """A setting's value, importing it when it is a dotted path."""
    return import_string(value) if isinstance(value, str) else value


def make_limiter(value: object) -> object:
    """A limiter, a rate written as text, a dotted path to a limiter, or a function that makes one.

    Text that starts with a digit is a rate (``"100/minute"``: a `KeyedTokenBucket`
    of it); a dotted path never does.
    """
    if is_rate_text(value):
        return limiter_or_text(value)
    value = resolve(value)
    if value is not None and not traits(value).checks and callable(value):
        value = value()
    return value


def django_gate(
    limiter: object,
    *,
    asynchronous: bool,
    key: object = "ip",
    trusted_proxies: Iterable[str] | str | None = None,
    cost: object = 1,
    routes: Iterable[Route] | None = None,
    exempt: str | Iterable[str] | None = None,
    **options: Unpack[Options],
) -> Gate:
    """The `Gate` of one configuration over Django's requests, on Django's sync or
    async path (*asynchronous*): its keys (and its routes' keys) read as `request_key`
    reads them; on the sync path an asyncio limiter or key is refused now."""
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
    gate = Gate(
        VIEW,
        limiter,
        key=keys[0],
        cost=cost,
        routes=rules,
        exempt=exempt,
        locked=True,  # the sync path's threads, and the async path counts into the same
        asynchronous=asynchronous,
        **options,
    )
    if not asynchronous:
        if any(p.is_async for p in gate.router.policies()):
            raise TypeError(
                "an asyncio limiter (async check()) needs an async view, or Django's "
                "async path (ASGI with async-capable middleware); pass a sync limiter"
            )
        if any(isinstance(k, AsyncKey) for k in keys):
            raise TypeError("an async key function needs an async view or ASGI")
    return gate


def decide(gate: Gate, request: Any, label: str | None) -> Outcome:
    """The sync `Outcome` of *request* (*label*: the hooks' ``route``; None for the
    matched rule's pattern); its decision left in ``request.META``."""
    outcome = gate.decide(request, None, label)
    if outcome[1] is not None:
        request.META[DECISION] = outcome[1]
    return outcome
