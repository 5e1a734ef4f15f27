"""What the ASGI and WSGI middlewares share: keys, routes, headers, counters.

Nothing here knows about a server. A request is seen through two small
views: an ASGI ``scope`` or a WSGI ``environ``; every ready-made key function
has one method for each (``asgi(scope)``, ``wsgi(environ)``), so the same
configuration serves both middlewares.

Header conventions (all values in whole seconds, rounded *up* so a client
that waits what it is told is never early):

* ``Retry-After`` (RFC 9110) on a 429: ``ceil(retry_after)``, at least 1.
* ``RateLimit-Policy: "default";q=<quota>;w=<window>`` and
  ``RateLimit: "default";r=<remaining>;t=<reset>`` (IETF httpapi draft).
  A token bucket is mapped to a window ``w`` = the time an empty bucket takes
  to fill (at least 1 s) and a quota ``q = floor(rate * w)``, so ``q / w`` is
  the long-run rate and, when the refill time is whole seconds,
  ``q`` is the capacity; ``t`` is the time until the bucket is full again.
* ``X-RateLimit-Limit`` (capacity), ``X-RateLimit-Remaining`` and
  ``X-RateLimit-Reset`` (seconds until full, a delta, not an epoch): the
  older form, for clients that read only that.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import ipaddress
import json
import math
import threading
import urllib.parse
import warnings
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, cast

from ._charge import Charge, check_charge, settlers
from ._limiter import is_keyed
from ._params import NS_PER_S, int_at_least, rate_fraction, validated_cost
from .hooks import Hook, make_hooks
from .tiered import AsyncTiered, Tiered

if TYPE_CHECKING:
    from typing_extensions import Unpack

# What `nanobucket.asgi` and `nanobucket.wsgi` offer besides their middleware.
__all__ = (
    "Counters",
    "Route",
    "client_address",
    "header",
    "route",
)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Headers = list[tuple[bytes, bytes]]
Check = Callable[[Hashable, int], Any]  # -> Decision, or an awaitable of one

HEADER_MODES = ("ietf", "legacy", "off")
# A policy name is quoted in header fields: printable ASCII but '"' and '\\'.
_NAME_CHARS = frozenset(chr(c) for c in range(0x20, 0x7F)) - {'"', "\\"}
# What a path keeps as is in a policy name; the rest is percent-encoded.
_PATH_SAFE = "".join(sorted(_NAME_CHARS - {" ", "%"}))
_NS = NS_PER_S
# Headers cannot carry a newline, so it cannot be forged into a composite key.
_KEY_SEP = "\n"


# --------------------------------------------------------------------------
# Key functions


class KeyFunc:
    """A request -> key function usable by both middlewares.

    Subclasses implement ``asgi(scope)`` and ``wsgi(environ)``; both return a
    ``str`` (so keys suit every table, including shared memory and Redis).
    """

    def asgi(self, scope: Mapping[str, Any]) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def wsgi(self, environ: Mapping[str, Any]) -> str:  # pragma: no cover - abstract
        raise NotImplementedError


# Longer request text is keyed by its digest, so a client cannot make one
# key cost more memory than a short one. 64 keeps usual API keys readable.
MAX_KEY_TEXT = 64


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


UNIX = "unix:"
_WARN_LOCK = threading.Lock()


def _networks(trusted: Iterable[str] | str | None) -> tuple[tuple[IPNetwork, ...], bool]:
    """The trusted networks, and whether the peer of a unix socket is trusted."""
    if trusted is None:
        return (), False
    if isinstance(trusted, str):
        trusted = [trusted]
    nets = []
    unix = False
    for item in trusted:
        if not isinstance(item, str):
            raise TypeError(f"trusted proxies must be str addresses or networks, not {item!r}")
        if item.strip() == UNIX:
            unix = True
            continue
        try:
            net = ipaddress.ip_network(item.strip(), strict=False)
        except ValueError:
            raise ValueError(f"not an IP address or network (or 'unix:'): {item!r}") from None
        if isinstance(net, ipaddress.IPv6Network) and net.prefixlen >= 96:
            mapped = net.network_address.ipv4_mapped
            if mapped is not None:  # "::ffff:10.0.0.0/104" is 10.0.0.0/8
                net = ipaddress.ip_network(f"{mapped}/{net.prefixlen - 96}")
        nets.append(net)
    return tuple(nets), unix


def _parse_ip(text: str) -> IPAddress | None:
    """An address from an ``X-Forwarded-For`` entry or a peer; IPv4-mapped as IPv4."""
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[::1]:8080" -> "::1"
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # "1.2.3.4:5678" -> "1.2.3.4"
        text = text.split(":", 1)[0]
    if len(text) > 64:  # longer than any address with a zone: not one
        return None
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _prefix_bits(ipv6_prefix: object) -> int:
    if isinstance(ipv6_prefix, bool) or not isinstance(ipv6_prefix, int):
        raise TypeError(f"ipv6_prefix must be an int, not {ipv6_prefix!r}")
    if not 1 <= ipv6_prefix <= 128:
        raise ValueError(f"ipv6_prefix must be 1..128, got {ipv6_prefix}")
    return ipv6_prefix


class client_address(KeyFunc):  # lower case: reads as a function at the call site
    """Key by client IP address (the default key).

    An IPv4-mapped address (``::ffff:1.2.3.4``) is its IPv4 address; an IPv6
    client is keyed by its network of *ipv6_prefix* bits (default 64, as
    one host is usually given a whole /64 and could otherwise take a fresh
    bucket per address).

    ``X-Forwarded-For`` is ignored unless ``trusted_proxies`` is given. With
    it, the header is read from the right while the hop that wrote the entry
    is a trusted proxy; the first untrusted address is the client. A client
    cannot forge its way to a fresh bucket: entries it wrote itself lie left
    of the one a trusted proxy appended, and are never reached. An entry that
    is not an address stops the walk at the last trusted hop (several
    clients then share that bucket: stricter, never looser).
    ``"unix:"`` in ``trusted_proxies`` trusts the peer of a unix socket
    (uvicorn ``--uds``, gunicorn ``unix:``), which has no address.

    >>> client_address(trusted_proxies=["10.0.0.0/8"]).wsgi(
    ...     {"REMOTE_ADDR": "10.0.0.2", "HTTP_X_FORWARDED_FOR": "6.6.6.6, 1.2.3.4"})
    '1.2.3.4'
    >>> client_address().wsgi({"REMOTE_ADDR": "2001:db8:1:2:3:4:5:6"})
    '2001:db8:1:2::/64'
    """

    __slots__ = ("_prefix", "_reads_header", "_trusted", "_unix", "_warned")

    def __init__(
        self, trusted_proxies: Iterable[str] | str | None = None, *, ipv6_prefix: int = 64
    ) -> None:
        self._trusted, self._unix = _networks(trusted_proxies)
        self._prefix = _prefix_bits(ipv6_prefix)
        self._reads_header = bool(self._trusted) or self._unix  # some proxy is trusted
        self._warned = False

    def _is_trusted(self, addr: IPAddress) -> bool:
        return any(addr in net for net in self._trusted)

    def _key(self, addr: IPAddress) -> str:
        if isinstance(addr, ipaddress.IPv4Address):
            return str(addr)
        bits = int(addr)  # int(): no "%zone", which a header could vary freely
        if self._prefix == 128:
            return str(ipaddress.IPv6Address(bits))
        drop = 128 - self._prefix
        return f"{ipaddress.IPv6Address(bits >> drop << drop)}/{self._prefix}"

    def peer_key(self, peer: str) -> str:
        """The key of a socket peer seen directly (no proxy header read).

        >>> client_address().peer_key("::ffff:1.2.3.4")
        '1.2.3.4'
        """
        if ":" not in peer:
            if not peer or peer[0] == "/":  # a unix socket (gunicorn: its path, if bound)
                self._no_address()
            return peer  # IPv4 as the server wrote it: the hot case
        addr = _parse_ip(peer)
        return peer if addr is None else self._key(addr)

    def _no_address(self) -> None:
        if self._warned or self._unix:
            return
        with _WARN_LOCK:  # once, even when threads meet here together
            if self._warned:
                return
            self._warned = True
        warnings.warn(
            "a request arrived with no peer address (a unix socket?): every such "
            "client shares one bucket; behind a proxy on a unix socket, pass "
            "client_address(trusted_proxies=['unix:']) so its X-Forwarded-For is read",
            RuntimeWarning,
            stacklevel=2,
        )

    def resolve(self, peer: str, forwarded_for: str | None) -> str:
        """The client address given the socket peer and ``X-Forwarded-For``.

        >>> client_address(trusted_proxies="10.0.0.0/8").resolve("10.0.0.2", "6.6.6.6, 1.2.3.4")
        '1.2.3.4'
        >>> client_address().resolve("10.0.0.2", "1.2.3.4")   # no proxy trusted: the peer
        '10.0.0.2'
        >>> client_address(trusted_proxies="unix:").resolve("", "1.2.3.4")
        '1.2.3.4'
        """
        if not peer or peer[0] == "/":  # a unix socket: no address
            if not self._unix:
                self._no_address()
                return peer
            current: IPAddress | None = None
        else:
            current = _parse_ip(peer)
            if current is None or not self._is_trusted(current) or not forwarded_for:
                return self.peer_key(peer)
        if not forwarded_for:
            return ""  # a trusted unix peer that named no client
        # Walk from the right without splitting: a long header costs one pass.
        end = len(forwarded_for)
        while end >= 0:
            start = forwarded_for.rfind(",", 0, end)
            hop = _parse_ip(forwarded_for[start + 1 : end])
            if hop is None:
                break
            current = hop
            if not self._is_trusted(hop):
                break
            end = start
        return "" if current is None else self._key(current)

    def asgi(self, scope: Mapping[str, Any]) -> str:
        """The client address of an ASGI request.

        >>> client_address().asgi({"type": "http", "client": ("1.2.3.4", 5678)})
        '1.2.3.4'
        """
        client = scope.get("client")
        peer = client[0] if client else ""
        if not self._reads_header:
            return self.peer_key(peer)  # the hot default: no header is even looked at
        return self.resolve(peer, _asgi_header(scope, b"x-forwarded-for"))

    def wsgi(self, environ: Mapping[str, Any]) -> str:
        """The client address of a WSGI request.

        >>> client_address().wsgi({"REMOTE_ADDR": "1.2.3.4"})
        '1.2.3.4'
        """
        peer = environ.get("REMOTE_ADDR") or ""
        if not self._reads_header:
            return self.peer_key(peer)
        return self.resolve(peer, environ.get("HTTP_X_FORWARDED_FOR"))

    def __repr__(self) -> str:
        nets = [str(n) for n in self._trusted] + ([UNIX] if self._unix else [])
        extra = f", ipv6_prefix={self._prefix}" if self._prefix != 64 else ""
        return f"client_address(trusted_proxies={nets!r}{extra})"


def _asgi_header(scope: Mapping[str, Any], name: bytes) -> str | None:
    # Several fields of one name are joined with ", " (RFC 9110 5.3), so a
    # second X-Forwarded-For cannot hide from the right-to-left walk.
    values = [v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == name]
    return ", ".join(values) if values else None


class header(KeyFunc):
    """Key by a request header, such as an API key; *fallback* when absent.

    Each distinct value gets its own bucket, so use it for values the app
    checks (a valid API key), not for anything a client may invent freely.
    A value longer than 64 characters is keyed by its digest (see
    `bounded`), so a key never holds more than 71 characters whatever the
    client sends. Without the header the key comes from *fallback* (the
    client address by default), prefixed so the two key spaces never meet.

    >>> header("X-API-Key").wsgi({"HTTP_X_API_KEY": "k1", "REMOTE_ADDR": "1.2.3.4"})
    'header:k1'
    """

    __slots__ = ("_asgi_name", "_fallback", "_wsgi_name")

    def __init__(self, name: str, fallback: KeyFunc | None = None) -> None:
        if not isinstance(name, str) or not name or any(c in name for c in " :\r\n"):
            raise ValueError(f"not a header name: {name!r}")
        self._asgi_name = name.lower().encode("latin-1")
        self._wsgi_name = "HTTP_" + name.upper().replace("-", "_")
        if fallback is not None and not isinstance(fallback, KeyFunc):
            raise TypeError("fallback must be a key function such as client_address()")
        self._fallback = fallback if fallback is not None else client_address()

    def asgi(self, scope: Mapping[str, Any]) -> str:
        """The key of an ASGI request: ``header:<value>``, else ``addr:<fallback key>``.

        >>> header("X-API-Key").asgi({"headers": [(b"x-api-key", b"k1")], "client": ("1.2.3.4", 5)})
        'header:k1'
        """
        value = _asgi_header(scope, self._asgi_name)
        return bounded("header", value) if value else "addr:" + self._fallback.asgi(scope)

    def wsgi(self, environ: Mapping[str, Any]) -> str:
        """The key of a WSGI request: ``header:<value>``, else ``addr:<fallback key>``.

        >>> header("X-API-Key").wsgi({"REMOTE_ADDR": "1.2.3.4"})   # no API key sent
        'addr:1.2.3.4'
        """
        value = environ.get(self._wsgi_name)
        return bounded("header", value) if value else "addr:" + self._fallback.wsgi(environ)


class route(KeyFunc):
    """Key by the matched `Route` pattern: one bucket per route for everyone.

    The pattern, not the raw path, so a client cannot mint keys by varying
    the URL; requests that match no route share the key ``"*"``. Combine
    with the client: ``key=(client_address(), route())``.

    >>> import nanobucket as nb
    >>> from nanobucket.wsgi import RateLimitMiddleware
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

    def asgi(self, scope: Mapping[str, Any]) -> str:
        """The route pattern the ASGI middleware matched, or ``"*"``.

        >>> route().asgi({"type": "http", "nanobucket.route": "/login"})
        '/login'
        """
        return scope.get("nanobucket.route") or "*"

    def wsgi(self, environ: Mapping[str, Any]) -> str:
        """The route pattern the WSGI middleware matched, or ``"*"``.

        >>> route().wsgi({"nanobucket.route": "/api/*"})
        '/api/*'
        """
        return environ.get("nanobucket.route") or "*"


class _Composite(KeyFunc):
    __slots__ = ("_parts",)

    def __init__(self, parts: tuple[KeyFunc, ...]) -> None:
        self._parts = parts

    def asgi(self, scope: Mapping[str, Any]) -> str:
        return _KEY_SEP.join([p.asgi(scope) for p in self._parts])

    def wsgi(self, environ: Mapping[str, Any]) -> str:
        return _KEY_SEP.join([p.wsgi(environ) for p in self._parts])


class _Plain(KeyFunc):
    """A user's own callable: it gets the scope (ASGI) or the environ (WSGI)."""

    __slots__ = ("_func",)

    def __init__(self, func: Callable[[Any], Hashable]) -> None:
        self._func = func

    def asgi(self, scope: Mapping[str, Any]) -> Any:
        return self._func(scope)

    def wsgi(self, environ: Mapping[str, Any]) -> Any:
        return self._func(environ)


def key_func(key: object) -> KeyFunc:
    """Normalise the ``key=`` argument: a KeyFunc, a tuple of them, or a callable."""
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


# --------------------------------------------------------------------------
# Limiters


def keyed_of(limiter: object, keyed: bool | None) -> bool:
    """Whether ``limiter.check`` takes a key first: *keyed* when given, else the
    limiter's own ``keyed`` (see `nanobucket._limiter`)."""
    if not callable(getattr(limiter, "check", None)):
        raise TypeError(
            f"limiter must have a check() method (a nanobucket limiter), "
            f"not {type(limiter).__name__}"
        )
    if keyed is not None:
        return keyed
    try:
        return is_keyed(limiter)
    except TypeError as e:
        raise TypeError(f"{e}: give it one, or pass keyed=True/False") from None


def checker(limiter: Any, keyed: bool) -> Check:
    """``(key, cost) -> Decision`` for any limiter, keyed or not."""
    check = limiter.check
    if keyed:
        return check  # type: ignore[no-any-return]

    def unkeyed(key: Hashable, cost: int) -> Any:
        return check(cost)

    return unkeyed


def is_async(limiter: object) -> bool:
    """Whether ``limiter.check`` is a coroutine function (the asyncio Redis one)."""
    return inspect.iscoroutinefunction(getattr(limiter, "check", None))


def retry_after_seconds(retry_after_ns: int) -> int:
    """``Retry-After`` for a limited request: rounded up and never 0."""
    s = -(-retry_after_ns // _NS)
    return s if s > 0 else 1


def _policy_header(name: str, limiter: object) -> tuple[bytes, bytes] | None:
    """The ``RateLimit-Policy`` field of one bucket (None unless it has a rate and capacity)."""
    capacity = getattr(limiter, "capacity", None)
    rate = getattr(limiter, "rate", None)
    if not isinstance(capacity, int) or rate is None:
        return None
    # w: the time an empty bucket takes to fill, in whole seconds (>=1);
    # q: what the long-run rate admits in w. See the module docstring.
    exact_rate = rate_fraction(rate)  # 0.1 as the decimal 1/10, as the bucket reads it
    window = max(1, math.ceil(capacity / exact_rate))
    quota = max(1, math.floor(exact_rate * window))
    return (b"ratelimit-policy", f'"{name}";q={quota};w={window}'.encode("ascii"))


# The RateLimit field up to "r=", and the RateLimit-Policy field (None: no policy to name).
Fields = tuple[bytes, tuple[bytes, bytes] | None]
Varying = dict[str, Fields] | tuple[Fields | dict[str, Fields], ...]


def _plan_fields(limiter: object) -> dict[str, Fields] | None:
    """A tiered limiter's fields for each plan, named by the plan; None for any other."""
    if not isinstance(limiter, (Tiered, AsyncTiered)):
        return None
    return {
        name: (f'"{name}";r='.encode("ascii"), _policy_header(name, plan))
        for name, plan in limiter.plans.items()
    }


def _leaves(limiter: object) -> tuple[object, ...]:
    """The buckets with a rate and capacity behind *limiter*: itself, its layers', its plans'."""
    layers = getattr(limiter, "layers", None)
    parts: Iterable[object] = (limiter,) if layers is None else layers
    leaves: list[object] = []
    for part in parts:
        if isinstance(part, (Tiered, AsyncTiered)):
            leaves.extend(part.plans.values())
        elif isinstance(getattr(part, "capacity", None), int) and hasattr(part, "rate"):
            leaves.append(part)
    return tuple(leaves)


def _snapshot(leaves: tuple[object, ...]) -> tuple[tuple[object, object], ...]:
    return tuple((getattr(b, "rate", None), getattr(b, "capacity", None)) for b in leaves)


def _varying(fields: Varying, decision: Any) -> Fields:
    """The fields of the policy that made *decision*: its plan's, or its binding layer's."""
    if type(fields) is dict:  # a tiered limiter
        return fields[decision.plan]
    layer = fields[decision.layer]
    if type(layer) is dict:  # a tiered layer of an all_of
        return layer[decision.decisions[decision.layer].plan]  # type: ignore[no-any-return]
    return layer


class Policy:
    """One limiter as the middleware uses it: check function and header text.

    ``layer_headers`` is None when one policy serves every decision. For a
    tiered limiter it holds each plan's fields, named by the plan (the one
    sent is ``decision.plan``'s); for an ``all_of``, each layer's (the one
    sent is the binding layer's, ``decision.layer``; a tiered layer's by its plan).
    """

    __slots__ = (
        "capacity",
        "capacity_seen",
        "check",
        "ietf_extra",
        "is_async",
        "keyed",
        "layer_headers",
        "leaves",
        "limiter",
        "name",
        "policy_header",
        "r_prefix",
        "rate_seen",
        "seen",
        "watched",
    )

    def __init__(self, limiter: object, name: str, keyed: bool | None) -> None:
        if not isinstance(name, str) or not name or any(c not in _NAME_CHARS for c in name):
            raise ValueError(
                f"policy name must be a non-empty string of printable ASCII "
                f"without '\"' or '\\', got {name!r}"
            )
        if getattr(limiter, "releases", False) is True:
            raise TypeError(
                "an in-flight limit (Concurrency, or an all_of holding one) keeps its slots "
                "until released, and a decision per request never releases them: hold the "
                "slot around the handler instead (with limiter.slot(key): ...)"
            )
        self.limiter = limiter  # for charge= (refund and debit after the response)
        self.keyed = keyed_of(limiter, keyed)
        self.check = checker(limiter, self.keyed)
        self.is_async = is_async(limiter)
        self.name = name
        capacity = getattr(limiter, "capacity", None)
        self.capacity: int | None = capacity if isinstance(capacity, int) else None
        self.r_prefix = f'"{name}";r='.encode("ascii")  # the RateLimit field up to r=
        # The buckets whose rate and capacity the header fields show: the
        # fields are built once, and again only when one is reconfigured.
        self.leaves = _leaves(limiter)
        self.refresh()

    def refresh(self) -> None:
        """Build the header fields from the limiter's rate and capacity as they are now."""
        limiter, name = self.limiter, self.name
        self.seen = _snapshot(self.leaves)
        self.policy_header = _policy_header(name, limiter)
        # One bucket: the hot path compares its rate (by identity) and capacity inline.
        self.watched: Any = limiter if self.policy_header is not None else None
        self.rate_seen = getattr(limiter, "rate", None)
        self.capacity_seen = getattr(limiter, "capacity", None)
        layers = getattr(limiter, "layers", None)
        self.layer_headers: Varying | None = _plan_fields(limiter)
        if layers is not None:
            self.layer_headers = tuple(
                _plan_fields(lr) or (self.r_prefix, _policy_header(name, lr)) for lr in layers
            )
        # The fields that never change (none for an all_of or tiered: a layer or plan does).
        self.ietf_extra: tuple[tuple[bytes, bytes], ...] = (
            (self.policy_header,) if self.policy_header is not None else ()
        )

    def stale(self) -> bool:
        """Whether a bucket behind the fields was reconfigured since they were built."""
        w = self.watched
        if w is not None:
            return bool(w.rate is not self.rate_seen or w.capacity != self.capacity_seen)
        return bool(self.leaves) and _snapshot(self.leaves) != self.seen

    def validated_cost(self, cost: object) -> int:
        """Check a fixed cost against the limiter now, not at the first request."""
        if self.capacity is not None:
            return validated_cost(cost, self.capacity)
        return int_at_least(cost, "cost", 0)


def ietf_field(policy: Policy, decision: Any) -> tuple[bytes, bytes]:
    """The ``RateLimit`` field of one decision of a single-bucket policy."""
    return (
        b"ratelimit",
        b"%b%d;t=%d" % (policy.r_prefix, decision.remaining, -(-decision.reset_after_ns // _NS)),
    )


def limit_headers(mode: str, policy: Policy, decision: Any) -> Headers:
    """The rate-limit fields for one decision (empty when *mode* is "off")."""
    if mode == "ietf":
        w = policy.watched  # policy.stale(), inlined for the one-bucket case
        if w is not None:
            if w.rate is not policy.rate_seen or w.capacity != policy.capacity_seen:
                policy.refresh()
        elif policy.leaves and policy.stale():
            policy.refresh()
        if policy.layer_headers is None:
            return [*policy.ietf_extra, ietf_field(policy, decision)]
        r_prefix, header = _varying(policy.layer_headers, decision)
        value = b"%b%d;t=%d" % (r_prefix, decision.remaining, -(-decision.reset_after_ns // _NS))
        if header is None:
            return [(b"ratelimit", value)]
        return [header, (b"ratelimit", value)]
    if mode == "legacy":
        return [
            (b"x-ratelimit-limit", b"%d" % decision.limit),
            (b"x-ratelimit-remaining", b"%d" % decision.remaining),
            (b"x-ratelimit-reset", b"%d" % -(-decision.reset_after_ns // _NS)),
        ]
    return []


@functools.lru_cache(maxsize=1024)
def problem_body(retry_after: int, name: str) -> bytes:
    """A small RFC 9457 ``application/problem+json`` body for a 429.

    Cached: a flood of rejected requests repeats a few bodies, and a 429
    should cost less than the request it turns away.
    """
    return json.dumps(
        {
            "type": "about:blank",
            "title": "Too Many Requests",
            "status": 429,
            "detail": f"Rate limit {name!r} exceeded; retry after {retry_after} s.",
            "retry_after": retry_after,
        },
        separators=(",", ":"),
    ).encode("utf-8")


def rejection(mode: str, policy: Policy, decision: Any) -> tuple[Headers, bytes]:
    """Headers and body of the 429 answer."""
    seconds = retry_after_seconds(decision.retry_after_ns)
    # A per-plan limit names the plan that refused, as its header fields do.
    body = problem_body(seconds, getattr(decision, "plan", None) or policy.name)
    headers = [
        (b"content-type", b"application/problem+json"),
        (b"content-length", b"%d" % len(body)),
        (b"retry-after", b"%d" % seconds),
    ]
    headers.extend(limit_headers(mode, policy, decision))
    return headers, body


# --------------------------------------------------------------------------
# Routes


@dataclass(slots=True, eq=False, repr=False)
class Route:
    """A rule for some paths: its own limiter, cost, key, or exempt.

    *path* is exact (``"/login"``) or a prefix ending in ``"/*"``
    (``"/api/*"`` matches ``/api`` and everything below it). The most
    specific rule wins: an exact match, else the longest prefix. *path* is
    the decoded path, as the app routes it (``"/café"``, not
    ``"/caf%C3%A9"``). *methods* limits the rule to some methods (e.g.
    ``{"POST"}``); other methods take the next rule that matches (a shorter
    prefix, else the middleware's default), so a rule for ``{"GET",
    "POST"}`` does not apply to ``OPTIONS``. ``GET`` brings ``HEAD`` along
    (the frameworks answer HEAD with the GET handler) unless a rule for the
    same path names ``HEAD``. Anything left as None comes from the
    middleware's own arguments. A path with a ``.`` or ``..`` segment, or
    with ``//``, never matches an exempt rule (see `Router`).

    >>> Route("/healthz", exempt=True)
    Route('/healthz', exempt=True)
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


@dataclass(slots=True, eq=False)
class Rule:
    """A resolved `Route`: what the middleware does for a request that matches it."""

    pattern: str
    policy: Policy | None
    key: KeyFunc | None
    cost: int
    cost_fn: Callable[[Any], int] | None
    exempt: bool
    peer_key: bool = field(init=False)

    def __post_init__(self) -> None:
        # The default key (the peer, no proxies trusted) is inlined by the ASGI hot path.
        key = self.key
        self.peer_key = type(key) is client_address and not key._reads_header


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
        raise TypeError("a limiter is required (e.g. nanobucket.KeyedTokenBucket(...))")
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

    def policies(self) -> list[Policy]:
        """The policy of every rule that is not exempt, the default's first."""
        rules = [self.default]
        rules += [rule for group in self.exact.values() for _, rule in group]
        rules += [rule for _, _, rule in self.prefixes]
        return [rule.policy for rule in rules if rule.policy is not None]

    def match(self, path: str, method: str) -> Rule:
        """The rule for *path* (as received) and *method*."""
        # An ordinary path pays two substring tests; one with "/." or "//" looks further.
        if ("/." in path or "//" in path) and self._guarded is not None:
            suspect = suspect_path(path)
            if suspect is not None:
                return self._guarded.match(suspect, method)
        for methods, rule in self.exact.get(path, ()):
            if methods is None or method in methods:
                return rule
        for prefix, methods, rule in self.prefixes:
            if (path == prefix or path.startswith(prefix + "/") or prefix == "") and (
                methods is None or method in methods
            ):
                return rule
        if path[:1] != "/" and path and self._guarded is not None:
            # A relative target ("GET login HTTP/1.1"): some servers pass it on
            # and Werkzeug routes it as "/login". Only requests that found no
            # rule pay this; like a suspect path, it is never exempt.
            return self._guarded.match("/" + path, method)
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


def headers_mode(mode: object) -> str:
    """Validate ``headers=``: "ietf" (default), "legacy" or "off"."""
    if mode not in HEADER_MODES:
        raise ValueError(f"headers must be one of {HEADER_MODES}, got {mode!r}")
    return mode


# --------------------------------------------------------------------------
# Counters


class Counters:
    """Requests seen by a middleware, readable by the app at any time.

    ``admitted``: passed the limiter; ``limited``: answered 429;
    ``shadow_limited``: would have been 429 but shadow mode let them through;
    ``exempt``: matched an exempt route and were not counted by any limiter.

    >>> c = Counters(); c.snapshot()
    {'admitted': 0, 'limited': 0, 'shadow_limited': 0, 'exempt': 0}
    """

    __slots__ = ("_lock", "admitted", "exempt", "limited", "shadow_limited")

    def __init__(self) -> None:
        self.admitted = 0
        self.limited = 0
        self.shadow_limited = 0
        self.exempt = 0
        # Only the WSGI middleware takes it: threads may add at once there,
        # while an ASGI app runs its middleware on one event-loop thread.
        self._lock = threading.Lock()

    def add(self, count: str) -> None:
        """Add one to *count* (``"admitted"``, ``"limited"``, ...), safely from any thread.

        >>> c = Counters(); c.add("limited"); c.add("limited")
        >>> c.limited
        2
        """
        with self._lock:
            setattr(self, count, getattr(self, count) + 1)

    def snapshot(self) -> dict[str, int]:
        """The four counts as a dict, read together.

        >>> c = Counters(); c.limited += 1
        >>> c.snapshot()["limited"]
        1
        """
        with self._lock:
            return {
                "admitted": self.admitted,
                "limited": self.limited,
                "shadow_limited": self.shadow_limited,
                "exempt": self.exempt,
            }

    def reset(self) -> None:
        """Set every count back to 0.

        >>> c = Counters(); c.admitted += 5; c.reset()
        >>> c.admitted
        0
        """
        with self._lock:
            self.admitted = self.limited = self.shadow_limited = self.exempt = 0

    def __repr__(self) -> str:
        return f"Counters({self.snapshot()})"


def counters_or_new(counters: object) -> Counters:
    """``counters=``: a `Counters` the app keeps, or None for a fresh one."""
    if counters is None:
        return Counters()
    if not isinstance(counters, Counters):
        raise TypeError(f"counters must be a nanobucket Counters, not {type(counters).__name__}")
    return counters


# --------------------------------------------------------------------------
# The integrations' shared arguments


class Options(TypedDict, total=False):
    """The keyword options every HTTP integration takes alike (as the ASGI
    middleware documents them); each integration adds its own (key, cost, routes)."""

    headers: str  # "ietf" by default
    name: str  # "default" by default
    shadow: bool  # False by default
    counters: Counters | None
    keyed: bool | None
    on_decision: Hook | None
    on_limited: Hook | None
    charge: Charge | None


class Integration:
    """What every HTTP integration does alike with its `Options`: checks them once,
    for the middlewares, the FastAPI dependency and the Django gate."""

    headers: str
    shadow: bool
    counters: Counters

    def _options(self, options: Options, allow_async: bool) -> tuple[str, bool | None]:
        """Check and keep *options*; returns what makes the policies: ``(name, keyed)``."""
        unknown = options.keys() - Options.__optional_keys__
        if unknown:
            raise TypeError(f"unexpected keyword argument {min(unknown)!r}")
        shadow = options.get("shadow", False)
        if not isinstance(shadow, bool):
            raise TypeError("shadow must be a bool")
        self.headers = headers_mode(options.get("headers", "ietf"))
        self.shadow = shadow
        self.counters = counters_or_new(options.get("counters"))
        self._hooks = make_hooks(
            options.get("on_decision"), options.get("on_limited"), allow_async=allow_async
        )
        self._charge = check_charge(options.get("charge"))
        self._quiet = shadow or self.headers == "off"
        return options.get("name", "default"), options.get("keyed")


class Middleware(Integration):
    """The constructor of the ASGI and WSGI middlewares (their docstrings say what it takes)."""

    _app_kind = "an ASGI callable"
    _async = True  # the limiter and the hooks may be awaited

    def __init__(
        self,
        app: Callable[..., Any],
        limiter: object,
        *,
        key: object = None,
        cost: int | Callable[[Any], int] = 1,
        routes: Iterable[Route] | None = None,
        exempt: str | Iterable[str] | None = None,
        **options: Unpack[Options],
    ) -> None:
        if not callable(app):
            raise TypeError(f"app must be {self._app_kind}, not {type(app).__name__}")
        self.app = app
        name, keyed = self._options(options, self._async)
        self._router = build_router(limiter, key, cost, name, keyed, routes, exempt)
        if not self._async and any(p.is_async for p in self._router.policies()):
            raise TypeError("a WSGI app needs a synchronous limiter (check() is async here)")
        # With no routes every request takes the default rule: skip matching.
        self._simple = not self._router.exact and not self._router.prefixes
        self._ietf = self.headers == "ietf"
        self._settlers = settlers(self._router) if self._charge is not None else {}

    def __repr__(self) -> str:
        return f"RateLimitMiddleware({self.app!r}, headers={self.headers!r}, shadow={self.shadow})"
