"""AsyncRedisTokenBucket coalescing, on a real redis-server.

Decisions that arrive while a round trip is in flight go as one script call
when it completes: exactly the decisions sequential calls would get, in
arrival order, in far fewer round trips (counted by Redis itself, ``INFO
commandstats``). Then cancellation (queued: spends nothing; in flight: the
others still get theirs), failures (every caller of a batch gets the policy,
the breaker counts the round trip once), the connection count, and a
limiter used from two event loops in turn.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from types import ModuleType
from typing import Any, TypeVar

import pytest

from nanobucket import redis as nbr
from nanobucket.redis import _coalesce
from nanobucket.tiered import tiered

from redis_server import RedisServer

T = TypeVar("T")
S = 1_000_000_000
MS = 1_000_000
#: Slow enough that no token comes back while a test runs: 1 per 1000 s.
SLOW = 0.001
TIMEOUT = 0.1
#: A decision of a failing Redis returns within TIMEOUT + MARGIN (as in
#: test_redis_failures.py: generous for a loaded 2-core machine).
MARGIN = 0.4
#: Hard bound on any one asyncio phase: past it the test fails, never hangs.
PHASE = 15.0


def run(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop | None = None) -> T:
    """*coro* on a new event loop (or on *loop*, closed after), failed past `PHASE`."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, PHASE)

    if loop is None:
        return asyncio.run(bounded())
    try:
        return loop.run_until_complete(bounded())
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


class StoppedClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when the test moves it (`skew`): round trips
    to the real Redis take no loop time, however loaded the machine, so every deadline
    sees exactly the lag the test made. Past `PHASE` real seconds the clock runs again,
    so that `run`'s bound still fails a test that hangs."""

    def __init__(self) -> None:
        super().__init__()
        self.skew = 0.0
        self._start = super().time()

    def time(self) -> float:
        real = super().time()
        return (self._start if real - self._start < PHASE else real) + self.skew


def script_calls(server: RedisServer) -> int:
    """EVALSHA calls the server has run since the last `reset_stats` (NOSCRIPT ones too)."""
    stats = server.client().info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def reset_stats(server: RedisServer) -> None:
    server.client().config_resetstat()


async def warm(limiter: nbr.AsyncRedisTokenBucket) -> None:
    """Load both decision scripts, so that every later call is one EVALSHA."""
    assert (await limiter.check("warm-up")).source == "redis"
    lone = asyncio.ensure_future(limiter.check("warm-up"))
    queued = asyncio.ensure_future(limiter.check("warm-up"))  # goes as a batch
    assert [d.source for d in await asyncio.gather(lone, queued)] == ["redis", "redis"]


def limiter_on(server: RedisServer, **kwargs: Any) -> nbr.AsyncRedisTokenBucket:
    kwargs.setdefault("rate", SLOW)
    kwargs.setdefault("capacity", 100)
    kwargs.setdefault("timeout", 2.0)
    rate, capacity = kwargs.pop("rate"), kwargs.pop("capacity")
    return nbr.AsyncRedisTokenBucket.from_url(
        server.url, rate, capacity, socket_timeout=kwargs.pop("timeout"), **kwargs
    )


def run_warm(
    server: RedisServer,
    body: Callable[[nbr.AsyncRedisTokenBucket], Awaitable[None]],
    loop: asyncio.AbstractEventLoop | None = None,
    **kwargs: Any,
) -> None:
    """``body(limiter)`` in a new event loop (or *loop*) on a `limiter_on` *server* (with
    *kwargs*), warmed and the server's stats reset first, closed after."""

    async def main() -> None:
        limiter = limiter_on(server, **kwargs)
        await warm(limiter)
        reset_stats(server)
        try:
            await body(limiter)
        finally:
            await limiter.aclose()

    run(main(), loop)


async def together(calls: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    """Start every call in this order on the loop at once; their results, in that order."""
    return list(await asyncio.gather(*(c() for c in calls)))


# -- 1. exact decisions, in arrival order, in few round trips -----------------------------------


def test_256_tasks_on_one_key_admit_exactly_the_first_100(own_redis_server: RedisServer) -> None:
    async def body(limiter: nbr.AsyncRedisTokenBucket) -> None:
        ds = await together([lambda: limiter.check("k")] * 256)
        assert script_calls(own_redis_server) == 2  # the first alone, then the 255 that waited
        assert [d.allowed for d in ds] == [True] * 100 + [False] * 156
        assert [d.remaining for d in ds] == [*range(99, -1, -1)] + [0] * 156
        assert {d.source for d in ds} == {"redis"}
        assert all(d.retry_after_ns > 0 for d in ds[100:])
        assert (await limiter.peek("k", 0)).remaining == 0

    run_warm(own_redis_server, body)


def test_mixed_costs_and_peeks_are_decided_as_in_sequence(own_redis_server: RedisServer) -> None:
    costs = [(i * 7) % 5 for i in range(300)]  # 0..4, zeros included
    peeks = {i for i in range(300) if i % 11 == 3}

    async def body(limiter: nbr.AsyncRedisTokenBucket) -> None:
        calls = [
            (lambda c=c: limiter.peek("k", c))
            if i in peeks
            else (lambda c=c: limiter.check("k", c))
            for i, c in enumerate(costs)
        ]
        ds = await together(calls)
        assert script_calls(own_redis_server) == 2
        # No token comes back meanwhile: in sequence, a call is admitted iff what
        # is left covers its cost; a refused one's remaining is what is left.
        left, expected = 200, []
        for i, c in enumerate(costs):
            expected.append((c <= left, left - c if c <= left else left))
            if i not in peeks and c <= left:
                left -= c
        assert [(d.allowed, d.remaining) for d in ds] == expected
        assert any(not a for a, _ in expected)  # the bucket ran dry on the way
        assert (await limiter.peek("k", 0)).remaining == left

    run_warm(own_redis_server, body, capacity=200)


def test_a_batch_of_peeks_spends_nothing_and_allow_answers_bools(
    own_redis_server: RedisServer,
) -> None:
    async def body(limiter: nbr.AsyncRedisTokenBucket) -> None:
        ds = await together([lambda: limiter.check("k")] + [lambda: limiter.peek("k", 3)] * 255)
        assert script_calls(own_redis_server) == 2  # the 255 peeks: one code for all
        assert [(d.allowed, d.remaining) for d in ds] == [(True, 99)] + [(True, 96)] * 255
        reset_stats(own_redis_server)
        admitted = await together([lambda: limiter.allow("k")] * 150)
        assert script_calls(own_redis_server) == 2
        assert admitted == [True] * 99 + [False] * 51
        assert {type(a) for a in admitted} == {bool}
        assert (await limiter.peek("k", 0)).remaining == 0

    run_warm(own_redis_server, body)


def test_coalesced_decisions_equal_the_in_process_table(
    impl: ModuleType, own_redis_server: RedisServer
) -> None:
    # Explicit times, whole microseconds, a whole-us interval: every field exact.
    keys = [f"u{i % 7}" for i in range(256)]
    costs = [1 + (i * 3) % 4 for i in range(256)]
    waves = [10 * S, 10 * S + 50 * MS, 10 * S + 900 * MS]

    async def body(limiter: nbr.AsyncRedisTokenBucket) -> None:
        reference = impl.KeyedTokenBucket(rate=100, capacity=20)
        for now in waves:
            reset_stats(own_redis_server)
            calls = [
                (lambda k=k, c=c, now=now: limiter.check_at(k, now, c))
                if i % 5
                else (lambda k=k, c=c, now=now: limiter.peek_at(k, now, c))
                for i, (k, c) in enumerate(zip(keys, costs))
            ]
            got = await together(calls)
            assert script_calls(own_redis_server) == 2
            want = [
                reference.check_at(k, now, c) if i % 5 else reference.peek_at(k, now, c)
                for i, (k, c) in enumerate(zip(keys, costs))
            ]
            assert got == want
            assert [d.source for d in got] == ["redis"] * 256

    run_warm(own_redis_server, body, rate=100, capacity=20)


def test_coalesced_equals_not_coalesced(own_redis_server: RedisServer) -> None:
    keys = [f"v{i % 5}" for i in range(120)]
    costs = [i % 4 for i in range(120)]

    async def body(on: nbr.AsyncRedisTokenBucket) -> None:
        off = limiter_on(own_redis_server, rate=1000, capacity=30, prefix="off", coalesce=False)
        await warm(off)
        now = 5 * S
        reset_stats(own_redis_server)
        got = await together(
            [functools.partial(on.check_at, k, now, c) for k, c in zip(keys, costs)]
        )
        assert script_calls(own_redis_server) == 2
        reset_stats(own_redis_server)
        want = [await off.check_at(k, now, c) for k, c in zip(keys, costs)]
        assert script_calls(own_redis_server) == 120  # off: one round trip each
        assert got == want
        await off.aclose()

    run_warm(own_redis_server, body, rate=1000, capacity=30, prefix="on")


def test_a_flood_goes_in_batches_of_at_most_max_batch(own_redis_server: RedisServer) -> None:
    n = 2 * _coalesce.MAX_BATCH + 175

    async def body(limiter: nbr.AsyncRedisTokenBucket) -> None:
        ds = await together([lambda: limiter.check("k")] * n)
        # One alone, then the n - 1 that waited: two full batches and the rest.
        assert script_calls(own_redis_server) == 1 + 3
        assert [d.allowed for d in ds] == [True] * 1000 + [False] * (n - 1000)
        assert [d.remaining for d in ds[:1000]] == [*range(999, -1, -1)]

    run_warm(own_redis_server, body, capacity=1000)


def test_a_batch_holds_one_clock_and_arrival_order_holds(own_redis_server: RedisServer) -> None:
    async def body(limiter: nbr.AsyncRedisTokenBucket) -> None:
        t1, t2 = 100 * S, 200 * S
        calls: list[Callable[[], Awaitable[nbr.RedisDecision]]] = [
            lambda: limiter.check("lone"),  # alone
            lambda: limiter.check_at("a", t1, 4),  # batch 1: t1
            lambda: limiter.check_at("a", t1, 4),
            lambda: limiter.check("b"),  # batch 2: Redis's clock
            lambda: limiter.check("b"),
            lambda: limiter.check_at("a", t1, 4),  # batch 3: t1 again, after batch 2
            lambda: limiter.check_at("a", t2, 1),  # batch 4: t2
        ]
        ds = await together(calls)
        assert script_calls(own_redis_server) == 5
        assert [d.remaining for d in ds] == [9, 6, 2, 9, 8, 2, 9]
        assert [d.allowed for d in ds] == [True, True, True, True, True, False, True]

    run_warm(own_redis_server, body, rate=1, capacity=10)


def test_a_lone_call_is_one_round_trip_and_off_means_one_each(
    own_redis_server: RedisServer,
) -> None:
    async def body(limiter: nbr.AsyncRedisTokenBucket) -> None:
        for i in range(5):
            assert (await limiter.check("k")).remaining == 99 - i  # nothing in flight: alone
        assert script_calls(own_redis_server) == 5
        off = limiter_on(own_redis_server, prefix="off", coalesce=False)
        await warm(off)
        reset_stats(own_redis_server)
        ds = await together([lambda: off.check("k")] * 20)
        # Off: a connection and a round trip each, answered in whatever order they come back.
        assert sorted(d.remaining for d in ds) == [*range(80, 100)]
        assert script_calls(own_redis_server) == 20
        await off.aclose()

    run_warm(own_redis_server, body)
    with pytest.raises(TypeError, match="coalesce must be a bool"):
        nbr.AsyncRedisTokenBucket.from_url(own_redis_server.url, 1, 1, coalesce=1)


def test_256_tasks_from_url_need_one_connection(own_redis_server: RedisServer) -> None:
    # Before coalescing, 256 tasks each held a connection: redis-py's pool of
    # 100 raised "Too many connections".
    admin = own_redis_server.client()
    admin.ping()

    async def worker(limiter: nbr.AsyncRedisTokenBucket, i: int) -> list[bool]:
        return [await limiter.allow(f"t{i}") for _ in range(20)]

    async def main() -> None:
        # The 2 s timeout of every test here: it is about connections, and the
        # default 0.1 s once timed out in a long pure-Python session.
        limiter = limiter_on(own_redis_server, rate=10**6, capacity=10**6)
        results = await asyncio.gather(*(worker(limiter, i) for i in range(256)))
        assert results == [[True] * 20] * 256
        assert admin.info("clients")["connected_clients"] == 2  # admin, and the limiter's one
        await limiter.aclose()

    run(main())


# -- 2. cancellation -----------------------------------------------------------------------------


def test_a_caller_cancelled_while_queued_spends_nothing(own_redis_server: RedisServer) -> None:
    async def body(limiter: nbr.AsyncRedisTokenBucket) -> None:
        lone = asyncio.ensure_future(limiter.check("other"))
        queued = [asyncio.ensure_future(limiter.check("k", 10)) for _ in range(3)]
        await asyncio.sleep(0)  # all started: the first in flight, the others queued
        queued[1].cancel()
        assert (await lone).remaining == 99
        got = await asyncio.gather(*queued, return_exceptions=True)
        assert queued[1].cancelled()
        assert [d.remaining for d in got if isinstance(d, nbr.RedisDecision)] == [90, 80]
        assert script_calls(own_redis_server) == 2
        assert (await limiter.peek("k", 0)).remaining == 80  # the cancelled 10 never spent
        # All of a batch cancelled: nothing is sent at all.
        reset_stats(own_redis_server)
        lone = asyncio.ensure_future(limiter.check("other"))
        queued = [asyncio.ensure_future(limiter.check("k", 10)) for _ in range(3)]
        await asyncio.sleep(0)
        for task in queued:
            task.cancel()
        await lone
        await asyncio.gather(*queued, return_exceptions=True)
        assert script_calls(own_redis_server) == 1
        assert (await limiter.peek("k", 0)).remaining == 80

    run_warm(own_redis_server, body)


def test_a_caller_cancelled_in_flight_does_not_cancel_the_batch(
    own_redis_server: RedisServer,
) -> None:
    async def body(limiter: nbr.AsyncRedisTokenBucket) -> None:
        lone = asyncio.ensure_future(limiter.check("other"))
        queued = [asyncio.ensure_future(limiter.check("k")) for _ in range(10)]
        await asyncio.sleep(0)
        await lone  # its round trip over, the pump has taken the 10 as a batch and sent it
        queued[4].cancel()  # in flight: its token is spent, its answer lost
        got = await asyncio.gather(*queued, return_exceptions=True)
        assert queued[4].cancelled()
        left = [d.remaining for d in got if isinstance(d, nbr.RedisDecision)]
        assert left == [99, 98, 97, 96, 94, 93, 92, 91, 90]  # 95 went to the cancelled one
        assert (await limiter.peek("k", 0)).remaining == 90
        # The queue works on: the next burst is decided as usual.
        ds = await together([lambda: limiter.check("k")] * 5)
        assert [d.remaining for d in ds] == [89, 88, 87, 86, 85]

    run_warm(own_redis_server, body)


# -- 3. Redis failing: every caller of the batch gets the policy ---------------------------------


def test_hung_redis_every_caller_gets_the_policy_within_the_timeout(
    own_redis_server: RedisServer,
) -> None:
    async def body(limiter: nbr.AsyncRedisTokenBucket) -> None:
        async def timed() -> tuple[nbr.RedisDecision, float]:
            start = time.monotonic()
            d = await limiter.check("k")
            return d, time.monotonic() - start

        own_redis_server.pause()
        try:
            results = await together([timed] * 256)
        finally:
            own_redis_server.resume()
        for d, elapsed in results:
            assert (d.allowed, d.source) == (False, "policy:closed"), d
            assert d.reason in ("timeout", "breaker-open"), d
            assert elapsed < TIMEOUT + MARGIN, f"{elapsed:.3f} s for {d}"
        assert results[0][0].reason == "timeout"  # the one in flight
        assert limiter.breaker.state == "open"

    run_warm(
        own_redis_server,
        body,
        timeout=TIMEOUT,
        on_error="closed",
        breaker=nbr.CircuitBreaker(backoff=60.0, max_backoff=60.0),
    )


@pytest.mark.parametrize("coalesce", [True, False], ids=["coalesced", "one-each"])
def test_a_blocked_event_loop_is_not_a_redis_failure(
    own_redis_server: RedisServer, coalesce: bool
) -> None:
    # Redis is healthy; the app's own loop is blocked 0.3 s (a CPU hog) while
    # decisions are in flight and the rest wait: three times the timeout passes on
    # the loop's clock, none of it Redis's. Every decision is Redis's, exactly the
    # first 100 admitted, and the breaker never opens (with on_error="open" each
    # policy decision would have been one more admitted). The loop's clock moves
    # only by the block: the round trips take no loop time, so a loaded machine
    # cannot bring the deadlines' hard limit (1 s) into the test.
    loop = StoppedClockLoop()

    async def body(limiter: nbr.AsyncRedisTokenBucket) -> None:
        async def hog() -> None:
            loop.skew += 0.3  # blocks the loop: the 256 calls are all sent or queued by now

        ds = await together([lambda: limiter.check("k")] * 256 + [hog])
        decisions = [d for d in ds if d is not None]
        assert {(d.source, getattr(d, "reason", None)) for d in decisions} == {("redis", None)}
        assert [d.allowed for d in decisions] == [True] * 100 + [False] * 156
        assert limiter.breaker.state == "closed"

    run_warm(own_redis_server, body, loop, timeout=TIMEOUT, on_error="open", coalesce=coalesce)


def test_dead_redis_the_breaker_counts_each_round_trip_once(
    own_redis_server: RedisServer,
) -> None:
    breaker = nbr.CircuitBreaker(failures=3, backoff=60.0, max_backoff=60.0)

    async def body(limiter: nbr.AsyncRedisTokenBucket) -> None:
        own_redis_server.stop()
        ds = await together([lambda: limiter.check("k")] * 256)
        assert {(d.allowed, d.source, d.reason) for d in ds} == {
            (False, "policy:closed", "connection")
        }
        # Two round trips failed (the lone call, then the batch of 255): two failures.
        assert breaker.state == "closed"
        assert (await limiter.check("k")).reason == "connection"  # the third
        assert str(breaker.state) == "open"
        assert (await limiter.check("k")).reason == "breaker-open"

    run_warm(own_redis_server, body, on_error="closed", breaker=breaker)


def test_dead_redis_each_caller_gets_its_own_exception_or_the_fallback(
    impl: ModuleType, own_redis_server: RedisServer
) -> None:
    async def main() -> None:
        raising = limiter_on(
            own_redis_server, breaker=nbr.CircuitBreaker(failures=5), on_error="raise"
        )
        fallback = impl.KeyedTokenBucket(rate=SLOW, capacity=10)
        falling = limiter_on(
            own_redis_server,
            prefix="fb",
            fallback=fallback,
            breaker=nbr.CircuitBreaker(failures=5),
        )
        await warm(raising)
        await warm(falling)
        own_redis_server.stop()
        errors = await asyncio.gather(
            *(raising.check("k") for _ in range(50)), return_exceptions=True
        )
        raised = [e for e in errors if isinstance(e, nbr.RedisUnavailable)]
        assert len(raised) == len({id(e) for e in raised}) == 50  # each its own
        assert {nbr.failure_reason(e.__cause__) for e in raised} == {"connection"}
        ds = await together([lambda: falling.check("k")] * 50)
        assert [d.allowed for d in ds] == [True] * 10 + [False] * 40  # in arrival order
        assert [d.remaining for d in ds[:10]] == [*range(9, -1, -1)]
        assert {(d.source, d.reason) for d in ds} == {("fallback", "connection")}
        await raising.aclose()
        await falling.aclose()

    run(main())


# -- 4. event loops ------------------------------------------------------------------------------


class FakeClient:
    """Stands in for redis.asyncio.Redis: every bucket full (the scripts reply owed 0).

    Records each call as (loop, "one" or "batch", decisions). Each call
    yields to the loop once, as a round trip would; one on :attr:`hold_loop`
    waits for :attr:`hold` first (a round trip that stays in flight), and
    only batches do when :attr:`hold_batches_only`; with :attr:`broken`,
    a batch raises it (an error that is no Redis error: a bug).
    """

    def __init__(self) -> None:
        self.hold = threading.Event()
        self.hold_loop: asyncio.AbstractEventLoop | None = None
        self.hold_batches_only = False
        self.broken: Exception | None = None
        self.calls: list[tuple[asyncio.AbstractEventLoop, str, int]] = []

    def register_script(self, script: str) -> Callable[..., Awaitable[Any]]:
        kind = "batch" if script == nbr._GCRA_BATCH else "one"

        async def call(keys: list[bytes], args: list[Any]) -> Any:
            loop = asyncio.get_running_loop()
            self.calls.append((loop, kind, len(keys)))
            await asyncio.sleep(0)
            held = kind == "batch" or not self.hold_batches_only
            while held and loop is self.hold_loop and not self.hold.is_set():
                await asyncio.sleep(0.005)
            if kind == "batch" and self.broken is not None:
                raise self.broken
            return b",".join([b"0"] * len(keys)) if kind == "batch" else 0

        return call


def test_each_event_loop_has_a_queue_of_its_own() -> None:
    fake = FakeClient()
    limiter = nbr.AsyncRedisTokenBucket(fake, rate=SLOW, capacity=10, timeout=PHASE)
    in_flight, b_done = threading.Event(), threading.Event()
    results_a: list[nbr.RedisDecision] = []
    loops: dict[str, asyncio.AbstractEventLoop] = {}

    def thread_a() -> None:
        async def main() -> None:
            loops["a"] = fake.hold_loop = asyncio.get_running_loop()
            tasks = [asyncio.ensure_future(limiter.check("a")) for _ in range(5)]
            await asyncio.sleep(0)  # the first in flight (held), four queued on loop a
            in_flight.set()
            while not b_done.is_set():
                await asyncio.sleep(0.01)
            fake.hold.set()
            results_a.extend(await asyncio.gather(*tasks))

        asyncio.run(main())

    a = threading.Thread(target=thread_a, daemon=True)
    a.start()
    assert in_flight.wait(PHASE)

    async def on_b() -> list[nbr.RedisDecision]:
        loops["b"] = asyncio.get_running_loop()
        return await together([lambda: limiter.check("b")] * 5)

    # Loop b, while loop a has a round trip in flight: b's calls do not wait behind it.
    results_b = run(on_b())
    b_done.set()
    a.join(PHASE)
    assert not a.is_alive()
    for results in (results_a, results_b):
        assert [(d.allowed, d.remaining, d.source) for d in results] == [(True, 9, "redis")] * 5
    by_loop = {
        name: [(kind, n) for lp, kind, n in fake.calls if lp is loop]
        for name, loop in loops.items()
    }
    assert by_loop == {"a": [("one", 1), ("batch", 4)], "b": [("one", 1), ("batch", 4)]}


def test_two_asyncio_runs_in_a_row() -> None:
    # As the doctests do; redis.asyncio's connections belong to the loop that
    # opened them, so here no call reaches a server.
    fake = FakeClient()
    limiter = nbr.AsyncRedisTokenBucket(fake, rate=SLOW, capacity=10, timeout=PHASE)
    down = nbr.AsyncRedisTokenBucket(
        fake, SLOW, 10, on_error="open", breaker=nbr.CircuitBreaker(clock=lambda: 0)
    )
    down.breaker.record_failure()

    async def burst(lim: nbr.AsyncRedisTokenBucket) -> list[str]:
        return [d.source for d in await together([lambda: lim.check("k")] * 50)]

    for _ in range(2):
        assert run(burst(down)) == ["policy:open"] * 50
        assert run(burst(limiter)) == ["redis"] * 50
    assert [(kind, n) for _, kind, n in fake.calls] == [("one", 1), ("batch", 49)] * 2
    assert len(limiter._coalescers) == 1  # the queue of the closed loop is forgotten


def test_a_loop_that_ends_with_a_batch_in_flight_leaves_the_limiter_working() -> None:
    fake = FakeClient()
    fake.hold_batches_only = True
    limiter = nbr.AsyncRedisTokenBucket(fake, rate=SLOW, capacity=10, timeout=PHASE)

    async def leave() -> None:
        fake.hold_loop = asyncio.get_running_loop()
        tasks = [asyncio.ensure_future(limiter.check("k")) for _ in range(5)]
        while len(fake.calls) < 2:  # the lone call, then the batch of 4, held
            await asyncio.sleep(0.005)
        assert not any(t.done() for t in tasks[1:])
        # asyncio.run cancels the pump and the callers as it ends

    asyncio.run(leave())
    assert [(kind, n) for _, kind, n in fake.calls] == [("one", 1), ("batch", 4)]
    ds = run(together([lambda: limiter.check("k")] * 3))  # a new loop: a new queue
    assert [d.source for d in ds] == ["redis"] * 3


def test_an_error_that_is_no_redis_error_reaches_every_caller_of_the_batch() -> None:
    fake = FakeClient()
    fake.broken = ValueError("a bug")
    limiter = nbr.AsyncRedisTokenBucket(fake, rate=SLOW, capacity=10, timeout=PHASE)

    async def main() -> list[Any]:
        return await asyncio.gather(*(limiter.check("k") for _ in range(5)), return_exceptions=True)

    got = run(main())
    assert isinstance(got[0], nbr.RedisDecision)  # alone: the single script
    assert [type(e) for e in got[1:]] == [ValueError] * 4
    fake.broken = None
    assert [d.source for d in run(together([lambda: limiter.check("k")] * 3))] == ["redis"] * 3


def test_asyncio_tokens_are_the_in_process_tables(
    impl: ModuleType, own_redis_server: RedisServer
) -> None:
    # tokens / tokens_at of the asyncio limiter (and of a tiered over it): Redis's bucket,
    # exactly the in-process table's at the same explicit times.
    async def body(limiter: nbr.AsyncRedisTokenBucket) -> None:
        reference = impl.KeyedTokenBucket(rate=100, capacity=20)
        plans = tiered({"std": limiter}, tier=lambda key: "std")
        assert await limiter.tokens("fresh") == 20.0  # Redis's own clock: a new key is full
        got = []
        for now, cost in ((10 * S, 7), (10 * S + 25 * MS, 3)):
            assert await limiter.check_at("t", now, cost) == reference.check_at("t", now, cost)
            got.append(await limiter.tokens_at("t", now))
            assert await plans.tokens_at("t", now) == got[-1] == reference.tokens_at("t", now)
        assert got == [13.0, 12.5]  # 20 - 7; then + 2.5 refilled - 3

    run_warm(own_redis_server, body, rate=100, capacity=20)
