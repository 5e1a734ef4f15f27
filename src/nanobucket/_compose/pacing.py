"""Pacing for asyncio: ``paced`` (an iterable, item by item) and ``paced_gather`` (awaitables).

Written here; documented and imported as ``nanobucket.pacing``."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Hashable, Iterable
from typing import Any, TypeVar, cast

from .._core._limiter import traits
from .._core._params import int_at_least, validated_timeout
from .decorator import RateLimited
from .executor import checked_cost, key_prefix

__all__ = ("paced", "paced_gather")

_T = TypeVar("_T")


class _Taker:
    """One limiter's ``acquire_async`` for a fixed key and cost; refused: `RateLimited`."""

    __slots__ = ("cost", "key", "limiter", "timeout")

    def __init__(self, limiter: Any, key: Hashable | None, cost: object, timeout: object) -> None:
        if not traits(limiter).acquires_async:
            raise TypeError(f"{type(limiter).__name__} cannot wait (no acquire_async())")
        self.limiter = limiter
        self.key = key_prefix(limiter, key)
        self.cost = checked_cost(limiter, cost)
        self.timeout = validated_timeout(timeout)

    async def __call__(self) -> None:
        limiter, key = self.limiter, self.key
        if not await limiter.acquire_async(*key, cost=self.cost, timeout=self.timeout):
            d = limiter.peek(*key, self.cost)
            raise RateLimited(d.retry_after_ns, d)


async def paced(
    items: Iterable[_T] | AsyncIterable[_T],
    limiter: Any,
    *,
    key: Hashable | None = None,
    cost: int = 1,
    timeout: float | None = None,
) -> AsyncIterator[_T]:
    """Yield each of *items* (sync or async iterable) once its *cost* tokens are taken.

    An item is taken from *items*, then waits for its tokens, then is
    yielded; a wait longer than *timeout* seconds raises `RateLimited`.
    Cancelled while it waits, the iteration gives the tokens back (the item
    it held is not yielded). *key*: the key of a keyed limiter.

    >>> import nanobucket as nb
    >>> slept = []   # a bucket whose clock stands still at 0; each wait recorded
    >>> async def nap(seconds): slept.append(seconds)
    >>> w = nb.Waiting(nb.TokenBucket(rate=10, capacity=1, clock=lambda: 0), async_sleep=nap)
    >>> async def main(): return [n async for n in paced(range(3), w)]
    >>> asyncio.run(main()), slept    # the 2nd item at 0.1 s, the 3rd at 0.2 s
    ([0, 1, 2], [0.1, 0.2])
    """
    take = _Taker(limiter, key, cost, timeout)
    if isinstance(items, AsyncIterable):
        async for item in items:
            await take()
            yield item
    else:
        for item in items:
            await take()
            yield item


async def paced_gather(
    awaitables: Iterable[Awaitable[_T]],
    limiter: Any,
    *,
    max_in_flight: int | None = None,
    return_exceptions: bool = False,
    key: Hashable | None = None,
    cost: int = 1,
    timeout: float | None = None,
) -> list[_T]:
    """Run *awaitables*, each started once its tokens are taken, in order; their results.

    At most *max_in_flight* run at once (None: no bound but the limiter).
    If one raises, no other starts, the running ones are cancelled and the
    error is raised (with *return_exceptions*, errors are results, as in
    ``asyncio.gather``). Cancelled, it cancels the running ones and gives a
    reservation in progress back; a coroutine never started is closed.

    >>> import nanobucket as nb
    >>> async def double(n): return 2 * n
    >>> asyncio.run(paced_gather([double(n) for n in range(4)], nb.TokenBucket(100, 2),
    ...                          max_in_flight=2))
    [0, 2, 4, 6]
    """
    take = _Taker(limiter, key, cost, timeout)
    if max_in_flight is not None:
        max_in_flight = int_at_least(max_in_flight, "max_in_flight", 1)
    if not isinstance(return_exceptions, bool):
        raise TypeError(f"return_exceptions must be a bool, not {type(return_exceptions).__name__}")
    todo = list(awaitables)
    me = asyncio.current_task()
    assert me is not None  # an async function runs in a task
    slots = asyncio.Semaphore(max_in_flight) if max_in_flight is not None else None
    tasks: list[asyncio.Future[_T]] = []
    errors: list[BaseException] = []

    def finished(task: asyncio.Future[_T]) -> None:
        if slots is not None:
            slots.release()
        if return_exceptions or task.cancelled() or errors:
            return
        error = task.exception()
        if error is not None:
            errors.append(error)
            me.cancel()  # wakes this call wherever it waits: for a slot, a token or the results

    try:
        for aw in todo:
            if slots is not None:
                await slots.acquire()
            await take()
            started = asyncio.ensure_future(aw)
            started.add_done_callback(finished)
            tasks.append(started)
        results = await asyncio.gather(*tasks, return_exceptions=return_exceptions)
        return cast("list[_T]", results)  # with return_exceptions, errors among them
    except asyncio.CancelledError:
        uncancel = getattr(me, "uncancel", None)  # 3.11+: was it cancelled from outside too?
        if not errors or (uncancel is not None and uncancel() > 0):
            raise
        raise errors[0] from None
    finally:
        for task in tasks:
            task.cancel()
        for aw in todo[len(tasks) :]:
            if inspect.iscoroutine(aw):
                aw.close()
        if tasks:  # none is left running behind this call
            await asyncio.wait(tasks)
