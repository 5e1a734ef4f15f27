"""The ready-made keys besides the address: `header`, `route`, tuples of keys, callables.

Every key is a `KeyFunc`: it reads the request through the `View` of its
framework, so one configuration serves the ASGI and WSGI middlewares, the
FastAPI dependency and Django alike. A key is text, bounded in length
(`bounded`), so a client cannot make one key cost more memory than another.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable
from typing import Any

from .address import client_address
from .views import KeyFunc, View

__all__ = ("bounded", "header", "key_func", "route")

# Longer request text is keyed by its digest, so a client cannot make one
# key cost more memory than a short one. 64 keeps usual API keys readable.
MAX_KEY_TEXT = 64
# Headers cannot carry a newline, so it cannot be forged into a composite key.
_KEY_SEP = "\n"


def bounded(tag: str, text: str) -> str:
    """``tag:text``, or ``tag#<digest>`` when *text* is longer than 64 characters.

    The digest is a 128-bit BLAKE2b with no secret: collisions are out of
    reach (about 2**64 work) and every process and machine derives the same
    key for the same client, as a shared table or Redis needs. The two
    forms never meet (``:`` against ``#`` after the tag).

    >>> bounded("header", "k1")
    'header:k1'
    >>> bounded("header", "x" * 8192)
    'header#8c8140441c8eee6544e1e91ff00ed109'
    """
    if len(text) <= MAX_KEY_TEXT:
        return tag + ":" + text
    data = text.encode("utf-8", "surrogatepass")
    return tag + "#" + hashlib.blake2b(data, digest_size=16).hexdigest()


class header(KeyFunc):  # lower case: reads as a function at the call site
    """Key by a request header, such as an API key; *fallback* when absent.

    Each distinct value gets its own bucket, so use it for values the app
    checks (a valid API key), not for anything a client may invent freely.
    A value longer than 64 characters is keyed by its digest (see
    `bounded`), so a key never holds more than 71 characters whatever the
    client sends. Without the header the key comes from *fallback* (the
    client address by default), prefixed so the two key spaces never meet.

    >>> header("X-API-Key").wsgi({"HTTP_X_API_KEY": "k1", "REMOTE_ADDR": "1.2.3.4"})
    'header:k1'
    >>> header("X-API-Key").asgi({"headers": [], "client": ("1.2.3.4", 5)})  # none sent
    'addr:1.2.3.4'
    >>> header("X-API-Key").asgi({"headers": [(b"x-api-key", b"k1"), (b"x-api-key", b"k2")]})
    'header:k1'
    """

    __slots__ = ("_fallback", "_name")

    def __init__(self, name: str, fallback: KeyFunc | None = None) -> None:
        if not isinstance(name, str) or not name or any(c in name for c in " :\r\n"):
            raise ValueError(f"not a header name: {name!r}")
        self._name = name.lower()
        if fallback is not None and not isinstance(fallback, KeyFunc):
            raise TypeError("fallback must be a key function such as client_address()")
        self._fallback = fallback if fallback is not None else client_address()

    def read(self, view: View, request: Any) -> str:
        """The key of *request*: ``header:<value>``, else ``addr:<fallback key>``.

        >>> from nanobucket.asgi import header
        >>> header("X-API-Key").asgi({"headers": [(b"x-api-key", b"k1")]})
        'header:k1'
        """
        # As the app reads it (the first of repeated fields under ASGI): the
        # key is the value the app authenticates, not a join the client extends.
        value = view.app_header(request, self._name)
        if value:
            return bounded("header", value)
        return "addr:" + self._fallback.read(view, request)  # type: ignore[no-any-return]

    def client(self) -> client_address | None:
        """The fallback's client address: a client's address with no header is read by it.

        >>> proxied = client_address(trusted_proxies="10.0.0.0/8")
        >>> header("X-API-Key", fallback=proxied).client() is proxied
        True
        """
        return self._fallback.client()


class route(KeyFunc):
    """Key by the matched `Route` pattern: one bucket per route for everyone.

    The pattern, not the raw path, so a client cannot mint keys by varying
    the URL; requests that match no route share the key ``"*"``. Combine
    with the client: ``key=(client_address(), route())``.

    >>> import nanobucket as nb
    >>> from nanobucket.wsgi import RateLimitMiddleware, Route
    >>> limiter = nb.KeyedTokenBucket(rate=1, capacity=10)
    >>> app = RateLimitMiddleware(lambda environ, start_response: [b"ok"], limiter,
    ...                           key=route(), routes=[Route("/api/*")])
    >>> first, second = {"PATH_INFO": "/api/a"}, {"PATH_INFO": "/api/b"}
    >>> app(first, print), app(second, print)
    ([b'ok'], [b'ok'])
    >>> second["nanobucket.decision"].remaining   # one bucket for the whole route
    8
    """

    __slots__ = ()

    def read(self, view: View, request: Any) -> str:
        """The route pattern the gate matched (left on the request), or ``"*"``.

        >>> route().asgi({"type": "http", "nanobucket.route": "/login"})
        '/login'
        >>> route().wsgi({})
        '*'
        """
        return view.noted(request, "nanobucket.route") or "*"


class _Composite(KeyFunc):
    __slots__ = ("_parts",)

    def __init__(self, parts: tuple[KeyFunc, ...]) -> None:
        self._parts = parts

    def read(self, view: View, request: Any) -> str:
        return _KEY_SEP.join([p.read(view, request) for p in self._parts])

    def client(self) -> client_address | None:
        """The first part's that reads one."""
        for part in self._parts:
            found = part.client()
            if found is not None:
                return found
        return None


class _Plain(KeyFunc):
    """A user's own callable: it gets the framework's request (scope, environ, request)."""

    __slots__ = ("_func",)

    def __init__(self, func: Callable[[Any], Hashable]) -> None:
        self._func = func

    def read(self, view: View, request: Any) -> Any:
        return self._func(request)


def key_func(key: object) -> KeyFunc:
    """Normalise the ``key=`` argument: a KeyFunc, a tuple of them, or a callable.

    >>> key_func(None)
    client_address(trusted_proxies=[])
    """
    if key is None:
        return client_address()
    if isinstance(key, KeyFunc):
        return key
    if isinstance(key, (tuple, list)):
        parts = tuple(key_func(k) for k in key)
        if not parts:
            raise ValueError("key=() names no key function")
        return parts[0] if len(parts) == 1 else _Composite(parts)
    if callable(key):
        return _Plain(key)
    raise TypeError(f"key must be a key function or a callable, not {type(key).__name__}")
