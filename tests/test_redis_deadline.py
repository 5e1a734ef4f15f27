"""The asyncio limiter's deadline: the event loop's own lag is not counted against Redis.

A future stands for a reply: a loop blocked for 0.3 s with a deadline of
0.1 s still gets a reply that came in meanwhile; a reply that never comes is
a `TimeoutError` after the deadline plus the lag, but never past the hard
limit (``max(10 * timeout, 1 s)``), however busy the loop; a cancel from
outside stays a cancel. Then a frozen redis-server (SIGSTOP) under a loop
blocked 5 to 200 ms per turn: the limiter's policy answers by the hard limit.
The busy loop's lag is made by moving its clock (`LaggingLoop`), not by
sleeping: the bounds are the promise's, whatever the machine's load.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from nanobucket import redis as nbr
from nanobucket.redis._deadline import TICK, Deadline, ceiling, lag_meter

from redis_server import RedisServer

pytestmark = pytest.mark.skipif(
    not hasattr(asyncio.Task, "uncancel"), reason="the deadline needs Task.uncancel (3.11+)"
)


async def blocked(seconds: float) -> None:
    time.sleep(seconds)  # what a CPU-bound handler does to the loop


def test_a_reply_that_came_while_the_loop_was_blocked_is_a_success() -> None:
    async def main() -> str:
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[str] = loop.create_future()
        loop.call_later(0.01, reply.set_result, "OK")  # the server answers in 10 ms
        hog = asyncio.ensure_future(blocked(0.3))
        async with Deadline(loop.time() + 0.1):
            got = await reply
        await hog
        return got

    assert asyncio.run(main()) == "OK"


def test_no_reply_times_out_after_the_deadline_and_the_lag() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        hog = asyncio.ensure_future(blocked(0.2))
        with pytest.raises(TimeoutError):
            async with Deadline(start + 0.1):
                await loop.create_future()  # never answered
        await hog
        return loop.time() - start

    elapsed = asyncio.run(main())
    # The deadline's own 0.1 s of loop time, after the 0.2 s the loop was blocked, less
    # the meter's first tick (the lag is what passes after a tick was due).
    assert elapsed >= 0.3 - TICK


def test_a_cancel_from_outside_stays_a_cancel_and_the_meter_is_released() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def wait() -> None:
            async with Deadline(loop.time() + 10):
                await loop.create_future()

        task = asyncio.ensure_future(wait())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        meter = lag_meter(loop)
        assert meter._handle is None and meter._users == 0  # nothing left ticking

    asyncio.run(main())


# -- the hard limit: however busy the loop, the policy answers --------------------------------


class LaggingLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock the test moves: `busy` spends a turn "blocked" by moving
    it, with no real wait, so the lag seen is exactly what the test made."""

    def __init__(self) -> None:
        super().__init__()
        self.skew = 0.0

    def time(self) -> float:
        return super().time() + self.skew


async def busy(turn: float) -> None:
    """Block the loop *turn* seconds per turn (as a CPU-bound handler would), for ever."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, LaggingLoop)
    while True:
        loop.skew += turn
        await asyncio.sleep(0)


def _on_lagging_loop(main: Any) -> Any:
    loop = LaggingLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


#: A loop blocked this long per turn (seconds): what was measured in deployments.
TURNS = [0.005, 0.02, 0.05, 0.2]
#: The turns between a deadline's hard limit and its answer: the one in progress then
#: (a timer runs at the first turn after it is due), the turn that runs the due timer,
#: the one that cancels the task and the one that runs it.
LATE_TURNS = 4


@pytest.mark.parametrize("turn", TURNS)
def test_a_deadline_comes_at_its_hard_limit_however_busy_the_loop(turn: float) -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        hog = asyncio.ensure_future(busy(turn))
        start = loop.time()
        try:
            never: asyncio.Future[None] = loop.create_future()
            loop.call_at(start + 60, never.set_result, None)  # the guard: no TimeoutError
            with pytest.raises(TimeoutError):
                async with Deadline(start + 0.1, start + ceiling(0.1)):
                    await never
            return loop.time() - start
        finally:
            hog.cancel()

    elapsed = _on_lagging_loop(main)
    # Nearly all the loop's time was lag (its blocked turns, less a tick's worth each):
    # without the hard limit the deadline moved with it for as long as the loop stayed
    # busy (here until the guard of 60 loop seconds answered instead).
    assert ceiling(0.1) == 1.0
    assert 0.1 <= elapsed <= 1.0 + LATE_TURNS * turn


def test_without_lag_a_deadline_comes_at_its_own_time() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError):
            async with Deadline(start + 0.1, start + 1.0):
                await loop.create_future()
        return loop.time() - start

    assert 0.1 <= _on_lagging_loop(main) < 1.0


@pytest.mark.parametrize("turn", TURNS)
def test_a_frozen_redis_on_a_busy_loop_gets_the_policy_by_the_hard_limit(
    own_redis_server: RedisServer, turn: float
) -> None:
    # One decision in flight and two queued behind it (coalesced): each is answered by
    # the policy no later than the hard limit after it was asked (it was 9.4 s for a
    # loop blocked 200 ms per turn).
    async def main() -> list[tuple[Any, float]]:
        loop = asyncio.get_running_loop()
        limiter = nbr.AsyncRedisTokenBucket.from_url(
            own_redis_server.url, rate=100, capacity=200, on_error="open"
        )
        own_redis_server.pause()
        hog = asyncio.ensure_future(busy(turn))

        async def timed() -> tuple[Any, float]:
            start = loop.time()
            d = await limiter.check("k")
            return d, loop.time() - start

        try:
            guard = loop.create_future()
            loop.call_at(loop.time() + 60, guard.set_result, None)  # no answer in 60 s
            work = asyncio.gather(timed(), timed(), timed())
            await asyncio.wait([work, guard], return_when=asyncio.FIRST_COMPLETED)
            assert work.done(), "no answer within 60 s of the loop"
            return list(work.result())
        finally:
            hog.cancel()
            own_redis_server.resume()
            await limiter.aclose()

    results = _on_lagging_loop(main)
    # The call in flight times out. A queued one either expires while it waits (a
    # timeout too), or its batch meets the breaker that timeout opened and is answered
    # with no call made: which, depends on whether a busy turn of the loop fell
    # between the calls being queued (each deadline counts from its own queuing).
    reasons = [d.reason for d, _ in results]
    assert "timeout" in reasons and set(reasons) <= {"timeout", "breaker-open"}, reasons
    for d, elapsed in results:
        assert (d.allowed, d.source) == (True, "policy:open")
        # A queued call is answered by the pump once the call in flight is: its turn,
        # then the caller's.
        assert elapsed <= ceiling(0.1) + (LATE_TURNS + 2) * turn
