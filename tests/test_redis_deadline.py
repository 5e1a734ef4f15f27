"""The asyncio limiter's deadline: the event loop's own lag is not counted against Redis.

No Redis here: a future stands for a reply. A loop blocked for 0.3 s with
a deadline of 0.1 s still gets a reply that came in meanwhile; a reply that
never comes is a `TimeoutError` after the deadline plus the lag; a cancel
from outside stays a cancel.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from nanobucket.redis._deadline import TICK, Deadline, lag_meter

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
