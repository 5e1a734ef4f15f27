"""The Redis limiters on a real 3-master Redis Cluster, through redis-py's cluster clients.

Exact decisions for keys on each of the three shards, ``allow_many`` over
shards, a layered limit, leases; then a master lost (SIGKILL) or hung
(SIGSTOP) under redis-py's default ``RedisCluster`` (5 s timeouts, 10
retries, each after a topology refresh: seconds to a minute per call): keys
of that shard get the policy within the limiter's timeout, keys of the
others keep being decided by Redis until the cluster marks the master failed
and answers ``CLUSTERDOWN`` for every key.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio.cluster
import redis.cluster
import valkey.asyncio.cluster
import valkey.cluster

import nanobucket as nb
from nanobucket import redis as nbr

from redis_server import RedisClusterServers, running_cluster

S = 1_000_000_000
MS = 1_000_000
T0 = 1_000 * S  # explicit times: decisions do not depend on how long the test takes
TIMEOUT = 0.1  # the limiters' default
#: The first decision on a lost master returns within TIMEOUT + MARGIN (as in
#: test_redis_failures: generous for a loaded machine).
MARGIN = 0.4
#: Any other failure has no pause: within TIMEOUT + QUICK (valkey-py's
#: asyncio client retried once and its pipeline paused 0.25 s: 0.25-0.35 s).
QUICK = 0.15
#: The timeout of limiters on a healthy cluster: long, so that a loaded
#: machine never turns a reply into a timeout.
SLOW_OK = 2.0
#: Hard bound on waiting for the cluster to notice a lost master.
PHASE = 15.0
#: How soon the nodes mark a silent master failed (default 15 s).
NODE_TIMEOUT_MS = "2500"


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterServers]:
    """One healthy cluster for the module's decision tests (they never stop it)."""
    yield from running_cluster()


@pytest.fixture
def own_cluster() -> Iterator[RedisClusterServers]:
    """A cluster of the test's own, whose masters it may kill or pause."""
    yield from running_cluster("--cluster-node-timeout", NODE_TIMEOUT_MS)


CLUSTER_CLIENTS: dict[str, Any] = {
    "redis": redis.cluster.RedisCluster,
    "valkey": valkey.cluster.ValkeyCluster,
}
ASYNC_CLUSTER_CLIENTS: dict[str, Any] = {
    "redis": redis.asyncio.cluster.RedisCluster,
    "valkey": valkey.asyncio.cluster.ValkeyCluster,
}


@pytest.fixture(params=sorted(CLUSTER_CLIENTS))
def lib(request: pytest.FixtureRequest) -> str:
    """The client library: redis-py or valkey-py."""
    return str(request.param)


def _client(cluster: RedisClusterServers, lib: str = "redis") -> Any:
    return CLUSTER_CLIENTS[lib](host="127.0.0.1", port=cluster.ports[0])  # the defaults


def _async_client(cluster: RedisClusterServers, lib: str) -> Any:
    return ASYNC_CLUSTER_CLIENTS[lib](host="127.0.0.1", port=cluster.ports[0])


def _limiter(client: Any, prefix: str, **kwargs: Any) -> nbr.RedisTokenBucket:
    kwargs.setdefault("timeout", SLOW_OK)
    return nbr.RedisTokenBucket(client, rate=100, capacity=200, prefix=prefix, **kwargs)


def _one_key_per_shard(cluster: RedisClusterServers, client: Any, limiter: Any) -> dict[int, str]:
    """A key for each master's port, checked with the servers and with the client."""
    found: dict[int, str] = {}
    for i in range(1000):
        key = f"user-{i}"
        port = cluster.node_of(limiter.key(key)).port
        if port not in found:
            assert client.get_node_from_key(limiter.key(key)).port == port
            found[port] = key
        if len(found) == len(cluster.nodes):
            return found
    raise AssertionError(f"keys found on {sorted(found)} only")


# -- decisions on a healthy cluster -------------------------------------------------------------


def test_a_cluster_client_from_a_url_with_a_db_decides(cluster: RedisClusterServers) -> None:
    # redis-py accepts ".../0" for a cluster (its one db); the limiter's own copy of
    # the client refused "db" ("not possible to use in cluster mode").
    url = f"redis://127.0.0.1:{cluster.ports[0]}/0"
    client = redis.cluster.RedisCluster.from_url(url)
    limiter = nbr.RedisTokenBucket(client, rate=100, capacity=200, prefix="url-db-sync")
    d = limiter.check("k")
    assert (d.allowed, d.remaining, d.source) == (True, 199, "redis")
    limiter.close()
    client.close()

    async def main() -> nbr.RedisDecision:
        client = redis.asyncio.cluster.RedisCluster.from_url(url)
        limiter = nbr.AsyncRedisTokenBucket(client, 100, 200, prefix="url-db-async")
        try:
            return await limiter.check("k")
        finally:
            await limiter.aclose()
            await client.aclose()

    d = asyncio.run(main())
    assert (d.allowed, d.remaining, d.source) == (True, 199, "redis")


def test_keys_on_every_shard_decide_exactly(cluster: RedisClusterServers, lib: str) -> None:
    client = _client(cluster, lib)
    limiter = _limiter(client, f"exact-{lib}")
    keys = _one_key_per_shard(cluster, client, limiter)
    assert limiter._client is not client  # a bounded copy: the user's retries for ten
    assert limiter._wire is None  # no wire of its own: redis-py routes each key to its node
    reference = nb.KeyedTokenBucket(rate=100, capacity=200)
    for key in keys.values():
        trace = [(0, 150), (0, 100), (400 * MS, 100), (400 * MS, 10), (2 * S, 0), (3 * S, 200)]
        for dt, cost in trace:
            d = limiter.check_at(key, T0 + dt, cost)
            assert d == reference.check_at(key, T0 + dt, cost), (key, dt, cost)
            assert (d.source, d.reason) == ("redis", None)
        # 150 at T0, 100 refused (wait 0.5 s), 100 refused at +0.4 s (0.1 s), ...
        d = limiter.peek_at(key, T0 + 3 * S, 1)
        assert (d.allowed, d.remaining, d.retry_after_ns, d.reset_after_ns) == (
            False,
            0,
            10 * MS,
            2 * S,
        )
    assert limiter.breaker.state == "closed"
    client.close()


def test_two_limits_on_one_prefix_decide_exactly_on_every_shard(
    cluster: RedisClusterServers,
) -> None:
    # A rolling change of limit on a cluster: each limit has its own buckets, each
    # key's buckets (of every limit) in the key's one slot, on its one shard.
    client = _client(cluster)
    old = _limiter(client, "change")
    new = nbr.RedisTokenBucket(client, rate=200, capacity=400, prefix="change", timeout=SLOW_OK)
    keys = _one_key_per_shard(cluster, client, old)
    for port, key in keys.items():
        assert cluster.node_of(new.key(key)).port == port
        admitted = [old.allow_at(key, T0, 150), new.allow_at(key, T0, 300)]
        admitted += [old.allow_at(key, T0, 100), new.allow_at(key, T0, 100)]
        admitted += [old.allow_at(key, T0, 50), new.allow_at(key, T0, 1)]
        assert admitted == [True, True, False, True, True, False]
    assert old.allow_many_at(list(keys.values()), T0 + S) == bytearray([1] * 3)
    new.reconfigure(rate=100, capacity=200, migrate=False)  # back to the old limit's buckets
    assert [new.tokens_at(key, T0 + S) for key in keys.values()] == [99.0] * 3
    client.close()


def test_allow_many_over_shards_gives_the_per_key_bits(
    cluster: RedisClusterServers, lib: str
) -> None:
    client = _client(cluster, lib)
    batch, single = _limiter(client, f"many-{lib}"), _limiter(client, f"single-{lib}")
    keys = list(_one_key_per_shard(cluster, client, batch).values())
    trace = [keys[i % 3] for i in (0, 1, 2, 0, 0, 1, 2, 2, 2, 0, 1, 0, 0, 2)]
    bits = batch.allow_many_at(trace, T0, cost=40)  # 5 of 40 per key, then refused
    assert bits == bytearray(single.allow_at(k, T0, 40) for k in trace)
    assert bits == nb.KeyedTokenBucket(rate=100, capacity=200).allow_many_at(trace, T0, 40)
    assert bits == bytearray([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1])
    assert batch.allow_many_at(trace[:3], T0 + 400 * MS, 41) == bytearray([0, 1, 0])  # 40 back
    client.close()


def test_a_layered_limit_on_the_cluster_is_all_or_nothing(cluster: RedisClusterServers) -> None:
    client = _client(cluster)
    shared = nbr.RedisTokenBucket(client, rate=1, capacity=5, prefix="layer", timeout=SLOW_OK)
    local = nb.KeyedTokenBucket(rate=1, capacity=3)
    limit = nb.all_of(shared, local)
    first, second, _ = _one_key_per_shard(cluster, client, shared).values()
    # The local layer binds: the fourth call is refused and Redis is not charged.
    assert [limit.allow_at(first, T0) for _ in range(4)] == [True, True, True, False]
    assert shared.peek_at(first, T0, 0).remaining == 2
    d = limit.check_at(first, T0)
    assert (d.allowed, d.layer, d.retry_after_ns) == (False, 1, S)
    # Redis binds: its refusal gives the local layer its token back.
    shared.check_at(second, T0, cost=4)
    assert [limit.allow_at(second, T0) for _ in range(2)] == [True, False]
    assert local.tokens_at(second, T0) == 2.0
    assert shared.peek_at(second, T0, 0).remaining == 0
    client.close()


def test_leases_on_every_shard(cluster: RedisClusterServers) -> None:
    client = _client(cluster)
    leased = nbr.LeasedTokenBucket(
        client, rate=100, capacity=100, prefix="lease", min_lease=10, max_lease=10, timeout=SLOW_OK
    )
    keys = _one_key_per_shard(cluster, client, leased).values()
    for key in keys:
        decisions = [leased.check_at(key, T0) for _ in range(101)]
        assert [d.allowed for d in decisions] == [True] * 100 + [False]
        assert sum(d.source == "redis" for d in decisions) == 11  # a lease per 10, one refusal
        assert decisions[-1].retry_after_ns == 10 * MS and leased.held(key) == 0
    assert leased.round_trips == 33
    leased.close()
    client.close()


def test_async_cluster_client_decides_exactly(cluster: RedisClusterServers, lib: str) -> None:
    async def run() -> None:
        client = _async_client(cluster, lib)
        limiter = nbr.AsyncRedisTokenBucket(
            client, rate=100, capacity=200, prefix=f"async-{lib}", timeout=SLOW_OK
        )
        assert isinstance(limiter._client, ASYNC_CLUSTER_CLIENTS[lib])
        assert limiter._client is not client
        sync = _limiter(_client(cluster), f"async-{lib}")
        keys = list(_one_key_per_shard(cluster, sync._client, sync).values())
        reference = nb.KeyedTokenBucket(rate=100, capacity=200)
        for key in keys:
            for dt, cost in [(0, 150), (0, 100), (400 * MS, 100)]:
                d = await limiter.check_at(key, T0 + dt, cost)
                assert d == reference.check_at(key, T0 + dt, cost) and d.source == "redis"
        trace = [keys[i % 3] for i in range(12)]
        bits = await limiter.allow_many_at(trace, T0 + 400 * MS, 40)
        assert bits == reference.allow_many_at(trace, T0 + 400 * MS, 40)
        await limiter.aclose()

    asyncio.run(run())


# -- a master lost --------------------------------------------------------------------------------


def _wait_cluster_state(cluster: RedisClusterServers, alive: Any, state: bytes) -> None:
    with alive.client() as admin:
        deadline = time.monotonic() + PHASE
        while b"cluster_state:" + state not in admin.execute_command("CLUSTER", "INFO"):
            assert time.monotonic() < deadline, f"the cluster never became {state!r}"
            time.sleep(0.02)


def _timed(decide: Any) -> tuple[Any, float]:
    start = time.monotonic()
    d = decide()
    return d, time.monotonic() - start


async def _waited(decision: Any) -> tuple[Any, float]:
    """*decision* awaited; the seconds it waited, less the time the loop itself ran late.

    An asyncio limiter's timeout bounds Redis, not its own event loop: while
    the loop is blocked (here by the cluster client's own discovery, 0.1-0.3 s
    of CPU, more on a loaded machine), no timer fires and no reply is read.
    A ticker beside it measures that lag, independently of the limiter.
    """
    lag = 0.0

    async def tick() -> None:
        nonlocal lag
        while True:
            due = time.monotonic() + 0.005
            await asyncio.sleep(0.005)
            lag += max(0.0, time.monotonic() - due - 0.005)  # a turn of slack: not lag

    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0)  # the ticker runs before the decision starts
    start = time.monotonic()
    try:
        d = await asyncio.wait_for(decision, PHASE)
    finally:
        took = time.monotonic() - start
        ticker.cancel()
    return d, took - lag


@pytest.mark.wall_clock
def test_a_slow_topology_discovery_never_holds_a_decision_past_the_timeout(
    cluster: RedisClusterServers, lib: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh asyncio cluster client learns the topology on its first call;
    on a loaded machine that takes longer than the limiter's timeout (here
    made 0.3 s). Each call still returns within the timeout (the policy,
    "timeout"), and the discovery, not cancelled with them, ends: then Redis
    decides. Cancelled with each call, it would start over every time."""
    cls = ASYNC_CLUSTER_CLIENTS[lib]
    learn = cls.initialize

    async def slow_initialize(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_initialize", False):
            await asyncio.sleep(0.3)  # a loaded machine parsing the command table
        return await learn(self, *args, **kwargs)

    monkeypatch.setattr(cls, "initialize", slow_initialize)

    async def run() -> list[tuple[str, str | None]]:
        limiter = nbr.AsyncRedisTokenBucket(
            _async_client(cluster, lib),
            100,
            200,
            prefix=f"slow-discovery-{lib}",
            on_error="closed",
            breaker=nbr.CircuitBreaker(failures=10**6),
        )
        seen: list[tuple[str, str | None]] = []
        try:
            for _ in range(20):
                start = time.monotonic()
                d = await asyncio.wait_for(limiter.check_at("alice", T0), PHASE)
                took = time.monotonic() - start
                assert took < TIMEOUT + QUICK, f"{took:.3f} s for {d}"
                seen.append((d.source, d.reason))
                if d.source == "redis":
                    assert (d.allowed, d.remaining) == (True, 199), d
                    break
                await asyncio.sleep(0.05)
        finally:
            await limiter.aclose()
        return seen

    seen = asyncio.run(run())
    assert seen[0] == ("policy:closed", "timeout") and seen[-1] == ("redis", None), seen
    assert len(seen) <= 5, seen  # 0.3 s of discovery: within a few 0.1 s calls


@pytest.mark.wall_clock
@pytest.mark.parametrize("how", ["dead", "hung"])
def test_a_lost_master_gets_the_policy_within_the_timeout_sync_and_async(
    own_cluster: RedisClusterServers, lib: str, how: str
) -> None:
    client = _client(own_cluster, lib)  # the library's defaults: redis-py retries 10 times
    counted = _limiter(
        client,
        "lost",
        timeout=TIMEOUT,
        on_error="closed",
        breaker=nbr.CircuitBreaker(backoff=60.0, max_backoff=60.0),
    )
    fallback = nb.KeyedTokenBucket(rate=1, capacity=2)
    # No breaker in the way: each call asks its shard (failures=1e6 never opens).
    per_shard = _limiter(
        client,
        "lost",
        timeout=TIMEOUT,
        fallback=fallback,
        breaker=nbr.CircuitBreaker(failures=10**6),
    )
    keys = _one_key_per_shard(own_cluster, client, counted)
    for key in keys.values():
        assert counted.check(key).source == "redis"
    victim = own_cluster.nodes[1]
    lost_key = keys[victim.port]
    assert victim.proc is not None
    reason = {"dead": "connection", "hung": "timeout"}[how]
    os.kill(victim.proc.pid, signal.SIGKILL if how == "dead" else signal.SIGSTOP)
    try:
        d, took = _timed(lambda: counted.check(lost_key))
        assert (d.allowed, d.source, d.reason) == (False, "policy:closed", reason), d
        assert took < TIMEOUT + MARGIN, f"{took:.3f} s"
        assert counted.breaker.state == "open"  # the worst of its nodes'
        # The breaker that opened is the lost master's: its key gets the policy at once,
        # and the keys of the other masters keep their exact limit (one breaker for all
        # refused them too).
        d, took = _timed(lambda: counted.check(lost_key))
        assert (d.source, d.reason) == ("policy:closed", "breaker-open") and took < MARGIN
        for port, key in keys.items():
            if port != victim.port:
                d = counted.check(key)
                assert (d.allowed, d.source, d.reason) == (True, "redis", None), d
        # Shard by shard: the lost one gets the fallback, the others Redis.
        for port, key in keys.items():
            d, took = _timed(lambda: per_shard.check(key))
            if port == victim.port:
                assert (d.allowed, d.remaining, d.source, d.reason) == (True, 1, "fallback", reason)
            else:
                assert (d.allowed, d.source, d.reason) == (True, "redis", None), d
            assert took < TIMEOUT + QUICK, f"{took:.3f} s for {d}"
        bits, took = _timed(lambda: per_shard.allow_many(list(keys.values())))
        assert took < TIMEOUT + QUICK, f"{took:.3f} s"  # one shard down fails the batch
        assert bits == bytearray([1, 1, 1]) and not fallback.peek(lost_key).allowed
        asyncio.run(_async_shard_by_shard(own_cluster, lib, keys, victim.port, reason))
        # The others mark the master failed: without full coverage they refuse every key.
        _wait_cluster_state(own_cluster, own_cluster.nodes[0], b"fail")
        for key in keys.values():
            d, took = _timed(lambda: per_shard.check(key))
            assert d.source == "fallback" and d.reason in ("clusterdown", reason), d
            # redis-py and valkey-py pause 0.25 s on CLUSTERDOWN, then refresh
            # the topology: the limiter's own connections raise it at once.
            assert took < TIMEOUT + QUICK, f"{took:.3f} s for {d}"
        assert per_shard.check(keys[own_cluster.ports[0]]).reason == "clusterdown"
    finally:
        if how == "hung" and victim.proc is not None:
            victim.resume()
    counted.close()
    per_shard.close()
    client.close()


async def _async_shard_by_shard(
    cluster: RedisClusterServers, lib: str, keys: dict[int, str], lost: int, reason: str
) -> None:
    """The asyncio cluster client, made after the loss: the lost shard's key gets the policy.

    Its first call also learns the topology (0.1-0.3 s of CPU in redis-py 8.2,
    more on a loaded machine): that call returns within the timeout too,
    beside the time that CPU blocks the loop (`_waited`), and the topology is
    learnt in the background meanwhile.
    """
    limiter = nbr.AsyncRedisTokenBucket(
        _async_client(cluster, lib),
        100,
        200,
        prefix="lost-async",
        on_error="closed",
        breaker=nbr.CircuitBreaker(failures=10**6),
    )
    healthy = next(key for port, key in keys.items() if port != lost)
    try:
        deadline = time.monotonic() + PHASE
        while True:  # until the topology is learnt, each call is bounded
            d, took = await _waited(limiter.peek(healthy))
            assert took < TIMEOUT + QUICK, f"{took:.3f} s beside the loop's lag, for {d}"
            if d.source == "redis":
                break
            assert (d.source, d.reason) == ("policy:closed", "timeout"), d
            assert time.monotonic() < deadline, "the topology was never learnt"
            await asyncio.sleep(0.05)
        for port, key in keys.items():
            d, took = await _waited(limiter.check(key))
            expected = ("policy:closed", reason) if port == lost else ("redis", None)
            assert (d.source, d.reason) == expected, (port == lost, d)
            assert took < TIMEOUT + QUICK, f"{took:.3f} s beside the loop's lag, for {d}"
        # One shard down fails the batch (closed: nothing admitted), at once.
        bits, took = await _waited(limiter.allow_many(list(keys.values())))
        assert bits == bytearray(3) and took < TIMEOUT + QUICK, (bits, f"{took:.3f} s")
    finally:
        await limiter.aclose()
