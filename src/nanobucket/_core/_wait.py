"""The line of one bucket's waiters: first in, first out, even when one gives up.

A reservation lives in the bucket's word, which stays the authority: plain
``allow`` callers never wait and never look at a line, yet see every
reserved token as owed. The line -- one per bucket, or per key of a keyed
bucket, in this process -- records who sleeps on which part of the word, in
order, and when each is due. When a waiter gives up
(a cancelled task, a timeout around it, an interrupted thread), its tokens
go back to the word and every waiter behind it is moved earlier by exactly
as much and woken to sleep again for what is left. A reconfigure of the
bucket moves every place with its part of the word (`retimed`). A line
exists only while it has waiters.

Why that is exact: a waiter still asleep has all of its place ahead of the
clock, so whatever was stacked on the word after it (waiters, or plain
callers admitted on top) was stacked on the word itself, never on "now".
Taking it out lowers the word and every later place by its cost: what they
would be had it never come. A waiter past its time may have seen part of
its place refill meanwhile; only the part still ahead goes back. So a
later caller, waiting or not, finds the freed tokens owed to the ones in
line, and the word never holds more than the bucket's capacity.

An ``all_of`` waiter holds a place in one line only: its slowest layer's
(the one it would wait longest for). When that place is due it takes the
other layers at that instant, all or none, so that every layer admits it
at the same moment; a layer that cannot (plain callers took what it had
refilled meanwhile) sends it back: its place goes back to its line and it
joins again, now in the line of whichever layer is slowest, at its end.
That is where first in, first out gives way: a plain caller of a faster
layer may take what an ``all_of`` waiter would have taken, and a waiter
sent back queues behind those that joined after it. Holding its place in
every layer at once instead would let a faster layer refill the token it
held while it waited, and admit it twice.

Waiters never poll: a thread sleeps on its own `Bell` with a timeout, a
task on a future that its timer or its `Alarm` settles.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any

from ._limiter import Clocked, Composite, Reservation
from ._params import NS_PER_S, validated_cost

# sleep_or_wake(bell, seconds): sleep up to *seconds*, or less if *bell* is
# set (a `Bell`: threading.Event's is_set / wait); True if it was set.
SleepOrWake = Callable[["Bell", float], bool]
AsyncSleep = Callable[[float], Awaitable[object]]
Key = tuple[Hashable, ...]


class Place:
    """A waiter's part of one bucket's word, in that bucket's line."""

    __slots__ = ("bucket", "deadline", "key", "line", "slack", "target", "waiter")

    def __init__(
        self, waiter: Waiter, bucket: Any, key: Key, slack: int, target: int, deadline: int
    ) -> None:
        self.waiter = waiter
        self.bucket = bucket
        self.key = key
        self.line = (id(bucket), key)
        self.slack = slack  # its part of the word ends at target + slack
        self.target = target  # when it is due, in ns of the bucket's own clock
        self.deadline = deadline  # the latest it may be due (its waiter's timeout)


Part = tuple[Any, Key]  # a single limiter (a bucket, a table, a Redis limiter) and its key


class Waiter:
    """One sleeping caller: its cost, the part it holds (and its place in that part's
    line, when the part can be re-timed), and the parts it takes when that is due."""

    __slots__ = (
        "budget", "cost", "held", "movable", "places", "refused", "reserved", "rest", "shape",
        "wake",
    )  # fmt: skip

    def __init__(
        self,
        cost: Any,
        wake: Callable[[], object],
        held: Part,
        movable: bool = True,
        shape: bool = False,
        rest: tuple[Part, ...] = (),
        reserved: Reservation | None = None,
    ) -> None:
        self.cost = cost
        self.wake = wake
        self.held = held
        self.movable = movable  # False: its sleep cannot be cut short
        self.shape = shape  # its parts are its cost long (else: the bucket's capacity)
        self.places: list[Place] = []  # none: its limiter cannot be re-timed
        self.rest = rest  # an all_of's other layers: taken when its held one is due
        self.reserved = reserved  # the held part's reservation, when it has no place in line
        self.refused = False  # moved past its timeout (`retimed`): it gave its place up
        self.budget = -1  # ns it may still wait after being sent back (see `finish`)


# Lines by (id(bucket), key). A place holds a reference to its bucket, so
# the id cannot be reused while the line exists. One lock for every line:
# waiting is off the hot path, and it makes "reserve, then take the place in
# line" atomic with respect to every give-up.
_lines: dict[tuple[int, Key], list[Place]] = {}
_lock = threading.Lock()


def _parts(limiter: Any, key: Key) -> list[Part]:
    """The single limiters *limiter* decides with for *key*: each layer of an
    ``all_of`` (flattened), the plan of a ``tiered``, else itself."""
    if not isinstance(limiter, Composite):
        return [(limiter, key)]
    found: list[Part] = []
    for layer, layer_key in limiter.parts(*key):
        found += _parts(layer, layer_key)
    return found


def _retimable(limiter: Any) -> bool:
    """Whether *limiter*'s word is in ns of a clock of its own: its waiters stand in line."""
    return isinstance(limiter, Clocked)


def _now(limiter: Any) -> int | None:
    return limiter.clock_ns() if _retimable(limiter) else None


def _slowest(parts: list[Part], cost: object, shape: bool) -> tuple[Part, tuple[Part, ...]]:
    """The part a waiter of *parts* would wait longest for, and the others."""
    longest, at = -1, 0
    for i, (limiter, k) in enumerate(parts):
        now = _now(limiter)
        d = limiter.peek(*k, cost) if now is None else limiter.peek_at(*k, now, cost)
        wait = d.reset_after_ns if shape else d.retry_after_ns  # shaped: its slot's start
        if wait > longest:
            longest, at = wait, i
    return parts[at], tuple(parts[:at] + parts[at + 1 :])


def _take(parts: tuple[Part, ...], cost: object, shape: bool) -> bool:
    """Take *cost* from every part now, or from none."""
    done: list[tuple[Reservation, int | None]] = []
    try:
        for limiter, k in parts:
            now = _now(limiter)
            r = Reservation.take(limiter, k, cost, shape=shape, now=now)
            if not r.ok:
                return False
            done.append((r, now))
        return True
    finally:
        if len(done) < len(parts):  # refused or failed: undo the others
            for r, now in done:
                r.cancel() if now is None else r.cancel_at(now)


def join(
    limiter: Any,
    key: Key,
    cost: object,
    max_wait: int,
    shape: bool,
    wake: Callable[[], object],
    movable: bool = True,
) -> tuple[int, Waiter | None]:
    """Reserve *cost* and take the place in line: ``(ns to wait, the waiter)``.

    The waiter is None when nothing is to be waited for: refused (-1,
    nothing reserved) or served at once (0). An ``all_of``'s waiter holds
    its slowest layer only (see the module); it may be due at once (0),
    when that layer refilled since it was read: `finish` takes the rest.
    """
    parts = _parts(limiter, key)
    rest: tuple[Part, ...] = ()
    held = parts[0]
    if len(parts) > 1:
        if _take(tuple(parts), cost, shape):
            return 0, None
        held, rest = _slowest(parts, cost, shape)
    bucket, k = held
    if not _retimable(bucket):  # not in a line: its word is not ours to re-time
        r = Reservation.take(bucket, k, cost, max_wait, shape)
        wait = r.delay_ns
        if wait < 0 or (not wait and not rest):
            return min(wait, 0), None
        return wait, Waiter(cost, wake, held, movable, shape, rest, r)  # cost: checked
    with _lock:
        now = bucket.clock_ns()
        wait = bucket.reserve(*k, cost=cost, max_wait_ns=max_wait, shape=shape, now=now)
        if wait < 0 or (not wait and not rest):
            return min(wait, 0), None
        c = validated_cost(cost, bucket.capacity)
        w = Waiter(c, wake, held, movable, shape, rest)
        interval = bucket.interval_ns
        slack = c * interval if shape else bucket.capacity * interval
        place = Place(w, bucket, k, slack, now + wait, now + max_wait)
        w.places.append(place)
        _lines.setdefault(place.line, []).append(place)
        return wait, w


def finish(w: Waiter, max_wait: int, wait: int) -> bool:
    """*w*'s held part is due: take its other parts now and be served (True), or give
    the held part back, with the ns *w* may still wait in ``w.budget`` (False).

    *max_wait* and *wait* are what it was given and told to wait (for a part
    without a line, whose clock is not ours to read).
    """
    if not w.rest:
        with _lock:
            for place in w.places:
                _drop(place)
        return True
    if _take(w.rest, w.cost, w.shape):
        with _lock:
            for place in w.places:
                _drop(place)
        return True
    with _lock:
        if w.places:
            place = w.places[0]
            w.budget = place.deadline - place.bucket.clock_ns()
        else:
            w.budget = max_wait - wait
        _give_back(w)
    return False


def remaining(w: Waiter, clear: Callable[[], object]) -> int:
    """Ns left to wait for *w*, woken early; clears its bell in step with the line.

    Raises `_TooLate` when a reconfigure moved one of its places past its deadline.
    """
    nows: list[int] = [place.bucket.clock_ns() for place in w.places]
    with _lock:
        clear()  # a later move sets it again
        if any(place.target > place.deadline for place in w.places):
            raise _TooLate
        return max(place.target - now for place, now in zip(w.places, nows))


def _drop(place: Place) -> int:
    """Take *place* out of its line (dropped when empty); its index there."""
    line = _lines[place.line]
    i = line.index(place)  # by identity: a Place has no __eq__
    del line[i]
    if not line:
        del _lines[place.line]
    return i


def give_up(w: Waiter) -> None:
    """*w* stops waiting: its tokens go back, and the places behind its own move up.

    Only the part of a place still ahead of the bucket's clock goes back (in
    whole tokens): a waiter cancelled after its time may have had callers
    admitted on top of it, and the token that refilled meanwhile is not
    given back twice. A waiter still asleep gives back all it reserved.
    Nothing goes back to a line with a waiter behind that cannot be moved
    up: it would still wake at its old time, with its part of the word
    moved earlier and refilled meanwhile -- spent twice.
    """
    with _lock:
        _give_back(w)


def _give_back(w: Waiter) -> None:
    """`give_up`, in the lock."""
    if not w.places:
        if w.reserved is not None:
            w.reserved.cancel()
        return
    for place in w.places:
        i = _drop(place)
        bucket = place.bucket
        now = bucket.clock_ns()
        interval = bucket.interval_ns
        ahead = place.target + place.slack - now  # of its part, not yet refilled
        tokens = min(w.cost, ahead // interval) if ahead > 0 else 0
        behind_it = _lines.get(place.line, [])[i:]
        if not tokens or not all(b.waiter.movable for b in behind_it):
            continue
        bucket.refund_at(*place.key, now, tokens)
        for behind in behind_it:
            behind.target -= tokens * interval
            behind.waiter.wake()


class _TooLate(Exception):
    """A waiter moved past its timeout: it gives its place up and is refused."""


@contextmanager
def retimed(bucket: Any, now: int) -> Iterator[None]:
    """Around a reconfigure of *bucket* at *now* (ns): its waiters move with their parts.

    The reconfigure carries the bucket's word over as tokens (`carry_over`),
    so each waiter's part of it moves; its place follows, and its waiter
    wakes to sleep again for what is left (left asleep, it would be admitted
    after its part had refilled, beside the plain callers admitted on that
    refill, or before its part began). A waiter whose place moved past its
    timeout gives it up and is refused (`remaining`, `in_line`).
    """
    with _lock:  # no waiter joins or gives up meanwhile
        interval = bucket.interval_ns
        tau = bucket.capacity * interval
        yield
        new_interval = bucket.interval_ns
        new_tau = bucket.capacity * new_interval
        if (new_interval, new_tau) == (interval, tau):
            return
        me = id(bucket)
        for (owner, _), line in _lines.items():
            if owner != me:
                continue
            for place in line:
                end = place.target + place.slack - now  # the word ahead of now at its end
                if end <= 0:
                    continue
                w = place.waiter
                new_end = new_tau - ((tau - end) * new_interval) // interval  # as carry_over
                slack = w.cost * new_interval if w.shape else new_tau
                target = now + new_end - slack
                if target != place.target:
                    place.target, place.slack = target, slack
                    w.wake()


@contextmanager
def in_line(w: Waiter, max_wait: int, wait: int) -> Iterator[None]:
    """Around *w*'s sleep: `finish` when the block ends (``w.budget`` >= 0 when it was
    sent back to join again), or its place handed back when an exception leaves it
    (an interrupted thread, a cancelled task, or `_TooLate`: then *w* is `refused`
    and the block ends quietly)."""
    try:
        yield
    except _TooLate:
        give_up(w)
        w.refused = True
    except BaseException:
        give_up(w)
        raise
    else:
        if not finish(w, max_wait, wait):
            w.refused = w.budget < 0


class Bell:
    """What a thread waiter sleeps on: ``threading.Event``'s ``set`` / ``is_set``
    / ``wait`` / ``clear``, built on two locks (an Event builds a Condition,
    several times dearer). ``wait`` and ``clear`` are its own thread's."""

    __slots__ = ("_guard", "_rung", "_sleep")

    def __init__(self) -> None:
        self._sleep = threading.Lock()
        self._sleep.acquire()  # held while not rung: wait blocks on it
        self._guard = threading.Lock()
        self._rung = False

    def set(self) -> None:
        with self._guard:
            if not self._rung:
                self._rung = True
                self._sleep.release()

    def is_set(self) -> bool:
        return self._rung

    def wait(self, timeout: float | None = None) -> bool:
        if self._sleep.acquire(timeout=-1 if timeout is None else timeout):
            self._sleep.release()  # it stays rung until cleared
            return True
        return False

    def clear(self) -> None:
        with self._guard:
            if self._rung:
                self._rung = False
                self._sleep.acquire(blocking=False)


def bell_wait(bell: Bell, seconds: float) -> bool:
    """The default sleep_or_wake."""
    return bell.wait(seconds)


class PlainSleep:
    """A ``sleep(seconds)`` as a sleep_or_wake that is never woken early."""

    __slots__ = ("sleep",)

    def __init__(self, sleep: Callable[[float], object]) -> None:
        self.sleep = sleep

    def __call__(self, bell: Bell, seconds: float) -> bool:
        self.sleep(seconds)
        return False


_STALLS = 16  # send-backs in a row with no time passing: a clock that stands still


def _stalled(stalls: int, budget: int, before: int) -> int:
    """The send-backs in a row that left as much of the timeout as the one before; -1
    past `_STALLS`: refuse. Only an injected clock stands still (beside a sleep that
    does not move it), and then a layer found empty at a waiter's turn stays so."""
    stalls = stalls + 1 if budget >= before else 0
    return -1 if stalls > _STALLS else stalls


def wait_sync(
    limiter: Any,
    key: Key,
    cost: object,
    max_wait: int,
    shape: bool,
    sleep_or_wake: SleepOrWake = bell_wait,
) -> Reservation:
    """Reserve, then block until due: the tokens, ``ok`` (and due now) if admitted, not
    ``ok`` if refused. Its ``cancel()`` gives them back to *limiter* (every layer of an
    ``all_of``), for a caller that did not use them after all."""
    bell = Bell()
    movable = not isinstance(sleep_or_wake, PlainSleep)
    stalls = 0
    while True:
        wait, w = join(limiter, key, cost, max_wait, shape, bell.set, movable)
        if w is None:
            return _served(limiter, key, cost, wait >= 0)
        with in_line(w, max_wait, wait):
            while wait > 0 and sleep_or_wake(bell, wait / NS_PER_S):
                wait = remaining(w, bell.clear)
        if w.budget < 0:
            return _served(limiter, key, cost, not w.refused)
        max_wait, stalls = w.budget, _stalled(stalls, w.budget, max_wait)
        if stalls < 0:
            return _served(limiter, key, cost, False)


def _served(limiter: Any, key: Key, cost: object, ok: bool) -> Reservation:
    """What a waiter ends with: its tokens, due now, or nothing (refused)."""
    return Reservation(limiter, key, cost, 0 if ok else -1)


def _time_up(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)


class Alarm:
    """What a task waiter sleeps on: rung from any thread, through its loop."""

    __slots__ = ("fut", "loop", "rung")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.rung = False
        self.fut: asyncio.Future[bool] | None = None

    def ring(self) -> bool:
        """Wake the task (from any thread); False if its loop is closed: nobody is left."""
        try:
            self.loop.call_soon_threadsafe(self._ring)
        except RuntimeError:
            return False
        return True

    def _ring(self) -> None:
        self.rung = True
        if self.fut is not None and not self.fut.done():
            self.fut.set_result(True)

    def clear(self) -> None:
        self.rung = False

    async def sleep(self, sleep: AsyncSleep, seconds: float) -> bool:
        """``await sleep(seconds)``, cut short when rung (then True)."""
        if self.rung:
            return True
        fut = self.fut = self.loop.create_future()
        if sleep is asyncio.sleep:  # on the loop's own timer: no task to start
            timer = self.loop.call_later(seconds, _time_up, fut)
            try:
                woken: bool = await fut
                return woken
            finally:
                timer.cancel()
                self.fut = None
        nap = asyncio.ensure_future(sleep(seconds))
        nap.add_done_callback(lambda _: _time_up(fut))
        try:
            if await fut:
                return True
        finally:
            self.fut = None
            if not nap.done():
                nap.cancel()
        nap.result()  # the sleep's own error, if any
        return False


async def wait_async(
    limiter: Any, key: Key, cost: object, max_wait: int, shape: bool, sleep: AsyncSleep
) -> Reservation:
    """`wait_sync` for asyncio; a waiter of another thread may move this one up."""
    alarm = Alarm(asyncio.get_running_loop())
    stalls = 0
    while True:
        wait, w = join(limiter, key, cost, max_wait, shape, alarm.ring)
        if w is None:
            return _served(limiter, key, cost, wait >= 0)
        with in_line(w, max_wait, wait):
            while wait > 0 and await alarm.sleep(sleep, wait / NS_PER_S):
                wait = remaining(w, alarm.clear)
        if w.budget < 0:
            return _served(limiter, key, cost, not w.refused)
        max_wait, stalls = w.budget, _stalled(stalls, w.budget, max_wait)
        if stalls < 0:
            return _served(limiter, key, cost, False)
