"""How the gate reads a request: a `View` of one framework's request objects.

A view is one object per framework, not per request: the gate asks it about
the request object the framework hands over (an ASGI ``scope``, a WSGI
``environ``, a Django ``HttpRequest``), so deciding a request makes no object
of its own. `KeyFunc`, the ready-made keys, read a request through a view,
so one configuration serves every framework.
"""

from __future__ import annotations

import operator
import urllib.parse
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from .address import client_address

# operator.setitem, typed as a view's ``note``.
_setitem = cast("Callable[[Any, str, object], None]", operator.setitem)

__all__ = (
    "ENVIRON",
    "SCOPE",
    "WS_SCOPE",
    "AiohttpView",
    "EnvironView",
    "KeyFunc",
    "ScopeView",
    "View",
    "WebSocketScopeView",
    "cgi_name",
    "target_path",
    "wsgi_path",
)


class View(Protocol):
    """What the gate needs from one framework's requests (each method takes the request).

    * ``method(request)``: the method (`Router` compares it upper-cased, as
      Werkzeug and Django route it: ``post`` reaches a ``POST`` view);
    * ``path(request)``: the path the application under the middleware
      routes: below its mount or root path (ASGI ``root_path``, WSGI
      ``SCRIPT_NAME``, Django's ``path_info``), as received otherwise
      (percent-decoded text, dot segments and all);
    * ``peer(request)``: the socket peer's address (``""`` when there is none,
      a unix socket);
    * ``header(request, name)``: a request header by its lower-case name, the
      fields of one name joined with ``", "`` (a forwarded address cannot
      hide in a second field); None when absent;
    * ``app_header(request, name)``: the header as the application reads it
      (the first field, where the framework reads the first): a key is
      built from the value the app authenticates, never from a join the
      client controls; None when absent;
    * ``note(request, name, value)``, ``noted(request, name)``: the
      ``"nanobucket.*"`` entries left on the request for the app and for
      `route` (``scope``, ``environ`` or ``request.META``).

    The request object itself is what a key, cost or charge callable gets.
    """

    def method(self, request: Any) -> str: ...
    def path(self, request: Any) -> str: ...
    def peer(self, request: Any) -> str: ...
    def header(self, request: Any, name: str) -> str | None: ...
    def app_header(self, request: Any, name: str) -> str | None: ...
    def note(self, request: Any, name: str, value: object) -> None: ...
    def noted(self, request: Any, name: str) -> Any: ...


class ScopeView:
    """An ASGI ``scope`` (Starlette, FastAPI, any ASGI app).

    >>> scope = {"method": "GET", "path": "/a", "client": ("1.2.3.4", 5),
    ...          "headers": [(b"x-api-key", b"k1")]}
    >>> SCOPE.peer(scope), SCOPE.header(scope, "x-api-key"), SCOPE.header(scope, "x-no")
    ('1.2.3.4', 'k1', None)
    >>> SCOPE.method(scope), SCOPE.path(scope)
    ('GET', '/a')
    >>> SCOPE.path({"path": "/api/login", "root_path": "/api"})
    '/login'
    >>> SCOPE.note(scope, "nanobucket.route", "/api/*"); scope["nanobucket.route"]
    '/api/*'
    """

    __slots__ = ("_names",)

    def __init__(self) -> None:
        self._names: dict[str, bytes] = {}  # header names as the scope spells them

    #: Leave a value in the scope: ``SCOPE.note(scope, "nanobucket.route", "/api/*")``.
    #: (A C callable: the gate calls it on every routed request.)
    note = staticmethod(_setitem)

    #: The method as sent (a C callable: the gate calls it on every routed
    #: request); `Router` compares it upper-cased, as Werkzeug (Quart) routes it.
    method = operator.itemgetter("method")

    def path(self, request: Mapping[str, Any]) -> str:
        """The path the app routes: ``scope["path"]`` below ``root_path``.

        Servers (uvicorn's ``--root-path``) and mounts (Starlette's
        ``Mount``) keep the root path inside ``scope["path"]``, and the
        frameworks route what follows it when it starts at a segment
        boundary. Right after the root path, mid-segment (``/apilogin``
        under ``/api``: a target such as ``login`` with no leading ``/``),
        they differ: Starlette routes the whole path, Quart and Litestar
        strip the prefix and serve ``/login``. That reading is taken, and
        marked as a suspect path (a doubled leading ``/``), so it never
        takes an exempt rule (see `Router`). A path that does not start
        with the root path is read whole, as Starlette reads it. The root
        path comes from the server's configuration or the app's mount,
        never from the client.

        >>> SCOPE.path({"path": "/v1/login", "root_path": "/v1"})
        '/login'
        >>> SCOPE.path({"path": "/v1", "root_path": "/v1"})
        '/'
        >>> SCOPE.path({"path": "/v1login", "root_path": "/v1"})
        '//login'
        >>> SCOPE.path({"path": "http://host/v1/items", "root_path": "/v1"})
        '//items'
        """
        path: str = request["path"]
        root = request.get("root_path")
        if not root:
            return path
        if path[:1] != "/" and path:
            # An absolute-form target ("http://host/api/items"), which a server
            # such as hypercorn passes on as its path: Quart routes the path in
            # it, below the root path. Never exempt (marked suspect below).
            path = target_path(path)
            if path.startswith(root) and path[len(root) : len(root) + 1] in ("/", ""):
                return "/" + (path[len(root) :] or "/")
            return "/" + path
        if not path.startswith(root):
            return path
        rest = path[len(root) :]
        if rest[:1] == "/":
            return rest
        return "//" + rest if rest else "/"

    def peer(self, request: Mapping[str, Any]) -> str:
        """The client's address, ``""`` for none (a unix socket).

        >>> SCOPE.peer({"client": None}), SCOPE.peer({"client": ("::1", 5)})
        ('', '::1')
        """
        client = request.get("client")
        return client[0] if client else ""

    def header(self, request: Mapping[str, Any], name: str) -> str | None:
        """The header *name* (lower case), several fields joined with ``", "``.

        Joined (RFC 9110 5.3), so a second ``X-Forwarded-For`` cannot hide
        from the right-to-left walk of `client_address`.

        >>> SCOPE.header({"headers": [(b"X-A", b"1"), (b"x-a", b"2")]}, "x-a")
        '1, 2'
        """
        raw = self._raw(name)
        values = [v.decode("latin-1") for k, v in request.get("headers", ()) if k.lower() == raw]
        return ", ".join(values) if values else None

    def _raw(self, name: str) -> bytes:
        """*name* as the scope spells header names (bytes), encoded once."""
        raw = self._names.get(name)
        if raw is None:
            raw = self._names[name] = name.encode("latin-1")
        return raw

    def app_header(self, request: Mapping[str, Any], name: str) -> str | None:
        """The header *name* (lower case) as Starlette and FastAPI read it: its first field.

        ``request.headers["x-api-key"]`` and FastAPI's ``APIKeyHeader`` read
        the first of repeated fields, so a key is built from that one: a
        second field the client adds buys no new bucket.

        >>> SCOPE.app_header({"headers": [(b"X-A", b"1"), (b"x-a", b"2")]}, "x-a")
        '1'
        """
        raw = self._raw(name)
        for k, v in request.get("headers", ()):
            if k.lower() == raw:
                return v.decode("latin-1")  # type: ignore[no-any-return]
        return None

    def noted(self, request: Mapping[str, Any], name: str) -> Any:
        """What `note` left under *name*, else None.

        >>> SCOPE.noted({"nanobucket.route": "/login"}, "nanobucket.route")
        '/login'
        """
        return request.get(name)


class WebSocketScopeView(ScopeView):
    """An ASGI ``websocket`` scope: read as an HTTP one, its method ``GET`` (the
    handshake's), which the scope does not name.

    >>> WS_SCOPE.method({"type": "websocket", "path": "/chat"}), WS_SCOPE.path({"path": "/chat"})
    ('GET', '/chat')
    """

    __slots__ = ()

    def method(self, request: Mapping[str, Any]) -> str:  # type: ignore[override]
        """``GET``: a websocket opens with a ``GET`` (RFC 6455), and routes match it so."""
        return "GET"


class EnvironView:
    """A WSGI ``environ`` (Flask, any WSGI app).

    >>> environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/a", "REMOTE_ADDR": "1.2.3.4",
    ...            "HTTP_X_API_KEY": "k1"}
    >>> ENVIRON.peer(environ), ENVIRON.header(environ, "x-api-key"), ENVIRON.path(environ)
    ('1.2.3.4', 'k1', '/a')
    """

    __slots__ = ()

    def method(self, request: Mapping[str, Any]) -> str:
        """The method as sent (GET when the server gave none); `Router` upper-cases it.

        >>> ENVIRON.method({}), ENVIRON.method({"REQUEST_METHOD": "post"})
        ('GET', 'post')
        """
        return request.get("REQUEST_METHOD") or "GET"

    def path(self, request: Mapping[str, Any]) -> str:
        """``PATH_INFO`` as text (see `wsgi_path`), ``"/"`` when empty: what the app routes.

        Never ``SCRIPT_NAME``: the app below a mount (Werkzeug's
        ``DispatcherMiddleware``) routes ``PATH_INFO`` alone, and a proxy
        fixer (``ProxyFix(x_prefix=1)``) sets ``SCRIPT_NAME`` from a header
        the client may send.

        >>> ENVIRON.path({"SCRIPT_NAME": "/app", "PATH_INFO": "/caf\xc3\xa9"})
        '/café'
        """
        return wsgi_path(request.get("PATH_INFO", "")) or "/"

    def peer(self, request: Mapping[str, Any]) -> str:
        """``REMOTE_ADDR``, ``""`` when absent.

        >>> ENVIRON.peer({"REMOTE_ADDR": "10.0.0.2"})
        '10.0.0.2'
        """
        return request.get("REMOTE_ADDR") or ""

    def header(self, request: Mapping[str, Any], name: str) -> str | None:
        """The header *name* (lower case): its ``HTTP_*`` variable.

        >>> ENVIRON.header({"HTTP_X_FORWARDED_FOR": "1.2.3.4"}, "x-forwarded-for")
        '1.2.3.4'
        """
        return request.get(cgi_name(name))

    #: The header as the app reads it: the server's one value (joined by the
    #: server where the client sent several, as Flask reads it too).
    app_header = header

    #: Leave a value in the environ (a C callable: the gate calls it on every routed request).
    note = staticmethod(_setitem)

    def noted(self, request: Mapping[str, Any], name: str) -> Any:
        """What `note` left under *name*, else None.

        >>> ENVIRON.noted({}, "nanobucket.route") is None
        True
        """
        return request.get(name)


class AiohttpView:
    """An aiohttp ``web.Request``, read as aiohttp's router reads it.

    * the path: ``request.rel_url.path_safe``, what ``UrlDispatcher.resolve``
      matches (percent-decoded but for ``%2F`` and ``%25``), below the
      prefix of the sub-application whose middleware asks (aiohttp adds that
      prefix to the sub-application's routes);
    * the method: ``request.method`` as sent (aiohttp routes it as is);
    * the peer: ``request.remote``, the socket's peer unless a middleware
      before this one cloned the request with another;
    * a header: ``request.headers[name]``, the first field, as the app reads
      it; all its fields joined for `client_address`.

    *keys* turns a ``"nanobucket.*"`` name into the key the request stores it
    under (aiohttp's ``web.RequestKey`` where it has one).

    >>> from types import SimpleNamespace
    >>> view = AiohttpView(lambda name: name)
    >>> class Headers(dict):
    ...     def getall(self, name, default): return [self[name]] if name in self else default
    >>> request = SimpleNamespace(method="GET", remote="1.2.3.4", headers=Headers(a="1"),
    ...     rel_url=SimpleNamespace(path_safe="/a%2Fb"), match_info=SimpleNamespace(apps=()))
    >>> view.method(request), view.path(request), view.peer(request), view.header(request, "a")
    ('GET', '/a%2Fb', '1.2.3.4', '1')
    """

    __slots__ = ("_keys", "_names", "_prefixes")

    def __init__(self, keys: Callable[[str], Any]) -> None:
        self._keys = keys
        self._names: dict[str, Any] = {}
        # id(app) -> (app, its prefix): the sub-applications this view served.
        self._prefixes: dict[int, tuple[Any, str]] = {}

    #: The method as sent (a C callable: the gate calls it on every routed request).
    method = operator.attrgetter("method")

    def path(self, request: Any) -> str:
        """``request.rel_url.path_safe``, below the asking sub-application's prefix."""
        path: str = request.rel_url.path_safe
        info = request.match_info
        apps = info.apps
        if len(apps) < 2 or info.current_app is apps[0]:
            return path  # the root application: most requests
        prefix = self._prefix(apps, info.current_app)
        if prefix and path.startswith(prefix):
            return path[len(prefix) :] or "/"
        return path

    def _prefix(self, apps: tuple[Any, ...], app: Any) -> str:
        """The prefix *app* was added under (``add_subapp``), ``""`` for none (a domain)."""
        known = self._prefixes.get(id(app))
        if known is not None:
            return known[1]
        prefix = ""
        # By identity: an Application is a mapping, and two empty ones compare equal.
        at = next((i for i, a in enumerate(apps) if a is app), 0)
        if at:
            parent = apps[at - 1]
            for resource in parent.router.resources():
                info = resource.get_info()
                if info.get("app") is app:
                    prefix = info.get("prefix", "")
                    break
        if len(self._prefixes) < 64:  # sub-applications are few
            self._prefixes[id(app)] = (app, prefix)  # the app kept: its id stays its own
        return prefix

    def peer(self, request: Any) -> str:
        """``request.remote``, ``""`` when there is none (a unix socket)."""
        return request.remote or ""

    def header(self, request: Any, name: str) -> str | None:
        """The header *name*, its fields joined with ``", "`` (see `View`)."""
        values = request.headers.getall(name, ())
        return ", ".join(values) if values else None

    def app_header(self, request: Any, name: str) -> str | None:
        """The header *name* as ``request.headers[name]`` reads it: its first field."""
        return request.headers.get(name)  # type: ignore[no-any-return]

    def _key(self, name: str) -> Any:
        key = self._names.get(name)
        if key is None:
            key = self._names[name] = self._keys(name)
        return key

    def note(self, request: Any, name: str, value: object) -> None:
        """Leave *value* on the request under *name*'s key."""
        request[self._key(name)] = value

    def noted(self, request: Any, name: str) -> Any:
        """What `note` left under *name*, else None."""
        return request.get(self._key(name))


_CGI_NAMES: dict[str, str] = {}  # a few names, from the configuration


def cgi_name(name: str) -> str:
    """The CGI variable of the header *name* (a WSGI environ, Django's ``META``).

    >>> cgi_name("x-api-key")
    'HTTP_X_API_KEY'
    """
    cgi = _CGI_NAMES.get(name)
    if cgi is None:
        cgi = _CGI_NAMES[name] = "HTTP_" + name.upper().replace("-", "_")
    return cgi


SCOPE = ScopeView()
WS_SCOPE = WebSocketScopeView()
ENVIRON = EnvironView()


def target_path(target: str) -> str:
    """The path Werkzeug and Quart route for a target that does not start with ``/``.

    An absolute form's path (``http://host/login``), a relative one below
    ``/``, without the last segment's ``;`` parameters (``urlparse``, as
    Quart reads it), runs of ``/`` as one.

    >>> target_path("http://t/login"), target_path("login;x=1"), target_path("items/a/.")
    ('/login', '/login', '/items/a/.')
    """
    path = urllib.parse.urlparse(target).path
    path = "/" + path.lstrip("/")
    while "//" in path:
        path = path.replace("//", "/")
    return path


def wsgi_path(path: str) -> str:
    """A WSGI path as text: PEP 3333 gives its bytes decoded as latin-1; they are UTF-8.

    >>> wsgi_path("/caf\xc3\xa9")
    '/café'
    """
    if path.isascii():
        return path
    try:
        raw = path.encode("latin-1")
    except UnicodeEncodeError:  # a server that decoded it already
        return path
    # Bytes that are not UTF-8 stay as lone surrogates: they match no route.
    return raw.decode("utf-8", "surrogateescape")


class KeyFunc:
    """A request -> key function that reads the request through a `View`.

    Subclasses implement ``read(view, request)``, returning a ``str`` (so
    keys suit every table, including shared memory and Redis): one
    configuration serves every framework. One that must await (an ``async
    def`` key function) sets ``awaits`` and implements ``read_async``; only
    the asyncio integrations take it.
    """

    __slots__ = ()

    awaits = False  # True: only read_async gives the key

    def read(self, view: View, request: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    async def read_async(self, view: View, request: Any) -> Any:
        """The key on the asyncio path: `read` unless the key function must await."""
        return self.read(view, request)

    def client(self) -> client_address | None:
        """The `client_address` this key reads the client's address with (None: it reads
        none), which the gate's ``exempt_clients`` reads too, trusted proxies and all.

        >>> from nanobucket.asgi import route
        >>> route().client() is None
        True
        """
        return None

    def asgi(self, scope: Mapping[str, Any]) -> Any:
        """The key of an ASGI request (its ``scope``).

        >>> from nanobucket.asgi import client_address
        >>> client_address().asgi({"type": "http", "client": ("1.2.3.4", 5678)})
        '1.2.3.4'
        """
        return self.read(SCOPE, scope)

    def wsgi(self, environ: Mapping[str, Any]) -> Any:
        """The key of a WSGI request (its ``environ``).

        >>> from nanobucket.wsgi import client_address
        >>> client_address().wsgi({"REMOTE_ADDR": "1.2.3.4"})
        '1.2.3.4'
        """
        return self.read(ENVIRON, environ)
