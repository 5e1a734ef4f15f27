"""The Redis limiters on valkey-py clients (``valkey.Valkey``, ``valkey.asyncio.Valkey``).

valkey-py is redis-py's fork: its errors are not redis-py's, and its client
retries by its own defaults. Against a real redis-server: the same exact
decisions as the in-process table, and hung (SIGSTOP), dead, BUSY, OOM and
READONLY servers answered by the policy (within the timeout where the server
does not reply at once), with ``reason`` named as for redis-py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest
import valkey
import valkey.asyncio

import nanobucket as nb
from nanobucket import redis as nbr

from redis_server import RedisServer, require_redis_server
from test_redis_failures import (
    PHASE,
    SLOW_OK,
    _busy,
    async_failing,
    sync_failing,
)

S = 1_000_000_000
MS = 1_000_000
T0 = 1_000 * S


def _user_client(server: RedisServer) -> Any:
    return valkey.Valkey(host="127.0.0.1", port=server.port)  # valkey-py's defaults


def _async_client(server: RedisServer) -> Any:
    return valkey.asyncio.Valkey(host="127.0.0.1", port=server.port)


def _breaker() -> nbr.CircuitBreaker:
    return nbr.CircuitBreaker(backoff=60.0, max_backoff=60.0)  # stays open for the test


def _limiter(client: Any, **kwargs: Any) -> nbr.RedisTokenBucket:
    kwargs.setdefault("on_error", "closed")
    kwargs.setdefault("breaker", _breaker())
    return nbr.RedisTokenBucket(client, rate=100, capacity=200, **kwargs)


TRACE = [(0, 150), (0, 100), (400 * MS, 100), (400 * MS, 10), (2 * S, 0), (3 * S, 200)]


def test_valkey_client_decides_exactly(own_redis_server: RedisServer) -> None:
    client = _user_client(own_redis_server)
    limiter = _limiter(client, timeout=SLOW_OK)
    kwargs = limiter._client.connection_pool.connection_kwargs
    assert isinstance(limiter._client, valkey.Valkey) and limiter._client is not client
    assert (kwargs["socket_timeout"], nbr._retries(kwargs["retry"])) == (SLOW_OK, 0)
    reference = nb.KeyedTokenBucket(rate=100, capacity=200)
    for dt, cost in TRACE:
        d = limiter.check_at("k", T0 + dt, cost)
        assert d == reference.check_at("k", T0 + dt, cost) and d.source == "redis"
    keys = ["a", "b", "a", "a", "b", "a", "a", "a"]
    assert limiter.allow_many_at(keys, T0, 40) == reference.allow_many_at(keys, T0, 40)
    # A limit of its own, so a prefix of its own (one prefix holds one limit's buckets).
    leased = nbr.LeasedTokenBucket(
        client, 100, 100, min_lease=10, max_lease=10, timeout=SLOW_OK, prefix="leased"
    )
    assert [leased.allow_at("lease", T0) for _ in range(101)] == [True] * 100 + [False]
    assert leased.round_trips == 11
    leased.close()
    limiter.close()
    client.close()


def test_async_valkey_client_decides_exactly(own_redis_server: RedisServer) -> None:
    async def run() -> None:
        limiter = nbr.AsyncRedisTokenBucket(
            _async_client(own_redis_server), 100, 200, timeout=SLOW_OK
        )
        assert isinstance(limiter._client, valkey.asyncio.Valkey)
        reference = nb.KeyedTokenBucket(rate=100, capacity=200)
        for dt, cost in TRACE:
            d = await limiter.check_at("k", T0 + dt, cost)
            assert d == reference.check_at("k", T0 + dt, cost) and d.source == "redis"
        keys = ["a", "b", "a", "a", "b", "a", "a", "a"]
        assert await limiter.allow_many_at(keys, T0, 40) == reference.allow_many_at(keys, T0, 40)
        await limiter.aclose()

    asyncio.run(run())


# -- hung, dead, busy: within the timeout ---------------------------------------------------------


@pytest.mark.parametrize("state", ["hung", "dead", "busy"])
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_valkey_failing_redis_returns_within_the_timeout(
    busy_server: RedisServer, state: str, asynchronous: bool
) -> None:
    if asynchronous:
        async_failing(busy_server, state, lambda: _async_client(busy_server))
    else:
        sync_failing(busy_server, state, lambda: _user_client(busy_server))


# -- error replies: the policy or the fallback, reason named --------------------------------------


def _expect_policy(server: RedisServer, reason: str) -> None:
    """Each verb on a valkey client gets the policy or the fallback, the breaker opens."""
    client = _user_client(server)
    limiter = _limiter(client, timeout=SLOW_OK)
    d = limiter.check("k")
    assert (d.allowed, d.remaining, d.source, d.reason) == (False, 0, "policy:closed", reason)
    assert limiter.breaker.state == "open"
    limiter = _limiter(client, timeout=SLOW_OK, fallback=nb.KeyedTokenBucket(rate=1, capacity=2))
    d = limiter.check("k")
    assert (d.allowed, d.remaining, d.source, d.reason) == (True, 1, "fallback", reason)
    limiter = _limiter(client, timeout=SLOW_OK, on_error="open")
    assert limiter.allow_many(["k", "k2"]) == bytearray([1, 1])
    with pytest.raises(nbr.RedisUnavailable) as info:
        _limiter(client, timeout=SLOW_OK, on_error="raise").check("k")
    assert isinstance(info.value.__cause__, valkey.ValkeyError)
    assert nbr.failure_reason(info.value.__cause__) == reason
    leased = nbr.LeasedTokenBucket(
        client, 100, 200, on_error="closed", breaker=_breaker(), timeout=SLOW_OK
    )
    d = leased.check("k")
    assert (d.allowed, d.source, d.reason) == (False, "policy:closed", reason)

    async def run() -> None:
        limiter = nbr.AsyncRedisTokenBucket(
            _async_client(server), 100, 200, on_error="closed", breaker=_breaker(), timeout=SLOW_OK
        )
        d = await limiter.check("k")
        assert (d.source, d.reason) == ("policy:closed", reason)
        await limiter.aclose()

    asyncio.run(run())
    client.close()


def test_valkey_busy(busy_server: RedisServer) -> None:
    with _busy(busy_server):
        _expect_policy(busy_server, "busy")


def test_valkey_out_of_memory(own_redis_server: RedisServer) -> None:
    admin = own_redis_server.client()
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)
    _expect_policy(own_redis_server, "oom")
    admin.config_set("maxmemory", 0)
    admin.close()


@pytest.fixture
def replica(own_redis_server: RedisServer) -> Iterator[RedisServer]:
    """*own_redis_server* as a synced replica of a master of its own."""
    master_args = ("--repl-diskless-sync-delay", "0")  # sync at once, not after 5 s
    with contextlib.closing(RedisServer(require_redis_server(), master_args)) as master:
        master.start()
        admin = own_redis_server.client()
        admin.replicaof("127.0.0.1", master.port)
        deadline = time.monotonic() + PHASE
        while admin.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.02)
        yield own_redis_server
        admin.replicaof("NO", "ONE")
        admin.close()


def test_valkey_read_only_replica(replica: RedisServer) -> None:
    _expect_policy(replica, "readonly")


def test_valkey_errors_have_redis_py_reasons() -> None:
    from valkey import exceptions as vex

    cases = [
        (vex.TimeoutError("Timeout reading"), "timeout"),
        (vex.ConnectionError("refused"), "connection"),
        (vex.BusyLoadingError("loading"), "loading"),
        (vex.OutOfMemoryError("command not allowed"), "oom"),
        (vex.ReadOnlyError("You can't write against a read only replica."), "readonly"),
        (cast(Any, vex.ClusterDownError)("The cluster is down"), "clusterdown"),
        (vex.ResponseError("BUSY Valkey is busy running a script."), "busy"),
        (vex.ValkeyClusterException("No targets were found"), "error"),
    ]
    assert [nbr.failure_reason(err) for err, _ in cases] == [reason for _, reason in cases]
    nbr.RedisTokenBucket(valkey.Valkey(), 100, 200)  # a valkey client: its errors count too
    assert all(isinstance(err, nbr.UNAVAILABLE) for err, _ in cases)
