"""paced / paced_gather: items and coroutines released at the limiter's exact times, in
order, and a cancelled pacing gives its reservation back and leaves nothing running.

The bucket runs on a `ManualClock` that the injected asyncio sleep moves by
exactly the time asked (or, for `Held`, only when the test lets it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any, TypeVar

import pytest

import nanobucket as nb
from nanobucket import RateLimited

from conftest import ManualClock

S = 1_000_000_000
MS = 1_000_000


class Advance:
    """An async sleep that moves *clock* by exactly the time asked, at once."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.naps: list[int] = []

    async def __call__(self, seconds: float) -> None:
        ns = round(seconds * S)
        self.naps.append(ns)
        self.clock.advance(ns)
        await asyncio.sleep(0)


class Held(Advance):
    """Like `Advance`, but each nap lasts until the test sets `go`."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.go = asyncio.Event()
        self.sleeping = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.sleeping.set()
        await self.go.wait()
        await super().__call__(seconds)


Nap = TypeVar("Nap", bound=Advance)


def on_clock(
    impl: ModuleType, nap: type[Nap], rate: int, capacity: int
) -> tuple[Any, Any, ManualClock, Nap]:
    """A bucket on a `ManualClock`, a `Waiting` over it that sleeps with *nap*, the clock
    and the nap."""
    clock = ManualClock()
    bucket = impl.TokenBucket(rate=rate, capacity=capacity, clock=clock)
    sleep = nap(clock)
    return bucket, nb.Waiting(bucket, async_sleep=sleep), clock, sleep


def test_paced_releases_items_at_the_exact_times_in_order(impl: ModuleType) -> None:
    _, limiter, clock, sleep = on_clock(impl, Advance, rate=4, capacity=2)

    async def source() -> AsyncIterator[str]:
        for item in "abcde":
            yield item

    async def main() -> list[tuple[str, int]]:
        return [(item, clock.now) async for item in nb.paced(source(), limiter)]

    assert asyncio.run(main()) == [
        ("a", 0),
        ("b", 0),
        ("c", S // 4),
        ("d", S // 2),
        ("e", 3 * S // 4),
    ]
    assert sleep.naps == [S // 4] * 3


def test_paced_over_a_plain_iterable_with_a_key_and_a_cost(impl: ModuleType) -> None:
    clock = ManualClock()
    sleep = Advance(clock)
    limiter = nb.Waiting(impl.KeyedTokenBucket(rate=10, capacity=4, clock=clock), async_sleep=sleep)

    async def main() -> list[tuple[int, int]]:
        return [(n, clock.now) async for n in nb.paced(range(4), limiter, key="api", cost=2)]

    assert asyncio.run(main()) == [(0, 0), (1, 0), (2, S // 5), (3, 2 * S // 5)]


def test_a_cancelled_paced_gives_its_reservation_back(impl: ModuleType) -> None:
    bucket, limiter, _, held = on_clock(impl, Held, rate=1, capacity=1)
    got: list[int] = []

    async def consume() -> None:
        async for n in nb.paced(range(10), limiter):
            got.append(n)

    async def main() -> None:
        task = asyncio.create_task(consume())
        await held.sleeping.wait()  # the 2nd item waits for its token (due at 1 s)
        assert bucket.peek().retry_after_ns == 2 * S  # the bucket is owed it
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert got == [0]
    assert bucket.peek().retry_after_ns == S  # given back: owed nothing beyond the 1st


def test_paced_refuses_a_wait_longer_than_its_timeout(impl: ModuleType) -> None:
    bucket = impl.TokenBucket(rate=1, capacity=1, clock=lambda: 0)

    async def main() -> list[int]:
        return [n async for n in nb.paced(range(3), bucket, timeout=0.5)]

    with pytest.raises(RateLimited) as refused:
        asyncio.run(main())
    assert refused.value.retry_after_ns == S


def test_paced_gather_starts_each_at_its_time_and_keeps_order(impl: ModuleType) -> None:
    _, limiter, clock, _ = on_clock(impl, Advance, rate=10, capacity=3)
    started: list[tuple[int, int]] = []

    async def job(n: int) -> int:
        started.append((n, clock.now))
        await asyncio.sleep(0.001 * (5 - n))  # later ones finish first
        return n * n

    results = asyncio.run(nb.paced_gather([job(n) for n in range(6)], limiter))
    assert results == [0, 1, 4, 9, 16, 25]
    assert started == [(0, 0), (1, 0), (2, 0), (3, S // 10), (4, 2 * S // 10), (5, 3 * S // 10)]


def test_paced_gather_holds_at_most_max_in_flight(impl: ModuleType) -> None:
    _, limiter, _, _ = on_clock(impl, Advance, rate=1000, capacity=100)
    running = peak = 0

    async def job(n: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.002)
        running -= 1
        return n

    results = asyncio.run(nb.paced_gather([job(n) for n in range(9)], limiter, max_in_flight=3))
    assert results == list(range(9)) and peak == 3


def test_paced_gather_stops_at_the_first_error(impl: ModuleType) -> None:
    """One raises: it is raised, the running one is cancelled, the rest never start
    (their coroutines are closed: no "never awaited" warning, an error here)."""
    _, limiter, _, _ = on_clock(impl, Advance, rate=1000, capacity=100)
    events: list[str] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            events.append("slow cancelled")
            raise

    async def bad() -> None:
        await asyncio.sleep(0.001)
        raise KeyError("boom")

    async def never() -> None:
        events.append("never ran")

    coros = [slow(), bad(), never(), never()]
    with pytest.raises(KeyError, match="boom"):
        asyncio.run(nb.paced_gather(coros, limiter, max_in_flight=2))
    assert events == ["slow cancelled"]


def test_paced_gather_return_exceptions_collects_them(impl: ModuleType) -> None:
    _, limiter, _, _ = on_clock(impl, Advance, rate=1000, capacity=100)

    async def div(n: int) -> float:
        return 1 / n

    results = asyncio.run(
        nb.paced_gather([div(1), div(0), div(2)], limiter, return_exceptions=True)
    )
    assert results[0] == 1.0 and isinstance(results[1], ZeroDivisionError) and results[2] == 0.5


def test_a_cancelled_paced_gather_leaves_nothing_behind(impl: ModuleType) -> None:
    bucket, limiter, _, held = on_clock(impl, Held, rate=1, capacity=2)
    events: list[str] = []

    async def job(n: int) -> None:
        try:
            events.append(f"start {n}")
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            events.append(f"cancelled {n}")
            raise

    async def main() -> None:
        gather = asyncio.create_task(nb.paced_gather([job(n) for n in range(5)], limiter))
        await held.sleeping.wait()  # two run; the third waits for its token
        await asyncio.sleep(0)
        assert bucket.peek().retry_after_ns == 2 * S
        gather.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gather

    asyncio.run(main())
    assert events == ["start 0", "start 1", "cancelled 0", "cancelled 1"]
    assert bucket.peek().retry_after_ns == S  # the third's reservation went back


def test_bad_arguments_are_refused(impl: ModuleType) -> None:
    bucket = impl.TokenBucket(rate=1, capacity=2)

    async def first(**kwargs: Any) -> list[int]:
        return [n async for n in nb.paced(range(1), **kwargs)]

    async def nothing() -> None:
        pass

    with pytest.raises(TypeError, match="no acquire_async"):
        asyncio.run(first(limiter=object()))
    with pytest.raises(ValueError, match="exceeds capacity 2"):
        asyncio.run(first(limiter=bucket, cost=3))
    with pytest.raises(TypeError, match="is keyed"):
        asyncio.run(first(limiter=impl.KeyedTokenBucket(1, 1)))
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        asyncio.run(first(limiter=bucket, timeout=-1))
    coro = nothing()
    with pytest.raises(ValueError, match="max_in_flight must be >= 1"):
        asyncio.run(nb.paced_gather([coro], bucket, max_in_flight=0))
    with pytest.raises(TypeError, match="return_exceptions must be a bool"):
        asyncio.run(nb.paced_gather([coro], bucket, return_exceptions=1))  # type: ignore[arg-type]
    coro.close()
    assert asyncio.run(nb.paced_gather([], bucket)) == []
