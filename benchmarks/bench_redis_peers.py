"""The distributed limiter beside its peers, in one run on one Redis (a script, not a test).

    python benchmarks/bench_redis_peers.py        # starts its own redis-server (and a cluster)
    python benchmarks/bench_redis_peers.py --runs 5 --seconds 2
    python benchmarks/bench_redis_peers.py --url redis://127.0.0.1:6379/0 --no-cluster

Every case makes decisions as fast as it can against the same redis-server on
loopback, through one connection (async: one event loop, one connection pool),
at a rate far above what it reaches, so nothing is refused and each decision
is a full update. Cases are run in turn, ``--runs`` times, and the median of
each is printed with its ratio to nanobucket's figure in the same run.

- sync, one thread: ``RedisTokenBucket.allow``; ``limits`` (fixed window and
  moving window, its cheapest and its exact strategy); ``throttled-py`` (its
  token bucket); ``pyrate-limiter`` (its Redis bucket); and a bare
  ``EVALSHA`` of a script that does nothing, given the same keys and
  arguments (the floor of one round trip through redis-py).
- async, 1, 16 and 256 tasks on one loop, each with its own key:
  ``AsyncRedisTokenBucket.allow``, ``limits.aio`` (fixed window) and the bare
  ``EVALSHA``.
- Redis CPU per decision: ``usec_per_call`` of the limiter's script from
  ``INFO commandstats`` beside the do-nothing script's.
- a 3-master Redis Cluster on loopback (``--no-cluster`` skips it):
  ``RedisTokenBucket`` through ``redis.cluster.RedisCluster``, keys spread
  over the shards, sync and async with 256 tasks.

A peer that is not installed is left out, said once. ``pip install -e
'.[bench]'`` installs them all.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import redis
import redis.asyncio

from nanobucket import redis as nbr

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "tests"))

RATE = 10_000_000  # far above what one client reaches: nothing is refused
NOOP = "return 0"  # the limiter's script also returns one integer
#: The async peers hold one connection per task in flight: redis-py's default
#: pool of 100 raises "Too many connections" at 256 tasks, so they get more.
#: nanobucket coalesces a loop's decisions onto one connection and keeps the
#: default.
PEER_POOL = 1024

# The single script's arguments: tau and cost in us, no explicit time, consume, no TTL slack.
BARE_ARGS = (b"10000000", 1, b"", b"1", b"0")

SyncCase = Callable[[], Callable[[], object]]
AsyncCase = Callable[[], Callable[[str], Awaitable[object]]]


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def sync_rate(call: Callable[[], object], seconds: float) -> float:
    """Decisions/s of *call* in one thread over *seconds* (after a warm-up call)."""
    call()
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(100):
            call()
        done += 100
    return done / elapsed


async def async_rate(call: Callable[[str], Awaitable[object]], tasks: int, seconds: float) -> float:
    """Decisions/s of *tasks* concurrent loops of ``await call(key)`` (each its own key)."""
    await call("warm")
    stop = time.perf_counter() + seconds
    counts = [0] * tasks

    async def worker(i: int) -> None:
        key, n = f"task-{i}", 0
        while time.perf_counter() < stop:
            await call(key)
            n += 1
        counts[i] = n

    start = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(tasks)))
    return sum(counts) / (time.perf_counter() - start)


def sync_cases(url: str, client: redis.Redis) -> dict[str, SyncCase]:
    """Each case builds its limiter (on its own connection) and returns the call to time."""

    def nanobucket() -> Callable[[], object]:
        limiter = nbr.RedisTokenBucket.from_url(url, rate=RATE, capacity=RATE, prefix="nb")
        return lambda: limiter.allow("k")

    def bare() -> Callable[[], object]:
        c = nbr.client_from_url(url)
        sha = c.script_load(NOOP)
        return lambda: c.evalsha(sha, 1, b"nb:{k}", *BARE_ARGS)

    cases: dict[str, SyncCase] = {"nanobucket RedisTokenBucket": nanobucket}
    if installed("limits"):
        import limits
        import limits.storage
        import limits.strategies

        item = limits.RateLimitItemPerSecond(RATE)

        def limits_case(strategy: Any) -> SyncCase:
            def build() -> Callable[[], object]:
                limiter = strategy(limits.storage.RedisStorage(url))
                return lambda: limiter.hit(item, "k")

            return build

        cases["limits, fixed window"] = limits_case(limits.strategies.FixedWindowRateLimiter)
        cases["limits, moving window"] = limits_case(limits.strategies.MovingWindowRateLimiter)
    if installed("throttled"):
        import throttled

        def throttled_case() -> Callable[[], object]:
            t = throttled.Throttled(
                using=throttled.RateLimiterType.TOKEN_BUCKET.value,
                quota=throttled.rate_limiter.per_sec(RATE, burst=RATE),
                store=throttled.RedisStore(server=url),
            )
            return lambda: t.limit("k")

        cases["throttled-py, token bucket"] = throttled_case
    if installed("pyrate_limiter"):
        import pyrate_limiter

        def pyrate_case() -> Callable[[], object]:
            rates = [pyrate_limiter.Rate(RATE, pyrate_limiter.Duration.SECOND)]
            bucket = pyrate_limiter.RedisBucket.init(rates, redis.Redis.from_url(url), "pyrate")
            limiter = pyrate_limiter.Limiter(bucket)
            return lambda: limiter.try_acquire("k", blocking=False)

        cases["pyrate-limiter, Redis bucket"] = pyrate_case
    cases["bare EVALSHA (does nothing)"] = bare
    return cases


def async_cases(url: str) -> dict[str, AsyncCase]:
    def nanobucket() -> Callable[[str], Awaitable[object]]:
        limiter = nbr.AsyncRedisTokenBucket.from_url(url, rate=RATE, capacity=RATE, prefix="nb")
        return limiter.allow

    def bare() -> Callable[[str], Awaitable[object]]:
        c = redis.asyncio.Redis.from_url(url, max_connections=PEER_POOL)
        sha: list[str] = []

        async def call(key: str) -> object:
            if not sha:
                sha.append(await c.script_load(NOOP))
            return await c.evalsha(sha[0], 1, b"nb:{" + key.encode() + b"}", *BARE_ARGS)

        return call

    cases: dict[str, AsyncCase] = {"nanobucket AsyncRedisTokenBucket": nanobucket}
    if installed("limits"):
        import limits
        import limits.aio.storage
        import limits.aio.strategies

        item = limits.RateLimitItemPerSecond(RATE)

        def limits_aio() -> Callable[[str], Awaitable[object]]:
            limiter = limits.aio.strategies.FixedWindowRateLimiter(
                limits.aio.storage.RedisStorage(
                    "async+" + url, implementation="redispy", max_connections=PEER_POOL
                )
            )
            return lambda key: limiter.hit(item, key)

        cases["limits.aio, fixed window"] = limits_aio
    cases["bare EVALSHA (does nothing)"] = bare
    return cases


def redis_usec(client: redis.Redis, url: str, n: int) -> tuple[float, float]:
    """us of Redis CPU per decision of the limiter's script, and of the do-nothing script."""
    limiter = nbr.RedisTokenBucket.from_url(url, rate=RATE, capacity=RATE, prefix="cpu")
    sha = client.script_load(NOOP)
    figures = []
    calls = (lambda: limiter.allow("k"), lambda: client.evalsha(sha, 1, b"cpu:{k}", *BARE_ARGS))
    for call in calls:
        call()
        client.config_resetstat()
        for _ in range(n):
            call()
        stats = client.info("commandstats")["cmdstat_evalsha"]
        figures.append(float(stats["usec_per_call"]))
    return figures[0], figures[1]


def table(title: str, runs: list[dict[str, float]], unit: str = "decisions/s") -> None:
    print(f"\n{title}  (median of {len(runs)} runs; ratio to nanobucket in the same run)")
    base = next(iter(runs[0]))
    for name in runs[0]:
        median = statistics.median(r[name] for r in runs)
        ratio = statistics.median(r[name] / r[base] for r in runs)
        print(f"  {name:<40} {median:12,.0f} {unit}   {ratio:6.2f}x")


@contextlib.contextmanager
def own_server(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    from redis_server import RedisServer, require_redis_server

    server = RedisServer(require_redis_server())
    server.start()
    try:
        yield f"redis://127.0.0.1:{server.port}/0"
    finally:
        server.stop()


def bench_single(url: str, runs: int, seconds: float, tasks: list[int], cpu_n: int) -> None:
    client = nbr.client_from_url(url, socket_timeout=5.0)
    client.flushdb()
    version = client.info("server")["redis_version"]
    print(f"redis-server {version} at {url}; redis-py {redis.__version__}")
    missing = [m for m in ("limits", "throttled", "pyrate_limiter") if not installed(m)]
    if missing:
        print(f"not installed, left out: {', '.join(missing)} (pip install -e '.[bench]')")
    scases, acases = sync_cases(url, client), async_cases(url)
    sync_runs: list[dict[str, float]] = []
    async_runs: dict[int, list[dict[str, float]]] = {n: [] for n in tasks}
    for _ in range(runs):
        sync_runs.append({})
        for name, build in scases.items():
            client.flushdb()  # each case starts from an empty Redis
            sync_runs[-1][name] = sync_rate(build(), seconds)
        for n in tasks:

            async def one_run(n: int = n) -> dict[str, float]:
                figures = {}
                for name, build in acases.items():
                    client.flushdb()
                    figures[name] = await async_rate(build(), n, seconds)
                return figures

            async_runs[n].append(asyncio.run(one_run()))
    table("sync, one thread, one connection", sync_runs)
    for n in tasks:
        table(f"async, {n} task{'s' * (n > 1)} on one loop", async_runs[n])
    script, floor = redis_usec(client, url, cpu_n)
    print(f"\nRedis CPU per decision: the script {script:.2f} us, one doing nothing {floor:.2f} us")


def bench_cluster(runs: int, seconds: float) -> None:
    import redis.asyncio.cluster
    import redis.cluster

    from redis_server import running_cluster

    # running_cluster is a fixture's generator (start, yield, stop): one step in.
    with contextlib.contextmanager(running_cluster)() as cluster:
        ports = cluster.ports
        startup = [redis.cluster.ClusterNode("127.0.0.1", p) for p in ports]
        client = redis.cluster.RedisCluster(startup_nodes=startup)
        limiter = nbr.RedisTokenBucket(client, rate=RATE, capacity=RATE, prefix="nb")
        keys = [f"key-{i}" for i in range(64)]
        shards = {client.keyslot(limiter.key(k)) // 5462 for k in keys}
        results: list[dict[str, float]] = []
        for _ in range(runs):
            it = iter(range(1 << 62))
            sync = sync_rate(lambda: limiter.allow(keys[next(it) % 64]), seconds)

            async def many() -> float:
                aclient = redis.asyncio.cluster.RedisCluster(
                    startup_nodes=[redis.asyncio.cluster.ClusterNode("127.0.0.1", p) for p in ports]
                )
                alimiter = nbr.AsyncRedisTokenBucket(aclient, rate=RATE, capacity=RATE, prefix="nb")
                try:
                    return await async_rate(alimiter.allow, 256, seconds)
                finally:
                    await alimiter.aclose()  # its own bounded copy of the client
                    await aclient.aclose()

            results.append({"sync, one thread": sync, "async, 256 tasks": asyncio.run(many())})
        print(f"\n3-master cluster, keys over {len(shards)} shards (median of {runs} runs)")
        for name in results[0]:
            print(f"  {name:<40} {statistics.median(r[name] for r in results):12,.0f} decisions/s")
        client.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an existing Redis (default: start one on a free port)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0, help="per case and run")
    parser.add_argument("--tasks", default="1,16,256", help="async task counts, comma-separated")
    parser.add_argument("--cpu-n", type=int, default=20_000, help="decisions timed for Redis CPU")
    parser.add_argument("--no-cluster", action="store_true")
    args = parser.parse_args(argv)
    tasks = [int(t) for t in args.tasks.split(",")]
    with own_server(args.url) as url:
        bench_single(url, args.runs, args.seconds, tasks, args.cpu_n)
    if not args.no_cluster:
        bench_cluster(args.runs, args.seconds)


if __name__ == "__main__":
    main()
