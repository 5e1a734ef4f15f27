"""``with limiter:`` / ``async with limiter:``: wait for one token, as aiolimiter's limiters do.

On both implementations (``impl``): a `TokenBucket`, a `Waiting` and a
`OneKey` enter by acquiring one token with no timeout, in line; leaving gives
nothing back; a full line of waiters raises `RateLimited`; a cancelled
``async with`` (``asyncio.wait_for``, ``asyncio.timeout``) reserves nothing. The clock stands
still, so every wait is the exact time the bucket owes; waits are 1 ms
(rate 1000/s) where a real sleep is taken.
"""

from __future__ import annotations

import asyncio
from types import ModuleType
from typing import Any

import pytest

import nanobucket as nb
from nanobucket._core import _acquire

MS = 1_000_000


def test_with_bucket_waits_for_one_token_in_line(impl: ModuleType) -> None:
    bucket = impl.TokenBucket(rate=1000, capacity=2, clock=lambda: 0)
    with bucket as entered:
        assert entered is bucket
        assert bucket.tokens() == 1.0
        with bucket, bucket:  # the second waits: 1 ms owed, as the clock stands still
            assert bucket.peek(cost=0).reset_after_ns == 3 * MS
    assert bucket.peek(cost=0).reset_after_ns == 3 * MS  # leaving gave nothing back


def test_async_with_bucket_waits_for_one_token(impl: ModuleType) -> None:
    bucket = impl.TokenBucket(rate=1000, capacity=1, clock=lambda: 0)

    async def enter_twice() -> Any:
        async with bucket as first, bucket:
            return first, bucket.peek(cost=0).reset_after_ns

    assert asyncio.run(enter_twice()) == (bucket, 2 * MS)


def test_leaving_by_an_exception_gives_nothing_back(impl: ModuleType) -> None:
    bucket = impl.TokenBucket(rate=1, capacity=2, clock=lambda: 0)
    with pytest.raises(KeyError), bucket:
        raise KeyError("in the block")
    assert bucket.tokens() == 1.0


def test_a_cancelled_async_with_reserves_nothing(impl: ModuleType) -> None:
    bucket = impl.TokenBucket(rate=1, capacity=1, clock=lambda: 0)
    bucket.allow()

    async def enter() -> None:
        async with bucket:  # owes 1 s: cancelled first
            pytest.fail("entered")

    async def wait_past_the_timeout() -> None:
        await asyncio.wait_for(enter(), 0.01)

    with pytest.raises(TimeoutError):
        asyncio.run(wait_past_the_timeout())
    assert bucket.peek(cost=0).reset_after_ns == 1_000_000_000  # one token owed, not two


def test_a_full_line_raises_rate_limited(impl: ModuleType) -> None:
    bucket = impl.TokenBucket(rate=1, capacity=1, clock=lambda: 0)
    bucket.allow()
    # The line of a bucket's own acquire holds DEFAULT_MAX_WAITERS callers: fill it.
    for _ in range(_acquire.DEFAULT_MAX_WAITERS):
        assert _acquire.enter_default(bucket)
    try:
        with pytest.raises(nb.RateLimited) as caught, bucket:
            pytest.fail("entered")
        assert caught.value.retry_after_ns == 1_000_000_000
        assert caught.value.decision.allowed is False
        with pytest.raises(nb.RateLimited):
            asyncio.run(bucket.__aenter__())
    finally:
        for _ in range(_acquire.DEFAULT_MAX_WAITERS):
            _acquire.leave_default(bucket)
    assert bucket.peek(cost=0).reset_after_ns == 1_000_000_000  # nothing reserved


def test_with_waiting_uses_its_own_line(impl: ModuleType) -> None:
    slept: list[float] = []
    waiting = nb.Waiting(
        impl.TokenBucket(rate=10, capacity=1, clock=lambda: 0), max_waiters=1, sleep=slept.append
    )
    with waiting as entered, waiting:
        assert entered is waiting
    assert slept == [0.1]
    full = nb.Waiting(impl.TokenBucket(rate=10, capacity=1, clock=lambda: 0), max_waiters=0)
    with full:
        pass
    with pytest.raises(nb.RateLimited) as caught, full:
        pytest.fail("entered")
    assert caught.value.retry_after_ns == 100_000_000


def test_async_with_waiting(impl: ModuleType) -> None:
    naps: list[float] = []

    async def nap(seconds: float) -> None:
        naps.append(seconds)

    waiting = nb.Waiting(impl.TokenBucket(rate=4, capacity=1, clock=lambda: 0), async_sleep=nap)

    async def enter_twice() -> int:
        async with waiting, waiting:
            return int(waiting.peek(cost=0).reset_after_ns)

    assert asyncio.run(enter_twice()) == 500 * MS
    assert naps == [0.25]


def test_with_a_keyed_limiter_needs_a_key(impl: ModuleType) -> None:
    waiting = nb.Waiting(impl.KeyedTokenBucket(rate=1, capacity=1))
    with pytest.raises(TypeError, match="takes the key first"), waiting:
        pytest.fail("entered")
    with pytest.raises(TypeError), impl.KeyedTokenBucket(rate=1, capacity=1):
        pytest.fail("entered")


def test_with_one_key(impl: ModuleType) -> None:
    table = impl.KeyedTokenBucket(rate=1000, capacity=1, clock=lambda: 0)
    one = nb.OneKey(table, "all")
    with one as entered, one:
        assert entered is one
    assert table.peek("all", 0).reset_after_ns == 2 * MS
    assert table.tokens("other") == 1.0

    async def enter() -> int:
        async with one:
            return int(table.peek("all", 0).reset_after_ns)

    assert asyncio.run(enter()) == 3 * MS
