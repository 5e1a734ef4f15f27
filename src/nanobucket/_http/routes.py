"""Routes: which rule a request takes (`Route`, `Router`), chosen from its path as received.

A `Route` is what the user writes (a path, a limiter, a cost, a key, or
exempt); a `Rule` is a route resolved against the integration's own
arguments, with its `Policy`; the `Router` finds the rule of a path and a
method, exact first, then the longest prefix.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, cast

from .._core._bucket import limiter_or_text
from .address import client_address
from .keys import key_func
from .policy import NAME_CHARS, Policy
from .views import KeyFunc, target_path

__all__ = (
    "Route",
    "Router",
    "Rule",
    "build_router",
    "path_name",
    "suspect_path",
    "target_path",
)

# What a path keeps as is in a policy name; the rest is percent-encoded.
_PATH_SAFE = "".join(sorted(NAME_CHARS - {" ", "%"}))


@dataclass(slots=True, eq=False, repr=False)
class Route:
    """A rule for some paths: its own limiter, cost, key, or exempt.

    *path* is exact (``"/login"``) or a prefix ending in ``"/*"``
    (``"/api/*"`` matches ``/api`` and everything below it). The most
    specific rule wins: an exact match, else the longest prefix. An exact
    path also takes its form with one trailing ``/`` more or less (unless
    the rule is exempt, or that form has a rule of its own). *path* is
    the decoded path, as the app routes it (``"/café"``, not
    ``"/caf%C3%A9"``). *methods* limits the rule to some methods (e.g.
    ``{"POST"}``); other methods take the next rule that matches (a shorter
    prefix, else the middleware's default), so a rule for ``{"GET",
    "POST"}`` does not apply to ``OPTIONS``. ``GET`` brings ``HEAD`` along
    (the frameworks answer HEAD with the GET handler) unless a rule for the
    same path names ``HEAD``. Anything left as None comes from the
    middleware's own arguments. A path with a ``.`` or ``..`` segment, or
    with ``//``, never matches an exempt rule (see `Router`). A rate written
    as text in place of the limiter (``Route("/login", "5/minute")``) is a
    `KeyedTokenBucket` of it, the route's own, its capacity the count.

    >>> Route("/healthz", exempt=True)
    Route('/healthz', exempt=True)
    >>> Route("/login", "5/minute").limiter.capacity
    5
    """

    path: str
    limiter: object | None = None
    _: KW_ONLY
    cost: int | Callable[[Any], int] | None = None
    key: object | None = None
    exempt: bool = False
    name: str | None = None
    methods: Iterable[str] | None = None  # kept as a frozenset of upper-case names

    def __post_init__(self) -> None:
        path = self.path
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(f"route path must start with '/', got {path!r}")
        if "*" in path[:-1] or (path.endswith("*") and not path.endswith("/*")):
            raise ValueError(f"only a trailing '/*' is a wildcard, got {path!r}")
        if not isinstance(self.exempt, bool):
            raise TypeError("exempt must be a bool")
        if self.exempt and (self.limiter is not None or self.cost is not None):
            raise ValueError("an exempt route takes no limiter or cost")
        self.limiter = limiter_or_text(self.limiter)
        methods = self.methods
        if methods is not None:
            if isinstance(methods, str) or not all(isinstance(m, str) and m for m in methods):
                raise TypeError("methods must be a collection of method names, e.g. {'POST'}")
            self.methods = methods = frozenset(m.upper() for m in methods)
            if not methods:
                raise ValueError(
                    "methods=() matches no request; leave it out to match every method"
                )

    def __repr__(self) -> str:
        extra = ", exempt=True" if self.exempt else ""
        return f"Route({self.path!r}{extra})"


def path_name(path: str) -> str:
    """A route's default policy name: its path, as sent on the wire (percent-encoded).

    >>> path_name("/café")
    '/caf%C3%A9'
    """
    return urllib.parse.quote(path, safe=_PATH_SAFE)


@dataclass(slots=True, eq=False)
class Rule:
    """A resolved `Route`: what the gate does for a request that matches it."""

    pattern: str
    policy: Policy | None
    key: KeyFunc | None
    cost: int
    cost_fn: Callable[[Any], int] | None
    exempt: bool
    peer_key: bool = field(init=False)
    plain: bool = field(init=False)

    def __post_init__(self) -> None:
        # The default key (the peer, no proxies trusted) is inlined by the gate.
        key = self.key
        self.peer_key = type(key) is client_address and not key._reads_header
        # The gate's hot case: that key, a fixed cost, a limit (exempt rules have none).
        self.plain = self.peer_key and self.cost_fn is None and self.policy is not None


def make_rule(
    pattern: str,
    limiter: object,
    key: object,
    cost: object,
    name: str,
    keyed: bool | None,
    exempt: bool = False,
    policies: dict[int, Policy] | None = None,
) -> Rule:
    """Validate the arguments of one rule (the default or a `Route`)."""
    if exempt:
        return Rule(pattern, None, None, 0, None, True)
    if limiter is None:
        raise TypeError(
            "a limiter is required (e.g. nanobucket.KeyedTokenBucket(...), or a rate "
            "written as text, '100/minute')"
        )
    cache = policies if policies is not None else {}
    policy = cache.get(id(limiter))
    if policy is None or policy.name != name:
        policy = Policy(limiter, name, keyed)
        cache[id(limiter)] = policy
    cost_fn: Callable[[Any], int] | None = None
    fixed = 1
    if callable(cost):
        cost_fn = cost
    else:
        fixed = policy.validated_cost(cost)
    return Rule(pattern, policy, key_func(key), fixed, cost_fn, False)


def suspect_path(path: str) -> str | None:
    """The path to match for *path* with a dot segment or ``//``, else None.

    Such a path never takes an exempt rule (see `Router`). Its runs of
    ``/`` count as one, as Werkzeug routes them (it serves ``//login`` as
    ``/login``, and a server decodes ``/%2Flogin`` into that); dot segments
    stay as they are, as every framework routes them.

    >>> suspect_path("/files/../healthz"), suspect_path("//login")
    ('/files/../healthz', '/login')
    >>> suspect_path("/.well-known/security.txt") is None
    True
    """
    if "//" not in path:
        segments = path.split("/")
        return path if "." in segments or ".." in segments else None
    while "//" in path:
        path = path.replace("//", "/")
    return path


class Router:
    """Finds the `Rule` for a path and method: exact first, then longest prefix.

    The path is matched as the server handed it over (percent-decoded, dot
    segments and all), because that is the path the app routes: uvicorn and
    gunicorn remove no dot segment, and Starlette, Django and Werkzeug serve
    ``/files/../healthz`` from their ``/files/{p:path}`` route, not from
    ``/healthz``. Resolving the dots here would lend such a request the
    rule of a path the app does not serve it under. As defence in depth, a
    path with a ``.`` or ``..`` segment, or with ``//``, never takes an
    exempt rule: it takes the most specific other rule that matches (runs
    of ``/`` as one, see `suspect_path`), else the default.
    """

    __slots__ = ("_guarded", "default", "exact", "prefixes")

    def __init__(self, default: Rule, routes: list[tuple[Route, Rule]]) -> None:
        self.default = default
        self.exact: dict[str, list[tuple[frozenset[str] | None, Rule]]] = {}
        prefixes: list[tuple[str, frozenset[str] | None, Rule]] = []
        # The frameworks answer HEAD with the GET handler, so a rule for GET
        # takes HEAD too (or HEAD would dodge it), unless a rule names HEAD.
        head_named = {r.path for r, _ in routes if r.methods and "HEAD" in r.methods}
        for r, rule in routes:
            methods = cast("frozenset[str] | None", r.methods)  # as `Route` keeps them
            if methods and "GET" in methods and r.path not in head_named:
                methods = methods | {"HEAD"}
            if r.path.endswith("/*"):
                prefixes.append((r.path[:-2], methods, rule))
            else:
                self.exact.setdefault(r.path, []).append((methods, rule))
        # Longest prefix first; within one length, a method-specific rule first.
        prefixes.sort(key=lambda p: (-len(p[0]), p[1] is None))
        for rules in self.exact.values():
            rules.sort(key=lambda p: p[0] is None)
        # One trailing slash more or less takes an exact rule's path too (never
        # an exempt one): Litestar serves "/login/" from its "/login" route, and
        # Starlette and Werkzeug redirect between the two forms. Kept in the
        # table, so matching pays nothing for it.
        for path, rules in list(self.exact.items()):
            twin_path = path[:-1] if path.endswith("/") else path + "/"
            kept = [(methods, rule) for methods, rule in rules if not rule.exempt]
            if len(path) > 1 and twin_path not in self.exact and kept:
                self.exact[twin_path] = kept
        self.prefixes = prefixes
        self._guarded: Router | None = self._without_exempt()

    def _without_exempt(self) -> Router:
        """A twin of this router without its exempt rules: it matches suspect paths."""
        twin = Router.__new__(Router)
        twin.default = self.default
        twin.exact = {}
        for path, rules in self.exact.items():
            kept = [(methods, rule) for methods, rule in rules if not rule.exempt]
            if kept:
                twin.exact[path] = kept
        twin.prefixes = [p for p in self.prefixes if not p[2].exempt]
        twin._guarded = None  # it is the guard: it looks the path up as given
        return twin

    def patterns(self) -> list[str]:
        """The paths the routes were written with (``"/api/*"`` as written).

        >>> import nanobucket as nb
        >>> limiter = nb.TokenBucket(rate=1, capacity=1)
        >>> build_router(limiter, None, 1, "d", None, [Route("/api/*")], "/healthz").patterns()
        ['/api/*', '/healthz']
        """
        found = {rule.pattern for rules in self.exact.values() for _, rule in rules}
        found.update(rule.pattern for _, _, rule in self.prefixes)
        return sorted(found)

    def policies(self) -> list[Policy]:
        """The policy of every rule that is not exempt, the default's first."""
        rules = [self.default]
        rules += [rule for group in self.exact.values() for _, rule in group]
        rules += [rule for _, _, rule in self.prefixes]
        return [rule.policy for rule in rules if rule.policy is not None]

    def match(self, path: str, method: str) -> Rule:
        """The rule for *path* (as received) and *method*."""
        if path[:1] != "/" and path and self._guarded is not None:
            # A target that does not start with "/" ("GET login", "GET
            # http://host/login"): some servers pass it on, and Werkzeug and
            # Quart route its path below "/". Like a suspect path, never exempt.
            return self._guarded.match(target_path(path), method)
        # An ordinary path pays two substring tests; one with "/." or "//" looks further.
        if ("/." in path or "//" in path) and self._guarded is not None:
            suspect = suspect_path(path)
            if suspect is not None:
                return self._guarded.match(suspect, method)
        # The method compared upper-cased, as Werkzeug and Django route it (a
        # "post" reaches Flask's POST view); only a method not found pays for it.
        for methods, rule in self.exact.get(path, ()):
            if methods is None or method in methods or method.upper() in methods:
                return rule
        for prefix, methods, rule in self.prefixes:
            if (path == prefix or path.startswith(prefix + "/") or prefix == "") and (
                methods is None or method in methods or method.upper() in methods
            ):
                return rule
        return self.default


def build_router(
    limiter: object,
    key: object,
    cost: object,
    name: str,
    keyed: bool | None,
    routes: Iterable[Route] | None,
    exempt: str | Iterable[str] | None,
) -> Router:
    """Validate the middleware's arguments into a `Router` (errors at startup)."""
    # A rate as text is made a limiter once: the routes without their own share it.
    limiter = limiter_or_text(limiter)
    policies: dict[int, Policy] = {}
    default = make_rule("*", limiter, key, cost, name, keyed, policies=policies)
    resolved: list[tuple[Route, Rule]] = []
    if isinstance(exempt, str):  # one path, as "/healthz": not its characters
        exempt = [exempt]
    for path in exempt or ():
        r = Route(path, exempt=True)
        resolved.append((r, make_rule(path, None, None, None, name, keyed, True)))
    for r in routes or ():
        if not isinstance(r, Route):
            raise TypeError(f"routes must be Route objects, not {type(r).__name__}")
        rule = make_rule(
            r.path,
            r.limiter if r.limiter is not None else limiter,
            r.key if r.key is not None else key,
            r.cost if r.cost is not None else cost,
            r.name or name if r.limiter is None else (r.name or path_name(r.path)),
            keyed,
            r.exempt,
            policies,
        )
        resolved.append((r, rule))
    return Router(default, resolved)
