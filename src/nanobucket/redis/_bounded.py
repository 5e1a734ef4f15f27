"""Bounded clients: the limiter's own connections, waiting at most its timeout, never retrying.

redis-py's default client retries with back-off, which would hold a request
for seconds on a dead Redis and for a minute on a hung one; a cluster client
retries 10 times, refreshing the topology each time. The limiter talks to the
client's server through a client of its own, with the client's connection
parameters but its ``timeout`` and no retries.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.retry
from redis.backoff import NoBackoff
from redis.retry import Retry

from . import _clients

__all__ = ("bounded_client", "client_from_url")

DEFAULT_SOCKET_TIMEOUT = 0.1
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


def _bounded(kwargs: dict[str, Any], timeout: float, deadline: bool = False) -> bool:
    """True if connections built from *kwargs* wait at most *timeout* and never retry.

    With *deadline*, reads and connecting must have no timeout of their own
    instead (the caller bounds each call by a deadline, see `_deadline_client`).
    """
    retry = kwargs.get("retry")
    read, connect = kwargs.get("socket_timeout"), kwargs.get("socket_connect_timeout")
    if deadline:
        waits = read is None and connect is None
    else:
        waits = read is not None and read <= timeout and connect is not None and connect <= timeout
    return (
        retry is not None and _retries(retry) == 0 and waits and not kwargs.get("decode_responses")
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
    lib = _clients.library_of(client)
    if lib is None:
        return client  # another library's client: used as given
    if lib is not _clients.REDIS:
        _clients.note_errors()  # its errors are "cannot decide" too
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
    by one deadline of its own instead (`_deadline.Deadline`), around the
    wait for a free connection and connecting too: those timeouts of
    redis-py would count the event loop's own lag against Redis. Nothing
    retries. Any other client: `bounded_client`.
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
    deadline = read_timeout is None
    if not isinstance(kwargs, dict):
        return client
    # Under a deadline, a pool that waits for a free connection with no bound of its own.
    waits = not deadline or (
        isinstance(pool, lib.async_blocking_pool) and getattr(pool, "timeout", 0) is None
    )
    if waits and _bounded(kwargs, timeout, deadline):
        return client
    kwargs = {k: v for k, v in kwargs.items() if k not in _POOL_OWNED}
    kwargs.update(
        socket_timeout=read_timeout,
        socket_connect_timeout=None if deadline else timeout,
        retry_on_error=[],
        decode_responses=False,
    )
    # The caller's pool size, and its kind: a blocking pool waits for a free
    # connection, here at most *timeout*; a plain one fails past its size.
    # Under a deadline the wait is the deadline's, on a blocking pool.
    limit = {"connection_class": pool.connection_class, "max_connections": pool.max_connections}
    if isinstance(client, lib.async_client):
        kwargs["retry"] = lib.async_retry(lib.no_backoff(), 0)
        if deadline:
            own: Any = lib.async_blocking_pool(timeout=None, **limit, **kwargs)
        elif isinstance(pool, lib.async_blocking_pool):
            own = lib.async_blocking_pool(timeout=timeout, **limit, **kwargs)
        else:
            own = lib.async_pool(**limit, **kwargs)
        return _owning(lib.async_client, own)
    kwargs["retry"] = lib.retry(lib.no_backoff(), 0)
    if isinstance(pool, lib.blocking_pool):
        own = lib.blocking_pool(timeout=timeout, **limit, **kwargs)
    else:
        own = lib.pool(**limit, **kwargs)
    return _owning(lib.client, own)


#: Cluster connection parameters the cluster client sets itself, per node; and
#: "db", always 0 in a cluster, which a URL ending in /0 brings along but the
#: cluster client refuses as an argument.
_CLUSTER_OWNED = frozenset({"redis_connect_func", "host", "port", "retry", "connection_pool", "db"})


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
    # The asyncio cluster client chooses its connection class itself (a
    # deadline bounds its pause); valkey-py's sync one passes none to its
    # nodes: they get it after (`prompt_cluster_nodes`).
    if sync and lib is _clients.REDIS:
        default = importlib.import_module(lib.name).Connection
        kwargs["connection_class"] = _clients.prompt_cluster_down(
            lib.name, kwargs.get("connection_class", default)
        )
    manager = client.nodes_manager
    node = lib.cluster_node if sync else lib.async_cluster_node
    startup = [node(n.host, n.port) for n in manager.startup_nodes.values()]
    full = getattr(manager, "_require_full_coverage", None)
    if full is None:
        full = manager.require_full_coverage
    own = cls(
        startup_nodes=startup,
        retry=(lib.retry if sync else lib.async_retry)(lib.no_backoff(), 0),
        require_full_coverage=full,
        address_remap=manager.address_remap,
        **counts,
        **kwargs,
    )
    if sync and lib is not _clients.REDIS:
        return _clients.prompt_cluster_nodes(lib.name, own)
    return own if sync else _clients.lean_command_table(own)


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
    # A caller past the pool's size (100) waits for a connection, at most the
    # timeout, rather than failing at once ("Too many connections").
    pool = module.BlockingConnectionPool.from_url(
        url,
        timeout=socket_timeout,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout,
        retry=retry,
    )
    return _owning(module.Redis, pool)
