"""LeasedTokenBucket under threads: one lease in flight per key per instance.

The documented bound: each instance holds at most ``max_lease - 1`` unspent
tokens between requests, so N instances admit at most
``capacity + N * (max_lease - 1)`` at one instant. Threads that miss the local
lease together must not each take a lease of their own.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from nanobucket import redis as nbr

from redis_server import RedisServer, leased, threads_within

S = 1_000_000_000
THREADS = 8
PROCESSES = 4
#: Hard bound on a threaded phase or a child process.
PHASE = 30.0
SPAWN = multiprocessing.get_context("spawn")


def _threads(count: int, target: Callable[[int], Any]) -> list[Any]:
    return threads_within(count, target, PHASE)


def _drain(limiter: nbr.LeasedTokenBucket, now: int) -> int:
    admitted = 0
    while limiter.allow_at("k", now):
        admitted += 1
    return admitted


def test_threads_missing_the_lease_together_take_one_lease(redis_url: str) -> None:
    prefix = f"threads{random.getrandbits(48):x}"
    client, limiter = leased(redis_url, prefix, 10)
    firsts = _threads(THREADS, lambda _: limiter.allow_at("k", 0))
    # One lease of 10 at t=0, 8 spent: 2 held, never more than max_lease - 1.
    assert firsts == [True] * THREADS
    assert (limiter.held("k"), limiter.round_trips) == (10 - THREADS, 1)
    # At 2 s Redis is full again: the instant admits capacity + what was held.
    at_two_seconds = sum(_threads(THREADS, lambda _: _drain(limiter, 2 * S)))
    assert at_two_seconds == 100 + (10 - THREADS)
    assert limiter.held("k") == 0
    # Round trips at 2 s: 10 leases of 10, one refusal (remembered locally after).
    assert limiter.round_trips == 1 + 100 // 10 + 1
    client.close()


def test_a_bucket_full_for_long_grants_capacity_not_the_idle_time(redis_url: str) -> None:
    # The key's tat (1 s) lies 9 s in the past at 10 s: the bucket is full,
    # not 9 s "more than full": the instant admits capacity, and the first
    # lease (10 tokens at 100/s) leaves 100 ms owed.
    client, limiter = leased(redis_url, f"idle{random.getrandbits(48):x}", 10)
    assert _drain(limiter, 0) == 100
    d = limiter.check_at("k", 10 * S)
    assert (d.allowed, d.remaining, d.retry_after_ns, d.reset_after_ns) == (True, 9, 0, S // 10)
    assert 1 + _drain(limiter, 10 * S) == 100
    client.close()


def test_threads_with_larger_costs_keep_the_bound(redis_url: str) -> None:
    prefix = f"costs{random.getrandbits(48):x}"
    client, limiter = leased(redis_url, prefix, 10)
    # Costs 1..8 at t=0: each thread short of its cost takes the next lease
    # alone; the balance left never reaches max_lease.
    firsts = _threads(THREADS, lambda i: limiter.check_at("k", 0, cost=i + 1))
    assert all(d.allowed for d in firsts)
    spent = sum(range(1, THREADS + 1))  # 36
    assert 0 <= limiter.held("k") <= 10 - 1
    shared = nbr.RedisTokenBucket(client, rate=100, capacity=100, prefix=prefix, timeout=2.0)
    # Everything Redis gave out is spent or held: nothing taken twice.
    assert shared.peek_at("k", 0, cost=0).remaining == 100 - spent - limiter.held("k")
    client.close()


def _instance(url: str, prefix: str, barrier: Any, out: Any) -> None:
    client, limiter = leased(url, prefix, 10)
    firsts = _threads(THREADS, lambda _: limiter.allow_at("k", 0))
    held, trips = limiter.held("k"), limiter.round_trips
    barrier.wait(PHASE)
    later = sum(_threads(THREADS, lambda _: _drain(limiter, 2 * S)))
    out.put((all(firsts), held, trips, later))
    barrier.wait(PHASE)  # nobody gives tokens back while another still counts
    client.close()


@pytest.mark.threads_in_child
def test_four_processes_of_eight_threads_keep_the_bound(redis_url: str) -> None:
    prefix = f"procs{random.getrandbits(48):x}"
    barrier, out = SPAWN.Barrier(PROCESSES), SPAWN.Queue()
    procs = [
        SPAWN.Process(target=_instance, args=(redis_url, prefix, barrier, out))
        for _ in range(PROCESSES)
    ]
    try:
        for p in procs:
            p.start()
        results = [out.get(timeout=2 * PHASE) for _ in procs]
        for p in procs:
            p.join(PHASE)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    assert all(p.exitcode == 0 for p in procs)
    assert all(first for first, _, _, _ in results)
    assert [(held, trips) for _, held, trips, _ in results] == [(10 - THREADS, 1)] * PROCESSES
    at_two_seconds = sum(later for _, _, _, later in results)
    # Exactly capacity plus what each instance held; the documented bound is
    # capacity + N * (max_lease - 1).
    assert at_two_seconds == 100 + PROCESSES * (10 - THREADS)
    assert at_two_seconds <= 100 + PROCESSES * (10 - 1)


def test_threads_waiting_for_a_lease_on_a_hung_redis_get_the_policy(
    own_redis_server: RedisServer,
) -> None:
    server = own_redis_server
    client = redis.Redis(host="127.0.0.1", port=server.port)  # redis-py's defaults
    limiter = nbr.LeasedTokenBucket(
        client,
        rate=100,
        capacity=100,
        max_lease=10,
        on_error="closed",
        breaker=nbr.CircuitBreaker(backoff=60.0, max_backoff=60.0),
    )
    assert limiter.allow("warm")

    def timed(_: int) -> tuple[Any, float]:
        start = time.monotonic()
        d = limiter.check("k")
        return d, time.monotonic() - start

    server.pause()
    try:
        results = _threads(THREADS, timed)
    finally:
        server.resume()
    # One thread takes the lease and times out; the others wait for it
    # (bounded by the timeout too), then find the breaker open.
    assert limiter.round_trips == 2  # the warm lease, one attempt for "k"
    for d, elapsed in results:
        assert (d.allowed, d.source) == (False, "policy:closed")
        assert d.reason in ("timeout", "breaker-open")
        assert elapsed < limiter.timeout + 0.4
    assert [d.reason for d, _ in results].count("timeout") >= 1
    limiter.close()
    client.close()
