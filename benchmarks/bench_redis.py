"""Redis limiter throughput on loopback: a script, not part of the pytest suite.

    python benchmarks/bench_redis.py            # starts its own redis-server on a free port
    python benchmarks/bench_redis.py --url redis://127.0.0.1:6379/0

Prints decisions/s for one connection: ``RedisTokenBucket.allow`` (one round
trip each) on a ``from_url`` client and on redis-py's default client (which
the limiter reaches through a bounded pool of its own), the same for
``AsyncRedisTokenBucket``, ``allow_many`` batches (one pipelined round trip per batch), the
``LeasedTokenBucket`` (local fast path) with its round trips per 1000
decisions, and the in-process ``KeyedTokenBucket`` for scale.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable

import redis
import redis.asyncio

import nanobucket as nb
from nanobucket import redis as nbr

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "tests"))


def bench_redis_rate(label: str, run: Callable[[], int], seconds: float) -> float:
    """Call *run* (returns decisions made) until *seconds* pass; print and return decisions/s."""
    run()  # warm: script loaded, connection open, lease sizes grown
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        done += run()
    per_s = done / elapsed
    print(f"  {label:<46} {per_s:12,.0f} decisions/s")
    return per_s


def bench_redis_all(url: str, seconds: float) -> None:
    client = nbr.client_from_url(url, socket_timeout=1.0)
    client.flushdb()
    # A rate far above what one client reaches, so every decision is a full
    # GCRA update and nothing is refused: we measure the machinery.
    plain = nbr.RedisTokenBucket(client, rate=1_000_000, capacity=1_000_000, prefix="bench")
    print(f"one connection to {url}")
    single = bench_redis_rate(
        "RedisTokenBucket.allow (1 key)", lambda: sum(plain.allow("k") for _ in range(200)), seconds
    )
    host, port = client.get_connection_kwargs()["host"], client.get_connection_kwargs()["port"]
    user = redis.Redis(host=host, port=port)  # redis-py's defaults: the limiter derives a pool
    default = nbr.RedisTokenBucket(user, rate=1_000_000, capacity=1_000_000, prefix="bench")
    derived = bench_redis_rate(
        "RedisTokenBucket.allow (redis.Redis() defaults)",
        lambda: sum(default.allow("k") for _ in range(200)),
        seconds,
    )
    print(f"  {'':<46} {derived / single:12.2f}x the from_url client")
    default.close()
    user.close()
    bench_async(host, port, url, seconds)
    keys = [f"user{i}" for i in range(100)]
    bench_redis_rate(
        "RedisTokenBucket.allow_many (batches of 100)", lambda: len(plain.allow_many(keys)), seconds
    )
    for max_lease in (100, 1000):
        leased = nbr.LeasedTokenBucket(
            client,
            rate=1_000_000,
            capacity=1_000_000,
            prefix=f"lease{max_lease}",
            max_lease=max_lease,
        )

        def spend(leased: nbr.LeasedTokenBucket = leased) -> int:
            return sum(leased.allow("k") for _ in range(10_000))

        per_s = bench_redis_rate(f"LeasedTokenBucket.allow (max_lease={max_lease})", spend, seconds)
        before_trips = leased.round_trips
        for _ in range(100_000):
            leased.allow("k")
        trips = (leased.round_trips - before_trips) / 100
        print(
            f"  {'':<46} {trips:12.2f} round trips / 1000 decisions, "
            f"{per_s / single:.0f}x RedisTokenBucket.allow"
        )
        leased.close()
    local = nb.KeyedTokenBucket(rate=1_000_000, capacity=1_000_000)
    bench_redis_rate(
        f"KeyedTokenBucket.allow in process ({nb.IMPLEMENTATION})",
        lambda: sum(local.allow("k") for _ in range(10_000)),
        seconds,
    )
    client.flushdb()
    client.close()


def bench_async(host: str, port: int, url: str, seconds: float) -> None:
    """``AsyncRedisTokenBucket.allow`` one at a time: from_url client, then redis-py's defaults."""

    async def run() -> None:
        rates = []
        for label, client in (
            (
                "from_url",
                nbr.client_from_url(url, socket_timeout=nbr.DEFAULT_SOCKET_TIMEOUT, asyncio=True),
            ),
            ("redis.asyncio.Redis() defaults", redis.asyncio.Redis(host=host, port=port)),
        ):
            limiter = nbr.AsyncRedisTokenBucket(
                client, rate=1_000_000, capacity=1_000_000, prefix="bench"
            )
            await limiter.allow("k")
            done, start = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < seconds:
                for _ in range(200):
                    done += await limiter.allow("k")
            rates.append(done / elapsed)
            print(
                f"  {'AsyncRedisTokenBucket.allow (' + label + ')':<46} "
                f"{rates[-1]:12,.0f} decisions/s"
            )
            await limiter.aclose()
        print(f"  {'':<46} {rates[1] / rates[0]:12.2f}x the from_url client")

    asyncio.run(run())


def redis_server_binary(script: str) -> str:
    """The redis-server binary, or exit saying that *script* needs one."""
    from redis_server import find_redis_server

    binary = find_redis_server()
    if binary is None:
        sys.exit(f"{script}: no redis-server binary; install one or pass --url")
    return binary


def on_server(url: str | None, script: str, bench: Callable[[str], None]) -> None:
    """``bench(url)``; without *url*, on a redis-server of its own, closed afterwards."""
    if url:
        bench(url)
        return
    from redis_server import RedisServer

    server = RedisServer(redis_server_binary(script))
    server.start()
    try:
        bench(server.url)
    finally:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an existing Redis (default: start one on a free port)")
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    args = parser.parse_args()
    on_server(args.url, "bench_redis", lambda url: bench_redis_all(url, args.seconds))


if __name__ == "__main__":
    main()
