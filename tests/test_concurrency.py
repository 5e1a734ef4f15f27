"""In-flight limits: exact counts, FIFO handoff, give-ups that hold nothing, all_of, threads."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

import nanobucket as nb
from nanobucket._compose.concurrency import _FOREVER_S
from nanobucket._core import _wait
from nanobucket._core._wait import Bell
from nanobucket.concurrency import Concurrency, KeyedConcurrency, Slot
from nanobucket.decorator import RateLimited
from nanobucket.layered import all_of

from conftest import ManualClock

S = 1_000_000_000


def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    """Wait (bounded) for another thread to reach a point the test can see."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the other thread never got there"
        time.sleep(0.001)


class Sleeper:
    """A sleep_or_wake the test drives: each thread sleeps until handed its slots,
    or until the test says its time is up (or that it is interrupted)."""

    def __init__(self) -> None:
        self.asked: dict[str, float] = {}
        self.bells: dict[str, Bell] = {}
        self.outcome: dict[str, str] = {}  # "time up" or "interrupt"

    def __call__(self, bell: Bell, seconds: float) -> bool:
        name = threading.current_thread().name
        self.asked[name] = seconds
        self.bells[name] = bell
        assert bell.wait(10)  # rung by a handoff, or by the test
        outcome = self.outcome.get(name)
        if outcome == "interrupt":
            raise Interrupted(name)
        return outcome != "time up"

    def end(self, name: str, outcome: str, by_release: Concurrency | None = None) -> None:
        """End *name*'s sleep on *outcome*: rung by the test, or by *by_release*
        releasing a slot, which hands it to *name* at that very moment."""
        until(lambda: name in self.bells)
        self.outcome[name] = outcome
        if by_release is None:
            self.bells[name].set()
        else:
            by_release.release()


class Interrupted(Exception):
    pass


class Waiters:
    """Threads calling acquire on one limiter, each recording what it got."""

    def __init__(self, limiter: Any) -> None:
        self.limiter = limiter
        self.threads: dict[str, threading.Thread] = {}
        self.got: dict[str, object] = {}
        self.order: list[str] = []

    def start(self, name: str, *args: Any, **kwargs: Any) -> None:
        before = self.limiter.waiters

        def run() -> None:
            try:
                self.got[name] = ok = self.limiter.acquire(*args, **kwargs)
                if ok:
                    self.order.append(name)
            except Interrupted as e:
                self.got[name] = e

        t = self.threads[name] = threading.Thread(target=run, name=name)
        t.start()
        until(lambda: self.limiter.waiters == before + 1 or name in self.got)

    def join(self, name: str) -> object:
        self.threads[name].join(10)
        assert not self.threads[name].is_alive()
        return self.got[name]


def run_all(threads: list[threading.Thread]) -> None:
    """Start every thread, then see each end (within a minute)."""
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)


def sleeping_line(max_in_flight: int, held: int = 1) -> tuple[Sleeper, Concurrency, Waiters]:
    """A pool with *held* slots taken, whose waiters sleep in a `Sleeper` the test drives."""
    sleeper = Sleeper()
    pool = Concurrency(max_in_flight, sleep_or_wake=sleeper)
    assert pool.allow(cost=held)
    return sleeper, pool, Waiters(pool)


# -- counts, decisions, bad input -------------------------------------------


def test_counts_and_decisions_are_exact() -> None:
    pool = Concurrency(3)
    assert (pool.max_in_flight, pool.in_flight, pool.tokens(), pool.waiters) == (3, 0, 3.0, 0)
    assert pool.check(cost=2) == nb.Decision(True, 1, 0, 0, 3)
    assert pool.peek(cost=1) == nb.Decision(True, 0, 0, 0, 3)  # as if spent, nothing taken
    assert pool.peek(cost=2) == nb.Decision(False, 1, 0, 0, 3)
    assert pool.check(cost=2) == nb.Decision(False, 1, 0, 0, 3)
    assert (pool.allow(cost=0), pool.allow(), pool.allow()) == (True, True, False)
    assert (pool.in_flight, pool.tokens(), pool.tokens_at(5)) == (3, 0.0, 0.0)
    pool.release(cost=2)
    pool.refund_at(7)
    assert pool.in_flight == 0 and pool._counts == {}  # nothing held: nothing kept
    assert pool.allow_at(0, cost=3) and not pool.check_at(0).allowed
    assert pool.peek_at(10**12).remaining == 0
    pool.refund(cost=3)
    assert repr(pool) == "Concurrency(max_in_flight=3, in_flight=0)"


def test_a_release_without_its_acquire_is_an_error() -> None:
    pool = Concurrency(2)
    with pytest.raises(ValueError, match=r"release of 1 slot\(s\), but 0 held"):
        pool.release()
    assert pool.allow()
    with pytest.raises(ValueError, match=r"release of 2 slot\(s\), but 1 held"):
        pool.release(cost=2)
    assert pool.in_flight == 1  # the refused release changed nothing
    per_user = KeyedConcurrency(2)
    assert per_user.allow("alice")
    with pytest.raises(ValueError, match="but 0 held for key 'bob'"):
        per_user.release("bob")
    with pytest.raises(ValueError, match="but 1 held for key 'alice'"):
        per_user.release("alice", cost=2)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"max_in_flight": 0}, ValueError, "max_in_flight must be >= 1, got 0"),
        ({"max_in_flight": -3}, ValueError, "max_in_flight must be >= 1"),
        ({"max_in_flight": 1.5}, TypeError, "max_in_flight must be an int, not float"),
        ({"max_in_flight": True}, TypeError, "max_in_flight must be an int, not bool"),
        ({"max_in_flight": "10"}, TypeError, "max_in_flight must be an int, not str"),
        ({"max_in_flight": 2, "max_waiters": -1}, ValueError, "max_waiters must be >= 0"),
        ({"max_in_flight": 2, "max_waiters": 1.0}, TypeError, "max_waiters must be an int"),
        ({"max_in_flight": 2, "sleep_or_wake": 3}, TypeError, "sleep_or_wake must be callable"),
        ({"max_in_flight": 2, "async_sleep": "x"}, TypeError, "async_sleep must be callable"),
    ],
)
def test_bad_construction(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    for cls in (Concurrency, KeyedConcurrency):
        with pytest.raises(error, match=match):
            cls(**kwargs)


def test_bad_calls() -> None:
    pool, per_user = Concurrency(2), KeyedConcurrency(2)
    with pytest.raises(TypeError, match="max_keys must be an int"):
        KeyedConcurrency(2, max_keys=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_keys must be in"):
        KeyedConcurrency(2, max_keys=0)
    for call in (pool.allow, pool.check, pool.peek, pool.release, pool.acquire):
        with pytest.raises(ValueError, match="cost 3 exceeds capacity 2"):
            call(3)
        with pytest.raises(ValueError, match="cost must be >= 0"):
            call(-1)
        with pytest.raises(TypeError, match="cost must be an int, not bool"):
            call(True)
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        pool.acquire(timeout=-1)
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        pool.acquire(timeout=float("nan"))
    with pytest.raises(TypeError, match="timeout must be a number"):
        pool.slot(timeout="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cost 3 exceeds"):
        pool.slot(3)  # checked when made, not when entered
    with pytest.raises(ValueError, match="now must be in"):
        pool.allow_at(-1)
    with pytest.raises(TypeError, match="now must be an int of nanoseconds"):
        per_user.check_at("alice", 1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unhashable"):
        per_user.allow(["alice"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        asyncio.run(pool.acquire_async(timeout=-1))
    assert pool.in_flight == 0 and len(per_user) == 0


# -- the line: first in, first out ------------------------------------------


def test_waiters_are_served_in_arrival_order() -> None:
    pool = Concurrency(1)
    assert pool.acquire()
    waiters = Waiters(pool)
    names = [f"w{i}" for i in range(6)]
    for name in names:
        waiters.start(name)
    assert pool.waiters == 6
    assert not pool.allow() and not pool.acquire(timeout=0)  # a late arrival waits its turn
    for i, name in enumerate(names):
        pool.release()  # handed straight to the first in line: never free in between
        assert waiters.join(name) is True
        assert waiters.order == names[: i + 1]
        assert (pool.in_flight, pool.waiters) == (1, 5 - i)
    pool.release()
    assert pool.in_flight == 0 and pool._counts == {}


def test_a_large_cost_is_not_passed_by_small_ones() -> None:
    pool = Concurrency(3)
    assert pool.allow(cost=2)
    waiters = Waiters(pool)
    waiters.start("big", cost=2)  # needs 2, only 1 free
    waiters.start("small", cost=1)  # 1 would fit, but big is first
    assert not pool.allow() and pool.in_flight == 2 and pool.tokens() == 1.0
    pool.release()  # 1 held: big's 2 fit
    assert waiters.join("big") is True
    assert (pool.in_flight, pool.waiters) == (3, 1)
    pool.release(cost=2)  # big done: small's 1 fits
    assert waiters.join("small") is True
    assert waiters.order == ["big", "small"]
    assert pool.in_flight == 2
    pool.release(cost=2)
    assert pool._counts == {}


def test_a_waiter_that_times_out_holds_nothing_and_moves_the_line_up() -> None:
    sleeper, pool, waiters = sleeping_line(3, held=2)
    waiters.start("big", cost=2, timeout=0.25)
    waiters.start("small", cost=1, timeout=None)
    sleeper.end("big", "time up")  # big gives up: small fits in the free slot at once
    assert waiters.join("big") is False
    assert waiters.join("small") is True
    assert sleeper.asked == {"big": 0.25, "small": _FOREVER_S}  # each slept its timeout
    assert (pool.in_flight, pool.waiters) == (3, 0)


def test_handed_its_slot_as_its_time_runs_out_a_waiter_keeps_it() -> None:
    sleeper, pool, waiters = sleeping_line(1)
    waiters.start("a", timeout=1.0)
    waiters.start("b", timeout=1.0)
    # Its sleep ends on the timeout as the release hands it the slot (and rings it).
    sleeper.end("a", "time up", by_release=pool)
    assert waiters.join("a") is True  # told True: it holds the slot and knows it
    assert (pool.in_flight, pool.waiters) == (1, 1)
    pool.release()
    assert waiters.join("b") is True and pool.in_flight == 1


def test_interrupted_as_it_is_handed_its_slot_a_waiter_passes_it_on() -> None:
    sleeper, pool, waiters = sleeping_line(1)
    waiters.start("a")
    waiters.start("b")
    sleeper.end("a", "interrupt", by_release=pool)  # a: handed the slot, then interrupted
    assert isinstance(waiters.join("a"), Interrupted)
    assert waiters.join("b") is True  # a's slot went on to b
    assert waiters.order == ["b"]
    assert (pool.in_flight, pool.waiters) == (1, 0)


def test_an_interrupted_waiter_leaves_the_line() -> None:
    sleeper, pool, waiters = sleeping_line(1)
    waiters.start("a")
    sleeper.end("a", "interrupt")
    assert isinstance(waiters.join("a"), Interrupted)
    assert (pool.in_flight, pool.waiters) == (1, 0)
    pool.release()
    assert pool._counts == {}


def test_the_line_is_bounded() -> None:
    pool = Concurrency(1, max_waiters=1)
    assert pool.max_waiters == 1 and pool.acquire()
    waiters = Waiters(pool)
    waiters.start("a", timeout=5)
    t0 = time.monotonic()
    assert pool.acquire(timeout=5) is False  # the line is full: refused at once
    with pytest.raises(RateLimited, match=r"retry after 0\.000 s"), pool:
        pass
    assert time.monotonic() - t0 < 4
    pool.release()
    assert waiters.join("a") is True
    assert Concurrency(1, max_waiters=0).acquire() is True


def test_a_real_timeout_returns_false_holding_nothing() -> None:
    pool = Concurrency(1)
    assert pool.acquire()
    t0 = time.monotonic()
    assert pool.acquire(timeout=0.05) is False
    assert 0.04 < time.monotonic() - t0 < 5
    assert (pool.in_flight, pool.waiters) == (1, 0)


def test_with_blocks_release_even_when_the_block_raises() -> None:
    pool = Concurrency(2)
    with pytest.raises(KeyError), pool:
        assert pool.in_flight == 1
        raise KeyError
    with pool.slot(cost=2, timeout=0) as held:
        assert isinstance(held, Slot) and pool.in_flight == 2
        with pytest.raises(RateLimited) as refused, pool.slot(timeout=0):
            pass  # pragma: no cover - not entered
        assert refused.value.retry_after_ns == 0 and refused.value.decision.remaining == 0
    assert pool.in_flight == 0


# -- asyncio ------------------------------------------------------------------


async def held_with_two_waiting(
    pool: Concurrency,
) -> tuple[asyncio.Task[bool], asyncio.Task[bool]]:
    """Take *pool*'s one slot, then line tasks a and b up for it, in that order."""
    assert await pool.acquire_async()
    a = asyncio.create_task(pool.acquire_async())
    b = asyncio.create_task(pool.acquire_async())
    await asyncio.sleep(0)
    return a, b


def test_a_cancelled_task_holds_nothing() -> None:
    pool = Concurrency(1)

    async def main() -> None:
        a, b = await held_with_two_waiting(pool)
        assert pool.waiters == 2
        a.cancel()
        with pytest.raises(asyncio.CancelledError):
            await a
        assert (pool.in_flight, pool.waiters) == (1, 1)
        pool.release()
        assert await b is True
        assert (pool.in_flight, pool.waiters) == (1, 0)
        pool.release()

    asyncio.run(main())
    assert pool._counts == {}


def test_release_and_cancel_together_pass_the_slot_on() -> None:
    pool = Concurrency(1)

    async def main() -> None:
        a, b = await held_with_two_waiting(pool)
        pool.release()  # hands a the slot...
        a.cancel()  # ...and a is cancelled before it runs again
        with pytest.raises(asyncio.CancelledError):
            await a
        assert await b is True  # a's slot went on to b
        assert (pool.in_flight, pool.waiters) == (1, 0)

    asyncio.run(main())


def test_async_timeouts_are_exact_with_an_injected_sleep() -> None:
    asked: list[float] = []

    async def nap(seconds: float) -> None:
        asked.append(seconds)  # time is up at once

    pool = Concurrency(1, async_sleep=nap)

    async def main() -> None:
        assert await pool.acquire_async()
        assert await pool.acquire_async(timeout=0.25) is False
        assert await pool.acquire_async(timeout=0) is False  # no wait at all
        assert (pool.in_flight, pool.waiters) == (1, 0)
        real = Concurrency(1)
        assert await real.acquire_async()
        assert await real.acquire_async(timeout=0.02) is False
        assert real.in_flight == 1

    asyncio.run(main())
    assert asked == [0.25]


def test_async_with_and_slot() -> None:
    pool = Concurrency(1)
    per_user = KeyedConcurrency(1)

    async def main() -> None:
        async with pool:
            assert pool.in_flight == 1
            with pytest.raises(RateLimited):
                async with pool.slot(timeout=0):
                    pass  # pragma: no cover - not entered
        async with per_user.slot("alice", timeout=0):
            assert per_user.in_flight("alice") == 1
        small = Concurrency(1, max_waiters=0)
        assert small.allow()
        with pytest.raises(RateLimited):
            async with small:
                pass  # pragma: no cover - not entered

    asyncio.run(main())
    assert pool.in_flight == 0 and len(per_user) == 0


def test_threads_and_tasks_share_one_line() -> None:
    pool = Concurrency(1)
    assert pool.allow()
    waiters = Waiters(pool)
    waiters.start("thread")
    order: list[str] = []

    async def main() -> None:
        async def task() -> None:
            assert await pool.acquire_async(timeout=10)
            order.append("task")

        t = asyncio.create_task(task())
        while pool.waiters < 2:
            await asyncio.sleep(0.001)
        pool.release()  # to the thread, first in line
        await asyncio.to_thread(waiters.join, "thread")
        order.append("thread done")
        pool.release()  # from this loop's thread: the task
        await t

    asyncio.run(main())
    assert order == ["thread done", "task"] and waiters.order == ["thread"]
    assert pool.in_flight == 1


def test_a_waiter_whose_loop_closed_gets_nothing() -> None:
    pool = Concurrency(1)
    assert pool.allow()
    loop = asyncio.new_event_loop()
    task = loop.create_task(pool.acquire_async())
    loop.run_until_complete(asyncio.sleep(0))
    assert pool.waiters == 1
    loop.close()  # the task can never run again
    pool.release()  # nobody to hand the slot to: it stays free
    assert (pool.in_flight, pool.waiters) == (0, 0) and pool._counts == {}
    task._log_destroy_pending = False  # type: ignore[attr-defined]  # a closed loop's task
    del task
    gc.collect()


# -- under threads ------------------------------------------------------------


def test_eight_threads_never_exceed_the_limit_and_lose_nothing() -> None:
    pool = Concurrency(3)
    guard = threading.Lock()
    inside = [0, 0, 0]  # now, most seen, entries
    start = threading.Barrier(8)
    iterations = 2_000

    def enter() -> None:
        with guard:
            inside[0] += 1
            inside[1] = max(inside[1], inside[0])
            inside[2] += 1
        time.sleep(0)  # let another thread run while the slot is held
        with guard:
            inside[0] -= 1

    def run(i: int) -> None:
        start.wait()
        for n in range(iterations):
            way = (i + n) % 3
            if way == 0:
                with pool:
                    enter()
            elif way == 1:
                assert pool.acquire(timeout=60)
                enter()
                pool.release()
            else:
                while not pool.allow():
                    time.sleep(0)
                enter()
                pool.release()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    run_all(threads)
    assert 1 <= inside[1] <= 3
    assert inside[0] == 0 and inside[2] == 8 * iterations
    assert (pool.in_flight, pool.waiters, pool._counts) == (0, 0, {})


def test_threads_and_tasks_together_never_exceed_the_limit() -> None:
    pool = Concurrency(2)
    guard = threading.Lock()
    inside = [0, 0, 0]  # now, most seen, entries

    def enter() -> None:
        with guard:
            inside[0] += 1
            inside[1] = max(inside[1], inside[0])
            inside[2] += 1

    def leave() -> None:
        with guard:
            inside[0] -= 1

    def thread() -> None:
        for _ in range(500):
            with pool:
                enter()
                time.sleep(0)
                leave()

    async def task() -> None:
        for _ in range(500):
            async with pool:
                enter()
                await asyncio.sleep(0)
                leave()

    async def tasks() -> None:
        await asyncio.gather(*(task() for _ in range(4)))

    threads = [threading.Thread(target=thread) for _ in range(4)]
    threads.append(threading.Thread(target=asyncio.run, args=(tasks(),)))
    run_all(threads)
    assert 1 <= inside[1] <= 2 and inside[0] == 0 and inside[2] == 8 * 500
    assert (pool.in_flight, pool.waiters, pool._counts) == (0, 0, {})


def test_keyed_under_threads(impl: ModuleType) -> None:
    per_key = KeyedConcurrency(2, max_keys=4)
    limit = all_of(per_key, impl.TokenBucket(rate=10**9, capacity=10**9))
    guard = threading.Lock()
    now: dict[str, int] = {"a": 0, "b": 0}
    most: dict[str, int] = {"a": 0, "b": 0}
    done = [0]

    def run(i: int) -> None:
        key = "ab"[i % 2]
        for _ in range(500):
            with limit.slot(key, timeout=60):
                with guard:
                    now[key] += 1
                    most[key] = max(most[key], now[key])
                time.sleep(0)
                with guard:
                    now[key] -= 1
                    done[0] += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    run_all(threads)
    assert max(most.values()) <= 2 and done[0] == 8 * 500
    assert (len(per_key), per_key.waiters) == (0, 0)


# -- keyed: bounded memory ----------------------------------------------------


def test_keyed_memory_is_bounded() -> None:
    per_user = KeyedConcurrency(2, max_keys=2)
    assert per_user.max_keys == 2 and per_user.max_in_flight == 2
    assert per_user.check("alice") == nb.Decision(True, 1, 0, 0, 2)
    assert per_user.allow_at("bob", 0, cost=2)
    assert len(per_user) == 2
    # A third key is refused, clearly, until a key has nothing in flight.
    assert per_user.check("carol") == nb.Decision(False, 0, 0, 0, 2)
    assert per_user.peek_at("carol", 0) == nb.Decision(False, 0, 0, 0, 2)
    t0 = time.monotonic()
    assert per_user.acquire("carol", timeout=5) is False  # refused at once, not waited for
    assert time.monotonic() - t0 < 4
    assert per_user.allow("carol", cost=0)  # a probe takes nothing, keeps nothing
    assert per_user.peek("bob") == nb.Decision(False, 0, 0, 0, 2)
    assert (per_user.tokens("alice"), per_user.tokens_at("dave", 0)) == (1.0, 2.0)
    per_user.release("alice")
    assert len(per_user) == 1  # alice has nothing in flight: forgotten
    assert per_user.allow("carol") and len(per_user) == 2
    per_user.refund_at("carol", 0)
    per_user.refund("bob", cost=2)
    assert len(per_user) == 0 and per_user.in_flight("bob") == 0
    assert repr(per_user) == "KeyedConcurrency(max_in_flight=2, max_keys=2, keys=0)"


def test_keyed_waiters_wait_per_key() -> None:
    per_user = KeyedConcurrency(1, max_keys=2)
    assert per_user.acquire("alice")
    waiters = Waiters(per_user)
    waiters.start("w", "alice", timeout=10)
    assert len(per_user) == 1 and per_user.allow("bob")  # bob has his own slots
    assert not per_user.allow("alice")
    per_user.release("alice")
    assert waiters.join("w") is True and per_user.in_flight("alice") == 1

    async def main() -> None:
        assert await per_user.acquire_async("bob", timeout=0) is False
        per_user.release("bob")
        assert await per_user.acquire_async("bob", timeout=0) is True

    asyncio.run(main())


# -- all_of ---------------------------------------------------------------------


@pytest.fixture
def bucket(impl: ModuleType, clock: ManualClock) -> Any:
    """The token layer of the all_of tests: 1 token/s, capacity 3, on the test's clock."""
    return impl.TokenBucket(rate=1, capacity=3, clock=clock)


def test_all_of_holds_a_slot_only_if_every_layer_admits(clock: ManualClock, bucket: Any) -> None:
    pool = Concurrency(2)
    limit = all_of(pool, bucket)
    assert limit.releases and not all_of(bucket).releases
    assert [limit.allow(), limit.allow(), limit.allow()] == [True, True, False]
    assert (pool.in_flight, bucket.tokens()) == (2, 1.0)  # the refusal charged no token
    limit.release()
    assert (pool.in_flight, bucket.tokens()) == (1, 1.0)  # a release keeps the token spent
    assert limit.allow() and not limit.allow()  # now the bucket is empty...
    assert (pool.in_flight, bucket.tokens()) == (2, 0.0)
    limit.release(cost=2)
    assert not limit.allow()  # ...and its refusal gives the slot back at once
    assert (pool.in_flight, bucket.tokens()) == (0, 0.0)
    d = limit.check()
    assert (d.allowed, d.layer, d.retry_after_ns, pool.in_flight) == (False, 1, S, 0)
    assert (d.decisions[0].allowed, d.decisions[0].remaining) == (True, 1)  # peeked
    clock.advance(S)
    d = limit.check()
    assert (d.allowed, d.layer, d.remaining, pool.in_flight) == (True, 1, 0, 1)
    assert limit.peek().layer == 1 and limit.tokens() == 0.0
    limit.refund()  # the work did not happen: the token and the slot
    assert (pool.in_flight, bucket.tokens()) == (0, 1.0)


def test_all_of_with_the_slot_last_gives_the_token_back(bucket: Any) -> None:
    pool = Concurrency(1)
    limit = all_of(bucket, pool)
    assert limit.allow_at(None, 0) and not limit.allow_at(None, 0)
    assert (pool.in_flight, bucket.tokens_at(0)) == (1, 2.0)
    d = limit.check_at(None, 0)
    assert (d.allowed, d.layer, d.remaining, bucket.tokens_at(0)) == (False, 1, 0, 2.0)
    limit.release()
    assert limit.check_at(None, 0).allowed and bucket.tokens_at(0) == 1.0
    limit.refund_at(None, 0)
    assert (pool.in_flight, bucket.tokens_at(0), limit.tokens_at(None, 0)) == (0, 2.0, 1.0)


def test_all_of_keyed_in_flight(impl: ModuleType, clock: ManualClock) -> None:
    per_user = KeyedConcurrency(1)
    limit = all_of(per_user, impl.KeyedTokenBucket(rate=1, capacity=5, clock=clock))
    assert limit.allow("alice") and not limit.allow("alice") and limit.allow("bob")
    with pytest.raises(TypeError, match="pass a key"):
        limit.release()
    limit.release("alice")
    assert (per_user.in_flight("alice"), len(per_user)) == (0, 1)
    with limit.slot("alice", timeout=0):
        assert per_user.in_flight("alice") == 1
    assert per_user.in_flight("alice") == 0


def test_all_of_without_in_flight_layers_has_nothing_to_release(impl: ModuleType) -> None:
    limit = all_of(impl.TokenBucket(rate=10**9, capacity=10**9))
    with pytest.raises(TypeError, match="no in-flight layer"):
        limit.release()
    with pytest.raises(TypeError, match="no in-flight layer"):
        limit.slot()
    assert limit._rates is None and limit._holding == ()


def test_the_fast_path_of_token_buckets_is_unchanged(impl: ModuleType) -> None:
    two = all_of(impl.TokenBucket(10, 10), impl.TokenBucket(10, 10))
    mixed = all_of(impl.TokenBucket(10, 10), Concurrency(3))
    if impl.__name__.endswith("_c"):
        assert type(two.allow.__self__).__name__ == "AllowAll"  # type: ignore[attr-defined]
    assert type(getattr(mixed.allow, "__self__", None)).__name__ != "AllowAll"


def test_all_of_acquire_waits_for_the_slot_then_the_token(impl: ModuleType) -> None:
    pool = Concurrency(1)
    bucket = impl.TokenBucket(rate=1000, capacity=5)
    limit = all_of(pool, bucket)
    assert limit.acquire(timeout=0)
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(limit.acquire(timeout=10)))
    t.start()
    until(lambda: pool.waiters == 1)
    assert not limit.allow()  # the waiter is first
    limit.release()
    t.join(10)
    assert got == [True] and pool.in_flight == 1
    limit.release()


def test_all_of_acquire_refused_by_the_tokens_holds_nothing(impl: ModuleType) -> None:
    pool = Concurrency(2)
    bucket = impl.TokenBucket(rate=1, capacity=1)
    limit = all_of(pool, bucket)
    assert limit.acquire(timeout=0.1)
    t0 = time.monotonic()
    assert limit.acquire(timeout=0.1) is False  # the token is ~1 s away: refused at once
    assert time.monotonic() - t0 < 0.5
    assert pool.in_flight == 1  # the slot it had taken was released
    assert bucket.peek().retry_after_ns > S // 2  # and no token was reserved
    with pytest.raises(RateLimited) as refused, limit.slot(timeout=0.1):
        pass  # pragma: no cover - not entered
    assert refused.value.decision.layer == 1 and pool.in_flight == 1


def test_all_of_acquire_timing_out_on_the_slot_holds_nothing(impl: ModuleType) -> None:
    pool = Concurrency(1)
    bucket = impl.TokenBucket(rate=1, capacity=5)
    limit = all_of(pool, bucket)
    assert limit.allow()
    assert limit.acquire(timeout=0.02) is False
    assert (pool.in_flight, pool.waiters, bucket.tokens() < 4.1) == (1, 0, True)
    assert all_of(limit, impl.TokenBucket(1, 1)).releases  # nested: still holds


def test_all_of_async_cancellation_holds_nothing(impl: ModuleType) -> None:
    pool = Concurrency(2)
    bucket = impl.TokenBucket(rate=1, capacity=1)
    limit = all_of(pool, bucket)

    async def main() -> None:
        assert await limit.acquire_async(timeout=0)
        # A slot is free; the token is ~1 s away: it holds the slot and waits.
        waiting = asyncio.ensure_future(limit.acquire_async(timeout=10))
        while not _wait._lines:
            await asyncio.sleep(0.001)
        assert pool.in_flight == 2
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert pool.in_flight == 1 and not _wait._lines  # slot released, token given back
        # Waiting for the slot, then cancelled.
        assert limit.layers[0].allow()
        slotless = asyncio.ensure_future(limit.acquire_async(timeout=10))
        while pool.waiters < 1:
            await asyncio.sleep(0.001)
        slotless.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slotless
        assert (pool.in_flight, pool.waiters) == (2, 0)
        pool.release()
        assert await limit.acquire_async(timeout=0) is False  # refused on the token
        assert pool.in_flight == 1
        async with all_of(Concurrency(1)).slot(timeout=0):
            pass

    asyncio.run(main())


def test_all_of_async_acquire_waits_for_the_slot(impl: ModuleType) -> None:
    pool = Concurrency(1)
    limit = all_of(pool, impl.TokenBucket(rate=10**9, capacity=10**9))

    async def main() -> None:
        assert await limit.acquire_async()
        second = asyncio.ensure_future(limit.acquire_async(timeout=10))
        while pool.waiters < 1:
            await asyncio.sleep(0.001)
        limit.release()
        assert await second is True and pool.in_flight == 1
        assert await limit.acquire_async(timeout=0.01) is False  # no slot in time
        assert (pool.in_flight, pool.waiters) == (1, 0)
        assert await all_of(Concurrency(1), Concurrency(1)).acquire_async() is True

    asyncio.run(main())


def test_the_decorator_releases_after_the_call() -> None:
    pool = Concurrency(1)
    seen: list[int] = []

    @nb.limit(pool)
    def work() -> None:
        seen.append(pool.in_flight)

    @nb.limit(pool, wait=True, timeout=0)
    async def fails() -> None:
        seen.append(pool.in_flight)
        raise KeyError

    work()
    with pytest.raises(KeyError):
        asyncio.run(fails())
    assert seen == [1, 1] and pool.in_flight == 0
    assert pool.allow()
    with pytest.raises(RateLimited):
        work()
    assert pool.in_flight == 1


def test_the_middlewares_refuse_an_in_flight_limit_they_would_never_release() -> None:
    from nanobucket.asgi import RateLimitMiddleware as AsgiMiddleware
    from nanobucket.wsgi import RateLimitMiddleware as WsgiMiddleware

    def app(*args: Any) -> Any:  # never called
        raise AssertionError

    for limiter in (
        nb.KeyedConcurrency(2),
        nb.all_of(nb.KeyedConcurrency(2), nb.TokenBucket(1, 1)),
    ):
        for middleware in (AsgiMiddleware, WsgiMiddleware):
            with pytest.raises(TypeError, match="keeps its slots until released"):
                middleware(app, limiter)


def test_keyed_concurrency_refuses_key_none_unless_told() -> None:
    # A key function returns None for a missing header: every such request
    # would share one limit. Before: admitted, two at a time for all of them.
    per_user = KeyedConcurrency(2)
    verbs: list[Callable[[KeyedConcurrency], object]] = [
        lambda c: c.allow(None),
        lambda c: c.allow_at(None, 0),
        lambda c: c.check(None),
        lambda c: c.check_at(None, 0),
        lambda c: c.peek(None),
        lambda c: c.peek_at(None, 0),
        lambda c: c.release(None),
        lambda c: c.refund(None),
        lambda c: c.acquire(None, timeout=0),
        lambda c: asyncio.run(c.acquire_async(None, timeout=0)),
        lambda c: c.slot(None).__enter__(),
    ]
    for verb in verbs:
        with pytest.raises(TypeError, match="key is None: KeyedConcurrency refuses it"):
            verb(per_user)
    assert len(per_user) == 0 and per_user.waiters == 0
    anyone = KeyedConcurrency(2, none_key=True)
    assert [anyone.allow(None) for _ in range(3)] == [True, True, False]
    assert anyone.in_flight(None) == 2
    with pytest.raises(TypeError, match="none_key must be a bool"):
        KeyedConcurrency(2, none_key=1)  # type: ignore[arg-type]
