"""Waiting: FIFO by reservation, the bound on waiters, timeouts and cancellation, shaping."""

from __future__ import annotations

import asyncio
import threading
import time
from types import ModuleType

import pytest

from nanobucket._core import _acquire, _wait
from nanobucket.layered import all_of
from nanobucket.waiting import LeakyBucket, Waiting

from conftest import ManualClock

S = 1_000_000_000


class Recorder:
    """An injected sleep: records each wait in ns and moves the clock by it (or not)."""

    def __init__(self, clock: ManualClock | None = None) -> None:
        self.clock = clock
        self.waits: list[int] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(round(seconds * S))
        if self.clock is not None:
            self.clock.advance(round(seconds * S))


def test_waiters_are_served_first_in_first_out(impl: ModuleType, clock: ManualClock) -> None:
    b = impl.TokenBucket(rate=1, capacity=2, clock=clock)
    rec = Recorder()  # the clock stands still: each acquire books the next slot
    w = Waiting(b, sleep=rec)
    assert b.allow(cost=2)
    assert w.acquire(cost=2) and w.acquire() and w.acquire(cost=1)
    assert rec.waits == [2 * S, 3 * S, 4 * S]
    # A large cost is not starved: the small ones queue behind it, and so
    # does a plain allow() until every waiter has had its tokens.
    clock.advance(5 * S - 1)
    assert not b.allow()
    clock.advance(1)
    assert b.peek().allowed


def test_acquire_with_tokens_at_hand_does_not_sleep(impl: ModuleType, clock: ManualClock) -> None:
    rec = Recorder()
    w = Waiting(impl.TokenBucket(rate=10, capacity=3, clock=clock), sleep=rec)
    assert [w.acquire() for _ in range(3)] == [True] * 3
    assert rec.waits == []
    assert w.acquire()
    assert rec.waits == [S // 10]


def test_timeout_refuses_at_once_and_reserves_nothing(impl: ModuleType, clock: ManualClock) -> None:
    b = impl.TokenBucket(rate=1, capacity=2, clock=clock)
    rec = Recorder()
    w = Waiting(b, sleep=rec)
    assert b.allow(cost=2)
    before = b.peek(cost=2)
    assert not w.acquire(cost=2, timeout=1.999)
    assert not w.acquire(timeout=0)
    assert rec.waits == []
    assert b.peek(cost=2) == before
    assert w.acquire(cost=2, timeout=2.0)
    assert rec.waits == [2 * S]


def test_keyed_waiting_is_per_key(impl: ModuleType, clock: ManualClock) -> None:
    t = impl.KeyedTokenBucket(rate=2, capacity=1, clock=clock)
    rec = Recorder()
    w = Waiting(t, sleep=rec)
    assert w.acquire("a") and w.acquire("a") and w.acquire("b") and w.acquire("a", cost=1)
    assert rec.waits == [S // 2, S]
    with pytest.raises(TypeError, match="key first"):
        w.acquire()


def test_the_bound_on_waiters_refuses_at_once(impl: ModuleType, clock: ManualClock) -> None:
    b = impl.TokenBucket(rate=1, capacity=1, clock=clock)
    release = threading.Event()
    sleeping = threading.Semaphore(0)

    def sleep(seconds: float) -> None:
        sleeping.release()
        release.wait(10)

    w = Waiting(b, max_waiters=2, sleep=sleep)
    assert b.allow()
    results: list[bool] = []
    threads = [threading.Thread(target=lambda: results.append(w.acquire())) for _ in range(2)]
    for th in threads:
        th.start()
    for _ in range(2):
        assert sleeping.acquire(timeout=10)
    assert w.waiters == 2
    before = b.peek()
    assert before.retry_after_ns == 3 * S  # two waiters hold the next two slots
    assert w.acquire() is False  # the third is refused at once...
    assert b.peek() == before  # ...and reserves nothing
    release.set()
    for th in threads:
        th.join(10)
    assert results == [True, True] and w.waiters == 0


def test_a_full_queue_still_rejects_bad_arguments(impl: ModuleType, clock: ManualClock) -> None:
    # Found by the long fuzz run: with shape=True nothing checked the cost
    # before the full queue refused, so cost=nan read as a refusal (False).
    bucket = impl.TokenBucket(rate=10, capacity=2, clock=clock)
    keyed = impl.KeyedTokenBucket(rate=10, capacity=2, clock=clock)
    for shape in (True, False):
        full = Waiting(bucket, max_waiters=0, shape=shape)
        with pytest.raises(TypeError):
            full.acquire(cost=float("nan"), timeout=0.0)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            full.acquire(cost=3)
        with pytest.raises(TypeError):
            asyncio.run(full.acquire_async(cost=1.5))  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            Waiting(keyed, max_waiters=0, shape=shape).acquire(["unhashable"])
    assert Waiting(bucket, max_waiters=0, shape=True).acquire(timeout=0.0) is False
    assert bucket.tokens() == 2.0  # nothing was reserved by any of them


def test_an_interrupted_thread_waiter_gives_its_tokens_back(
    impl: ModuleType, clock: ManualClock
) -> None:
    b = impl.TokenBucket(rate=1, capacity=3, clock=clock)

    def sleep(seconds: float) -> None:
        raise KeyboardInterrupt

    w = Waiting(b, sleep=sleep)
    assert b.allow(cost=3)
    clock.advance(S // 2)
    before = b.peek(cost=3)
    with pytest.raises(KeyboardInterrupt):
        w.acquire(cost=2)
    assert b.peek(cost=3) == before and w.waiters == 0


def test_a_cancelled_task_leaves_nothing_reserved(impl: ModuleType, clock: ManualClock) -> None:
    b = impl.TokenBucket(rate=1, capacity=2, clock=clock)
    asleep = asyncio.Event()

    async def forever(seconds: float) -> None:
        asleep.set()
        await asyncio.Event().wait()

    w = Waiting(b, async_sleep=forever)

    async def main() -> None:
        assert b.allow(cost=2)
        before = b.peek(cost=2)
        task = asyncio.create_task(w.acquire_async(cost=2))
        await asyncio.wait_for(asleep.wait(), 10)
        assert b.peek(cost=2).retry_after_ns == 4 * S and w.waiters == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert b.peek(cost=2) == before and w.waiters == 0

    asyncio.run(main())


def test_async_waiters_in_fifo_order(impl: ModuleType, clock: ManualClock) -> None:
    b = impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock)
    waits: list[int] = []

    async def sleep(seconds: float) -> None:
        waits.append(round(seconds * S))
        await asyncio.sleep(0)

    w = Waiting(b, async_sleep=sleep)
    done: list[int] = []

    async def one(i: int, cost: int) -> None:
        assert await w.acquire_async("k", cost=cost)
        done.append(i)

    async def main() -> None:
        await asyncio.gather(one(0, 1), one(1, 1), one(2, 1), one(3, 1))

    asyncio.run(main())
    assert waits == [S, 2 * S, 3 * S]
    assert sorted(done) == [0, 1, 2, 3]


def test_shaping_spaces_requests_evenly_with_no_burst(clock: ManualClock) -> None:
    rec = Recorder()
    shaper = LeakyBucket(rate=10, capacity=5, clock=clock, sleep=rec)
    assert all(shaper.acquire() for _ in range(4))
    assert shaper.acquire(cost=5)
    assert shaper.acquire()
    assert rec.waits == [S // 10, 2 * S // 10, 3 * S // 10, 4 * S // 10, 9 * S // 10]
    # the same bucket without shaping lets a burst of capacity through at once
    burst = Recorder()
    w = Waiting(shaper.limiter.__class__(rate=10, capacity=5, clock=clock), sleep=burst)
    assert all(w.acquire() for _ in range(6))
    assert burst.waits == [S // 10]


def test_all_of_waits_for_the_slowest_layer(impl: ModuleType, clock: ManualClock) -> None:
    fast = impl.TokenBucket(rate=10, capacity=1, clock=clock)
    slow = impl.KeyedTokenBucket(rate=1, capacity=1, clock=clock)
    rec = Recorder(clock)  # each wait moves the clock
    w = Waiting(all_of(fast, slow), sleep=rec)
    assert w.acquire("a") and w.acquire("a") and w.acquire("b")
    # "a" waits for its own bucket (1 s) and takes the fast layer's token at 1 s;
    # "b", at 1 s, for the fast layer only (its next token at 1.1 s)
    assert rec.waits == [S, S // 10] and clock.now == 11 * S // 10
    assert fast.peek().retry_after_ns == S // 10
    assert slow.peek("a").retry_after_ns == 9 * S // 10  # its second token's refill
    assert not w.acquire("a", timeout=0.5)  # "a" would wait 0.9 s
    assert rec.waits == [S, S // 10]
    # the refused waiter reserved nothing: not in its own bucket, nor in the fast layer
    assert fast.peek().retry_after_ns == S // 10
    assert slow.peek("a").retry_after_ns == 9 * S // 10


def test_an_all_of_waiter_on_a_clock_that_stands_still_is_refused_not_stuck(
    impl: ModuleType,
) -> None:
    # Its turn comes (the sleep returns) but no time passes: the faster layer,
    # empty, stays empty, and the waiter sent back again and again gives up.
    fast = impl.TokenBucket(rate=10, capacity=1, clock=lambda: 0)
    slow = impl.TokenBucket(rate=1, capacity=1, clock=lambda: 0)
    rec = Recorder()
    w = Waiting(all_of(fast, slow), sleep=rec)
    assert w.acquire()
    assert not w.acquire(timeout=5)
    assert rec.waits == [S] * (_wait._STALLS + 1)  # its slow layer's turn, each time
    assert (fast.tokens(), slow.tokens()) == (0.0, 0.0)  # nothing held: each given back
    assert _wait._lines == {}


def test_bad_waiting_arguments(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=1, capacity=1)
    with pytest.raises(TypeError, match="timeout must be a number"):
        b.acquire(timeout="1")
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        b.acquire(timeout=-1)
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        Waiting(b).acquire(timeout=float("nan"))
    with pytest.raises(ValueError, match="max_waiters must be >= 0"):
        Waiting(b, max_waiters=-1)
    with pytest.raises(TypeError, match="cannot reserve"):
        Waiting(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exceeds capacity"):
        b.acquire(cost=2)
    with pytest.raises(ValueError, match="exceeds capacity"):
        asyncio.run(b.acquire_async(cost=2))


# -- real time: small sleeps, no timed assertions ------------------------------


def test_core_acquire_really_waits(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=100, capacity=1)
    t0 = time.monotonic_ns()
    assert b.acquire() and b.acquire() and b.acquire(timeout=5)
    assert time.monotonic_ns() - t0 >= 2 * S // 100 - S // 1000  # two 10 ms slots, at least
    assert _acquire.waiters(b) == 0


def test_core_acquire_timeout_and_threads(impl: ModuleType) -> None:
    b = impl.KeyedTokenBucket(rate=200, capacity=1)
    assert b.acquire("k")
    assert not b.acquire("k", timeout=0)
    got: list[bool] = []
    threads = [
        threading.Thread(target=lambda: got.append(b.acquire("k", timeout=10))) for _ in range(4)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert got == [True] * 4


def test_core_acquire_async_fifo_and_cancel(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=200, capacity=1)
    order: list[int] = []

    async def one(i: int) -> None:
        assert await b.acquire_async(timeout=10)
        order.append(i)

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(4)))
        slow = impl.TokenBucket(rate=1, capacity=1)
        assert await slow.acquire_async()
        task = asyncio.create_task(slow.acquire_async())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert slow.peek().retry_after_ns <= S  # the cancelled second slot is free again

    asyncio.run(main())
    assert order == [0, 1, 2, 3]
