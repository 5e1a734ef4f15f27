"""Waiting stays first in, first out when a waiter gives up (cancelled, timed out, interrupted).

The running example: rate 1/s, capacity 3, one token spent at 0 (two left).
A waits for 3 tokens (due at 1 s), B for 3 (due at 4 s). A gives up at 0:
its 3 tokens go back, and B is due at 1 s -- A's own time -- exactly. A
caller D arriving after that for one token is owed behind B: due at 2 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
import threading
import time
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any, TypeVar

import pytest

from nanobucket._core import _acquire, _wait
from nanobucket._core._wait import Bell
from nanobucket.layered import all_of
from nanobucket.waiting import LeakyBucket, Waiting

from conftest import ManualClock

S = 1_000_000_000
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., None])


WHO: contextvars.ContextVar[str] = contextvars.ContextVar("WHO", default="?")


def task(name: str, waits: Awaitable[T]) -> asyncio.Task[T]:
    """A task called *name*: its naps (run in tasks of their own) carry the name."""

    async def run() -> T:
        WHO.set(name)
        return await waits

    return asyncio.create_task(run())


class Naps:
    """An injected asyncio sleep on a fake clock: records each nap (by the
    name of the waiting `task`, in ns) and lasts until the test ends it or
    the waiter stops sleeping."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.ends: dict[str, asyncio.Future[None]] = {}

    async def __call__(self, seconds: float) -> None:
        end = asyncio.get_running_loop().create_future()
        self.calls.append((WHO.get(), round(seconds * S)))
        self.ends[WHO.get()] = end
        await end

    def of(self, name: str) -> list[int]:
        return [ns for who, ns in self.calls if who == name]

    def end(self, name: str) -> None:
        self.ends.pop(name).set_result(None)


class Dozes:
    """An injected ``sleep_or_wake`` on a fake clock, for threads: records each
    doze (by thread name, in ns); returns True when the waiter is woken, False
    when the test ends the doze, or raises KeyboardInterrupt when told to."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.events: dict[str, Bell] = {}
        self.orders: dict[str, str] = {}
        self.cond = threading.Condition()

    def __call__(self, event: Bell, seconds: float) -> bool:
        name = threading.current_thread().name
        with self.cond:
            self.calls.append((name, round(seconds * S)))
            self.events[name] = event
            self.cond.notify_all()
        if not event.wait(10):
            raise AssertionError(f"{name} was never woken")
        with self.cond:
            order = self.orders.pop(name, None)
        if order == "interrupt":
            raise KeyboardInterrupt
        return order != "end"

    def seen(self, count: int) -> list[tuple[str, int]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.calls) >= count, 10), self.calls
            return list(self.calls)

    def tell(self, name: str, order: str) -> None:
        with self.cond:
            self.orders[name] = order
            self.events[name].set()


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def example(impl: ModuleType, clock: ManualClock, keyed: bool = False) -> Any:
    """The running example's limiter, 1 token/s and capacity 3: a bucket, or a keyed table."""
    return (impl.KeyedTokenBucket if keyed else impl.TokenBucket)(rate=1, capacity=3, clock=clock)


def make(impl: ModuleType, clock: ManualClock, keyed: bool) -> tuple[Any, tuple[str, ...]]:
    """`example`, and the key arguments its verbs take."""
    return example(impl, clock, keyed), ("k",) if keyed else ()


def napping(limiter: Any, **options: Any) -> tuple[Waiting, Naps]:
    """A `Waiting` of *limiter* that naps in `Naps`, and its naps."""
    naps = Naps()
    return Waiting(limiter, async_sleep=naps, **options), naps


@pytest.mark.parametrize("keyed", [False, True], ids=["bucket", "keyed"])
def test_a_cancelled_task_moves_the_waiters_behind_it_up(
    impl: ModuleType, clock: ManualClock, keyed: bool
) -> None:
    bucket, key = make(impl, clock, keyed)
    w, naps = napping(bucket)

    async def main() -> None:
        assert w.allow(*key)
        a = task("A", w.acquire_async(*key, cost=3))
        await settle()
        b = task("B", w.acquire_async(*key, cost=3, timeout=4.0))
        await settle()
        assert naps.of("A") == [S] and naps.of("B") == [4 * S]
        a.cancel()
        with pytest.raises(asyncio.CancelledError):
            await a
        await settle()
        # B was woken and sleeps again until A's time, within its deadline.
        assert naps.of("B") == [4 * S, S]
        # D, later, is owed behind B: a plain allow is refused, a waiter queues.
        assert not w.allow(*key)
        assert w.peek(*key).retry_after_ns == 2 * S
        d = task("D", w.acquire_async(*key))
        await settle()
        assert naps.of("D") == [2 * S]
        clock.advance(S)
        naps.end("B")
        await settle()
        assert b.done() and b.result() is True and not d.done()
        clock.advance(S)
        naps.end("D")
        assert await d is True
        assert w.peek(*key).retry_after_ns == S  # the next token: at 3 s
        assert w.waiters == 0 and _wait._lines == {}

    asyncio.run(main())


@pytest.mark.parametrize("keyed", [False, True], ids=["bucket", "keyed"])
def test_an_interrupted_thread_moves_the_waiters_behind_it_up(
    impl: ModuleType, clock: ManualClock, keyed: bool
) -> None:
    bucket, key = make(impl, clock, keyed)
    dozes = Dozes()
    w = Waiting(bucket, sleep_or_wake=dozes)
    results: dict[str, object] = {}

    def run(name: str) -> None:
        try:
            results[name] = w.acquire(*key, cost=3)
        except KeyboardInterrupt:
            results[name] = "interrupted"

    assert w.allow(*key)
    threads = {name: threading.Thread(target=run, args=(name,), name=name) for name in "AB"}
    try:
        threads["A"].start()
        dozes.seen(1)
        threads["B"].start()
        assert dozes.seen(2) == [("A", S), ("B", 4 * S)]
        dozes.tell("A", "interrupt")
        threads["A"].join(10)
        assert results["A"] == "interrupted"
        assert dozes.seen(3)[2] == ("B", S)  # woken: due at 1 s now
        assert not w.allow(*key)  # D: the freed tokens are B's
        clock.advance(S)
        dozes.tell("B", "end")
        threads["B"].join(10)
        assert results["B"] is True
        # D for one token: exactly at 2 s, after B
        clock.advance(S - 1)
        assert not w.allow(*key)
        clock.advance(1)
        assert w.allow(*key)
    finally:
        for name, th in threads.items():
            if th.is_alive():
                dozes.tell(name, "end")
                th.join(10)
    assert _wait._lines == {}


def test_a_timed_out_task_moves_the_waiters_behind_it_up(
    impl: ModuleType, clock: ManualClock
) -> None:
    w, naps = napping(example(impl, clock))

    async def main() -> None:
        assert w.allow()
        a = task("A", asyncio.wait_for(w.acquire_async(cost=3), 0.01))
        await settle()
        b = task("B", w.acquire_async(cost=3))
        await settle()
        with pytest.raises(asyncio.TimeoutError):
            await a
        await settle()
        assert naps.of("B") == [4 * S, S]
        clock.advance(S)
        naps.end("B")
        assert await b is True

    asyncio.run(main())


def test_only_the_same_keys_waiters_move(impl: ModuleType, clock: ManualClock) -> None:
    w, naps = napping(example(impl, clock, keyed=True))

    async def main() -> None:
        assert w.allow("k") and w.allow("j")
        tasks: dict[str, asyncio.Task[bool]] = {}
        for name, key in (("A", "k"), ("B", "k"), ("J", "j"), ("J2", "j")):
            tasks[name] = task(name, w.acquire_async(key, cost=3))
            await settle()
        tasks["A"].cancel()
        await settle()
        assert naps.of("B") == [4 * S, S]
        assert naps.of("J") == [S] and naps.of("J2") == [4 * S]  # untouched
        for t in tasks.values():
            t.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        assert _wait._lines == {} and w.waiters == 0

    asyncio.run(main())


def test_a_shaper_moves_its_slots_up(clock: ManualClock) -> None:
    naps = Naps()
    shaper = LeakyBucket(rate=1, capacity=3, clock=clock, async_sleep=naps)

    async def main() -> None:
        assert await shaper.acquire_async()  # slot 0: at once
        tasks: dict[str, asyncio.Task[bool]] = {}
        for name in "ABC":
            tasks[name] = task(name, shaper.acquire_async())
            await settle()
        assert [naps.of(n) for n in "ABC"] == [[S], [2 * S], [3 * S]]
        tasks["A"].cancel()
        await settle()
        assert naps.of("B") == [2 * S, S] and naps.of("C") == [3 * S, 2 * S]
        for t in tasks.values():
            t.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)

    asyncio.run(main())


def test_shaping_over_either_implementation(impl: ModuleType, clock: ManualClock) -> None:
    w, naps = napping(example(impl, clock), shape=True)

    async def main() -> None:
        assert await w.acquire_async(cost=2)  # slot [0, 2 s)
        a = task("A", w.acquire_async(cost=2))
        await settle()
        b = task("B", w.acquire_async(cost=1))
        await settle()
        assert naps.of("A") == [2 * S] and naps.of("B") == [4 * S]
        a.cancel()
        await settle()
        assert naps.of("B") == [4 * S, 2 * S]  # A's slot start
        b.cancel()
        await asyncio.gather(a, b, return_exceptions=True)

    asyncio.run(main())


def test_a_waiter_cancelled_after_its_time_gives_back_only_what_has_not_refilled(
    impl: ModuleType, clock: ManualClock
) -> None:
    w, naps = napping(example(impl, clock))

    async def main() -> None:
        assert w.allow(cost=3)  # empty: full again at 3 s
        a = task("A", w.acquire_async(cost=3))  # place [3 s, 6 s)
        await settle()
        clock.advance(4 * S)  # A is due (at 3 s) but has not run yet
        b = task("B", w.acquire_async(cost=3))  # place [6 s, 9 s)
        await settle()
        assert naps.of("A") == [3 * S] and naps.of("B") == [2 * S]
        a.cancel()
        await settle()
        # Had A never reserved, B (arriving at 4 s) would own [4 s, 7 s): the
        # token of [3 s, 4 s) refilled while A owned it and is not given back.
        assert b.done() and b.result() is True and naps.of("B") == [2 * S]
        assert w.peek().retry_after_ns == S and not w.allow()
        assert _wait._lines == {}

    asyncio.run(main())


def test_core_acquire_async_moves_up_too(impl: ModuleType, clock: ManualClock) -> None:
    # The core verbs sleep in asyncio for real; the bucket's clock is the
    # test's. A is cancelled at 1 s, its own time: B, behind it, is due then.
    bucket = example(impl, clock)

    async def main() -> None:
        assert bucket.allow()
        a = asyncio.create_task(bucket.acquire_async(cost=3))
        await settle()
        b = asyncio.create_task(bucket.acquire_async(cost=3))
        await settle()
        assert _acquire.waiters(bucket) == 2
        clock.advance(S)
        a.cancel()
        assert await asyncio.wait_for(b, 2) is True  # without the move: 4 s of real sleep
        assert not bucket.allow() and bucket.peek().retry_after_ns == S
        assert _acquire.waiters(bucket) == 0

    asyncio.run(main())


def test_sleep_or_wake_arguments(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=1, capacity=1)
    with pytest.raises(TypeError, match="sleep_or_wake must be callable"):
        Waiting(b, sleep_or_wake=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not both"):
        Waiting(b, sleep=lambda s: None, sleep_or_wake=lambda e, s: False)


def test_all_of_waiters_move_up_in_the_layer_they_share(
    impl: ModuleType, clock: ManualClock
) -> None:
    # Two clients wait on the instance-wide layer; the first gives up.
    instance = example(impl, clock)
    per_client = impl.KeyedTokenBucket(rate=100, capacity=3, clock=clock)
    w, naps = napping(all_of(per_client, instance))

    async def main() -> None:
        assert instance.allow()
        a = task("A", w.acquire_async("alice", cost=3))
        await settle()
        b = task("B", w.acquire_async("bob", cost=3))
        await settle()
        assert naps.of("A") == [S] and naps.of("B") == [4 * S]
        a.cancel()
        await settle()
        assert naps.of("B") == [4 * S, S]
        # Each holds only its slowest layer: nothing of its own bucket while it waits.
        assert per_client.tokens("alice") == 3.0 and per_client.tokens("bob") == 3.0
        assert instance.peek().retry_after_ns == 2 * S  # a later caller: behind bob
        clock.advance(S)
        naps.end("B")
        assert await b is True
        assert per_client.tokens("bob") == 0.0  # taken at its turn, with the instance's
        assert _wait._lines == {}

    asyncio.run(main())


def test_all_of_waiter_is_due_when_its_slowest_layer_is(
    impl: ModuleType, clock: ManualClock
) -> None:
    # B waits on two layers and holds a place in its slowest only: A's
    # give-up in the faster one neither wakes it nor frees anything of its.
    slow = example(impl, clock, keyed=True)
    fast = impl.TokenBucket(rate=2, capacity=3, clock=clock)
    w, naps = napping(all_of(slow, fast))
    core = Waiting(fast, async_sleep=naps)

    async def main() -> None:
        assert slow.allow("b", cost=3)  # b's own bucket: 3 s to refill
        a = task("A", core.acquire_async(cost=3))  # fast layer at once: no wait
        await settle()
        assert a.done() and naps.of("A") == []
        a = task("A", core.acquire_async(cost=3))  # fast: due at 1.5 s
        await settle()
        b = task("B", w.acquire_async("b", cost=3))  # slow 3 s, fast 3 s: it holds slow
        await settle()
        assert naps.of("A") == [3 * S // 2] and naps.of("B") == [3 * S]
        assert fast.peek().retry_after_ns == 2 * S  # A's reservation alone
        a.cancel()
        await settle()
        assert naps.of("B") == [3 * S]  # not woken: it has no place in fast's line
        assert fast.peek().retry_after_ns == S // 2  # A's 3 back: full again at 1.5 s
        clock.advance(3 * S)
        naps.end("B")
        assert await b is True  # at 3 s: slow's reservation, and fast's 3 taken then
        assert slow.tokens("b") == 0.0 and fast.tokens() == 0.0 and _wait._lines == {}
        with pytest.raises(asyncio.CancelledError):
            await a

    asyncio.run(main())


RATE, CAPACITY = 3, 4  # the random runs' table


def random_run(seeds: int) -> Callable[[F], F]:
    """Run a test once per seed, with waiters paying in tokens and in shaped slots."""
    by_shape = pytest.mark.parametrize("shape", [False, True], ids=["tokens", "shape"])
    by_seed = pytest.mark.parametrize("seed", range(seeds))
    return lambda test: by_shape(by_seed(test))


def waiting_table(
    impl: ModuleType, clock: ManualClock, shape: bool, naps: Naps
) -> tuple[Any, Waiting]:
    """The random runs' keyed table, and a `Waiting` of it napping in *naps*."""
    table = impl.KeyedTokenBucket(rate=RATE, capacity=CAPACITY, clock=clock)
    return table, Waiting(table, shape=shape, async_sleep=naps)


@random_run(6)
def test_after_any_give_ups_the_line_is_as_if_they_never_came(
    impl: ModuleType, clock: ManualClock, shape: bool, seed: int
) -> None:
    # Callers of random costs on two keys, all at 0; some of those still
    # waiting give up.
    # Every one left must be due exactly when it would be had the others
    # never come: what a fresh table gives the same callers, in order.
    rng = random.Random(seed)
    naps = Naps()
    table, w = waiting_table(impl, clock, shape, naps)
    fresh = impl.KeyedTokenBucket(rate=RATE, capacity=CAPACITY, clock=clock)
    callers = [(f"w{i}", rng.choice("xy"), rng.randint(0, 4)) for i in range(12)]
    leaving = set(rng.sample(range(12), 6))

    async def main() -> None:
        for key in "xy":
            assert table.allow(key, cost=3) and fresh.allow(key, cost=3)
        tasks = []
        for name, key, cost in callers:
            tasks.append(task(name, w.acquire_async(key, cost=cost)))
            await settle()
        for i in sorted(leaving, key=lambda _: rng.random()):
            tasks[i].cancel()  # a no-op for one served meanwhile (moved up to now)
            if rng.random() < 0.5:
                await settle()
        await settle()
        gone = {i for i in leaving if tasks[i].cancelled()}
        assert gone
        for i, (name, key, cost) in enumerate(callers):
            if i in gone:
                continue
            due = fresh.reserve(key, cost=cost, max_wait_ns=1 << 62, shape=shape)
            if due == 0:
                assert tasks[i].done() and tasks[i].result() is True, name
            else:
                assert not tasks[i].done() and naps.of(name)[-1] == due, name
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert _wait._lines == {}

    asyncio.run(main())


class TimedNaps(Naps):
    """`Naps` that also knows when each nap ends on the fake clock."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock
        self.due: dict[str, int] = {}

    async def __call__(self, seconds: float) -> None:
        self.due[WHO.get()] = self.clock.now + round(seconds * S)
        await super().__call__(seconds)


@random_run(8)
def test_random_arrivals_give_ups_and_plain_callers_keep_the_line_and_the_limit(
    impl: ModuleType, clock: ManualClock, shape: bool, seed: int
) -> None:
    # Waiters arrive, plain allow() callers try, waiters give up and time
    # passes, at random. Per key: waiters are served in arrival order, a
    # plain caller is admitted only once every earlier waiter was served (not
    # with shaping: a shaped waiter sleeps to the start of its slot while the
    # tokens after it are there to take), and no window admits more than
    # capacity + rate * window.
    rng = random.Random(seed)
    naps = TimedNaps(clock)
    table, w = waiting_table(impl, clock, shape, naps)
    admitted: dict[str, list[tuple[int, int]]] = {"x": [], "y": []}  # (time, cost)
    waiters: list[tuple[str, str, int, asyncio.Task[bool]]] = []  # name, key, cost, task
    served: dict[str, int] = {}

    def collect() -> None:
        for name, key, cost, t in waiters:
            if name not in served and t.done() and not t.cancelled():
                assert t.result() is True
                served[name] = clock.now
                admitted[key].append((clock.now, cost))

    async def main() -> None:
        for step in range(80):
            action = rng.random()
            key = rng.choice("xy")
            sleeping = [(n, t) for n, _, _, t in waiters if not t.done()]
            if action < 0.35:
                name = f"w{step}"
                cost = rng.randint(0, CAPACITY)
                waiters.append((name, key, cost, task(name, w.acquire_async(key, cost=cost))))
                await settle()
            elif action < 0.55:
                cost = rng.randint(1, 2)
                if table.allow(key, cost=cost):
                    ahead = [n for n, k, _, t in waiters if k == key and not t.done()]
                    assert shape or not ahead, (key, clock.now, ahead)
                    admitted[key].append((clock.now, cost))
            elif action < 0.7 and sleeping:
                rng.choice(sleeping)[1].cancel()
                await settle()
            else:
                # Never past a waiter's time: each is served when it is due.
                dues = [naps.due[n] for n, _ in sleeping if n in naps.due]
                step_to = clock.now + rng.randint(1, S // 2)
                if dues and (rng.random() < 0.7 or min(dues) < step_to):
                    step_to = min(dues)
                clock.now = max(step_to, clock.now)
                for n, _ in sleeping:
                    if naps.due.get(n, clock.now + 1) <= clock.now and n in naps.ends:
                        naps.end(n)
                await settle()
            collect()
        for _, _, _, t in waiters:
            t.cancel()
        await asyncio.gather(*(t for _, _, _, t in waiters), return_exceptions=True)

    asyncio.run(main())
    assert _wait._lines == {}
    for key in "xy":
        order = [served[n] for n, k, _, _ in waiters if k == key and n in served]
        assert order == sorted(order), key  # first in, first out
        events = admitted[key]
        for i, (t0, _) in enumerate(events):
            for t1, _ in events[i:]:
                tokens = sum(c for t, c in events if t0 <= t <= t1)
                assert tokens * S <= CAPACITY * S + RATE * (t1 - t0), (key, t0, t1)


def test_core_acquire_in_a_thread_is_woken_by_a_give_up(
    impl: ModuleType, clock: ManualClock
) -> None:
    # B blocks in the core acquire (a real sleep of 3 s); A, ahead of it,
    # is interrupted at A's own time: B is due at once and wakes.
    bucket = example(impl, clock)
    asleep, interrupt = threading.Event(), threading.Event()

    def sleep(seconds: float) -> None:
        asleep.set()
        if interrupt.wait(10):
            raise KeyboardInterrupt

    w = Waiting(bucket, sleep=sleep)
    got: list[object] = []

    def a() -> None:
        try:
            got.append(w.acquire(cost=3))
        except KeyboardInterrupt:
            got.append("interrupted")

    assert bucket.allow()
    ta = threading.Thread(target=a, name="A")
    tb = threading.Thread(target=lambda: got.append(bucket.acquire(cost=3)), name="B")
    ta.start()
    assert asleep.wait(10)
    tb.start()
    deadline = time.monotonic() + 10
    while bucket.peek().retry_after_ns != 5 * S:  # until B has reserved, behind A
        assert time.monotonic() < deadline
        time.sleep(0.001)
    clock.advance(S)
    interrupt.set()
    ta.join(10)
    tb.join(2)  # without the move: 3 s more of real sleep
    alive = tb.is_alive()
    tb.join(10)
    assert not alive and got == ["interrupted", True]
    assert not bucket.allow() and bucket.peek().retry_after_ns == S


def test_a_give_up_in_one_thread_wakes_a_task_in_another(
    impl: ModuleType, clock: ManualClock
) -> None:
    bucket = example(impl, clock)
    dozes, naps = Dozes(), Naps()
    w = Waiting(bucket, sleep_or_wake=dozes, async_sleep=naps)
    got: list[object] = []
    moved = threading.Event()

    def a() -> None:
        try:
            got.append(w.acquire(cost=3))
        except KeyboardInterrupt:
            got.append("interrupted")

    async def b() -> None:
        t = task("B", w.acquire_async(cost=3))
        while len(naps.of("B")) < 2:  # its first nap, then the one after the move
            await asyncio.sleep(0.001)
        moved.set()
        naps.end("B")
        got.append(await t)

    assert bucket.allow()
    ta = threading.Thread(target=a, name="A")
    ta.start()
    dozes.seen(1)
    tb = threading.Thread(target=lambda: asyncio.run(asyncio.wait_for(b(), 10)))
    tb.start()
    deadline = time.monotonic() + 10
    while not naps.of("B"):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    dozes.tell("A", "interrupt")
    ta.join(10)
    assert moved.wait(10)
    tb.join(10)
    assert naps.of("B") == [4 * S, S] and got == ["interrupted", True]


@pytest.mark.parametrize("keyed", [False, True], ids=["bucket", "keyed"])
def test_threads_and_tasks_giving_up_at_random_leave_no_line_behind(
    impl: ModuleType, keyed: bool
) -> None:
    # Real time, 4 threads and 2 event loops on one bucket, a fifth of the
    # waiters giving up part-way: nothing hangs, and no line or waiter is left.
    bucket = (impl.KeyedTokenBucket if keyed else impl.TokenBucket)(rate=5000, capacity=5)
    key = ("k",) if keyed else ()
    served: list[int] = []

    def sleep_or_wake(bell: Bell, seconds: float) -> bool:
        if random.random() < 0.2:
            bell.wait(seconds * random.random())
            raise KeyboardInterrupt
        return bell.wait(seconds)

    w = Waiting(bucket, sleep_or_wake=sleep_or_wake, max_waiters=64)

    def thread(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(150):
            cost = rng.randint(1, 5)
            with contextlib.suppress(KeyboardInterrupt):
                if w.acquire(*key, cost=cost):
                    served.append(cost)

    async def tasks(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(150):
            t = asyncio.ensure_future(w.acquire_async(*key, cost=rng.randint(1, 5)))
            if rng.random() < 0.2:
                await asyncio.sleep(rng.random() / 1000)
                t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                if await t:
                    served.append(1)

    threads = [threading.Thread(target=thread, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=lambda i=i: asyncio.run(tasks(100 + i))) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not any(th.is_alive() for th in threads)
    assert len(served) > 300 and w.waiters == 0 and _wait._lines == {}
