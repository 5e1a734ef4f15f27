"""Deadlines on the event loop's clock that do not count the loop's own lag against Redis.

A round trip is bounded by the limiter's timeout. But an event loop that is
blocked (a CPU-bound handler, a sync call in a coroutine) or busy with
other tasks runs nothing of the limiter's meanwhile: a reply that came back
in a millisecond is read only when the loop gets to it, after the deadline
passed on its clock. Counted as a Redis failure, that lag opened the
breaker and sent every decision of an overloaded app to the failure
policy while Redis was healthy.

* `LagMeter` measures, per loop, how long the loop ran a timer late, while
  someone holds it: the time the loop could not spend on the limiter.
* `Deadline` is ``asyncio.timeout_at`` moved by the lag measured while it
  runs, and with one turn of grace at its end: when it is due the loop has
  already read what the sockets hold (it polls them before it runs the
  timers due), and the tasks those replies woke run in its next turn; it
  cancels in that turn, after them.
* A queued decision's deadline moves the same way (`_coalesce`).

So a decision waits for at most ``timeout`` of the loop's own time, plus
whatever time the loop gave to others: the timeout bounds Redis, not the app.
But a loop that is always busy lends Redis all of its time: a deadline moved
by every lag it sees would never come (a loop blocked 200 ms per turn made a
0.1 s timeout 9 s). So a deadline has a hard limit too, `ceiling` after the
call began (``max(10 * timeout, 1 s)``), that no lag moves: then the failure
policy answers, however busy the loop (a turn or two of the loop later, the
time it takes to run the answer).
"""

from __future__ import annotations

import asyncio
import math
import weakref
from types import TracebackType
from typing import Any, cast

__all__ = ("Deadline", "LagMeter", "ceiling", "lag_meter")

#: How often a held lag meter looks at the clock (loop seconds).
TICK = 0.005
#: The hard limit of a deadline, in timeouts, and at least this many seconds (see `ceiling`).
CEILING_TIMEOUTS = 10
CEILING_MIN_S = 1.0


def ceiling(timeout: float) -> float:
    """The longest a deadline of *timeout* seconds waits, lag or not: ``max(10 * timeout, 1)``.

    >>> ceiling(0.1), ceiling(0.5)
    (1.0, 5.0)
    """
    return max(CEILING_TIMEOUTS * timeout, CEILING_MIN_S)


class LagMeter:
    """How long (loop seconds, summed) the loop ran a timer late while the meter was held.

    >>> import asyncio, time
    >>> async def main():
    ...     meter = lag_meter(asyncio.get_running_loop())
    ...     meter.hold()
    ...     time.sleep(0.05)              # the loop is blocked: nothing runs
    ...     await asyncio.sleep(0.01)
    ...     meter.release()
    ...     return meter.lag >= 0.04
    >>> asyncio.run(main())
    True
    """

    __slots__ = ("__weakref__", "_due", "_handle", "_lag", "_loop", "_users")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lag = 0.0
        self._due = 0.0
        self._users = 0
        self._handle: asyncio.TimerHandle | None = None

    @property
    def lag(self) -> float:
        """The lag so far, the tick running late now included."""
        if self._handle is None:
            return self._lag
        return self._lag + max(self._loop.time() - self._due, 0.0)

    def hold(self) -> None:
        """Measure (until as many `release` calls): the first holder starts the ticks."""
        self._users += 1
        if self._handle is None:
            self._due = self._loop.time() + TICK
            self._handle = self._loop.call_at(self._due, self._tick)

    def release(self) -> None:
        """One holder is done; the last stops the ticks (the lag so far is kept)."""
        self._users -= 1
        if self._users <= 0 and self._handle is not None:
            self._lag = self.lag
            self._handle.cancel()
            self._handle = None
            self._users = 0

    def _tick(self) -> None:
        now = self._loop.time()
        self._lag += max(now - self._due, 0.0)
        self._due = now + TICK
        self._handle = self._loop.call_at(self._due, self._tick)


_meters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LagMeter] = (
    weakref.WeakKeyDictionary()
)


def lag_meter(loop: asyncio.AbstractEventLoop) -> LagMeter:
    """The lag meter of *loop* (one per loop, shared by every limiter on it)."""
    meter = _meters.get(loop)
    if meter is None:
        meter = _meters[loop] = LagMeter(loop)
    return meter


class Deadline:
    """``async with Deadline(at, hard):`` -- raise `TimeoutError` once loop time *at*, moved
    by the loop's lag meanwhile but never past loop time *hard*, has passed and the block
    has had one more turn (see the module).

    >>> import asyncio
    >>> async def main():
    ...     loop = asyncio.get_running_loop()
    ...     now = loop.time()
    ...     async with Deadline(now + 0.01, now + 0.1):
    ...         await loop.create_future()   # never answered
    >>> asyncio.run(main())
    Traceback (most recent call last):
    ...
    TimeoutError
    """

    __slots__ = ("_at", "_expired", "_handle", "_hard", "_lag0", "_meter", "_task")

    def __init__(self, at: float, hard: float | None = None) -> None:
        self._at = at
        self._hard = math.inf if hard is None else max(hard, at)  # None: no hard limit
        self._expired = False
        self._handle: asyncio.Handle | None = None
        self._task: asyncio.Task[object] | None = None
        self._meter: LagMeter | None = None
        self._lag0 = 0.0

    async def __aenter__(self) -> Deadline:
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - a coroutine always runs in a task here
            raise RuntimeError("Deadline must be entered inside a task")
        self._task = task
        loop = task.get_loop()
        meter = self._meter = lag_meter(loop)
        meter.hold()
        self._lag0 = meter.lag
        self._handle = loop.call_at(self._at, self._due)
        return self

    def _due(self) -> None:
        assert self._task is not None and self._meter is not None
        loop = self._task.get_loop()
        # The loop's own lag does not count, up to the hard limit.
        at = min(self._at + self._meter.lag - self._lag0, self._hard)
        if loop.time() < at:
            self._handle = loop.call_at(at, self._due)
        else:  # the replies read in this turn woke their tasks for the next one: after them
            self._handle = loop.call_soon(self._expire)

    def _expire(self) -> None:
        assert self._task is not None
        self._expired = True
        self._handle = None
        self._task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._meter is not None:
            self._meter.release()
            self._meter = None
        if self._expired and exc_type is asyncio.CancelledError:
            assert self._task is not None
            if cast(Any, self._task).uncancel() == 0:  # ours, and no one else's (3.11+)
                raise TimeoutError from exc
