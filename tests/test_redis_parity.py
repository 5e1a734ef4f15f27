"""Redis limiters against the in-process table: refund, reset, reconfigure, reserve, all_of."""

from __future__ import annotations

import asyncio
import random
from types import ModuleType
from typing import Any

import pytest

from nanobucket import all_of
from nanobucket import redis as nbr

S = 1_000_000_000
MS = 1_000_000
#: Rates whose intervals are whole ms, apart by powers of 2: the microsecond carry-over is
#: the ns one exactly.
RATES = (1, 2, 4, 8)


def _fresh(prefix: str) -> str:
    return f"{prefix}{random.getrandbits(48):x}"


@pytest.fixture
def client(redis_url: str) -> Any:
    c = nbr.client_from_url(redis_url, socket_timeout=2.0)
    yield c
    c.close()


def _fields(d: Any) -> tuple[Any, ...]:
    return (d.allowed, d.remaining, d.retry_after_ns, d.reset_after_ns)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_differential_refund_reset_reserve_reconfigure(
    impl: ModuleType, client: Any, seed: int
) -> None:
    rng = random.Random(seed)
    rate, capacity = 4, 6
    redis_lim = nbr.RedisTokenBucket(
        client, rate=rate, capacity=capacity, prefix=_fresh("par"), timeout=2.0
    )
    local = impl.KeyedTokenBucket(rate=rate, capacity=capacity)
    now = 10**15
    keys = ["a", "b", "c"]
    # Each limit once: a limit's key space returned to still holds its buckets, which
    # carrying over never makes laxer (see test_redis_prefix); the in-process table has one.
    used = {(rate, capacity)}
    for _ in range(300):
        now += rng.choice([0, 0, MS, 50 * MS, 250 * MS, S])
        key = rng.choice(keys)
        cost = rng.randint(0, capacity)  # of the limit in force
        op = rng.choice(["check", "check", "refund", "reset", "reserve", "reconf", "peek"])
        if op == "check":
            assert _fields(redis_lim.check_at(key, now, cost)) == _fields(
                local.check_at(key, now, cost)
            )
        elif op == "peek":
            assert _fields(redis_lim.peek_at(key, now, cost)) == _fields(
                local.peek_at(key, now, cost)
            )
        elif op == "refund":
            assert redis_lim.refund_at(key, now, cost) is True
            local.refund_at(key, now, cost)
        elif op == "reset":
            assert redis_lim.reset(key) is True
            local.reset(key)
        elif op == "reserve":
            max_wait = rng.choice([0, S, 3 * S])
            assert redis_lim.reserve(
                key, cost=cost, max_wait_ns=max_wait, now=now
            ) == local.reserve(key, cost=cost, max_wait_ns=max_wait, now=now)
        else:
            # Rates whose 1e6/rate is whole and a capacity that never grows past
            # a full bucket's: the microsecond carry-over is the ns one exactly.
            fresh = [(r, c) for r in RATES for c in (6, 4, 3) if c <= capacity]
            fresh = [limit for limit in fresh if limit not in used]
            if not fresh:
                continue
            new_rate, new_cap = rng.choice(fresh)
            used.add((new_rate, new_cap))
            redis_lim.reconfigure(rate=new_rate, capacity=new_cap, now=now)
            local.reconfigure(rate=new_rate, capacity=new_cap, now=now)
            rate, capacity = new_rate, new_cap
        for k in keys:
            assert _fields(redis_lim.peek_at(k, now, 1)) == _fields(local.peek_at(k, now, 1))


def test_reconfigure_carries_spent_tokens(client: Any) -> None:
    lim = nbr.RedisTokenBucket(client, rate=1, capacity=4, prefix=_fresh("rc"), timeout=2.0)
    assert lim.allow_at("alice", 0, cost=3)
    lim.reconfigure(rate=10, capacity=2, now=0)  # the 1 token left stays
    assert (lim.rate, lim.capacity) == (10, 2)
    assert lim.tokens_at("alice", 0) == 1.0
    assert lim.tokens_at("alice", 100 * MS) == 2.0
    # A full (missing) bucket stays full under a larger capacity.
    lim.reconfigure(capacity=5, now=0)
    assert lim.tokens_at("bob", 0) == 5.0
    # Another instance switched without migrating reads the same state.
    other = nbr.RedisTokenBucket(
        client, rate=1, capacity=4, prefix=lim._prefix.decode(), timeout=2.0
    )
    other.reconfigure(rate=10, capacity=5, migrate=False)
    assert other.tokens_at("alice", 0) == lim.tokens_at("alice", 0)


def test_refund_and_reset_on_redis_time(client: Any) -> None:
    lim = nbr.RedisTokenBucket(client, rate=1, capacity=3, prefix=_fresh("rt"), timeout=2.0)
    assert lim.allow("k", cost=3)
    assert not lim.allow("k")
    assert lim.refund("k", cost=2) is True
    assert [lim.allow("k") for _ in range(3)] == [True, True, False]
    assert lim.reset("k") is True
    assert lim.check("k", cost=3).remaining == 0 and lim.peek("k").allowed is False
    assert lim.reset("k") and lim.peek("k", cost=3).allowed


def test_refund_reset_on_failed_redis_follow_the_policy() -> None:
    down = nbr.CircuitBreaker(clock=lambda: 0)
    down.record_failure()
    import redis

    for policy in ("open", "closed"):
        lim = nbr.RedisTokenBucket(redis.Redis(), 1, 2, on_error=policy, breaker=down)
        assert lim.refund("a") is False  # lost, not queued
        assert lim.reset("a") is False
        assert lim.reserve("a", cost=1, max_wait_ns=S) == (0 if policy == "open" else -1)
    lim = nbr.RedisTokenBucket(redis.Redis(), 1, 2, on_error="raise", breaker=down)
    with pytest.raises(nbr.RedisUnavailable):
        lim.refund("a")
    from nanobucket import KeyedTokenBucket

    fb = KeyedTokenBucket(rate=1, capacity=2)
    lim = nbr.RedisTokenBucket(redis.Redis(), 1, 2, fallback=fb, breaker=down)
    assert fb.allow_at("a", 0, cost=2)
    assert lim.refund_at("a", 0, 2) is False  # Redis did not take it; the fallback did
    assert fb.tokens_at("a", 0) == 2.0


def test_all_of_two_redis_layers_all_or_nothing(client: Any) -> None:
    per_key = nbr.RedisTokenBucket(client, rate=1, capacity=5, prefix=_fresh("l1"), timeout=2.0)
    shared = nbr.RedisTokenBucket(client, rate=1, capacity=3, prefix=_fresh("l2"), timeout=2.0)
    limit = all_of(per_key, shared)
    assert [limit.allow_at("a", 0) for _ in range(4)] == [True, True, True, False]
    # The refusal came from the second layer and charged the first nothing.
    assert per_key.tokens_at("a", 0) == 2.0 and shared.tokens_at("a", 0) == 0.0
    assert limit.check_at("a", 0).layer == 1
    assert per_key.tokens_at("a", 0) == 2.0
    limit.refund_at("a", 0, 1)
    assert (per_key.tokens_at("a", 0), shared.tokens_at("a", 0)) == (3.0, 1.0)
    assert limit.acquire("b", timeout=0) and limit.acquire("b", cost=2, timeout=0)
    assert limit.acquire("b", timeout=0) is False  # the second layer would wait: nothing kept
    assert per_key.peek("b", cost=2).allowed  # 5 - 3 spent: the refused acquire kept none


def test_all_of_redis_and_in_process(impl: ModuleType, client: Any) -> None:
    red = nbr.RedisTokenBucket(client, rate=1, capacity=2, prefix=_fresh("mx"), timeout=2.0)
    local = impl.TokenBucket(rate=1, capacity=3)
    limit = all_of(red, local)
    assert [limit.allow_at("a", 0) for _ in range(3)] == [True, True, False]
    assert local.tokens_at(0) == 1.0
    assert limit.allow_at("b", 0) and not limit.allow_at("b", 0)
    assert red.tokens_at("b", 0) == 1.0  # refunded after the in-process layer refused


def test_all_of_waiter_holds_a_slow_redis_layer_and_takes_the_rest_at_its_turn(
    impl: ModuleType, client: Any
) -> None:
    # The Redis layer refills every 0.5 s, the in-process one every 1 ms: the
    # waiter holds its Redis token (no line: its clock is Redis's) and takes
    # the in-process one when that token is due, all or none.
    red = nbr.RedisTokenBucket(client, rate=2, capacity=1, prefix=_fresh("hw"), timeout=2.0)
    local = impl.TokenBucket(rate=1000, capacity=1)
    limit = all_of(red, local)
    assert limit.acquire("a", timeout=0)
    assert limit.acquire("a", timeout=2.0)
    assert limit.acquire("a", timeout=0) is False  # both spent again; nothing kept
    assert not red.peek("a").allowed  # its second token: taken by the waiter


def test_acquire_reserves_and_waits(client: Any) -> None:
    # 250 ms a token: the reserve below comes well within one token of the wake-up
    # even on a loaded machine (at 10 ms a token, one CI run refilled it in between).
    lim = nbr.RedisTokenBucket(client, rate=4, capacity=1, prefix=_fresh("aq"), timeout=2.0)
    assert lim.acquire("k")
    assert lim.acquire("k", timeout=0) is False  # would wait 250 ms
    assert lim.acquire("k", timeout=5.0) is True  # reserved, slept
    assert lim.reserve("k", cost=1) == -1


def test_acquire_async_gives_back_on_cancel(client: Any, redis_url: str) -> None:
    prefix = _fresh("aa")
    lim = nbr.RedisTokenBucket(client, rate=1, capacity=1, prefix=prefix, timeout=2.0)

    async def main() -> None:
        assert await lim.acquire_async("k")
        task = asyncio.ensure_future(lim.acquire_async("k", timeout=10))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The reservation went back: owed about one token, not two.
        assert 0 < lim.peek("k").retry_after_ns <= S

    asyncio.run(main())

    async def main_async() -> None:
        alim = nbr.AsyncRedisTokenBucket.from_url(
            redis_url, rate=1, capacity=1, prefix=_fresh("ab"), socket_timeout=2.0
        )
        assert await alim.acquire_async("k")
        assert await alim.acquire_async("k", timeout=0) is False
        task = asyncio.ensure_future(alim.acquire_async("k", timeout=10))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert 0 < (await alim.peek("k")).retry_after_ns <= S
        assert await alim.refund("k") is True
        assert (await alim.peek("k")).allowed
        assert await alim.allow("k") and await alim.reset("k") and await alim.allow("k")
        await alim.reconfigure(capacity=2, now=None)
        assert alim.capacity == 2
        await alim.aclose()

    asyncio.run(main_async())


def test_leased_refund_reset(client: Any) -> None:
    prefix = _fresh("ls")
    lim = nbr.LeasedTokenBucket(
        client, rate=1, capacity=10, prefix=prefix, min_lease=4, max_lease=4, timeout=2.0
    )
    assert lim.allow_at("k", 0)  # leases 4, spends 1
    assert lim.held("k") == 3
    assert lim.allow_at("k", 0, cost=2) and lim.held("k") == 1
    red = nbr.RedisTokenBucket(client, rate=1, capacity=10, prefix=prefix, timeout=2.0)
    assert red.tokens_at("k", 0) == 6.0
    assert lim.refund_at("k", 0, 3) is True  # 2 fit in the lease (max_lease - 1), 1 to Redis
    assert lim.held("k") == 3 and red.tokens_at("k", 0) == 7.0
    assert lim.reset("k") is True
    assert lim.held("k") == 0 and red.tokens_at("k", 0) == 10.0
    assert lim.reserve("k", cost=10, now=0) == 0
    assert lim.reserve("k", cost=1, now=0) == -1
    assert lim.reserve("k", cost=1, max_wait_ns=2 * S, now=0) == S
