"""The line of one bucket's waiters: first in, first out, even when one gives up.

A reservation lives in the bucket's word, which stays the authority: plain
``allow`` callers never wait and never look at a line, yet see every
reserved token as owed. The line -- one per bucket, or per key of a keyed
bucket, in this process -- records who sleeps on which part of the word, in
order, and when each is due. When a waiter gives up (a cancelled task, a
timeout around it, an interrupted thread), its tokens go back to the word
and every waiter behind it is moved earlier by exactly as much and woken to
sleep again for what is left. Word and line stay in step, so a caller that
arrives later, waiting or not, finds the freed tokens already owed to the
ones in line. A line exists only while it has waiters.

Waiters never poll: a thread sleeps on its own ``threading.Event`` with a
timeout, a task on its sleep raced against its own ``asyncio.Event``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from ._params import NS_PER_S, check_cost

# sleep_or_wake(event, seconds): sleep up to *seconds*, or less if *event* is
# set; True if it was set (the waiter was moved earlier).
SleepOrWake = Callable[[threading.Event, float], bool]
AsyncSleep = Callable[[float], Awaitable[object]]
Key = tuple[Hashable, ...]


class Waiter:
    """One sleeping caller: its cost, its slack (see ``_reserve``) and when it is due."""

    __slots__ = ("cost", "line", "slack", "target", "wake")

    def __init__(self, cost: Any, slack: int, target: int, wake: Callable[[], object]) -> None:
        self.cost = cost
        self.slack = slack  # due at target: its place in the word ends at target + slack
        self.target = target  # ns on the bucket's own clock
        self.wake = wake
        self.line: tuple[int, Key] | None = None  # None: its limiter cannot be re-timed


# Lines by (id(limiter), key). A waiter holds a reference to its limiter, so
# the id cannot be reused while the line exists. One lock for every line:
# waiting is off the hot path, and it makes "reserve, then take the place in
# line" atomic with respect to every give-up.
_lines: dict[tuple[int, Key], list[Waiter]] = {}
_lock = threading.Lock()


def _retimable(limiter: Any) -> bool:
    # A single bucket whose word is in ns of its own clock; an all_of spans
    # several words with different intervals, and keeps plain refunds.
    return hasattr(limiter, "_clock_ns") and hasattr(limiter, "interval_ns")


def join(
    limiter: Any, key: Key, cost: object, max_wait: int, shape: bool, wake: Callable[[], object]
) -> tuple[int, Waiter | None]:
    """Reserve *cost* and take the place in line: ``(ns to wait, the waiter)``.

    The waiter is None when nothing is to be waited for: refused (-1,
    nothing reserved) or served at once (0).
    """
    if not _retimable(limiter):
        wait = limiter._reserve(*key, None, cost, max_wait, shape)
        if wait <= 0:
            return wait, None
        return wait, Waiter(cost, 0, 0, wake)  # its limiter validated the cost
    with _lock:
        now = limiter._clock_ns()
        wait = limiter._reserve(*key, now, cost, max_wait, shape)
        if wait <= 0:
            return wait, None
        c = check_cost(cost, limiter.capacity)
        interval = limiter.interval_ns
        slack = c * interval if shape else limiter.capacity * interval
        w = Waiter(c, slack, now + wait, wake)
        w.line = (id(limiter), key)
        _lines.setdefault(w.line, []).append(w)
        return wait, w


def remaining(limiter: Any, w: Waiter, clear: Callable[[], object]) -> int:
    """Ns left to wait for *w*, woken early; clears its event in step with the line."""
    now: int = limiter._clock_ns()
    with _lock:
        clear()  # a later move sets it again
        return w.target - now


def leave(w: Waiter) -> None:
    """*w* is served: its tokens are its own now."""
    if w.line is None:
        return
    with _lock:
        _drop(w)


def _drop(w: Waiter) -> int:
    """Take *w* out of its line (dropped when empty); its index there."""
    assert w.line is not None
    line = _lines[w.line]
    i = next(i for i, v in enumerate(line) if v is w)
    del line[i]
    if not line:
        del _lines[w.line]
    return i


def give_up(limiter: Any, key: Key, w: Waiter) -> None:
    """*w* stops waiting: its tokens go back, and the waiters behind it move up.

    Only the part of its reservation still ahead of the clock goes back (in
    whole tokens), so a waiter cancelled after its time gives back no token
    that has meanwhile refilled: the word never holds more than capacity.
    """
    if w.line is None:
        limiter.refund(*key, w.cost)
        return
    with _lock:
        i = _drop(w)
        now = limiter._clock_ns()
        interval = limiter.interval_ns
        ahead = w.target + w.slack - now  # ns of its place in the word not yet refilled
        tokens = min(w.cost, ahead // interval) if ahead > 0 else 0
        if not tokens:
            return
        limiter.refund_at(*key, now, tokens)
        for v in _lines.get(w.line, ())[i:]:
            v.target -= tokens * interval
            v.wake()


def event_wait(event: threading.Event, seconds: float) -> bool:
    return event.wait(seconds)


def plain_sleep(sleep: Callable[[float], object]) -> SleepOrWake:
    """A ``sleep(seconds)`` as a sleep_or_wake that is never woken early."""

    def sleep_or_wake(event: threading.Event, seconds: float) -> bool:
        sleep(seconds)
        return False

    return sleep_or_wake


def wait_sync(
    limiter: Any,
    key: Key,
    cost: object,
    max_wait: int,
    shape: bool,
    sleep_or_wake: SleepOrWake = event_wait,
) -> bool:
    """Reserve, then block until due; True if admitted, False if refused at once."""
    event = threading.Event()
    wait, w = join(limiter, key, cost, max_wait, shape, event.set)
    if w is None:
        return wait >= 0
    try:
        while wait > 0 and sleep_or_wake(event, wait / NS_PER_S):
            wait = remaining(limiter, w, event.clear)
    except BaseException:  # interrupted: hand the place in line back
        give_up(limiter, key, w)
        raise
    leave(w)
    return True


async def _sleep_or_wake(sleep: AsyncSleep, seconds: float, event: asyncio.Event) -> bool:
    """``await sleep(seconds)``, cut short if *event* is set (then True)."""
    if event.is_set():
        return True
    nap = asyncio.ensure_future(sleep(seconds))
    woken = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait((nap, woken), return_when=asyncio.FIRST_COMPLETED)
    finally:
        woken.cancel()
        if not nap.done():
            nap.cancel()
    if nap.done() and not nap.cancelled():
        nap.result()  # the sleep's own error, if any
        return False
    return True


async def wait_async(
    limiter: Any, key: Key, cost: object, max_wait: int, shape: bool, sleep: AsyncSleep
) -> bool:
    """`wait_sync` for asyncio; a waiter of another thread may move this one up."""
    loop = asyncio.get_running_loop()
    event = asyncio.Event()

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # its loop is closed: nobody is left to wake
            loop.call_soon_threadsafe(event.set)

    wait, w = join(limiter, key, cost, max_wait, shape, wake)
    if w is None:
        return wait >= 0
    try:
        while wait > 0 and await _sleep_or_wake(sleep, wait / NS_PER_S, event):
            wait = remaining(limiter, w, event.clear)
    except BaseException:  # cancelled: hand the place in line back
        give_up(limiter, key, w)
        raise
    leave(w)
    return True
