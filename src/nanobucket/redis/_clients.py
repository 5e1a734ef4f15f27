"""The client libraries the Redis limiters accept: redis-py, and valkey-py when given one.

valkey-py is a fork of redis-py: the same classes under other names
(``valkey.Valkey``, ``valkey.cluster.ValkeyCluster``, ``valkey.exceptions``),
none a subclass of redis-py's. A :class:`Library` names one library's classes,
so the limiters bound, classify and catch a client's errors by its own
library. valkey is imported only when a valkey client is given.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.backoff
import redis.cluster
import redis.exceptions
import redis.retry

#: Error classes and the reasons they stand for, by name (subclasses first):
#: both libraries name them alike, and redis-py strips the code of the errors
#: it maps.
_REASON_NAMES = (
    ("TimeoutError", "timeout"),
    ("BusyLoadingError", "loading"),
    ("ConnectionError", "connection"),
    ("OutOfMemoryError", "oom"),
    ("ReadOnlyError", "readonly"),
    ("MasterDownError", "masterdown"),
    ("ClusterDownError", "clusterdown"),
    ("TryAgainError", "tryagain"),
    ("MovedError", "moved"),
    ("AskError", "ask"),
    ("ClusterCrossSlotError", "crossslot"),
    ("NoPermissionError", "noperm"),
    ("NoScriptError", "noscript"),
)


@dataclass(frozen=True)
class Library:
    """One client library's classes: clients, pools, retries and errors."""

    name: str
    client: type
    async_client: type
    cluster: type
    async_cluster: type
    cluster_node: type
    async_cluster_node: type
    pool: type
    blocking_pool: type
    async_pool: type
    async_blocking_pool: type
    retry: type
    async_retry: type
    no_backoff: type
    #: Everything the library raises when the server cannot decide: its base
    #: error and its cluster errors (``SlotNotCoveredError``, "no targets"),
    #: which are not subclasses of the base.
    errors: tuple[type[BaseException], ...]
    reasons: tuple[tuple[type[BaseException], str], ...]
    #: A cluster client's retry counts of its own, beside its ``retry``
    #: (valkey-py: a CLUSTERDOWN or a lost connection is retried 3 times).
    cluster_retry_counts: tuple[str, ...] = ()

    @property
    def plain(self) -> tuple[type, type]:
        return (self.client, self.async_client)

    @property
    def clusters(self) -> tuple[type, type]:
        return (self.cluster, self.async_cluster)


def _library(
    name: str, prefix: str, exceptions: Any, cluster_retry_counts: tuple[str, ...] = ()
) -> Library:
    mod = importlib.import_module(name)
    aio = importlib.import_module(f"{name}.asyncio")
    cluster = importlib.import_module(f"{name}.cluster")
    aio_cluster = importlib.import_module(f"{name}.asyncio.cluster")
    aio_retry = importlib.import_module(f"{name}.asyncio.retry")
    return Library(
        name=name,
        client=getattr(mod, prefix),
        async_client=getattr(aio, prefix),
        cluster=getattr(cluster, f"{prefix}Cluster"),
        async_cluster=getattr(aio_cluster, f"{prefix}Cluster"),
        cluster_node=cluster.ClusterNode,
        async_cluster_node=aio_cluster.ClusterNode,
        pool=mod.ConnectionPool,
        blocking_pool=mod.BlockingConnectionPool,
        async_pool=aio.ConnectionPool,
        async_blocking_pool=aio.BlockingConnectionPool,
        retry=importlib.import_module(f"{name}.retry").Retry,
        async_retry=aio_retry.Retry,
        no_backoff=importlib.import_module(f"{name}.backoff").NoBackoff,
        errors=(
            getattr(exceptions, f"{prefix}Error"),
            getattr(exceptions, f"{prefix}ClusterException"),
        ),
        reasons=tuple((getattr(exceptions, cls), reason) for cls, reason in _REASON_NAMES),
        cluster_retry_counts=cluster_retry_counts,
    )


REDIS = _library("redis", "Redis", redis.exceptions)
_libraries: dict[str, Library] = {"redis": REDIS}
#: Errors that mean "Redis could not decide": everything redis-py raises,
#: down, timed out, and every error reply (OOM, READONLY, BUSY, MASTERDOWN,
#: CLUSTERDOWN, TRYAGAIN, MOVED, ...), and its cluster client's own errors
#: (no node serves the slot): the policy answers instead. valkey-py's errors
#: join when a limiter is given a valkey client (`note_errors`).
UNAVAILABLE: tuple[type[BaseException], ...] = REDIS.errors


def library_of(obj: object) -> Library | None:
    """The library *obj* (a client, or an error) comes from, if it is redis-py or valkey-py.

    >>> library_of(redis.Redis()).name, library_of(ValueError()) is None
    ('redis', True)
    """
    top = type(obj).__module__.partition(".")[0]
    if top == "valkey" and top not in _libraries:
        _libraries[top] = _library(
            "valkey",
            "Valkey",
            importlib.import_module("valkey.exceptions"),
            ("cluster_error_retry_attempts", "connection_error_retry_attempts"),
        )
    return _libraries.get(top)


def loaded_errors() -> tuple[type[BaseException], ...]:
    """The "cannot decide" errors of every library loaded so far."""
    return tuple(cls for lib in _libraries.values() for cls in lib.errors)


def note_errors() -> None:
    """Make `UNAVAILABLE` the errors of every library loaded so far (a limiter was given one)."""
    global UNAVAILABLE  # noqa: PLW0603 -- grows once, when valkey-py is first given
    UNAVAILABLE = loaded_errors()


def class_reason(err: BaseException) -> str | None:
    """The reason *err*'s class stands for, in its own library; None if it maps none."""
    lib = library_of(err)
    if lib is not None:
        for cls, reason in lib.reasons:
            if isinstance(err, cls):
                return reason
    return None


def node_of(client: Any, key: bytes) -> str | None:
    """The name (``host:port``) of the cluster node *client* sends *key* to now, or
    None when it does not know yet (no topology, a slot not covered).

    >>> node_of(redis.cluster.RedisCluster.__new__(redis.cluster.RedisCluster), b"k") is None
    True
    """
    try:
        node = client.nodes_manager.get_node_from_slot(client.keyslot(key))
    except Exception:  # any reason the client cannot say: not known
        return None
    name = getattr(node, "name", None)
    return name if isinstance(name, str) else None


def is_cluster(client: object) -> bool:
    """Whether *client* is a cluster client (sync or asyncio) of redis-py or valkey-py.

    >>> is_cluster(redis.Redis()), is_cluster(redis.cluster.RedisCluster)   # a class is no client
    (False, False)
    """
    lib = library_of(client)
    return lib is not None and isinstance(client, lib.clusters)


def is_asyncio(client: object) -> bool | None:
    """Whether *client* is an asyncio client (True), a sync one (False), or neither (None).

    A redis-py or valkey-py client by its class; any other by whether its
    ``execute_command`` is a coroutine function.

    >>> is_asyncio(redis.Redis()), is_asyncio(redis.asyncio.Redis()), is_asyncio(42)
    (False, True, None)
    """
    lib = library_of(client)
    if lib is not None:
        if isinstance(client, (lib.async_client, lib.async_cluster)):
            return True
        if isinstance(client, (lib.client, lib.cluster)):
            return False
    run = getattr(client, "execute_command", None)
    if not callable(run):
        return None
    return inspect.iscoroutinefunction(run)


def wrong_kind(limiter: str, client: object, asyncio: bool) -> str:
    """The error of a sync *limiter* given an asyncio *client*, or the reverse.

    >>> wrong_kind("AsyncRedisTokenBucket", redis.Redis(), asyncio=True).partition(": ")[2]
    'for a sync client use RedisTokenBucket'
    """
    lib = library_of(client) or REDIS
    if asyncio:
        want, where = "an asyncio", f"{lib.name}.asyncio"
        given, other = "a sync", "RedisTokenBucket"
        classes = (lib.async_client, lib.async_cluster)
    else:
        want, where, classes = "a sync", lib.name, (lib.client, lib.cluster)
        given, other = "an asyncio", "AsyncRedisTokenBucket"
    names = " or ".join(f"{where}.{cls.__name__}" for cls in classes)
    kind = type(client)
    return (
        f"{limiter} takes {want} client ({names}), not {given} "
        f"{kind.__module__}.{kind.__qualname__}: for {given} client use {other}"
    )


_one_pass: dict[type, type] = {}


def one_pass_async_cluster(cls: type) -> type:
    """valkey-py's asyncio cluster client *cls*, whose pipelines make one attempt and never pause.

    Its pipeline retries as many times as ``cluster_error_retry_attempts``
    (0 makes no attempt at all) and pauses 0.25 s after each lost or
    timed-out node, even the last, so a batch on a lost shard took
    ``timeout + 0.25`` s; and its commands retry on the same count. With
    this class, the count is 0 (one attempt) and a pipeline fails at once:
    the topology is still marked for a refresh before the next call, as the
    library does. *cls* as it is when its pipeline is not the one expected.
    """
    made = _one_pass.get(cls)
    if made is not None:
        return made
    pipeline_cls: Any = importlib.import_module(cls.__module__).ClusterPipeline
    if not all(hasattr(pipeline_cls, n) for n in ("_execute", "ERRORS_ALLOW_RETRY")):
        return cls

    class OnePassPipeline(pipeline_cls):  # type: ignore[misc]
        async def execute(
            self, raise_on_error: bool = True, allow_redirections: bool = True
        ) -> list[Any]:
            stack: list[Any] = self._command_stack
            if not stack:
                return []
            try:
                if self._client._initialize:
                    await self._client.initialize()
                try:
                    return await self._execute(  # type: ignore[no-any-return]
                        self._client,
                        stack,
                        raise_on_error=raise_on_error,
                        allow_redirections=allow_redirections,
                    )
                except BaseException as e:
                    if type(e) in self.ERRORS_ALLOW_RETRY:
                        await self._client._reset_for_reinitialize()
                    raise
            finally:
                self._command_stack: list[Any] = []

    class OnePassCluster(cls):  # type: ignore[misc]
        def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
            super().pipeline(transaction, shard_hint)  # its checks of the arguments
            return OnePassPipeline(self)

    # Named as the library's class, in its module: `library_of` (and a
    # reader of a repr) knows it by that.
    OnePassCluster.__name__ = OnePassCluster.__qualname__ = cls.__name__
    OnePassCluster.__module__ = cls.__module__
    _one_pass[cls] = OnePassCluster
    return OnePassCluster


_prompt: dict[type, type] = {}


def prompt_cluster_down(lib_name: str, connection_cls: type) -> type:
    """*connection_cls*, raising a ``CLUSTERDOWN`` reply as a plain ``ResponseError``.

    A sync cluster client sleeps 0.25 s and then refreshes the whole topology
    when a node answers CLUSTERDOWN, before it raises: a decision took 0.26-0.36
    s against a timeout of 0.1 s. Raised as a plain error reply (its code kept
    first, so the reason is still ``"clusterdown"``), it reaches the limiter
    at once. Nothing is lost: a cluster that heals answers MOVED for the slots
    that moved, and the client follows MOVED as it always does.
    """
    made = _prompt.get(connection_cls)
    if made is not None:
        return made
    if connection_cls in _prompt.values():
        return connection_cls
    exceptions = importlib.import_module(f"{lib_name}.exceptions")
    down: type[BaseException] = exceptions.ClusterDownError
    plain: type[BaseException] = exceptions.ResponseError

    class PromptConnection(connection_cls):  # type: ignore[misc]
        def read_response(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().read_response(*args, **kwargs)
            except down as e:
                raise plain(f"CLUSTERDOWN {e}") from e

    PromptConnection.__name__ = PromptConnection.__qualname__ = connection_cls.__name__
    _prompt[connection_cls] = PromptConnection
    return PromptConnection


def prompt_cluster_nodes(lib_name: str, cluster: Any) -> Any:
    """*cluster* (a sync cluster client of the limiter's own), its nodes' connections prompt.

    For a library whose cluster client passes no connection class to its
    nodes (valkey-py): each node's pool gets `prompt_cluster_down`'s class,
    those discovered later too, and the connections the discovery made
    already are dropped (they are made again, of that class, when needed).
    """
    manager: Any = getattr(cluster, "nodes_manager", None)
    make = getattr(manager, f"create_{lib_name}_node", None)
    if manager is None or make is None:
        return cluster

    def prompt(node_client: Any) -> Any:
        pool = node_client.connection_pool
        pool.connection_class = prompt_cluster_down(lib_name, pool.connection_class)
        pool.disconnect()
        pool.reset()
        return node_client

    def create(host: str, port: int, **kwargs: Any) -> Any:
        return prompt(make(host, port, **kwargs))

    setattr(manager, f"create_{lib_name}_node", create)
    nodes = [*manager.nodes_cache.values(), *manager.startup_nodes.values()]
    for client in {
        id(c): c for n in nodes if (c := getattr(n, f"{lib_name}_connection", None))
    }.values():
        prompt(client)
    return cluster


#: The commands a limiter sends through its own asyncio cluster client (the
#: keys of EVALSHA and EVAL are found without the table).
_LIMITER_COMMANDS = ("evalsha", "eval", "script", "del", "ping")


def lean_command_table(client: Any) -> Any:
    """*client* (an asyncio cluster client of the limiter's own), learning a small command table.

    Its first call fetches ``COMMAND`` and parses the ~10,000 lines of the
    reply on the event loop: 0.1-0.7 s of CPU that no deadline interrupts,
    during which every other task waits. valkey-py does it again on every
    topology refresh, and a lost node asks for one. The client's commands are
    known: their table (``COMMAND INFO``) is a few lines, fetched once; a
    command outside it still fetches the whole table, as the library does.
    """
    parser = getattr(client, "commands_parser", None)
    fetch = getattr(parser, "initialize", None)
    if parser is None or not inspect.iscoroutinefunction(fetch):
        return client

    async def initialize(node: Any = None) -> None:
        if node is not None:
            parser.node = node
        if not parser.commands:
            table = await parser.node.execute_command("COMMAND", "INFO", *_LIMITER_COMMANDS)
            parser.commands = {_text(name).lower(): info for name, info in table.items()}
        elif node is None:  # asked for a command the table lacks
            await fetch()

    parser.initialize = initialize
    return client


def _text(name: str | bytes) -> str:
    return name.decode() if isinstance(name, bytes) else name
