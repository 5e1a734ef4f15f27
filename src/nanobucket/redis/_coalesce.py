"""Coalescing: the decisions that arrive while one round trip is in flight go as one.

An asyncio server with hundreds of requests in flight would otherwise make
one round trip, and hold one connection, per request. Here a decision that
finds nothing in flight is sent at once, alone, in the caller's own task,
exactly as without coalescing (no timer, no wait). Decisions that arrive
while a round trip is in flight wait in the loop's queue; when it completes,
a task of the queue's own (the *pump*) sends what waits as one call, at most
:data:`MAX_BATCH` decisions, in arrival order, and keeps going until nothing
waits. So one event loop has at most one decision round trip in flight, on
one connection, however many tasks decide at once.

- A caller cancelled while queued is dropped before its batch is formed:
  it spends nothing. One cancelled while its batch is in flight loses its
  answer only: the batch runs in the pump's task, not the caller's, so the
  others still get theirs.
- Every queued call carries a deadline (``timeout`` after it was queued,
  moved by whatever time the loop itself was too busy to run, but never
  past its hard limit, `ceiling` after it was queued: see `_deadline`); a
  batch is bounded by its oldest call's, so no caller waits much longer
  than ``timeout`` of Redis's time in all, nor past its own hard limit. One
  whose deadline passed while it waited is answered by ``expired`` without
  being sent.
- A batch holds calls of one clock only (all Redis's, or all the same
  explicit ``now``): a call of another clock ends it and starts the next,
  so the order of arrival is kept across batches too.
- The queue belongs to one event loop (:attr:`Coalescer.loop`); the limiter
  keeps one per loop it is used from, so a limiter used from two loops in
  turn never hands a future of one loop to the other.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from ._deadline import ceiling, lag_meter

#: The most decisions one script call carries: a flood is sent as several
#: calls of this size, never one multi-megabyte call that holds Redis long.
MAX_BATCH = 512

Answer = Any  # a decision, or the exception its caller gets


@dataclass(slots=True, eq=False)  # eq=False: a call is itself, never one with equal fields
class Call:
    """One decision: the limiter's arguments, and the future its caller awaits."""

    rkey: bytes
    key: Hashable
    cost: int
    now_ns: int | None
    consume: bool
    full: bool = True  # the caller wants the whole decision, not just admitted or not
    deadline: float = field(default=0.0, init=False)
    hard: float = field(default=0.0, init=False)  # the deadline no lag moves
    lag: float = field(default=0.0, init=False)  # the loop's lag when it was queued
    future: asyncio.Future[Any] | None = field(default=None, init=False)


def _deliver(call: Call, answer: Answer) -> None:
    fut = call.future
    if fut is None or fut.done():  # its caller was cancelled meanwhile
        return
    if isinstance(answer, BaseException):
        fut.set_exception(answer)
    else:
        fut.set_result(answer)


class Coalescer:
    """One event loop's queue of decisions waiting for the round trip in flight.

    *one* decides a call alone (in the caller's task); *many* decides a
    batch before a loop-time deadline (moved by the loop's lag up to a hard
    one, both given) and answers every call, raising
    nothing (an answer may be an exception for its caller); *expired*
    answers a call whose deadline passed while it waited.
    """

    __slots__ = (
        "_expired", "_lag", "_many", "_one", "_pump", "busy", "loop", "queue", "timeout",
    )  # fmt: skip

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        timeout: float,
        one: Callable[[Call], Awaitable[Any]],
        many: Callable[[list[Call], float, float], Awaitable[list[Answer]]],
        expired: Callable[[Call], Answer],
    ) -> None:
        self.loop = loop
        self.timeout = timeout
        self._one = one
        self._many = many
        self._expired = expired
        self.busy = False  # a round trip is in flight
        self.queue: deque[Call] = deque()
        # Held: the loop keeps only a weak reference to a task.
        self._pump: asyncio.Task[None] | None = None
        self._lag = lag_meter(loop)  # held while calls wait: their deadlines move by its lag

    async def decide(self, call: Call) -> Any:
        """*call*'s decision: sent at once if nothing is in flight, else with the next batch."""
        if not self.busy:
            self.busy = True
            try:
                return await self._one(call)
            finally:
                self._hand_over()
        loop = self.loop
        meter = self._lag
        meter.hold()
        now = loop.time()
        call.deadline = now + self.timeout
        call.hard = now + ceiling(self.timeout)
        call.lag = meter.lag
        call.future = fut = loop.create_future()
        self.queue.append(call)
        try:
            return await fut
        finally:
            meter.release()

    def _hand_over(self) -> None:
        """The round trip in flight is over: the pump sends what waits, or nothing is busy."""
        queue = self.queue
        while queue and queue[0].future.done():  # type: ignore[union-attr]
            queue.popleft()  # cancelled while queued
        if queue:
            self._pump = self.loop.create_task(self._drain())
        else:
            self.busy = False

    def _next_batch(self) -> list[Call]:
        """Take the next batch off the queue: live calls of one clock, answering the expired."""
        queue, batch = self.queue, list[Call]()
        now, lag = self.loop.time(), self._lag.lag
        while queue and len(batch) < MAX_BATCH:
            call = queue[0]
            if call.future.done():  # type: ignore[union-attr]
                queue.popleft()  # cancelled while queued: never sent, spends nothing
            elif min(call.deadline + lag - call.lag, call.hard) <= now:
                queue.popleft()
                _deliver(call, self._answer(self._expired, call))
            elif batch and call.now_ns != batch[0].now_ns:
                break  # another clock: the next batch, so arrival order holds
            else:
                batch.append(queue.popleft())
        return batch

    @staticmethod
    def _answer(decide: Callable[[Call], Answer], call: Call) -> Answer:
        try:
            return decide(call)
        except Exception as exc:  # e.g. on_error="raise": this caller's exception
            return exc

    async def _drain(self) -> None:
        batch: list[Call] = []
        try:
            while self.queue:
                batch = self._next_batch()
                if batch:
                    oldest = batch[0]
                    due = min(oldest.deadline + self._lag.lag - oldest.lag, oldest.hard)
                    try:
                        answers = await self._many(batch, due, oldest.hard)
                    except Exception as exc:  # not "cannot decide" (those are answers): a bug
                        answers = [exc] * len(batch)
                    for call, answer in zip(batch, answers):
                        _deliver(call, answer)
                    batch = []
                # One turn of the loop: the callers just answered may decide
                # again, and join the next batch rather than start a trip alone.
                await asyncio.sleep(0)
        except BaseException:  # the pump cancelled: the loop is shutting down
            for call in (*batch, *self.queue):
                if call.future is not None:
                    call.future.cancel()
            self.queue.clear()
            raise
        finally:
            self.busy = False
            self._pump = None
