"""Token buckets shared through Redis: one limit across many machines.

Each decision is one Lua script (``_redis_gcra.lua``) run by Redis: the same
GCRA as the in-process table, one ``tat`` per key, so a rejected request
writes nothing and a full bucket is a missing key (``SET ... PX`` makes the
key expire when its bucket is full again, so idle clients cost nothing).

Units. Lua numbers are doubles, exact only below 2**53, so Redis keeps time
in **microseconds**: ``interval_us = ceil(1e6 / rate)``. That rounding is
conservative (the bucket refills a hair slower, never faster) and costs at
most 1 us per token: a relative rate error below ``rate / 1e6`` (0.1 % at
1000/s, 1e-6 at 1/s; rates whose ``1e6 / rate`` is whole, such as 1, 4, 100,
1000/s, are exact) and caps the usable rate at 1e6 tokens/s per key. By
default time is the Redis server's ``TIME``, so clients with skewed clocks
share one limit. The ``*_at`` forms take an explicit ``now`` in int ns (for
tests and replays) and pass ``now // 1000`` us to Redis (floor: a partial
microsecond never counts, conservative); their returned times are us * 1000.
With times that are whole microseconds and a whole-microsecond interval, a
trace gives the very same decisions as :class:`nanobucket.KeyedTokenBucket`.

Keys are ``b"<prefix>:{<key>}"``: the user key is the Redis Cluster hash tag,
so every limit on one key (different prefixes, one layered decision) lives in
one slot. Keys may be ``str``, ``bytes`` or ``int`` (``1`` and ``"1"`` are the
same bucket). Two limiters with different rates must not share a prefix.

No call waits longer than the limiter's ``timeout`` (0.1 s by default),
whatever client it is given: the limiter talks to the client's server through
a connection pool of its own, with the client's connection parameters but
``timeout`` as socket and connect timeout and no retries (redis-py's default
client retries with back-off, which would hold a request for seconds on a
dead Redis and for a minute on a hung one). A client already built that way
(:func:`client_from_url`) is used as it is. A ``RedisCluster`` gets a cluster
client of its own to the same nodes, bounded the same way (redis-py's retries
10 times, refreshing the topology each time). valkey-py's clients, plain and
cluster, sync and asyncio, are taken like redis-py's (:func:`bounded_client`);
their errors are "cannot decide" and get the same reasons.

When Redis cannot decide, the failure policy decides: ``on_error="open"``
admits, ``"closed"`` rejects, ``"raise"`` raises :class:`RedisUnavailable`; a
``fallback`` limiter (any object with
``check``/``check_at``/``peek``/``peek_at``/``allow_many``/``allow_many_at``
taking the key first, e.g. a :class:`nanobucket.KeyedTokenBucket` with
``rate / instances``) decides instead of the policy when given. "Cannot
decide" is every error redis-py raises: refused, timed out, ``LOADING``,
``BUSY`` (a long script), ``OOM`` (maxmemory with noeviction), ``READONLY`` (a
replica), ``MASTERDOWN``, ``CLUSTERDOWN``, ``TRYAGAIN``, ``MOVED``/``ASK``,
an error reply of any kind. A :class:`CircuitBreaker` counts each and stops
calling a failing Redis for a back-off that doubles on every failed probe, so
only the first call pays the timeout. Every :class:`RedisDecision` says who
decided in ``source`` and why Redis did not in ``reason``.

A key of the limiter's prefix that holds no bucket (another type, a string
that is not a number, ``inf``, ``nan``, a negative or huge number) is an
empty bucket: refused until it refills, and replaced by a real bucket on the
first consuming call. Never an error, never a token it did not have.

>>> import nanobucket.redis as nbr
>>> limiter = nbr.RedisTokenBucket.from_url("redis://127.0.0.1:6379", rate=100, capacity=200)
>>> limiter.allow("client-42")                                 # doctest: +SKIP
True
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable
from importlib.resources import files
from typing import Any, Literal, Protocol

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.cluster
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import (
    NoScriptError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from . import _coalesce
from . import _redis_clients as _clients
from . import waiting as _waiting
from ._bucket_py import Decision
from ._params import (
    NOW_MAX,
    NS_PER_S,
    RateLike,
    bucket_params,
    check_cost,
    check_max_keys,
    check_now,
)

__all__ = (
    "AsyncRedisTokenBucket",
    "CircuitBreaker",
    "LeasedTokenBucket",
    "RedisDecision",
    "RedisTokenBucket",
    "RedisUnavailable",
)

Policy = Literal["open", "closed", "raise"]
Source = Literal["redis", "lease", "policy:open", "policy:closed", "fallback"]
Clock = Callable[[], int]

NS_PER_US = 1000
#: Largest tau in us: tat = now + tau must stay below 2**53 for every now.
TAU_US_MAX = (1 << 53) - 1 - NOW_MAX // NS_PER_US
#: Keys written at explicit times live this much longer than their debt: an
#: explicit clock is not Redis's, so Redis cannot tell when such a bucket is
#: full; without the slack a slow replay would lose state mid-trace.
EXPLICIT_TTL_SLACK_MS = 86_400_000
#: Compare-and-swap attempts per key when reconfigure migrates a busy bucket.
SWAP_TRIES = 100
DEFAULT_SOCKET_TIMEOUT = 0.1
#: ``asyncio.timeout_at`` (Python >= 3.11): one deadline around a round trip,
#: instead of redis.asyncio's costly socket timeout. On 3.10 the asyncio
#: limiter keeps the socket timeout.
_timeout_at: Callable[[float], contextlib.AbstractAsyncContextManager[Any]] | None = getattr(
    asyncio, "timeout_at", None
)
#: Errors that mean "Redis could not decide": everything redis-py raises,
#: down, timed out, and every error reply (OOM, READONLY, BUSY, MASTERDOWN,
#: CLUSTERDOWN, TRYAGAIN, MOVED, ...), and its cluster client's own errors
#: (no node serves the slot): the policy answers instead. valkey-py's errors
#: join when a limiter is given a valkey client (:func:`bounded_client`).
UNAVAILABLE: tuple[type[BaseException], ...] = _clients.REDIS.errors
#: Connection parameters that belong to one pool, not to the server: a pool
#: of the limiter's own builds its own.
_POOL_OWNED = frozenset(
    {
        "maint_notifications_pool_handler",
        "oss_cluster_maint_notifications_handler",
        "orig_host_address",
        "orig_socket_timeout",
        "orig_socket_connect_timeout",
        "himport_registry",
    }
)

_GCRA = files(__package__).joinpath("_redis_gcra.lua").read_text(encoding="utf-8")
_GCRA_MANY = files(__package__).joinpath("_redis_gcra_many.lua").read_text(encoding="utf-8")
_GCRA_BATCH = files(__package__).joinpath("_redis_gcra_batch.lua").read_text(encoding="utf-8")
_LEASE = files(__package__).joinpath("_redis_lease.lua").read_text(encoding="utf-8")
_RESERVE = files(__package__).joinpath("_redis_reserve.lua").read_text(encoding="utf-8")
_SWAP = files(__package__).joinpath("_redis_swap.lua").read_text(encoding="utf-8")


class RedisUnavailable(RedisConnectionError):
    """Redis could not decide (``on_error="raise"``): down, timed out, an error reply, breaker open.

    The redis-py error, when there was one, is the ``__cause__``.

    A ``redis.ConnectionError``, so code catching redis-py's errors catches it too.

    >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
    >>> try:
    ...     RedisTokenBucket(redis.Redis(), rate=100, capacity=200, breaker=down).check("alice")
    ... except redis.ConnectionError as e:
    ...     print(type(e).__name__, "-", e)
    RedisUnavailable - Redis unavailable: circuit breaker open
    """


class RedisDecision(Decision):
    """A :class:`nanobucket.Decision` plus ``source`` (who decided) and ``reason`` (why).

    ``source`` is ``"redis"`` (the shared bucket), ``"lease"`` (a local lease,
    :class:`LeasedTokenBucket`), ``"fallback"`` (the local fallback limiter
    while Redis could not decide), ``"policy:open"`` or ``"policy:closed"``.
    ``reason`` is None when Redis or a lease decided, else why Redis did not:
    ``"breaker-open"`` (no call made), ``"timeout"``, ``"connection"``
    (refused, reset, too many connections), ``"loading"``, or the lowercased
    code of Redis's error reply: ``"oom"``, ``"readonly"``, ``"busy"``,
    ``"masterdown"``, ``"clusterdown"``, ``"tryagain"``, ``"moved"``,
    ``"ask"``, ``"noperm"``, ``"err"``...; ``"error"`` for anything else.
    Equality compares the five Decision fields only, so a Redis decision
    equals the in-process one for the same trace.

    >>> from nanobucket import KeyedTokenBucket
    >>> d = RedisDecision(True, 199, 0, 10_000_000, 200)   # Redis's answer to a first request
    >>> d.source, d.reason, d == KeyedTokenBucket(rate=100, capacity=200).check_at("alice", 0)
    ('redis', None, True)
    """

    __slots__ = ("reason", "source")

    source: Source
    reason: str | None

    def __init__(
        self,
        allowed: bool,
        remaining: int,
        retry_after_ns: int,
        reset_after_ns: int,
        limit: int,
        source: Source = "redis",
        reason: str | None = None,
    ) -> None:
        super().__init__(allowed, remaining, retry_after_ns, reset_after_ns, limit)
        self.source = source
        self.reason = reason

    def __repr__(self) -> str:
        tail = "" if self.reason is None else f", reason={self.reason!r}"
        return f"{super().__repr__()[:-1]}, source={self.source!r}{tail})"


def failure_reason(err: BaseException | None) -> str:
    """Why Redis did not decide, as :attr:`RedisDecision.reason` names it.

    >>> from redis.exceptions import OutOfMemoryError, ResponseError
    >>> failure_reason(None), failure_reason(RedisTimeoutError("Timeout reading"))
    ('breaker-open', 'timeout')
    >>> failure_reason(OutOfMemoryError("command not allowed", status_code="OOM"))
    'oom'
    >>> failure_reason(ResponseError("BUSY Redis is busy running a script."))
    'busy'
    """
    if err is None:
        return "breaker-open"
    reason = _clients.class_reason(err)  # redis-py's or valkey-py's class
    if reason is not None:
        return reason
    code = getattr(err, "status_code", None)
    if not code and err.args and isinstance(err.args[0], str):
        code = err.args[0].split(" ", 1)[0]
    if isinstance(code, str) and code.isalpha() and code.isupper():
        return code.lower()
    return "error"


class CircuitBreaker:
    """Stops calling a failing Redis for a back-off, then lets one probe through.

    After ``failures`` consecutive failures the breaker opens for ``backoff``
    seconds; the first call after that is a probe: success closes the breaker
    (and resets the back-off), failure re-opens it for twice as long, up to
    ``max_backoff``. Thread-safe; ``clock`` (int ns) is injectable for tests.

    >>> b = CircuitBreaker(backoff=1.0, clock=lambda: 0)
    >>> b.record_failure(); b.allow_request()
    False
    """

    def __init__(
        self,
        *,
        failures: int = 1,
        backoff: float = 0.1,
        max_backoff: float = 5.0,
        clock: Clock | None = None,
    ) -> None:
        if isinstance(failures, bool) or not isinstance(failures, int):
            raise TypeError(f"failures must be an int, not {type(failures).__name__}")
        if failures < 1:
            raise ValueError(f"failures must be >= 1, got {failures!r}")
        for name, value in (("backoff", backoff), ("max_backoff", max_backoff)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
            if not 0 < value < 86_400 * 365:
                raise ValueError(f"{name} must be > 0 seconds and finite, got {value!r}")
        if max_backoff < backoff:
            raise ValueError(f"max_backoff {max_backoff!r} < backoff {backoff!r}")
        if clock is not None and not callable(clock):
            raise TypeError("clock must be a callable returning int ns")
        self._threshold = failures
        self._base_ns = int(backoff * NS_PER_S)
        self._max_ns = int(max_backoff * NS_PER_S)
        self._clock: Clock = clock if clock is not None else time.monotonic_ns
        self._lock = threading.Lock()
        self._failures = 0
        self._backoff_ns = self._base_ns
        self._open_until = 0  # meaningful only while failures >= threshold

    @property
    def state(self) -> Literal["closed", "open", "half-open"]:
        """``closed`` (calls go to Redis), ``open`` (they do not), ``half-open`` (one probes).

        >>> now = [0]
        >>> b = CircuitBreaker(backoff=1.0, clock=lambda: now[0])
        >>> b.record_failure(); b.state
        'open'
        >>> now[0] = 1_000_000_000; b.state   # the back-off is over: the next call probes
        'half-open'
        """
        with self._lock:
            if self._failures < self._threshold:
                return "closed"
            return "open" if self._clock() < self._open_until else "half-open"

    def allow_request(self) -> bool:
        """True if the caller may try Redis now (closed, or this call is the probe).

        >>> b = CircuitBreaker(clock=lambda: 0)
        >>> b.allow_request()
        True
        >>> b.record_failure(); b.allow_request()
        False
        """
        with self._lock:
            if self._failures < self._threshold:
                return True
            now = self._clock()
            if now < self._open_until:
                return False
            # This caller probes; others keep getting the policy meanwhile.
            self._open_until = now + self._backoff_ns
            return True

    def retry_in_ns(self) -> int:
        """Nanoseconds until the breaker lets a probe through (0 when closed).

        >>> b = CircuitBreaker(backoff=0.5, clock=lambda: 0)
        >>> b.retry_in_ns()
        0
        >>> b.record_failure(); b.retry_in_ns()
        500000000
        """
        with self._lock:
            if self._failures < self._threshold:
                return 0
            return max(0, self._open_until - self._clock())

    def record_success(self) -> None:
        """Redis answered: close the breaker and reset the back-off.

        >>> b = CircuitBreaker(clock=lambda: 0)
        >>> b.record_failure(); b.record_success(); b.state
        'closed'
        """
        with self._lock:
            self._failures = 0
            self._backoff_ns = self._base_ns

    def record_failure(self) -> None:
        """Redis failed: count it; open (or re-open, for twice as long) at the threshold.

        >>> b = CircuitBreaker(failures=2, backoff=1.0, clock=lambda: 0)
        >>> b.record_failure(); b.state
        'closed'
        >>> b.record_failure(); b.state, b.retry_in_ns()
        ('open', 1000000000)
        """
        with self._lock:
            self._failures += 1
            if self._failures < self._threshold:
                return
            if self._failures > self._threshold:
                self._backoff_ns = min(self._max_ns, self._backoff_ns * 2)
            self._open_until = self._clock() + self._backoff_ns


class Fallback(Protocol):
    """A local keyed limiter to decide while Redis is unreachable."""

    def check(self, key: Hashable, cost: int = 1) -> Any: ...
    def check_at(self, key: Hashable, now: int, cost: int = 1) -> Any: ...
    def peek(self, key: Hashable, cost: int = 1) -> Any: ...
    def peek_at(self, key: Hashable, now: int, cost: int = 1) -> Any: ...
    def allow_many(self, keys: Iterable[Hashable], cost: int = 1) -> bytearray: ...
    def allow_many_at(self, keys: Iterable[Hashable], now: int, cost: int = 1) -> bytearray: ...


def _check_timeout(timeout: object) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
    if not 0 < timeout <= 3600:
        raise ValueError(f"timeout must be in (0, 3600] seconds, got {timeout!r}")
    return float(timeout)


def _bounded(kwargs: dict[str, Any], timeout: float, deadline: bool = False) -> bool:
    """True if connections built from *kwargs* wait at most *timeout* and never retry.

    With *deadline*, reads must have no timeout of their own instead (the
    caller bounds each call by a deadline, see `_deadline_client`).
    """
    retry = kwargs.get("retry")
    read, connect = kwargs.get("socket_timeout"), kwargs.get("socket_connect_timeout")
    return (
        retry is not None
        and _retries(retry) == 0
        and ((read is None) if deadline else (read is not None and read <= timeout))
        and connect is not None
        and connect <= timeout
        and not kwargs.get("decode_responses")
    )


def _retries(retry: Any) -> int | None:
    get = getattr(retry, "get_retries", None)  # redis-py >= 5.0.1
    return get() if get is not None else getattr(retry, "_retries", None)


def bounded_client(client: Any, timeout: float) -> Any:
    """A client to *client*'s server whose calls wait at most *timeout* s and never retry.

    *client* itself when it is already so, or when it is no redis-py or
    valkey-py client; otherwise a new client of the same library and kind
    (plain or cluster, sync or asyncio) with the same connection parameters
    (host, port, db, credentials, TLS, ...; a cluster's known nodes) but
    *timeout* as socket and connect timeout, no retries and raw replies, on
    connections of its own. The caller's client is never changed: other code
    may share it.

    >>> user = redis.Redis(port=6380)   # redis-py's defaults: 5 s timeouts, 3 retries
    >>> own = bounded_client(user, 0.1)
    >>> kw = own.connection_pool.connection_kwargs
    >>> own is user, kw["port"], kw["socket_timeout"], kw["retry"].get_retries()
    (False, 6380, 0.1, 0)
    >>> bounded_client(own, 0.1) is own
    True
    """
    global UNAVAILABLE  # noqa: PLW0603 -- grows once, when valkey-py is first given
    lib = _clients.library_of(client)
    if lib is None:
        return client  # another library's client: used as given
    if lib is not _clients.REDIS:
        UNAVAILABLE = _clients.loaded_errors()  # its errors are "cannot decide" too
    if isinstance(client, lib.clusters):
        return _bounded_cluster(lib, client, timeout)
    if not isinstance(client, lib.plain):
        return client
    return _bounded_plain(lib, client, timeout, timeout)


def _deadline_client(client: Any, timeout: float) -> Any:
    """For an asyncio client: `bounded_client`, but reads without a timeout of their own.

    redis.asyncio spends about 20 us of CPU per call on a socket timeout (a
    task for ``wait_for`` around the write, a timeout around the read);
    :class:`AsyncRedisTokenBucket` bounds each of its decision round trips
    by one deadline of its own instead (``asyncio.timeout_at``). Connecting
    still waits at most *timeout*, and nothing retries. Any other client:
    `bounded_client`.
    """
    lib = _clients.library_of(client)
    if lib is None or not isinstance(client, lib.async_client):
        return bounded_client(client, timeout)
    return _bounded_plain(lib, client, timeout, None)


def _bounded_plain(
    lib: _clients.Library, client: Any, timeout: float, read_timeout: float | None
) -> Any:
    """`bounded_client` for a plain client; reads wait at most *read_timeout* (None: no bound)."""
    pool: Any = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if not isinstance(kwargs, dict) or _bounded(kwargs, timeout, read_timeout is None):
        return client
    kwargs = {k: v for k, v in kwargs.items() if k not in _POOL_OWNED}
    kwargs.update(
        socket_timeout=read_timeout,
        socket_connect_timeout=timeout,
        retry_on_error=[],
        decode_responses=False,
    )
    # The caller's pool size, and its kind: a blocking pool waits for a free
    # connection, here at most *timeout*; a plain one fails past its size.
    limit = {"connection_class": pool.connection_class, "max_connections": pool.max_connections}
    if isinstance(client, lib.async_client):
        kwargs["retry"] = lib.async_retry(lib.no_backoff(), 0)
        if isinstance(pool, lib.async_blocking_pool):
            own: Any = lib.async_blocking_pool(timeout=timeout, **limit, **kwargs)
        else:
            own = lib.async_pool(**limit, **kwargs)
        return _owning(lib.async_client, own)
    kwargs["retry"] = lib.retry(lib.no_backoff(), 0)
    if isinstance(pool, lib.blocking_pool):
        own = lib.blocking_pool(timeout=timeout, **limit, **kwargs)
    else:
        own = lib.pool(**limit, **kwargs)
    return _owning(lib.client, own)


#: Cluster connection parameters the cluster client sets itself, per node.
_CLUSTER_OWNED = frozenset({"redis_connect_func", "host", "port", "retry", "connection_pool"})


def _bounded_cluster(lib: _clients.Library, client: Any, timeout: float) -> Any:
    """`bounded_client` for a cluster client: a cluster client of its own to the same nodes.

    A cluster client retries a failed command (10 times in redis-py, with
    back-off, each after refreshing the topology), so a lost master held a
    decision for seconds, a hung one for about a minute: the copy retries
    nothing, and each node connection waits at most *timeout*.
    """
    sync = isinstance(client, lib.cluster)
    cls = lib.cluster if sync else lib.async_cluster
    named = inspect.signature(cls).parameters
    counts = {name: 0 for name in lib.cluster_retry_counts if name in named}
    if not sync and "cluster_error_retry_attempts" in counts:
        # valkey-py's asyncio pipeline makes this many attempts in all (0:
        # none) and pauses after each: the copy's pipeline makes one, at once.
        one_pass = _clients.one_pass_async_cluster(cls)
        if one_pass is cls:
            counts["cluster_error_retry_attempts"] = 1
        cls = one_pass
    kwargs = client.get_connection_kwargs() if sync else client.connection_kwargs
    retry = getattr(client, "retry", None)
    if (
        retry is not None
        and _retries(retry) == 0
        and all(getattr(client, name, 1) == 0 for name in counts)
        and _bounded({**kwargs, "retry": retry}, timeout)
    ):
        return client
    kwargs = {k: v for k, v in kwargs.items() if k not in _POOL_OWNED | _CLUSTER_OWNED}
    if not sync:  # the asyncio cluster takes named parameters only, and keeps more than those
        kwargs = {k: v for k, v in kwargs.items() if k in named}
    kwargs.update(socket_timeout=timeout, socket_connect_timeout=timeout, decode_responses=False)
    manager = client.nodes_manager
    node = lib.cluster_node if sync else lib.async_cluster_node
    startup = [node(n.host, n.port) for n in manager.startup_nodes.values()]
    full = getattr(manager, "_require_full_coverage", None)
    if full is None:
        full = manager.require_full_coverage
    return cls(
        startup_nodes=startup,
        retry=(lib.retry if sync else lib.async_retry)(lib.no_backoff(), 0),
        require_full_coverage=full,
        address_remap=manager.address_remap,
        **counts,
        **kwargs,
    )


def _owning(cls: Any, pool: Any) -> Any:
    """A client of class *cls* on *pool* that closes the pool when it is closed."""
    from_pool = getattr(cls, "from_pool", None)  # redis-py >= 5.0.1
    if from_pool is not None:
        return from_pool(pool)
    client = cls(connection_pool=pool)
    client.auto_close_connection_pool = True
    return client


def client_from_url(
    url: str, *, socket_timeout: float = DEFAULT_SOCKET_TIMEOUT, asyncio: bool = False
) -> Any:
    """A redis-py client for limiting: short timeouts and **no retries**.

    redis-py retries a failed command 10 times with back-off by default, which
    would block a request for seconds on a dead Redis; a limiter would rather
    apply its failure policy after one ``socket_timeout``.
    """
    module = redis.asyncio if asyncio else redis
    # redis-py >= 8.2 warns when an asyncio client is given the sync Retry.
    retry = (redis.asyncio.retry.Retry if asyncio else Retry)(NoBackoff(), 0)
    return module.Redis.from_url(
        url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout, retry=retry
    )


def _redis_params(rate: RateLike, capacity: int) -> tuple[Any, int, int]:
    """Validated ``(exact rate, capacity, interval_us)`` of a Redis limiter."""
    exact, cap, interval_ns, _ = bucket_params(rate, capacity)
    # ceil(ceil(1e9/r) / 1000) == ceil(1e6/r): whole us, rounded up.
    interval_us = -(-interval_ns // NS_PER_US)
    if cap * interval_us > TAU_US_MAX:
        raise ValueError(
            f"capacity / rate is {cap * interval_us / 1e6 / 86400 / 365.25:.0f} years to refill: "
            f"more than Redis's microsecond state can hold exactly"
        )
    return exact, cap, interval_us


class _RedisLimits:
    """Parameters, key encoding and failure policy shared by the Redis limiters."""

    keyed = True  # the verbs take the key first

    def __init__(
        self,
        rate: RateLike,
        capacity: int,
        prefix: str,
        on_error: Policy,
        fallback: Fallback | None,
        breaker: CircuitBreaker | None,
        timeout: float,
    ) -> None:
        self._timeout = _check_timeout(timeout)
        self._set_params(_redis_params(rate, capacity))
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        if "{" in prefix or "}" in prefix:
            raise ValueError("prefix must not contain '{' or '}': the key is the hash tag")
        self._prefix = prefix.encode("utf-8") + b":{"
        if on_error not in ("open", "closed", "raise"):
            raise ValueError(f"on_error must be 'open', 'closed' or 'raise', got {on_error!r}")
        self._on_error = on_error
        self._fallback = fallback
        if breaker is not None and not isinstance(breaker, CircuitBreaker):
            raise TypeError("breaker must be a CircuitBreaker")
        self._breaker = breaker if breaker is not None else CircuitBreaker()

    @property
    def rate(self) -> Any:
        """Tokens per second, as an exact Fraction (Redis applies ``interval_us``).

        >>> RedisTokenBucket(redis.Redis(), rate=2.5, capacity=10).rate
        Fraction(5, 2)
        """
        return self._rate

    @property
    def capacity(self) -> int:
        """The most tokens a bucket holds.

        >>> RedisTokenBucket(redis.Redis(), rate=100, capacity=200).capacity
        200
        """
        return self._capacity

    @property
    def interval_ns(self) -> int:
        """Nanoseconds per token as Redis applies it: a whole number of microseconds.

        >>> RedisTokenBucket(redis.Redis(), rate=3, capacity=3).interval_ns   # 1/3 s, rounded up
        333334000
        """
        return self._interval_ns

    @property
    def timeout(self) -> float:
        """The longest a call waits for Redis, in seconds (socket and connect timeout).

        >>> RedisTokenBucket(redis.Redis(), rate=100, capacity=200).timeout
        0.1
        """
        return self._timeout

    @property
    def breaker(self) -> CircuitBreaker:
        """The circuit breaker guarding calls to Redis.

        >>> RedisTokenBucket(redis.Redis(), rate=100, capacity=200).breaker.state
        'closed'
        """
        return self._breaker

    def key(self, key: Hashable) -> bytes:
        """The Redis key of *key*'s bucket: ``<prefix>:{<key>}``.

        >>> limiter = RedisTokenBucket(redis.Redis(), rate=100, capacity=200, prefix="api")
        >>> limiter.key("alice"), limiter.key(42)
        (b'api:{alice}', b'api:{42}')
        """
        if isinstance(key, str):
            raw = key.encode("utf-8")
        elif isinstance(key, bytes):
            raw = key
        elif isinstance(key, int) and not isinstance(key, bool):
            raw = str(key).encode()
        else:
            raise TypeError(
                f"a Redis limiter key must be str, bytes or int, not {type(key).__name__}"
            )
        return self._prefix + raw + b"}"

    def _cost(self, cost: object) -> int:
        if cost.__class__ is int and 0 <= cost <= self._capacity:
            return cost
        return check_cost(cost, self._capacity)

    def _args(self, cost: int, now_ns: int | None, consume: bool) -> tuple[bytes | int, ...]:
        cost_us = cost * self._interval_us
        if now_ns is None:
            return (self._head[1], cost_us, b"", b"1" if consume else b"0", b"0")
        return (
            self._head[1],
            cost_us,
            now_ns // NS_PER_US,
            b"1" if consume else b"0",
            EXPLICIT_TTL_SLACK_MS,
        )

    def _many_args(self, cost: int, now_ns: int | None) -> tuple[bytes | int, ...]:
        if now_ns is None:
            return (*self._head, cost, b"", b"0")
        return (*self._head, cost, now_ns // NS_PER_US, EXPLICIT_TTL_SLACK_MS)

    def _admits(self, owed_us: int, cost: int) -> bool:
        """Whether a bucket owing *owed_us* (the script's reply) admits *cost* tokens."""
        return owed_us <= self._tau_us - cost * self._interval_us

    def _decision(self, owed_us: int, cost: int) -> RedisDecision:
        # The script returns only the debt before the decision (Redis's CPU
        # is shared by every client); the rest is the same GCRA, here.
        cost_us = cost * self._interval_us
        room = self._tau_us - cost_us
        if owed_us > room:
            retry_us, debt = owed_us - room, owed_us
        else:
            retry_us, debt = 0, owed_us + cost_us
        remaining = max(self._tau_us - debt, 0) // self._interval_us
        return RedisDecision(
            owed_us <= room,
            remaining,
            retry_us * NS_PER_US,
            debt * NS_PER_US,
            self._capacity,
            "redis",
        )

    def _policy(
        self, key: Hashable, cost: int, now_ns: int | None, consume: bool, err: BaseException | None
    ) -> RedisDecision:
        fb = self._fallback
        if fb is not None:
            if consume:
                d = fb.check(key, cost) if now_ns is None else fb.check_at(key, now_ns, cost)
            else:
                d = fb.peek(key, cost) if now_ns is None else fb.peek_at(key, now_ns, cost)
            return RedisDecision(
                d.allowed,
                d.remaining,
                d.retry_after_ns,
                d.reset_after_ns,
                d.limit,
                "fallback",
                failure_reason(err),
            )
        if self._on_error == "raise":
            raise RedisUnavailable(f"Redis unavailable: {err or 'circuit breaker open'}") from err
        if self._on_error == "open":
            return RedisDecision(
                True,
                self._capacity - cost,
                0,
                0,
                self._capacity,
                "policy:open",
                failure_reason(err),
            )
        # Closed: come back when the breaker will try Redis again (at least one
        # token's interval, so clients never spin on a zero Retry-After).
        retry = max(self._breaker.retry_in_ns(), cost * self._interval_ns, 1)
        return RedisDecision(
            False, 0, retry, self._tau_ns, self._capacity, "policy:closed", failure_reason(err)
        )

    def _policy_many(
        self, keys: list[Hashable], cost: int, now_ns: int | None, err: BaseException | None
    ) -> bytearray:
        fb = self._fallback
        if fb is not None:
            return (
                fb.allow_many(keys, cost)
                if now_ns is None
                else fb.allow_many_at(keys, now_ns, cost)
            )
        if self._on_error == "raise":
            raise RedisUnavailable(f"Redis unavailable: {err or 'circuit breaker open'}") from err
        return bytearray([1 if self._on_error == "open" else 0]) * len(keys)

    def _batch(self, keys: Iterable[Hashable]) -> tuple[list[Hashable], list[bytes]]:
        if isinstance(keys, (str, bytes)):
            raise TypeError("keys must be a sequence of keys, not a single str or bytes")
        keys = list(keys)
        return keys, [self.key(k) for k in keys]  # a bad key fails the batch before any call

    # -- refund, reset, reserve, reconfigure: the in-process table's verbs ------

    def _set_params(self, params: tuple[Any, int, int]) -> None:
        self._rate, self._capacity, self._interval_us = params
        self._tau_us = self._capacity * self._interval_us
        self._interval_ns = self._interval_us * NS_PER_US
        self._tau_ns = self._tau_us * NS_PER_US
        self._head = (str(self._interval_us).encode(), str(self._tau_us).encode())

    def _give_args(self, cost: int, now_ns: int | None) -> tuple[bytes | int, ...]:
        # The lease script's "give": tat -= cost * interval, never below now.
        now_arg: int | bytes = b"" if now_ns is None else now_ns // NS_PER_US
        return (*self._head, b"give", cost, 0, now_arg, EXPLICIT_TTL_SLACK_MS)

    def _reserve_args(
        self, cost: int, now_ns: int | None, max_wait: int, shape: bool
    ) -> tuple[bytes | int, ...]:
        now_arg: int | bytes = b"" if now_ns is None else now_ns // NS_PER_US
        return (
            self._head[1],
            cost * self._interval_us,
            now_arg,
            max(max_wait, 0) // NS_PER_US,  # floor: never wait past the caller's bound
            b"1" if shape else b"0",
            EXPLICIT_TTL_SLACK_MS,
        )

    def _reserve_policy(self, key: Hashable, cost: int, now_ns: int | None, err: Any) -> int:
        """What `_reserve` answers when Redis cannot: admitted now (0) or refused (-1)."""
        return 0 if self._policy(key, cost, now_ns, True, err).allowed else -1

    def _lost(self, verb: str, key: Hashable, args: tuple[Any, ...], err: Any) -> bool:
        """A refund or reset Redis could not take: to the fallback if it has *verb*, else lost.

        Never queued: a refund is worth only its moment, and a bucket that
        keeps the tokens refills them by itself. Raises only under
        ``on_error="raise"`` without a fallback, as every verb does.
        """
        fb = self._fallback
        if fb is not None:
            fn = getattr(fb, verb, None)
            if fn is not None:
                fn(key, *args)
            return False
        if self._on_error == "raise":
            raise RedisUnavailable(f"Redis unavailable: {err or 'circuit breaker open'}") from err
        return False

    def _new_tat(
        self, raw: bytes, now_us: int, params: tuple[Any, int, int], slack_ms: int
    ) -> tuple[bytes, int] | None:
        """*raw* re-expressed under *params*: ``(value or b"" for full, TTL ms)``, or
        None to leave it (full, or not a bucket). The in-process carry-over in ns,
        the new debt rounded up to whole us (never a fraction of a token gained)."""
        try:
            tat = int(raw)
        except ValueError:
            return None
        if not 0 <= tat <= (1 << 53) - 1 or tat <= now_us:
            return None  # not a bucket (an empty one until replaced), or full: stays full
        interval, tau = self._interval_ns, self._tau_ns
        new_interval = params[2] * NS_PER_US
        new_tau = params[1] * new_interval
        debt = (tat - now_us) * NS_PER_US
        new_debt = new_tau - ((tau - debt) * new_interval) // interval
        if new_debt <= 0:
            return b"", 0
        debt_us = -(-new_debt // NS_PER_US)
        return str(now_us + debt_us).encode(), debt_us // 1000 + 1 + slack_ms

    def _migrate(
        self, client: Any, swap: Any, params: tuple[Any, int, int], now: int | None
    ) -> None:
        """Re-express every stored bucket of the prefix under *params* (see `reconfigure`)."""
        explicit = None if now is None else check_now(now) // NS_PER_US
        slack = 0 if explicit is None else EXPLICIT_TTL_SLACK_MS
        for rkey in client.scan_iter(match=self._pattern(), count=1000, _type="string"):
            for _ in range(SWAP_TRIES):
                if explicit is None:
                    pipe = client.pipeline(transaction=False)
                    (secs, us), raw = pipe.time().get(rkey).execute()
                    now_us = int(secs) * 1_000_000 + int(us)
                else:
                    now_us, raw = explicit, client.get(rkey)
                new = None if raw is None else self._new_tat(raw, now_us, params, slack)
                if new is None or swap(keys=(rkey,), args=(raw, *new)):
                    break
            else:
                raise RuntimeError(f"{rkey!r} kept changing: not migrated")

    def _pattern(self) -> bytes:
        # SCAN's glob: every byte of the prefix literal, then the key.
        return b"".join(b"\\" + bytes([c]) for c in self._prefix) + b"*"


def _late() -> RedisTimeoutError:
    """The error of a decision past its deadline (its reason: ``"timeout"``)."""
    return RedisTimeoutError("Timeout: no reply within the limiter's timeout")


async def _sleep_reserved(
    limiter: Any, wait: int, give_back: Callable[[], Awaitable[object]]
) -> bool:
    """Sleep out a reservation of *wait* ns on the loop; a cancelled sleep gives it back."""
    if wait <= 0:
        return wait == 0
    if not _waiting._enter_default(limiter):  # the bound on waiters, as in process
        await give_back()
        return False
    try:
        await asyncio.sleep(wait / NS_PER_S)
    except BaseException:
        # Shielded: cancelled again meanwhile, the give-back still finishes.
        with contextlib.suppress(RedisUnavailable):
            await asyncio.shield(asyncio.ensure_future(give_back()))
        raise
    finally:
        _waiting._leave_default(limiter)
    return True


def _evalsha_pipeline(
    client: Any, script: Any, calls: list[tuple[bytes, tuple[Any, ...]]]
) -> list[Any]:
    """Run ``script`` once per (key, args) in one pipelined round trip.

    redis-py's own pipeline support sends ``SCRIPT EXISTS`` first (a second
    round trip on every batch); instead send ``EVALSHA`` and, should Redis have
    lost the script (restart, ``SCRIPT FLUSH``), load it and re-run only the
    calls that got ``NOSCRIPT``: those ran nothing, so none is applied twice.
    """
    results: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for _ in range(2):
        pipe = client.pipeline(transaction=False)
        for i in todo:
            key, args = calls[i]
            # Not pipe.evalsha: cluster pipelines refuse that name, not the command.
            pipe.execute_command("EVALSHA", script.sha, 1, key, *args)
        replies = pipe.execute(raise_on_error=False)
        missing = []
        for i, reply in zip(todo, replies):
            if isinstance(reply, Exception) and _clients.class_reason(reply) == "noscript":
                missing.append(i)
            elif isinstance(reply, Exception):
                raise reply
            else:
                results[i] = reply
        if not missing:
            return results
        script.sha = client.script_load(script.script)
        todo = missing
    raise NoScriptError("script vanished twice while running a batch")


async def _evalsha_pipeline_async(
    client: Any, script: Any, calls: list[tuple[bytes, tuple[Any, ...]]]
) -> list[Any]:
    """`_evalsha_pipeline` for ``redis.asyncio``."""
    results: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for _ in range(2):
        pipe = client.pipeline(transaction=False)
        for i in todo:
            key, args = calls[i]
            # Not pipe.evalsha: cluster pipelines refuse that name, not the command.
            pipe.execute_command("EVALSHA", script.sha, 1, key, *args)
        replies = await pipe.execute(raise_on_error=False)
        missing = []
        for i, reply in zip(todo, replies):
            if isinstance(reply, Exception) and _clients.class_reason(reply) == "noscript":
                missing.append(i)
            elif isinstance(reply, Exception):
                raise reply
            else:
                results[i] = reply
        if not missing:
            return results
        script.sha = await client.script_load(script.script)
        todo = missing
    raise NoScriptError("script vanished twice while running a batch")


class RedisTokenBucket(_RedisLimits):
    """A token bucket per key, held in Redis and shared by every client.

    Same verbs and :class:`Decision` as :class:`nanobucket.KeyedTokenBucket`;
    decisions are :class:`RedisDecision` (with ``source``). One round trip
    per decision, one per batch for ``allow_many``.

    A call waits for Redis at most ``timeout`` seconds (0.1 by default),
    whatever *client*'s own timeouts and retries: the limiter uses a pool of
    its own to the same server (:func:`bounded_client`; :meth:`close` closes
    it). While the breaker is open no call touches the network.

    >>> limiter = RedisTokenBucket.from_url(url, rate=100, capacity=200)  # doctest: +SKIP
    >>> limiter.check("alice").remaining                                  # doctest: +SKIP
    199

    While Redis is unreachable, the failure policy (or ``fallback``) decides:

    >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
    >>> limiter = RedisTokenBucket(redis.Redis(), 100, 200, on_error="open", breaker=down)
    >>> limiter.check("alice").source
    'policy:open'
    """

    def __init__(
        self,
        client: Any,  # redis-py or valkey-py, plain or cluster
        rate: RateLike,
        capacity: int,
        *,
        prefix: str = "nanobucket",
        on_error: Policy = "raise",
        fallback: Fallback | None = None,
        breaker: CircuitBreaker | None = None,
        timeout: float = DEFAULT_SOCKET_TIMEOUT,
    ) -> None:
        super().__init__(rate, capacity, prefix, on_error, fallback, breaker, timeout)
        if not hasattr(client, "register_script"):
            raise TypeError(f"client must be a redis.Redis, not {type(client).__name__}")
        self._user_client = client
        self._client = bounded_client(client, self._timeout)
        self._script = self._client.register_script(_GCRA)
        self._many_script = self._client.register_script(_GCRA_MANY)
        self._cluster = _clients.is_cluster(self._client)
        self._give_script = self._client.register_script(_LEASE)
        self._reserve_script = self._client.register_script(_RESERVE)
        self._swap_script = self._client.register_script(_SWAP)

    @classmethod
    def from_url(
        cls,
        url: str,
        rate: RateLike,
        capacity: int,
        *,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        **kwargs: Any,
    ) -> RedisTokenBucket:
        """Build on a new client for *url* with a short timeout and no retries.

        >>> limiter = RedisTokenBucket.from_url("redis://127.0.0.1:6379/0", rate=100, capacity=200)
        >>> limiter.client.get_connection_kwargs()["socket_timeout"]   # no connection made yet
        0.1
        """
        client = client_from_url(url, socket_timeout=socket_timeout)
        return cls(client, rate, capacity, timeout=socket_timeout, **kwargs)

    @property
    def client(self) -> Any:
        """The redis-py client it was given (calls go through a bounded pool to its server).

        >>> client = redis.Redis()
        >>> RedisTokenBucket(client, rate=100, capacity=200).client is client
        True
        """
        return self._user_client

    def close(self) -> None:
        """Close the limiter's own connections (the client it was given stays open).

        >>> RedisTokenBucket(redis.Redis(), rate=100, capacity=200).close()
        """
        if self._client is not self._user_client:
            self._client.close()

    def _call(self, key: Hashable, cost: int, now_ns: int | None, consume: bool) -> RedisDecision:
        rkey = self.key(key)
        breaker = self._breaker
        if not breaker.allow_request():
            return self._policy(key, cost, now_ns, consume, None)
        try:
            owed_us = self._script(keys=(rkey,), args=self._args(cost, now_ns, consume))
        except UNAVAILABLE as err:
            breaker.record_failure()
            return self._policy(key, cost, now_ns, consume, err)
        breaker.record_success()
        return self._decision(owed_us, cost)

    def allow(self, key: Hashable, cost: int = 1) -> bool:
        """Spend *cost* tokens from *key*'s shared bucket now (Redis time); True if admitted.

        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = RedisTokenBucket(redis.Redis(), 100, 200, on_error="closed", breaker=down)
        >>> limiter.allow("alice")
        False
        """
        return self._call(key, self._cost(cost), None, True).allowed

    def allow_at(self, key: Hashable, now: int, cost: int = 1) -> bool:
        """`allow` at an explicit time *now* (int ns; Redis sees ``now // 1000`` us).

        >>> from nanobucket import KeyedTokenBucket
        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> local = KeyedTokenBucket(rate=1, capacity=1)
        >>> limiter = RedisTokenBucket(redis.Redis(), 100, 200, fallback=local, breaker=down)
        >>> limiter.allow_at("alice", 0), limiter.allow_at("alice", 0)   # the fallback decides
        (True, False)
        """
        return self._call(key, self._cost(cost), check_now(now), True).allowed

    def check(self, key: Hashable, cost: int = 1) -> RedisDecision:
        """Like `allow`, but return the whole decision.

        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = RedisTokenBucket(redis.Redis(), 100, 200, on_error="open", breaker=down)
        >>> d = limiter.check("alice")
        >>> d.allowed, d.remaining, d.source
        (True, 199, 'policy:open')
        """
        return self._call(key, self._cost(cost), None, True)

    def check_at(self, key: Hashable, now: int, cost: int = 1) -> RedisDecision:
        """`check` at an explicit time *now* (int ns).

        >>> from nanobucket import KeyedTokenBucket
        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> local = KeyedTokenBucket(rate=10, capacity=20)
        >>> limiter = RedisTokenBucket(redis.Redis(), 100, 200, fallback=local, breaker=down)
        >>> d = limiter.check_at("alice", 0)
        >>> d.allowed, d.remaining, d.limit, d.source   # the fallback's own numbers
        (True, 19, 20, 'fallback')
        """
        return self._call(key, self._cost(cost), check_now(now), True)

    def peek(self, key: Hashable, cost: int = 1) -> RedisDecision:
        """The decision `check` would return now, without spending anything.

        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = RedisTokenBucket(redis.Redis(), 100, 200, on_error="closed", breaker=down)
        >>> d = limiter.peek("alice")
        >>> d.allowed, d.retry_after, d.source   # retry when the breaker next tries Redis
        (False, 0.1, 'policy:closed')
        """
        return self._call(key, self._cost(cost), None, False)

    def peek_at(self, key: Hashable, now: int, cost: int = 1) -> RedisDecision:
        """`peek` at an explicit time *now* (int ns).

        >>> from nanobucket import KeyedTokenBucket
        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> local = KeyedTokenBucket(rate=10, capacity=20)
        >>> limiter = RedisTokenBucket(redis.Redis(), 100, 200, fallback=local, breaker=down)
        >>> [limiter.peek_at("alice", 0, cost=5).remaining for _ in range(2)]   # nothing spent
        [15, 15]
        """
        return self._call(key, self._cost(cost), check_now(now), False)

    def tokens_at(self, key: Hashable, now: int) -> float:
        """Tokens in *key*'s bucket at *now* (int ns); raises if Redis is unavailable.

        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = RedisTokenBucket(redis.Redis(), 100, 200, on_error="open", breaker=down)
        >>> limiter.tokens_at("alice", 0)
        Traceback (most recent call last):
        ...
        nanobucket.redis.RedisUnavailable: Redis unavailable: cannot read tokens
        """
        d = self._call(key, 0, check_now(now), False)
        return self._tokens(d)

    def tokens(self, key: Hashable) -> float:
        """Tokens in *key*'s bucket now (Redis time).

        Only Redis knows: with Redis unreachable it raises `RedisUnavailable`,
        whatever ``on_error`` and ``fallback`` say.

        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> RedisTokenBucket(redis.Redis(), 100, 200, on_error="open", breaker=down).tokens("alice")
        Traceback (most recent call last):
        ...
        nanobucket.redis.RedisUnavailable: Redis unavailable: cannot read tokens
        """
        return self._tokens(self._call(key, 0, None, False))

    def _tokens(self, d: RedisDecision) -> float:
        if d.source != "redis":
            raise RedisUnavailable("Redis unavailable: cannot read tokens")
        if d.reset_after_ns >= self._tau_ns:
            return 0.0
        return (self._tau_us - d.reset_after_ns // NS_PER_US) / self._interval_us

    def allow_many(self, keys: Iterable[Hashable], cost: int = 1) -> bytearray:
        """Decide a batch in order, in one round trip; ``bytearray`` of 1 / 0.

        On one Redis the batch is one script call at one reading of Redis's
        clock, like ``KeyedTokenBucket.allow_many``. On a ``RedisCluster``
        client (keys of different slots cannot share a script) it is one
        script call per key, pipelined, each reading the clock itself.

        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = RedisTokenBucket(redis.Redis(), 100, 200, on_error="open", breaker=down)
        >>> list(limiter.allow_many(["alice", "bob"]))
        [1, 1]
        """
        return self._many(keys, self._cost(cost), None)

    def allow_many_at(self, keys: Iterable[Hashable], now: int, cost: int = 1) -> bytearray:
        """`allow_many` at an explicit time *now* (int ns).

        >>> from nanobucket import KeyedTokenBucket
        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> local = KeyedTokenBucket(rate=1, capacity=1)
        >>> limiter = RedisTokenBucket(redis.Redis(), 100, 200, fallback=local, breaker=down)
        >>> list(limiter.allow_many_at(["alice", "alice", "bob"], 0))
        [1, 0, 1]
        """
        return self._many(keys, self._cost(cost), check_now(now))

    def _many(self, keys: Iterable[Hashable], cost: int, now_ns: int | None) -> bytearray:
        keys, rkeys = self._batch(keys)
        if not keys:
            return bytearray()
        breaker = self._breaker
        if not breaker.allow_request():
            return self._policy_many(keys, cost, now_ns, None)
        try:
            if self._cluster:
                args = self._args(cost, now_ns, True)
                replies = _evalsha_pipeline(self._client, self._script, [(k, args) for k in rkeys])
                result = bytearray([self._admits(owed, cost) for owed in replies])
            else:
                result = bytearray(
                    self._many_script(keys=rkeys, args=self._many_args(cost, now_ns))
                )
        except UNAVAILABLE as err:
            breaker.record_failure()
            return self._policy_many(keys, cost, now_ns, err)
        breaker.record_success()
        return result

    # -- refund, reset, waiting, reconfigure -------------------------------------

    def refund(self, key: Hashable, cost: int = 1) -> bool:
        """Give back *cost* tokens to *key*'s bucket (Redis time), never above capacity.

        As in process: a full bucket gets nothing, and the bucket ends where
        it would be had the tokens not been spent, or full. True if Redis
        took it; when Redis cannot, the refund goes to the ``fallback`` (if
        it has ``refund``) or is lost -- never queued, never raised except
        under ``on_error="raise"`` -- and the result is False.

        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> RedisTokenBucket(redis.Redis(), 100, 200, on_error="open", breaker=down).refund("alice")
        False
        """
        return self._give(key, self._cost(cost), None)

    def refund_at(self, key: Hashable, now: int, cost: int = 1) -> bool:
        """`refund` at an explicit time *now* (int ns).

        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = RedisTokenBucket(redis.Redis(), 1, 2, on_error="open", breaker=down)
        >>> limiter.refund_at("alice", 0, cost=2)   # not delivered: lost, never queued
        False
        """
        return self._give(key, self._cost(cost), check_now(now))

    def _give(self, key: Hashable, cost: int, now_ns: int | None) -> bool:
        rkey = self.key(key)
        verb, args = ("refund", (cost,)) if now_ns is None else ("refund_at", (now_ns, cost))
        breaker = self._breaker
        if not breaker.allow_request():
            return self._lost(verb, key, args, None)
        try:
            self._give_script(keys=(rkey,), args=self._give_args(cost, now_ns))
        except UNAVAILABLE as err:
            breaker.record_failure()
            return self._lost(verb, key, args, err)
        breaker.record_success()
        return True

    def reset(self, key: Hashable) -> bool:
        """Forget *key*'s bucket: the next decision sees it full. True if Redis took it.

        A failed Redis is handled as for `refund` (the fallback's ``reset``, or lost).

        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> RedisTokenBucket(redis.Redis(), 100, 200, on_error="open", breaker=down).reset("alice")
        False
        """
        rkey = self.key(key)
        breaker = self._breaker
        if not breaker.allow_request():
            return self._lost("reset", key, (), None)
        try:
            self._client.delete(rkey)
        except UNAVAILABLE as err:
            breaker.record_failure()
            return self._lost("reset", key, (), err)
        breaker.record_success()
        return True

    def _reserve(
        self, key: Hashable, now: int | None, cost: int, max_wait: int, shape: bool
    ) -> int:
        """Reserve *cost* tokens in Redis; the ns to wait before using them, or -1.

        The in-process ``_reserve``: the bucket may go past empty (a place in
        line every instance sees), nothing is reserved past *max_wait* ns.
        When Redis cannot decide, the failure policy answers 0 or -1.
        """
        cost = self._cost(cost)
        now_ns = None if now is None else check_now(now)
        rkey = self.key(key)
        breaker = self._breaker
        if not breaker.allow_request():
            return self._reserve_policy(key, cost, now_ns, None)
        try:
            wait_us = self._reserve_script(
                keys=(rkey,), args=self._reserve_args(cost, now_ns, max_wait, shape)
            )
        except UNAVAILABLE as err:
            breaker.record_failure()
            return self._reserve_policy(key, cost, now_ns, err)
        breaker.record_success()
        return -1 if wait_us < 0 else int(wait_us) * NS_PER_US

    def acquire(self, key: Hashable, cost: int = 1, timeout: float | None = None) -> bool:
        """Wait (block the thread) until *cost* tokens of *key* are spent, or refuse.

        One round trip reserves the tokens in Redis (every instance then sees
        them owed), and the thread sleeps until they exist. False at once,
        with nothing reserved, when the wait would exceed *timeout* seconds
        or 1024 callers already wait on this limiter; an interrupted wait
        gives the reservation back (`refund`).

        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> RedisTokenBucket(redis.Redis(), 100, 200, on_error="closed", breaker=down).acquire("a")
        False
        """
        cost = self._cost(cost)
        self.key(key)
        return _waiting.acquire_slow(self, (key,), cost, _waiting.check_timeout(timeout))

    async def acquire_async(
        self, key: Hashable, cost: int = 1, timeout: float | None = None
    ) -> bool:
        """`acquire` for asyncio: the round trips run in a worker thread, the wait on the loop.

        A cancelled waiter gives its reservation back.

        >>> import asyncio
        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = RedisTokenBucket(redis.Redis(), 1, 2, on_error="open", breaker=down)
        >>> asyncio.run(limiter.acquire_async("alice"))   # the policy admits at once
        True
        """
        cost = self._cost(cost)
        self.key(key)
        max_wait = _waiting._max_wait_ns(timeout)
        wait = await asyncio.to_thread(self._reserve, key, None, cost, max_wait, False)
        return await _sleep_reserved(self, wait, lambda: asyncio.to_thread(self.refund, key, cost))

    def reconfigure(
        self,
        rate: RateLike | None = None,
        capacity: int | None = None,
        *,
        now: int | None = None,
        migrate: bool = True,
    ) -> None:
        """Change this instance's rate and/or capacity; with *migrate*, every stored bucket too.

        Rate and capacity travel with each call, so they are this instance's:
        reconfigure every instance sharing the prefix, the first with
        ``migrate=True`` (the default), the others with ``migrate=False``
        (the stored state is already in the new terms). Migrating does what
        the in-process ``reconfigure`` does to each bucket of the prefix:
        the tokens it holds at *now* (default: Redis time) carry over as
        they are, capped at the new capacity, the new debt rounded up to a
        whole microsecond. One difference: a full bucket is a missing key,
        so it stays full under a larger capacity (in process it keeps the old
        capacity's tokens and refills the rest). Each bucket changes
        atomically (a compare-and-swap: a decision made meanwhile is never
        overwritten); the prefix as a whole does not. Redis errors raise.

        >>> limiter = RedisTokenBucket(redis.Redis(), rate=100, capacity=200)
        >>> limiter.reconfigure(rate=50, migrate=False)   # another instance already migrated
        >>> limiter.rate, limiter.capacity, limiter.interval_ns
        (Fraction(50, 1), 200, 20000000)
        """
        params = _redis_params(
            self._rate if rate is None else rate, self._capacity if capacity is None else capacity
        )
        if not isinstance(migrate, bool):
            raise TypeError(f"migrate must be a bool, not {type(migrate).__name__}")
        if migrate:
            self._migrate(self._client, self._swap_script, params, now)
        self._set_params(params)

    def __repr__(self) -> str:
        return f"RedisTokenBucket(rate={self._rate!r}, capacity={self._capacity})"


class AsyncRedisTokenBucket(_RedisLimits):
    """:class:`RedisTokenBucket` on ``redis.asyncio.Redis``: the same verbs, awaited.

    Decisions coalesce (``coalesce=True``, the default): one that finds no
    round trip of the loop in flight is sent at once, alone; those that
    arrive while one is in flight are sent together when it completes, as one
    script call (``_redis_gcra_batch.lua``, at most 512 per call), each
    caller getting the very decision it would have got alone at that Redis
    time, in arrival order. So hundreds of tasks deciding at once make one
    round trip per batch, on one connection. ``allow``, ``check``, ``peek``
    and their ``_at`` forms coalesce (a batch holds one clock: Redis's, or
    one explicit ``now``); ``allow_many`` and the other verbs do not. A
    caller cancelled while queued spends nothing; one cancelled while its
    batch is in flight does not cancel the batch. On a Redis Cluster
    decisions are not coalesced (keys of different slots cannot share a
    script), and ``coalesce=False`` turns it off.

    Each decision round trip is bounded by one deadline (``timeout`` after
    the oldest caller of the batch queued) instead of a socket timeout
    (Python >= 3.11; on 3.10, and on a cluster, the socket timeout). A caller
    that waited past its deadline behind a slow round trip gets the policy
    (reason ``"timeout"``) without being sent. When
    Redis cannot decide a batch, every caller in it gets the policy's (or the
    fallback's) answer, and the breaker counts one failure: one round trip
    failed, however many callers it carried.

    >>> limiter = AsyncRedisTokenBucket.from_url(url, rate=100, capacity=200)  # doctest: +SKIP
    >>> await limiter.allow("alice")                                           # doctest: +SKIP
    True

    Outside a running loop, ``asyncio.run`` it:

    >>> import asyncio
    >>> limiter = AsyncRedisTokenBucket.from_url("redis://127.0.0.1:6379/0", rate=100, capacity=200)
    >>> limiter.interval_ns, asyncio.run(limiter.aclose())
    (10000000, None)
    """

    def __init__(
        self,
        client: Any,  # redis-py or valkey-py asyncio, plain or cluster
        rate: RateLike,
        capacity: int,
        *,
        prefix: str = "nanobucket",
        on_error: Policy = "raise",
        fallback: Fallback | None = None,
        breaker: CircuitBreaker | None = None,
        timeout: float = DEFAULT_SOCKET_TIMEOUT,
        coalesce: bool = True,
    ) -> None:
        super().__init__(rate, capacity, prefix, on_error, fallback, breaker, timeout)
        if not hasattr(client, "register_script"):
            raise TypeError(f"client must be a redis.asyncio.Redis, not {type(client).__name__}")
        if not isinstance(coalesce, bool):
            raise TypeError(f"coalesce must be a bool, not {type(coalesce).__name__}")
        self._user_client = client
        self._client = bounded_client(client, self._timeout)
        self._cluster = _clients.is_cluster(self._client)
        # Decisions go through a client whose reads have no timeout of their
        # own, each round trip under one deadline (`_deadline`); the other
        # verbs keep the socket timeout. A cluster, or Python 3.10: as they are.
        deadline = _timeout_at is not None and not self._cluster
        self._fast = _deadline_client(client, self._timeout) if deadline else self._client
        self._script = self._fast.register_script(_GCRA)
        self._many_script = self._fast.register_script(_GCRA_MANY)
        self._batch_script = self._fast.register_script(_GCRA_BATCH)
        self._coalesce = coalesce and not self._cluster
        # The queue of the loop last used, and of every loop not closed (a
        # limiter shared by loops in several threads keeps one queue per loop).
        self._coalescer: _coalesce.Coalescer | None = None
        self._coalescers: dict[asyncio.AbstractEventLoop, _coalesce.Coalescer] = {}
        self._give_script = self._client.register_script(_LEASE)
        self._reserve_script = self._client.register_script(_RESERVE)
        self._swap_script = self._client.register_script(_SWAP)

    @classmethod
    def from_url(
        cls,
        url: str,
        rate: RateLike,
        capacity: int,
        *,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        **kwargs: Any,
    ) -> AsyncRedisTokenBucket:
        """Build on a new asyncio client for *url* with a short timeout and no retries.

        >>> url = "redis://127.0.0.1:6379/0"
        >>> limiter = AsyncRedisTokenBucket.from_url(url, rate=100, capacity=200)
        >>> limiter.client.get_connection_kwargs()["socket_timeout"]   # no connection made yet
        0.1
        """
        client = client_from_url(url, socket_timeout=socket_timeout, asyncio=True)
        return cls(client, rate, capacity, timeout=socket_timeout, **kwargs)

    @property
    def client(self) -> Any:
        """The redis-py asyncio client it was given (calls go through a bounded pool).

        >>> client = redis.asyncio.Redis()
        >>> AsyncRedisTokenBucket(client, rate=100, capacity=200).client is client
        True
        """
        return self._user_client

    def _deadline(self, at: float | None = None) -> contextlib.AbstractAsyncContextManager[Any]:
        """The bound of one decision round trip: loop time *at* (default: ``timeout`` from now)."""
        if _timeout_at is None or self._cluster:
            return contextlib.nullcontext()  # the client's socket timeout bounds it
        if at is None:
            at = asyncio.get_running_loop().time() + self._timeout
        return _timeout_at(at)

    async def _call(
        self, key: Hashable, cost: int, now_ns: int | None, consume: bool
    ) -> RedisDecision:
        result: RedisDecision = await self._submit(
            _coalesce.Call(self.key(key), key, cost, now_ns, consume)
        )
        return result

    async def _allowed(self, key: Hashable, cost: int, now_ns: int | None) -> bool:
        """`_call` for `allow`: a decision Redis made is answered as a bool, not built."""
        d = await self._submit(_coalesce.Call(self.key(key), key, cost, now_ns, True, False))
        return d if d.__class__ is bool else d.allowed

    def _submit(self, call: _coalesce.Call) -> Awaitable[Any]:
        if not self._coalesce:
            return self._one(call)
        loop = asyncio.get_running_loop()
        coalescer = self._coalescer
        if coalescer is None or coalescer.loop is not loop:  # each loop its own queue
            coalescer = self._coalescers.get(loop)
            if coalescer is None:
                for lp in list(self._coalescers):  # forget the queues of closed loops
                    if lp.is_closed():
                        self._coalescers.pop(lp, None)
                coalescer = self._coalescers[loop] = _coalesce.Coalescer(
                    loop, self._timeout, self._one, self._send_batch, self._expired
                )
            self._coalescer = coalescer
        return coalescer.decide(call)

    async def _one(self, call: _coalesce.Call) -> Any:
        """One decision alone: the single script, as without coalescing."""
        key, cost, now_ns, consume = call.key, call.cost, call.now_ns, call.consume
        breaker = self._breaker
        if not breaker.allow_request():
            return self._policy(key, cost, now_ns, consume, None)
        try:
            async with self._deadline():
                owed_us = await self._script(
                    keys=(call.rkey,), args=self._args(cost, now_ns, consume)
                )
        except UNAVAILABLE as err:
            breaker.record_failure()
            return self._policy(key, cost, now_ns, consume, err)
        except TimeoutError:  # the deadline
            breaker.record_failure()
            return self._policy(key, cost, now_ns, consume, _late())
        breaker.record_success()
        if call.full:
            return self._decision(owed_us, cost)
        return owed_us <= self._tau_us - cost * self._interval_us

    async def _send_batch(self, calls: list[_coalesce.Call], deadline: float) -> list[Any]:
        """Decide coalesced *calls* (one clock) in one script call before loop time *deadline*.

        Answers every call, raising nothing: a decision each, or when Redis
        cannot decide, the policy's answer each (its exception, for "raise").
        """
        breaker = self._breaker
        if not breaker.allow_request():
            return [self._policy_answer(c, None) for c in calls]
        now_ns = calls[0].now_ns
        interval = self._interval_us
        args: list[bytes | int] = (
            [self._head[1], b"", 0]
            if now_ns is None
            else [self._head[1], now_ns // NS_PER_US, EXPLICIT_TTL_SLACK_MS]
        )
        # A peek goes as -cost_us - 1; one code for all when they share it (see the script).
        codes = [c.cost * interval if c.consume else -c.cost * interval - 1 for c in calls]
        first = codes[0]
        if codes.count(first) == len(codes):
            args.append(first)
        else:
            args.append(b"")
            args += codes
        err: BaseException
        try:
            async with self._deadline(deadline):
                replies = await self._batch_script(keys=[c.rkey for c in calls], args=args)
        except UNAVAILABLE as e:
            err = e
        except TimeoutError:
            err = _late()
        else:
            breaker.record_success()
            decision, tau = self._decision, self._tau_us
            return [
                decision(owed, c.cost) if c.full else owed <= tau - c.cost * interval
                for c, owed in zip(calls, map(int, replies.split(b",")))
            ]
        breaker.record_failure()  # once: one round trip failed, whatever it carried
        return [self._policy_answer(c, err) for c in calls]

    def _policy_answer(self, call: _coalesce.Call, err: BaseException | None) -> Any:
        try:
            return self._policy(call.key, call.cost, call.now_ns, call.consume, err)
        except RedisUnavailable as exc:  # on_error="raise": each caller gets its own
            return exc

    def _expired(self, call: _coalesce.Call) -> RedisDecision:
        """A call that waited past its deadline: the policy answers, the breaker is not told
        (the round trip before it was slow and counted already)."""
        return self._policy(call.key, call.cost, call.now_ns, call.consume, _late())

    async def allow(self, key: Hashable, cost: int = 1) -> bool:
        """Spend *cost* tokens from *key*'s shared bucket now; True if admitted.

        >>> import asyncio
        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 100, 200,
        ...                                 on_error="closed", breaker=down)
        >>> asyncio.run(limiter.allow("alice"))
        False
        """
        return await self._allowed(key, self._cost(cost), None)

    async def allow_at(self, key: Hashable, now: int, cost: int = 1) -> bool:
        """`allow` at an explicit time *now* (int ns).

        >>> import asyncio
        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 100, 200,
        ...                                 on_error="open", breaker=down)
        >>> asyncio.run(limiter.allow_at("alice", 0))
        True
        """
        return await self._allowed(key, self._cost(cost), check_now(now))

    async def check(self, key: Hashable, cost: int = 1) -> RedisDecision:
        """Like `allow`, but return the whole decision.

        >>> import asyncio
        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 100, 200,
        ...                                 on_error="open", breaker=down)
        >>> asyncio.run(limiter.check("alice")).source
        'policy:open'
        """
        return await self._call(key, self._cost(cost), None, True)

    async def check_at(self, key: Hashable, now: int, cost: int = 1) -> RedisDecision:
        """`check` at an explicit time *now* (int ns).

        >>> import asyncio
        >>> from nanobucket import KeyedTokenBucket
        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 100, 200,
        ...                                 fallback=KeyedTokenBucket(1, 2), breaker=down)
        >>> asyncio.run(limiter.check_at("alice", 0)).remaining   # the fallback's bucket
        1
        """
        return await self._call(key, self._cost(cost), check_now(now), True)

    async def peek(self, key: Hashable, cost: int = 1) -> RedisDecision:
        """The decision `check` would return now, without spending anything.

        >>> import asyncio
        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 100, 200,
        ...                                 on_error="closed", breaker=down)
        >>> asyncio.run(limiter.peek("alice")).retry_after   # when the breaker next tries Redis
        0.1
        """
        return await self._call(key, self._cost(cost), None, False)

    async def peek_at(self, key: Hashable, now: int, cost: int = 1) -> RedisDecision:
        """`peek` at an explicit time *now* (int ns).

        >>> import asyncio
        >>> from nanobucket import KeyedTokenBucket
        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 100, 200,
        ...                                 fallback=KeyedTokenBucket(1, 2), breaker=down)
        >>> [asyncio.run(limiter.peek_at("alice", 0)).remaining for _ in range(2)]   # nothing spent
        [1, 1]
        """
        return await self._call(key, self._cost(cost), check_now(now), False)

    async def allow_many(self, keys: Iterable[Hashable], cost: int = 1) -> bytearray:
        """Decide a batch in order, in one round trip; ``bytearray`` of 1 / 0.

        >>> import asyncio
        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 100, 200,
        ...                                 on_error="closed", breaker=down)
        >>> list(asyncio.run(limiter.allow_many(["alice", "bob"])))
        [0, 0]
        """
        return await self._many(keys, self._cost(cost), None)

    async def allow_many_at(self, keys: Iterable[Hashable], now: int, cost: int = 1) -> bytearray:
        """`allow_many` at an explicit time *now* (int ns).

        >>> import asyncio
        >>> from nanobucket import KeyedTokenBucket
        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 100, 200,
        ...                                 fallback=KeyedTokenBucket(1, 1), breaker=down)
        >>> list(asyncio.run(limiter.allow_many_at(["alice", "alice", "bob"], 0)))
        [1, 0, 1]
        """
        return await self._many(keys, self._cost(cost), check_now(now))

    async def _many(self, keys: Iterable[Hashable], cost: int, now_ns: int | None) -> bytearray:
        keys, rkeys = self._batch(keys)
        if not keys:
            return bytearray()
        breaker = self._breaker
        if not breaker.allow_request():
            return self._policy_many(keys, cost, now_ns, None)
        try:
            if self._cluster:
                args = self._args(cost, now_ns, True)
                replies = await _evalsha_pipeline_async(
                    self._client, self._script, [(k, args) for k in rkeys]
                )
                result = bytearray([self._admits(owed, cost) for owed in replies])
            else:
                async with self._deadline():
                    reply = await self._many_script(keys=rkeys, args=self._many_args(cost, now_ns))
                result = bytearray(reply)
        except UNAVAILABLE as err:
            breaker.record_failure()
            return self._policy_many(keys, cost, now_ns, err)
        except TimeoutError:
            breaker.record_failure()
            return self._policy_many(keys, cost, now_ns, _late())
        breaker.record_success()
        return result

    async def aclose(self) -> None:
        """Close the client's connections and the limiter's own.

        >>> import asyncio
        >>> url = "redis://127.0.0.1:6379/0"
        >>> limiter = AsyncRedisTokenBucket.from_url(url, rate=100, capacity=200)
        >>> asyncio.run(limiter.aclose())   # at shutdown
        """
        clients = (self._fast, self._client, self._user_client)
        for client in {id(c): c for c in clients}.values():
            close = getattr(client, "aclose", None) or client.close  # redis-py 5.0: close
            await close()

    # -- refund, reset, waiting, reconfigure (as RedisTokenBucket's) -------------

    async def refund(self, key: Hashable, cost: int = 1) -> bool:
        """`RedisTokenBucket.refund`, awaited: True if Redis took it, else fallback or lost.

        >>> import asyncio
        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 1, 2, on_error="open",
        ...                                 breaker=down)
        >>> asyncio.run(limiter.refund("alice"))   # not delivered: lost, never queued
        False
        """
        return await self._give(key, self._cost(cost), None)

    async def refund_at(self, key: Hashable, now: int, cost: int = 1) -> bool:
        """`refund` at an explicit time *now* (int ns).

        >>> import asyncio
        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 1, 2, on_error="open",
        ...                                 breaker=down)
        >>> asyncio.run(limiter.refund_at("alice", 0))
        False
        """
        return await self._give(key, self._cost(cost), check_now(now))

    async def _give(self, key: Hashable, cost: int, now_ns: int | None) -> bool:
        rkey = self.key(key)
        verb, args = ("refund", (cost,)) if now_ns is None else ("refund_at", (now_ns, cost))
        breaker = self._breaker
        if not breaker.allow_request():
            return self._lost(verb, key, args, None)
        try:
            await self._give_script(keys=(rkey,), args=self._give_args(cost, now_ns))
        except UNAVAILABLE as err:
            breaker.record_failure()
            return self._lost(verb, key, args, err)
        breaker.record_success()
        return True

    async def reset(self, key: Hashable) -> bool:
        """`RedisTokenBucket.reset`, awaited: forget *key*'s bucket (next decision: full).

        >>> import asyncio
        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 1, 2, on_error="open",
        ...                                 breaker=down)
        >>> asyncio.run(limiter.reset("alice"))
        False
        """
        rkey = self.key(key)
        breaker = self._breaker
        if not breaker.allow_request():
            return self._lost("reset", key, (), None)
        try:
            await self._client.delete(rkey)
        except UNAVAILABLE as err:
            breaker.record_failure()
            return self._lost("reset", key, (), err)
        breaker.record_success()
        return True

    async def _reserve(
        self, key: Hashable, now: int | None, cost: int, max_wait: int, shape: bool
    ) -> int:
        """`RedisTokenBucket._reserve`, awaited."""
        cost = self._cost(cost)
        now_ns = None if now is None else check_now(now)
        rkey = self.key(key)
        breaker = self._breaker
        if not breaker.allow_request():
            return self._reserve_policy(key, cost, now_ns, None)
        try:
            wait_us = await self._reserve_script(
                keys=(rkey,), args=self._reserve_args(cost, now_ns, max_wait, shape)
            )
        except UNAVAILABLE as err:
            breaker.record_failure()
            return self._reserve_policy(key, cost, now_ns, err)
        breaker.record_success()
        return -1 if wait_us < 0 else int(wait_us) * NS_PER_US

    async def acquire_async(
        self, key: Hashable, cost: int = 1, timeout: float | None = None
    ) -> bool:
        """`RedisTokenBucket.acquire` on the loop: reserve in Redis, sleep, never block.

        A cancelled waiter gives its reservation back.

        >>> import asyncio
        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), 1, 2, on_error="open",
        ...                                 breaker=down)
        >>> asyncio.run(limiter.acquire_async("alice"))   # the policy admits at once
        True
        """
        cost = self._cost(cost)
        self.key(key)
        wait = await self._reserve(key, None, cost, _waiting._max_wait_ns(timeout), False)
        return await _sleep_reserved(self, wait, lambda: self.refund(key, cost))

    acquire = acquire_async

    async def reconfigure(
        self,
        rate: RateLike | None = None,
        capacity: int | None = None,
        *,
        now: int | None = None,
        migrate: bool = True,
    ) -> None:
        """`RedisTokenBucket.reconfigure`, awaited.

        >>> import asyncio
        >>> limiter = AsyncRedisTokenBucket(redis.asyncio.Redis(), rate=100, capacity=200)
        >>> asyncio.run(limiter.reconfigure(capacity=50, migrate=False)); limiter.capacity
        50
        """
        params = _redis_params(
            self._rate if rate is None else rate, self._capacity if capacity is None else capacity
        )
        if not isinstance(migrate, bool):
            raise TypeError(f"migrate must be a bool, not {type(migrate).__name__}")
        if migrate:
            explicit = None if now is None else check_now(now) // NS_PER_US
            slack = 0 if explicit is None else EXPLICIT_TTL_SLACK_MS
            client = self._client
            async for rkey in client.scan_iter(match=self._pattern(), count=1000, _type="string"):
                for _ in range(SWAP_TRIES):
                    if explicit is None:
                        pipe = client.pipeline(transaction=False)
                        (secs, us), raw = await pipe.time().get(rkey).execute()
                        now_us = int(secs) * 1_000_000 + int(us)
                    else:
                        now_us, raw = explicit, await client.get(rkey)
                    new = None if raw is None else self._new_tat(raw, now_us, params, slack)
                    if new is None or await self._swap_script(keys=(rkey,), args=(raw, *new)):
                        break
                else:
                    raise RuntimeError(f"{rkey!r} kept changing: not migrated")
        self._set_params(params)

    def __repr__(self) -> str:
        return f"AsyncRedisTokenBucket(rate={self._rate!r}, capacity={self._capacity})"


class _Lease:
    __slots__ = ("balance", "denied_need", "denied_until", "size", "taken_at")

    def __init__(self, size: int, taken_at: int) -> None:
        self.balance = 0
        self.size = size
        self.taken_at = taken_at
        # After Redis refused `denied_need` tokens, requests needing as many
        # are refused locally until `denied_until`: a rejected burst costs
        # one round trip, not one per request.
        self.denied_need = 0
        self.denied_until = 0


class LeasedTokenBucket(_RedisLimits):
    """A Redis-shared limit whose fast path stays local, spending leased tokens.

    When a key's local balance cannot pay for a request, one round trip takes
    a lease of up to ``size`` tokens from the shared Redis bucket (the same
    GCRA state as :class:`RedisTokenBucket`, so both can share a prefix);
    requests then spend it in process with no network. ``size`` adapts per
    key: it doubles (up to ``max_lease``) when a lease lasted less than
    ``lease_period`` seconds and halves (down to ``min_lease``) when it
    lasted more than four. Unspent tokens go back to Redis on :meth:`close`.

    The bound. Every admitted token was taken from Redis first, so over a
    whole run the total admitted never exceeds ``capacity + rate * T``. Over
    a window that starts later, tokens leased *before* it can be spent in it:
    each instance holds at most ``max_lease - 1`` unspent tokens between
    requests, so N instances admit at most
    ``capacity + rate * T + N * (max_lease - 1)`` in any window of T seconds.
    That holds for any number of threads: one lease per key is in flight per
    instance at a time; threads that miss the local balance meanwhile wait for
    it (at most ``timeout``, then the failure policy decides) and spend from it.
    Round trips: about ``1000 / size`` per 1000 decisions on a busy key; a
    refusal from Redis is remembered locally until its ``retry_after``, so a
    rejected burst costs one round trip. Lease state is kept for at most
    ``max_keys`` keys; past that the oldest eighth is dropped and its unspent
    tokens forfeited (an under-admission, never an over-admission).

    >>> with LeasedTokenBucket(client, rate=1000, capacity=2000) as limiter:  # doctest: +SKIP
    ...     limiter.allow("alice")
    True

    >>> limiter = LeasedTokenBucket(redis.Redis(), rate=1000, capacity=2000)
    >>> limiter.max_lease, limiter.held("alice")   # capacity / 16 by default; none held yet
    (125, 0)
    """

    def __init__(
        self,
        client: Any,  # redis-py or valkey-py, plain or cluster
        rate: RateLike,
        capacity: int,
        *,
        prefix: str = "nanobucket",
        min_lease: int = 1,
        max_lease: int | None = None,
        lease_period: float = 0.1,
        on_error: Policy = "raise",
        fallback: Fallback | None = None,
        breaker: CircuitBreaker | None = None,
        clock: Clock | None = None,
        max_keys: int = 100_000,
        timeout: float = DEFAULT_SOCKET_TIMEOUT,
    ) -> None:
        super().__init__(rate, capacity, prefix, on_error, fallback, breaker, timeout)
        if not hasattr(client, "register_script"):
            raise TypeError(f"client must be a redis.Redis, not {type(client).__name__}")
        self._max_keys = check_max_keys(max_keys)
        if max_lease is None:
            max_lease = max(1, self._capacity // 16)
        for name, value in (("min_lease", min_lease), ("max_lease", max_lease)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, not {type(value).__name__}")
            if not 1 <= value <= self._capacity:
                raise ValueError(f"{name} must be in [1, capacity={self._capacity}], got {value!r}")
        if min_lease > max_lease:
            raise ValueError(f"min_lease {min_lease} > max_lease {max_lease}")
        if isinstance(lease_period, bool) or not isinstance(lease_period, (int, float)):
            raise TypeError(f"lease_period must be seconds, not {type(lease_period).__name__}")
        if not 0 < lease_period < 86_400:
            raise ValueError(f"lease_period must be in (0, 86400) seconds, got {lease_period!r}")
        if clock is not None and not callable(clock):
            raise TypeError("clock must be a callable returning int ns")
        self._user_client = client
        self._client = bounded_client(client, self._timeout)
        self._script = self._client.register_script(_LEASE)
        self._reserve_script = self._client.register_script(_RESERVE)
        self._swap_script = self._client.register_script(_SWAP)
        self._min_lease = min_lease
        self._max_lease = max_lease
        self._period_ns = int(lease_period * NS_PER_S)
        self._clock: Clock = clock if clock is not None else time.monotonic_ns
        self._leases: dict[bytes, _Lease] = {}
        #: Keys whose lease a thread is taking now, with the event it sets when
        #: done (made by the first thread to wait: none on an uncontended key).
        self._in_flight: dict[bytes, threading.Event | None] = {}
        self._lock = threading.Lock()
        #: Round trips to Redis so far (leases taken, plus one per close).
        self.round_trips = 0

    @property
    def max_lease(self) -> int:
        """The most tokens one lease takes (the over-admission bound is instances x this).

        >>> LeasedTokenBucket(redis.Redis(), rate=1000, capacity=2000, max_lease=50).max_lease
        50
        """
        return self._max_lease

    def held(self, key: Hashable) -> int:
        """Tokens this instance holds for *key*: leased, not yet spent.

        >>> limiter = LeasedTokenBucket(redis.Redis(), rate=1000, capacity=2000)
        >>> limiter.held("alice")   # no lease taken yet
        0
        """
        lease = self._leases.get(self.key(key))
        return lease.balance if lease is not None else 0

    def allow(self, key: Hashable, cost: int = 1) -> bool:
        """Spend *cost* tokens of *key*'s lease, taking a new lease when it runs out.

        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = LeasedTokenBucket(redis.Redis(), 100, 200, on_error="open", breaker=down)
        >>> limiter.allow("alice")   # no lease could be taken: the policy admits
        True
        """
        rkey, cost = self.key(key), self._cost(cost)
        with self._lock:  # the fast path: no clock, no Decision object
            lease = self._leases.get(rkey)
            if lease is not None and lease.balance >= cost:
                lease.balance -= cost
                return True
        return self._decide(rkey, key, cost, None).allowed

    def allow_at(self, key: Hashable, now: int, cost: int = 1) -> bool:
        """`allow` at an explicit time *now* (int ns), for Redis and for the adaptation.

        >>> from nanobucket import KeyedTokenBucket
        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> local = KeyedTokenBucket(rate=1, capacity=1)
        >>> limiter = LeasedTokenBucket(redis.Redis(), 100, 200, fallback=local, breaker=down)
        >>> limiter.allow_at("alice", 0), limiter.allow_at("alice", 0)   # the fallback decides
        (True, False)
        """
        return self._decide(self.key(key), key, self._cost(cost), check_now(now)).allowed

    def check(self, key: Hashable, cost: int = 1) -> RedisDecision:
        """Like `allow`, returning a decision; ``remaining`` is this instance's lease balance.

        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = LeasedTokenBucket(redis.Redis(), 100, 200, on_error="closed", breaker=down)
        >>> d = limiter.check("alice")
        >>> d.allowed, d.source
        (False, 'policy:closed')
        """
        return self._decide(self.key(key), key, self._cost(cost), None)

    def check_at(self, key: Hashable, now: int, cost: int = 1) -> RedisDecision:
        """`check` at an explicit time *now* (int ns).

        >>> from nanobucket import KeyedTokenBucket
        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> local = KeyedTokenBucket(rate=1, capacity=2)
        >>> limiter = LeasedTokenBucket(redis.Redis(), 100, 200, fallback=local, breaker=down)
        >>> d = limiter.check_at("alice", 0)
        >>> d.allowed, d.remaining, d.source
        (True, 1, 'fallback')
        """
        return self._decide(self.key(key), key, self._cost(cost), check_now(now))

    def _decide(self, rkey: bytes, key: Hashable, cost: int, now_ns: int | None) -> RedisDecision:
        wait_until = 0  # monotonic ns past which a waiter stops waiting for a lease in flight
        while True:
            t = self._clock() if now_ns is None else now_ns
            with self._lock:
                lease = self._leases.get(rkey)
                if lease is not None and lease.balance >= cost:
                    lease.balance -= cost
                    return RedisDecision(True, lease.balance, 0, 0, self._capacity, "lease")
                if cost == 0:
                    return RedisDecision(True, 0, 0, 0, self._capacity, "lease")
                if (
                    lease is not None
                    and lease.denied_need
                    and cost - lease.balance >= lease.denied_need
                    and lease.denied_until > t
                ):
                    return RedisDecision(
                        False, lease.balance, lease.denied_until - t, 0, self._capacity, "lease"
                    )
                if rkey not in self._in_flight:
                    # This thread takes the key's lease; others wait for it.
                    self._in_flight[rkey] = None
                    size, need = self._lease_size(lease, cost, t)
                    break
                in_flight = self._in_flight[rkey]
                if in_flight is None:  # the first waiter makes the event
                    in_flight = self._in_flight[rkey] = threading.Event()
            # Another thread's lease of this key is in flight: one lease at a
            # time keeps the instance's unspent tokens under max_lease. Its
            # round trip is bounded by the timeout, and so is this wait.
            now = time.monotonic_ns()
            if not wait_until:
                wait_until = now + int(self._timeout * NS_PER_S)
            if not in_flight.wait((wait_until - now) / NS_PER_S):
                err = RedisTimeoutError("timed out waiting for a lease in flight")
                return self._policy(key, cost, now_ns, True, err)
        try:
            return self._take(rkey, key, cost, now_ns, t, size, need)
        finally:
            with self._lock:
                waiters = self._in_flight.pop(rkey)
            if waiters is not None:
                waiters.set()

    def _lease_size(self, lease: _Lease | None, cost: int, t: int) -> tuple[int, int]:
        """(size of the next lease, tokens it must bring at least); called with the lock held."""
        if lease is None:
            return self._min_lease, cost
        elapsed = t - lease.taken_at
        size = lease.size
        if elapsed < self._period_ns:
            size = min(self._max_lease, size * 2)
        elif elapsed > 4 * self._period_ns:
            size = max(self._min_lease, size // 2)
        return size, cost - lease.balance

    def _take(
        self,
        rkey: bytes,
        key: Hashable,
        cost: int,
        now_ns: int | None,
        t: int,
        size: int,
        need: int,
    ) -> RedisDecision:
        # Called by the one thread taking *rkey*'s lease. The round trip runs
        # without the lock: other keys (and this one's balance) stay usable.
        want = max(size, need)
        breaker = self._breaker
        if not breaker.allow_request():
            return self._policy(key, cost, now_ns, True, None)
        now_arg: int | bytes = b"" if now_ns is None else now_ns // NS_PER_US
        with self._lock:
            self.round_trips += 1
        try:
            granted, retry_us, reset_us = self._script(
                keys=(rkey,),
                args=(*self._head, b"take", want, need, now_arg, EXPLICIT_TTL_SLACK_MS),
            )
        except UNAVAILABLE as err:
            breaker.record_failure()
            return self._policy(key, cost, now_ns, True, err)
        breaker.record_success()
        with self._lock:
            lease = self._leases.get(rkey)
            if lease is None:
                if len(self._leases) >= self._max_keys:
                    self._evict()
                lease = self._leases[rkey] = _Lease(size, t)
            if granted:
                lease.balance += granted
                lease.size = size
                lease.taken_at = t
                lease.denied_need = 0
            if lease.balance >= cost:
                lease.balance -= cost
                return RedisDecision(
                    True, lease.balance, 0, int(reset_us) * NS_PER_US, self._capacity, "redis"
                )
            retry_ns = max(1, int(retry_us)) * NS_PER_US
            if not granted:
                lease.denied_need = need
                lease.denied_until = t + retry_ns
            return RedisDecision(
                False, lease.balance, retry_ns, int(reset_us) * NS_PER_US, self._capacity, "redis"
            )

    def _evict(self) -> None:
        # Called with the lock held and the table full: drop the oldest
        # eighth of the keys. Their unspent tokens are forfeited, not given
        # back (no round trip under the lock): that only ever under-admits,
        # and Redis refills them within max_lease intervals.
        for rkey in list(self._leases)[: max(1, self._max_keys // 8)]:
            del self._leases[rkey]

    def __len__(self) -> int:
        """Keys this instance keeps lease state for (at most ``max_keys``)."""
        return len(self._leases)

    def close(self) -> None:
        """Give every unspent leased token back to Redis (one round trip) and forget the leases.

        Then close the limiter's own connections, if it made a pool of its own
        (the client it was given stays open); a later call opens a new one.

        >>> limiter = LeasedTokenBucket(redis.Redis(), rate=1000, capacity=2000)
        >>> limiter.close(); limiter.round_trips   # nothing held: nothing to send
        0
        """
        self._give_back(None)
        if self._client is not self._user_client:
            self._client.close()

    def close_at(self, now: int) -> None:
        """`close` at an explicit time *now* (int ns).

        >>> limiter = LeasedTokenBucket(redis.Redis(), rate=1000, capacity=2000)
        >>> limiter.close_at(0); len(limiter)   # no lease state is left
        0
        """
        self._give_back(check_now(now))

    def _give_back(self, now_ns: int | None) -> None:
        with self._lock:
            leases = [(k, v.balance) for k, v in self._leases.items() if v.balance]
            self._leases.clear()
        if not leases:
            return
        now_arg: int | bytes = b"" if now_ns is None else now_ns // NS_PER_US
        calls = [
            (k, (*self._head, b"give", n, 0, now_arg, EXPLICIT_TTL_SLACK_MS)) for k, n in leases
        ]
        with self._lock:
            self.round_trips += 1
        # Redis gone: the tokens return by themselves as the buckets refill.
        with contextlib.suppress(*UNAVAILABLE):
            _evalsha_pipeline(self._client, self._script, calls)

    # -- refund, reset, waiting, reconfigure ------------------------------------

    def refund(self, key: Hashable, cost: int = 1) -> bool:
        """Give back *cost* tokens: to this instance's lease while it stays under
        ``max_lease`` unspent (the bound holds), the rest to Redis as
        `RedisTokenBucket.refund` does. False if a part for Redis was lost.

        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = LeasedTokenBucket(redis.Redis(), 1, 2, on_error="open", breaker=down)
        >>> limiter.refund("alice")   # no lease held, Redis down: lost
        False
        """
        return self._give(key, self._cost(cost), None)

    def refund_at(self, key: Hashable, now: int, cost: int = 1) -> bool:
        """`refund` at an explicit time *now* (int ns).

        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = LeasedTokenBucket(redis.Redis(), 1, 2, on_error="open", breaker=down)
        >>> limiter.refund_at("alice", 0)
        False
        """
        return self._give(key, self._cost(cost), check_now(now))

    def _give(self, key: Hashable, cost: int, now_ns: int | None) -> bool:
        rkey = self.key(key)
        with self._lock:
            lease = self._leases.get(rkey)
            if lease is not None:
                local = min(cost, max(self._max_lease - 1 - lease.balance, 0))
                lease.balance += local
                cost -= local
        if not cost:
            return True
        verb, args = ("refund", (cost,)) if now_ns is None else ("refund_at", (now_ns, cost))
        breaker = self._breaker
        if not breaker.allow_request():
            return self._lost(verb, key, args, None)
        with self._lock:
            self.round_trips += 1
        try:
            self._script(keys=(rkey,), args=self._give_args(cost, now_ns))
        except UNAVAILABLE as err:
            breaker.record_failure()
            return self._lost(verb, key, args, err)
        breaker.record_success()
        return True

    def reset(self, key: Hashable) -> bool:
        """Forget *key*: this instance's lease (unspent tokens forfeited) and its Redis bucket.

        The next decision sees a full bucket. False if Redis could not take it
        (the lease is dropped all the same; see `RedisTokenBucket.reset`).

        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = LeasedTokenBucket(redis.Redis(), 1, 2, on_error="open", breaker=down)
        >>> limiter.reset("alice"), limiter.held("alice")
        (False, 0)
        """
        rkey = self.key(key)
        with self._lock:
            self._leases.pop(rkey, None)
        breaker = self._breaker
        if not breaker.allow_request():
            return self._lost("reset", key, (), None)
        try:
            self._client.delete(rkey)
        except UNAVAILABLE as err:
            breaker.record_failure()
            return self._lost("reset", key, (), err)
        breaker.record_success()
        return True

    def _reserve(
        self, key: Hashable, now: int | None, cost: int, max_wait: int, shape: bool
    ) -> int:
        """Spend from the lease when it pays (0), else reserve in Redis as
        `RedisTokenBucket._reserve` does (the lease is not touched)."""
        cost = self._cost(cost)
        now_ns = None if now is None else check_now(now)
        rkey = self.key(key)
        if not shape:
            with self._lock:
                lease = self._leases.get(rkey)
                if lease is not None and lease.balance >= cost:
                    lease.balance -= cost
                    return 0
        breaker = self._breaker
        if not breaker.allow_request():
            return self._reserve_policy(key, cost, now_ns, None)
        with self._lock:
            self.round_trips += 1
        try:
            wait_us = self._reserve_script(
                keys=(rkey,), args=self._reserve_args(cost, now_ns, max_wait, shape)
            )
        except UNAVAILABLE as err:
            breaker.record_failure()
            return self._reserve_policy(key, cost, now_ns, err)
        breaker.record_success()
        return -1 if wait_us < 0 else int(wait_us) * NS_PER_US

    def acquire(self, key: Hashable, cost: int = 1, timeout: float | None = None) -> bool:
        """`RedisTokenBucket.acquire`, spending the lease first when it pays.

        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = LeasedTokenBucket(redis.Redis(), 1, 2, on_error="open", breaker=down)
        >>> limiter.acquire("alice")   # the policy admits at once
        True
        """
        cost = self._cost(cost)
        self.key(key)
        return _waiting.acquire_slow(self, (key,), cost, _waiting.check_timeout(timeout))

    async def acquire_async(
        self, key: Hashable, cost: int = 1, timeout: float | None = None
    ) -> bool:
        """`acquire` for asyncio (round trips in a worker thread, the wait on the loop).

        >>> down = CircuitBreaker(clock=lambda: 0); down.record_failure()   # Redis has just failed
        >>> limiter = LeasedTokenBucket(redis.Redis(), 1, 2, on_error="open", breaker=down)
        >>> import asyncio
        >>> asyncio.run(limiter.acquire_async("alice"))
        True
        """
        cost = self._cost(cost)
        self.key(key)
        max_wait = _waiting._max_wait_ns(timeout)
        wait = await asyncio.to_thread(self._reserve, key, None, cost, max_wait, False)
        return await _sleep_reserved(self, wait, lambda: asyncio.to_thread(self.refund, key, cost))

    def reconfigure(
        self,
        rate: RateLike | None = None,
        capacity: int | None = None,
        *,
        now: int | None = None,
        migrate: bool = True,
    ) -> None:
        """`RedisTokenBucket.reconfigure`, after giving every lease back (leased
        tokens were counted in the old terms); ``min_lease`` and ``max_lease``
        are capped at the new capacity.

        >>> limiter = LeasedTokenBucket(redis.Redis(), rate=100, capacity=200, max_lease=50)
        >>> limiter.reconfigure(capacity=20, migrate=False); limiter.capacity, limiter.max_lease
        (20, 20)
        """
        params = _redis_params(
            self._rate if rate is None else rate, self._capacity if capacity is None else capacity
        )
        if not isinstance(migrate, bool):
            raise TypeError(f"migrate must be a bool, not {type(migrate).__name__}")
        self._give_back(None if now is None else check_now(now))
        if migrate:
            self._migrate(self._client, self._swap_script, params, now)
        self._set_params(params)
        self._max_lease = min(self._max_lease, params[1])
        self._min_lease = min(self._min_lease, self._max_lease)

    def __enter__(self) -> LeasedTokenBucket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"LeasedTokenBucket(rate={self._rate!r}, capacity={self._capacity}, "
            f"max_lease={self._max_lease})"
        )
