"""A shaper shares its bucket with plain callers and still admits at most capacity + rate*T.

Why the bound holds: every admission owns a part ``[start, end)`` of the
bucket's word, the parts never overlap, and each starts no earlier than the
admission and ends at most ``tau`` (capacity / rate) after it -- a plain
caller by the bucket's test ``end - now <= tau``, a shaped waiter because it
is admitted at the start of its own part (``end = start + cost/rate``). A
waiter that gives up while its part is ahead of the clock takes it out, and
the parts stacked after it move down by as much: a plain caller's part
(admitted before the give-up) still starts at or after the freed part's
start, ahead of the clock, and a waiter behind is woken at its new start.
So the parts of the admissions in any window ``[t0, t1]`` lie in
``[t0, t1 + tau]``, and their costs add up to at most
``(t1 - t0 + tau) / interval <= capacity + rate * (t1 - t0)``.

What breaks it is a waiter admitted after its part starts, the part having
refilled meanwhile: one that cannot be woken earlier (``sleep=``) behind a
give-up, or an ``all_of`` waiter in a layer faster than its slowest.
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import ModuleType
from typing import Any

import pytest

from nanobucket._core import _wait
from nanobucket.layered import all_of
from nanobucket.waiting import Waiting

from conftest import ManualClock

S = 1_000_000_000
#: Waiters paying in tokens (their part is the bucket's capacity long), or shaped (their cost).
BY_SHAPE = pytest.mark.parametrize("shape", [False, True], ids=["tokens", "shape"])


class Timer:
    """An injected asyncio sleep on a fake clock: a nap ends when the test
    moves the clock to its end (`advance_to`)."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.naps: list[tuple[int, asyncio.Future[None]]] = []

    async def __call__(self, seconds: float) -> None:
        end = asyncio.get_running_loop().create_future()
        self.naps.append((self.clock.now + round(seconds * S), end))
        await end

    async def advance_to(self, now: int) -> None:
        self.clock.now = now
        for due, end in self.naps:
            if due <= now and not end.done():
                end.set_result(None)
        await settle()


@pytest.fixture
def timer(clock: ManualClock) -> Timer:
    return Timer(clock)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def over_the_bound(events: list[tuple[int, int]], capacity: int, rate: int) -> list[object]:
    """The windows ``[t0, t1]`` of *events* ``(time ns, cost)`` admitting more
    than ``capacity + rate * (t1 - t0)``, with what they admitted."""
    times = sorted({t for t, _ in events})
    return [
        (t0, t1, tokens)
        for i, t0 in enumerate(times)
        for t1 in times[i:]
        if (tokens := sum(c for t, c in events if t0 <= t <= t1)) * S
        > capacity * S + rate * (t1 - t0)
    ]


def bucket_or_key(
    impl: ModuleType, keyed: bool, rate: float, capacity: int, clock: ManualClock
) -> tuple[Any, tuple[str, ...]]:
    """A `TokenBucket`, or a `KeyedTokenBucket` and the key its verbs take first."""
    if keyed:
        return impl.KeyedTokenBucket(rate=rate, capacity=capacity, clock=clock), ("k",)
    return impl.TokenBucket(rate=rate, capacity=capacity, clock=clock), ()


@pytest.mark.parametrize("keyed", [False, True], ids=["bucket", "keyed"])
def test_shaped_waiters_moved_up_and_plain_callers_admit_exactly_the_bound(
    impl: ModuleType, clock: ManualClock, timer: Timer, keyed: bool
) -> None:
    # rate 1/s, capacity 3. At 0 a plain caller takes 2; shaped A (cost 2)
    # is given the part [2, 4) s and B (cost 1) [4, 5). A gives up at 1: B
    # moves to [2, 3) and the plain caller at 1 has one token (3 - 1 + 1 <=
    # 3). B and a plain caller at 2; C (cost 3) is given [5, 8) and admitted
    # at 5, before a last plain caller at 6. The windows [0, 2], [5, 6] and
    # [0, 6] admit exactly capacity + rate * T, none more.
    table, key = bucket_or_key(impl, keyed, 1, 3, clock)
    w = Waiting(table, shape=True, async_sleep=timer)
    events: list[tuple[int, int]] = []
    plain: list[tuple[int, int, bool]] = []

    def allow(cost: int) -> None:
        ok = table.allow(*key, cost=cost)
        plain.append((clock.now, cost, ok))
        if ok:
            events.append((clock.now, cost))

    async def admitted(cost: int) -> int:
        assert await w.acquire_async(*key, cost=cost)
        events.append((clock.now, cost))
        return clock.now

    async def main() -> None:
        allow(2)
        a = asyncio.create_task(admitted(2))
        await settle()
        b = asyncio.create_task(admitted(1))
        await settle()
        allow(1)  # refused: owed to A and B
        assert [due for due, _ in timer.naps] == [2 * S, 4 * S]
        await timer.advance_to(1 * S)
        a.cancel()
        await settle()
        assert [due for due, _ in timer.naps][2:] == [2 * S]  # B moved up to A's start
        allow(1)
        await timer.advance_to(2 * S)
        assert b.done() and b.result() == 2 * S
        allow(1)
        allow(1)  # refused: the bucket is empty
        c = asyncio.create_task(admitted(3))
        await settle()
        await timer.advance_to(3 * S)
        allow(1)  # refused: owed to C
        await timer.advance_to(5 * S)
        assert c.done() and c.result() == 5 * S
        allow(1)  # refused: C has just taken all
        await timer.advance_to(6 * S)
        allow(1)
        with pytest.raises(asyncio.CancelledError):
            await a

    asyncio.run(main())
    assert _wait._lines == {}
    assert plain == [
        (0, 2, True),
        (0, 1, False),
        (1 * S, 1, True),
        (2 * S, 1, True),
        (2 * S, 1, False),
        (3 * S, 1, False),
        (5 * S, 1, False),
        (6 * S, 1, True),
    ]
    assert sorted(events) == [(0, 2), (1 * S, 1), (2 * S, 1), (2 * S, 1), (5 * S, 3), (6 * S, 1)]
    assert over_the_bound(events, capacity=3, rate=1) == []
    for t0, t1 in [(0, 2 * S), (5 * S, 6 * S), (0, 6 * S)]:  # tight
        assert sum(c for t, c in events if t0 <= t <= t1) * S == 3 * S + (t1 - t0)


@BY_SHAPE
def test_a_give_up_ahead_of_a_sleep_nothing_cuts_short_gives_nothing_back(
    impl: ModuleType, clock: ManualClock, timer: Timer, shape: bool
) -> None:
    # rate 1/s, capacity 1, the token spent at 0. Task A is given the slot
    # [1, 2) s, thread B -- a plain sleep=, which a move up cannot shorten --
    # [2, 3) and sleeps 2 s. A gives up at 0. Were A's token given back, B's
    # part would be [1, 2) while B still wakes at 2, and a plain caller at 2
    # would find a token too: two admitted at 2 s by a bucket of capacity 1.
    # So A's token is not given back: B at 2 s, the next caller at 3 s.
    table = impl.TokenBucket(rate=1, capacity=1, clock=clock)
    naps: list[float] = []
    release = threading.Event()

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        assert release.wait(10)

    events: list[tuple[int, int]] = [(0, 1)]
    assert table.allow()
    results: list[object] = []

    async def main() -> None:
        a = asyncio.create_task(Waiting(table, shape=shape, async_sleep=timer).acquire_async())
        await settle()
        w = Waiting(table, shape=shape, sleep=sleep)
        b = threading.Thread(target=lambda: results.append(w.acquire()))
        b.start()
        try:
            for _ in range(1000):
                if naps:
                    break
                time.sleep(0.01)
            assert naps == [2.0]
            a.cancel()
            await settle()
            for now in (1 * S, 2 * S, 3 * S):
                clock.now = now
                if table.allow():
                    events.append((now, 1))
                if now == 2 * S:
                    release.set()
                    b.join(10)
                    assert results == [True]
                    events.append((now, 1))
        finally:
            release.set()
            b.join(10)
        with pytest.raises(asyncio.CancelledError):
            await a

    asyncio.run(main())
    assert _wait._lines == {}
    assert over_the_bound(events, capacity=1, rate=1) == []
    assert sorted(events) == [(0, 1), (2 * S, 1), (3 * S, 1)]


@BY_SHAPE
@pytest.mark.parametrize("keyed", [False, True], ids=["bucket", "keyed"])
def test_a_faster_rate_moves_the_waiters_up_with_their_parts(
    impl: ModuleType, clock: ManualClock, timer: Timer, keyed: bool, shape: bool
) -> None:
    # rate 1/s, capacity 1. At 0 a plain caller takes the token and a waiter
    # is given the part [1, 2) s. At 0 the rate becomes 10/s: the tokens
    # carry over (-1 of them), so the waiter's part is now [0.1, 0.2) s and
    # it is admitted at 0.1 s; plain callers then every 0.1 s from 0.2 s.
    # Left asleep until 1 s, it would be admitted beside the plain caller
    # of 1 s: two in an instant, capacity 1.
    table, key = bucket_or_key(impl, keyed, 1, 1, clock)
    w = Waiting(table, shape=shape, async_sleep=timer)
    events: list[tuple[int, int]] = []
    tenth = S // 10

    async def main() -> None:
        assert table.allow(*key)
        events.append((0, 1))
        waiter = asyncio.create_task(w.acquire_async(*key))
        await settle()
        assert [due for due, _ in timer.naps] == [S]
        table.reconfigure(rate=10, now=0)
        await settle()
        assert [due for due, _ in timer.naps][1:] == [tenth]  # woken: due at 0.1 s
        await timer.advance_to(tenth)
        assert waiter.done() and waiter.result() is True
        events.append((tenth, 1))
        assert not table.allow(*key)  # its part is [0.1, 0.2) s
        for now in range(2 * tenth, S + 1, tenth):
            await timer.advance_to(now)
            assert table.allow(*key), now
            events.append((now, 1))

    asyncio.run(main())
    assert _wait._lines == {}
    assert over_the_bound(events, capacity=1, rate=10) == []


@BY_SHAPE
def test_a_slower_rate_moves_the_waiters_later_within_their_timeouts(
    impl: ModuleType, clock: ManualClock, timer: Timer, shape: bool
) -> None:
    # rate 10/s, capacity 1. At 0 a plain caller takes the token; A (no
    # timeout) is given [0.1, 0.2) s and B (timeout 0.5 s) [0.2, 0.3) s. At 0
    # the rate becomes 1/s: A's part moves to [1, 2) s and A with it; B's to
    # [2, 3) s, past its timeout: B is refused at once, its token given back.
    # Left at 0.1 s, A would be admitted before its part began.
    table = impl.TokenBucket(rate=10, capacity=1, clock=clock)
    w = Waiting(table, shape=shape, async_sleep=timer)

    async def main() -> None:
        assert table.allow()
        a = asyncio.create_task(w.acquire_async())
        await settle()
        b = asyncio.create_task(w.acquire_async(timeout=0.5))
        await settle()
        assert [due for due, _ in timer.naps] == [S // 10, 2 * S // 10]
        table.reconfigure(rate=1, now=0)
        await settle()
        assert b.done() and b.result() is False
        assert [due for due, _ in timer.naps][2:] == [S]  # A woken: due at 1 s
        await timer.advance_to(S // 10)
        assert not a.done()
        await timer.advance_to(S)
        assert a.done() and a.result() is True
        assert table.peek().retry_after_ns == S  # A's part [1, 2) s: B's went back

    asyncio.run(main())
    assert _wait._lines == {}


@pytest.mark.parametrize("keyed", [False, True], ids=["bucket", "keyed"])
def test_a_reconfigure_wakes_a_thread_waiter_to_its_new_time(
    impl: ModuleType, clock: ManualClock, keyed: bool
) -> None:
    # The clock stands at 0. A thread due in 50 s (rate 1/50 s) is woken by
    # a faster rate: due at 1 ms, it is admitted at once (its part [1, 2)
    # ms: -1 token). At 12.5 s a token, another thread with a 30 s timeout
    # is due at 25 s; a slower rate (100 s a token) moves it to 200 s, past
    # its timeout: it is refused at once and its token goes back.
    table, key = bucket_or_key(impl, keyed, 0.02, 1, clock)
    results: list[bool] = []

    def acquire(timeout: float | None) -> threading.Thread:
        thread = threading.Thread(
            target=lambda: results.append(table.acquire(*key, timeout=timeout))
        )
        thread.start()
        deadline = time.monotonic() + 10
        while not _wait._lines:  # in line: asleep, or about to be
            assert time.monotonic() < deadline, "the waiter never joined the line"
            time.sleep(0.001)
        return thread

    assert table.allow(*key)
    first = acquire(None)
    table.reconfigure(rate=1000, now=0)
    first.join(10)
    assert not first.is_alive() and results == [True]
    table.reconfigure(rate=0.08, now=0)
    assert table.peek(*key).retry_after_ns == 25 * S  # -1 token: 2 to refill
    second = acquire(30)
    table.reconfigure(rate=0.01, now=0)
    second.join(10)
    assert not second.is_alive() and results == [True, False]
    assert table.peek(*key).retry_after_ns == 200 * S and _wait._lines == {}


@BY_SHAPE
def test_an_all_of_waiter_keeps_its_faster_layer_within_the_bound(
    impl: ModuleType, clock: ManualClock, timer: Timer, shape: bool
) -> None:
    # Two layers of rate 1/s, capacity 1; the slow one is owed until 5 s.
    # The waiter holds its place in the slow layer only; plain callers of
    # the fast layer take its token at 1, 2, 3 and 4 s, and at 5 s the
    # waiter, due, takes the fast layer's token of that instant: the plain
    # caller after it finds none. (Holding a fast token from 0 on, it was
    # admitted at 5 s beside the plain caller: two in an instant at capacity 1.)
    fast = impl.TokenBucket(rate=1, capacity=1, clock=clock)
    slow = impl.TokenBucket(rate=1, capacity=1, clock=clock)
    assert slow.allow() and all(
        slow.reserve(cost=1, max_wait_ns=1 << 62, now=0) >= 0 for _ in range(4)
    )
    w = Waiting(all_of(fast, slow), shape=shape, async_sleep=timer)
    events: list[tuple[int, int]] = []

    async def main() -> None:
        waiter = asyncio.create_task(w.acquire_async())
        await settle()
        assert fast.tokens() == 1.0  # nothing held in the fast layer while it waits
        for now in range(1 * S, 6 * S, S):
            await timer.advance_to(now)
            if waiter.done() and (now, 1) not in events:
                assert waiter.result() is True
                events.append((now, 0))  # the waiter, before the plain caller of that instant
            if fast.allow():
                events.append((now, 1))
        assert waiter.done() and waiter.result() is True

    asyncio.run(main())
    assert events == [(1 * S, 1), (2 * S, 1), (3 * S, 1), (4 * S, 1), (5 * S, 0)]
    admitted = [(t, 1) for t, _ in events]
    assert over_the_bound(admitted, capacity=1, rate=1) == []
    assert (fast.peek().retry_after_ns, slow.peek().retry_after_ns) == (S, S)


@BY_SHAPE
def test_an_all_of_waiter_refused_by_a_faster_layer_joins_again_behind(
    impl: ModuleType, clock: ManualClock, timer: Timer, shape: bool
) -> None:
    # The slow layer is owed until 2 s. At 2 s a plain caller of the fast
    # layer takes its token before the waiter runs: the waiter, due, finds
    # the fast layer empty, gives the slow layer's token back and joins
    # again in the fast layer's line (due at 3 s), where it is admitted.
    fast = impl.TokenBucket(rate=1, capacity=1, clock=clock)
    slow = impl.TokenBucket(rate=1, capacity=1, clock=clock)
    assert slow.allow() and slow.reserve(cost=1, max_wait_ns=1 << 62, now=0) == S  # owed until 2 s
    w = Waiting(all_of(fast, slow), shape=shape, async_sleep=timer)

    async def main() -> list[int]:
        waiter = asyncio.create_task(w.acquire_async(timeout=10))
        await settle()
        admitted = []
        clock.now = 2 * S
        assert fast.allow()  # before the waiter's nap ends
        admitted.append(2 * S)
        await timer.advance_to(2 * S)
        assert not waiter.done()
        assert slow.peek().retry_after_ns == 0  # its slow token went back
        await timer.advance_to(3 * S)
        assert waiter.done() and waiter.result() is True
        admitted.append(3 * S)
        # Both layers admitted it at 3 s: each is empty then, its next token at 4 s.
        assert (fast.peek().retry_after_ns, slow.peek().retry_after_ns) == (S, S)
        return admitted

    assert asyncio.run(main()) == [2 * S, 3 * S]
    assert _wait._lines == {}
