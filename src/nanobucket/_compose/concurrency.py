"""In-flight limits: at most *max_in_flight* requests at once, waiting in a bounded FIFO line.

Written here; documented and imported as ``nanobucket.concurrency``."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from .._core._acquire import DEFAULT_MAX_WAITERS
from .._core._bucket import Decision
from .._core._params import (
    FOREVER_NS,
    NS_PER_S,
    int_at_least,
    none_key_error,
    validated_cost,
    validated_flag,
    validated_max_keys,
    validated_timeout,
)
from .._core._wait import Alarm, AsyncSleep, Bell, SleepOrWake, bell_wait
from .decorator import RateLimited
from .verbs import KeyedVerbs, Verbs

__all__ = ("Concurrency", "KeyedConcurrency", "Slot")

DEFAULT_MAX_KEYS = 100_000
_FOREVER_S = FOREVER_NS / NS_PER_S  # a wait without timeout (146 years)


def _seconds(timeout: object) -> float:
    seconds = validated_timeout(timeout)
    return _FOREVER_S if seconds is None else min(seconds, _FOREVER_S)


class _Waiter:
    """One caller in line: its cost, how to wake it, and whether it was handed its slots."""

    __slots__ = ("cost", "granted", "queued", "wake")

    def __init__(self, cost: int, wake: Callable[[], bool]) -> None:
        self.cost = cost
        self.wake: Callable[[], bool] = wake  # False if nobody is left to wake
        self.granted = False
        self.queued = True  # in line (neither granted nor dropped)


class _Count:
    """One key's slots: how many are held, and who waits for more (FIFO)."""

    __slots__ = ("held", "line")

    def __init__(self) -> None:
        self.held = 0
        self.line: deque[_Waiter] = deque()


class _InFlight:
    """The machinery of both classes: counts by key, under one lock."""

    releases = True  # an admitted request holds its slots until release()
    _refuses_none = False  # KeyedConcurrency: key None is refused (see `none_key`)

    def __init__(
        self,
        max_in_flight: int,
        max_keys: int,
        max_waiters: int,
        sleep_or_wake: SleepOrWake | None,
        async_sleep: AsyncSleep | None,
    ) -> None:
        for name, fn in (("sleep_or_wake", sleep_or_wake), ("async_sleep", async_sleep)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable, not {type(fn).__name__}")
        self._max = int_at_least(max_in_flight, "max_in_flight", 1)
        self._max_keys = max_keys
        self._max_waiters = int_at_least(max_waiters, "max_waiters", 0)
        self._sleep_or_wake: SleepOrWake = sleep_or_wake or bell_wait
        self._async_sleep: AsyncSleep = async_sleep or asyncio.sleep
        self._counts: dict[Hashable, _Count] = {}  # only keys holding or awaited
        self._waiting = 0
        self._lock = threading.Lock()

    @property
    def max_in_flight(self) -> int:
        """The most slots held at once (per key for `KeyedConcurrency`).

        >>> Concurrency(10).max_in_flight
        10
        """
        return self._max

    @property
    def max_waiters(self) -> int:
        """The most callers that may wait at once (over all keys).

        >>> Concurrency(10, max_waiters=8).max_waiters
        8
        """
        return self._max_waiters

    @property
    def waiters(self) -> int:
        """Callers waiting now (over all keys).

        >>> Concurrency(1).waiters
        0
        """
        return self._waiting

    # -- under the lock --------------------------------------------------------

    def _take(self, key: Hashable, cost: int, take: bool = True) -> bool | None:
        """Take *cost* slots of *key* if free and nobody waits (only tell, unless *take*);
        None if *key* would be one key too many."""
        count = self._counts.get(key)
        if count is None:
            if cost and len(self._counts) >= self._max_keys:
                return None
            if not take or not cost:
                return True  # a probe of cost 0 leaves no count behind
            count = self._counts[key] = _Count()
        elif count.line or count.held + cost > self._max:
            return False
        elif not take:
            return True
        count.held += cost
        return True

    def _serve(self, key: Hashable, count: _Count) -> None:
        """Hand free slots to the head of *key*'s line, in order; drop an idle count."""
        line = count.line
        while line and count.held + line[0].cost <= self._max:
            w = line.popleft()
            w.queued = False
            self._waiting -= 1
            count.held += w.cost
            w.granted = True
            if not w.wake():  # its event loop is closed: the slots go on
                count.held -= w.cost
                w.granted = False
        if not count.held and not line:
            del self._counts[key]

    # -- the verbs, keyed (Concurrency passes key None) ------------------------

    def _cost(self, cost: object) -> int:
        return validated_cost(cost, self._max)

    def _allow(self, key: Hashable, cost: object) -> bool:
        if key is None and self._refuses_none:
            raise none_key_error(type(self).__name__)
        c = self._cost(cost)
        with self._lock:
            return self._take(key, c) is True

    def _peek(self, key: Hashable, cost: object, take: bool) -> Decision:
        if key is None and self._refuses_none:
            raise none_key_error(type(self).__name__)
        c = self._cost(cost)
        with self._lock:
            ok = self._take(key, c, take)
            count = self._counts.get(key)
            held = count.held if count is not None else 0
        if ok is None:
            return Decision(False, 0, 0, 0, self._max)  # no room for another key
        return Decision(ok, self._max - held - (c if ok and not take else 0), 0, 0, self._max)

    # The steps the verbs are derived from (`nanobucket._compose.verbs`): time plays no part.

    def _decide(self, key: Hashable, cost: object, now: int | None, consume: bool) -> Decision:
        return self._peek(key, cost, consume)

    def _admit(self, key: Hashable, cost: object, now: int | None) -> bool:
        return self._allow(key, cost)

    def _give(self, key: Hashable, cost: object, now: int | None) -> None:
        self._release(key, cost)

    def _release(self, key: Hashable, cost: object) -> None:
        if key is None and self._refuses_none:
            raise none_key_error(type(self).__name__)
        c = self._cost(cost)
        with self._lock:
            count = self._counts.get(key)
            held = count.held if count is not None else 0
            if c > held:
                raise ValueError(f"release of {c} slot(s), but {held} held{_of(key)}")
            if count is not None:
                count.held -= c
                self._serve(key, count)

    def _join(
        self, key: Hashable, cost: int, seconds: float, wake: Callable[[], bool]
    ) -> _Waiter | bool:
        """Take the slots (True), refuse (False), or take a place in line (the waiter)."""
        taken = self._take(key, cost)
        if taken is not False:
            return bool(taken)
        if not seconds or self._waiting >= self._max_waiters:
            return False
        w = _Waiter(cost, wake)
        self._counts[key].line.append(w)
        self._waiting += 1
        return w

    def _leave(self, key: Hashable, w: _Waiter, keep: bool) -> bool:
        """*w* stops waiting: True if it holds its slots (*keep*), else it holds nothing."""
        with self._lock:
            count = self._counts.get(key)
            if w.granted:
                if keep:
                    return True
                assert count is not None  # it holds slots there
                count.held -= w.cost
            elif w.queued:
                assert count is not None  # it is in the line there
                count.line.remove(w)
                self._waiting -= 1
            else:
                return False  # dropped: its loop closed before it could be handed anything
            self._serve(key, count)  # the waiters behind it may fit now
            return False

    def _acquire(self, key: Hashable, cost: object, timeout: object) -> bool:
        if key is None and self._refuses_none:
            raise none_key_error(type(self).__name__)
        c, seconds = self._cost(cost), _seconds(timeout)
        bell = Bell()
        with self._lock:
            w = self._join(key, c, seconds, _ringer(bell))
        if not isinstance(w, _Waiter):
            return w
        try:
            self._sleep_or_wake(bell, seconds)
        except BaseException:  # interrupted: whatever it was handed goes on
            self._leave(key, w, keep=False)
            raise
        return self._leave(key, w, keep=True)  # handed its slots as time ran out: kept

    async def _acquire_async(self, key: Hashable, cost: object, timeout: object) -> bool:
        if key is None and self._refuses_none:
            raise none_key_error(type(self).__name__)
        c, seconds = self._cost(cost), _seconds(timeout)
        alarm = Alarm(asyncio.get_running_loop())
        with self._lock:
            w = self._join(key, c, seconds, alarm.ring)
        if not isinstance(w, _Waiter):
            return w
        try:
            await alarm.sleep(self._async_sleep, seconds)
        except BaseException:  # cancelled: whatever it was handed goes on
            self._leave(key, w, keep=False)
            raise
        return self._leave(key, w, keep=True)


def _ringer(bell: Bell) -> Callable[[], bool]:
    def ring() -> bool:
        bell.set()
        return True  # a thread is always there to wake

    return ring


def _of(key: Hashable) -> str:
    return "" if key is None else f" for key {key!r}"


class Slot:
    """The slots of one request, held for a ``with`` or ``async with`` block.

    Entering waits (at most *timeout* seconds, in line) and raises
    `RateLimited` if refused; leaving releases. Made by ``slot()`` of
    `Concurrency`, `KeyedConcurrency` and ``all_of``.

    >>> pool = Concurrency(1)
    >>> with pool.slot() as s:
    ...     pool.in_flight
    1
    >>> pool.in_flight
    0
    """

    __slots__ = ("cost", "key", "limiter", "timeout")

    def __init__(
        self, limiter: Any, key: tuple[Hashable, ...], cost: int, timeout: float | None
    ) -> None:
        validated_timeout(timeout)
        limiter.peek(*key, cost)  # checks the key and the cost now, takes nothing
        self.limiter, self.key, self.cost, self.timeout = limiter, key, cost, timeout

    def _refused(self) -> RateLimited:
        d = self.limiter.peek(*self.key, self.cost)
        return RateLimited(d.retry_after_ns, d)

    def __enter__(self) -> Slot:
        if not self.limiter.acquire(*self.key, cost=self.cost, timeout=self.timeout):
            raise self._refused()
        return self

    def __exit__(self, *exc: object) -> None:
        self.limiter.release(*self.key, self.cost)

    async def __aenter__(self) -> Slot:
        if not await self.limiter.acquire_async(*self.key, cost=self.cost, timeout=self.timeout):
            raise self._refused()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.limiter.release(*self.key, self.cost)


class Concurrency(_InFlight, Verbs[Decision, None]):
    """At most *max_in_flight* slots held at once; callers wait in a bounded FIFO line.

    The verbs are a bucket's, with slots for tokens and no clock: ``allow``,
    ``check``, ``peek`` (and their ``_at`` forms, where time plays no part),
    ``acquire`` / ``acquire_async`` (False after *timeout* seconds in line,
    or at once past *max_waiters* waiters), ``release`` when the request is
    done (``refund``: the same, for work that did not happen). ``with`` and
    ``async with`` hold one slot for the block, waiting as long as it takes;
    ``slot(cost, timeout)`` is the same with a bound. A refusal's
    ``retry_after_ns`` is 0: a slot frees when a request ends, which no
    limiter can know in advance. *sleep_or_wake* / *async_sleep* replace
    the sleeps, as in `Waiting`.

    >>> pool = Concurrency(10)
    >>> with pool:                    # one slot for the block
    ...     pool.in_flight
    1
    >>> pool.acquire(cost=10), pool.acquire(timeout=0), pool.check().remaining
    (True, False, 0)
    """

    keyed = False

    def __init__(
        self,
        max_in_flight: int,
        *,
        max_waiters: int = DEFAULT_MAX_WAITERS,
        sleep_or_wake: SleepOrWake | None = None,
        async_sleep: AsyncSleep | None = None,
    ) -> None:
        super().__init__(max_in_flight, 1, max_waiters, sleep_or_wake, async_sleep)

    @property
    def in_flight(self) -> int:
        """Slots held now.

        >>> pool = Concurrency(3)
        >>> pool.allow(cost=2), pool.in_flight
        (True, 2)
        """
        count = self._counts.get(None)
        return count.held if count is not None else 0

    def _tokens(self, key: Hashable, now: int | None) -> float:
        return float(self._max - self.in_flight)  # waiters may still be owed them

    def release(self, cost: int = 1) -> None:
        """Give back *cost* slots held by a finished request; the first waiter gets them.

        ``ValueError`` if fewer are held: a release without its acquire.

        >>> pool = Concurrency(2)
        >>> pool.allow(), pool.release(), pool.in_flight
        (True, None, 0)
        >>> pool.release()
        Traceback (most recent call last):
        ...
        ValueError: release of 1 slot(s), but 0 held
        """
        self._release(None, cost)

    def acquire(self, cost: int = 1, timeout: float | None = None) -> bool:
        """Block until *cost* slots are held (True), or *timeout* seconds pass (False).

        False at once for ``timeout=0`` or past *max_waiters* waiters; a
        waiter that gives up holds nothing.

        >>> pool = Concurrency(1)
        >>> pool.acquire(), pool.acquire(timeout=0.01)
        (True, False)
        """
        return self._acquire(None, cost, timeout)

    async def acquire_async(self, cost: int = 1, timeout: float | None = None) -> bool:
        """`acquire` for asyncio; a cancelled waiter holds nothing.

        >>> pool = Concurrency(1)
        >>> [asyncio.run(pool.acquire_async(timeout=0.01)) for _ in range(2)]
        [True, False]
        """
        return await self._acquire_async(None, cost, timeout)

    def slot(self, cost: int = 1, timeout: float | None = None) -> Slot:
        """*cost* slots for a ``with`` / ``async with`` block; `RateLimited` if refused.

        >>> pool = Concurrency(1)
        >>> with pool.slot(timeout=1.0):
        ...     pool.slot(timeout=0).__enter__()
        Traceback (most recent call last):
        ...
        nanobucket.decorator.RateLimited: rate limited: retry after 0.000 s
        """
        return Slot(self, (), cost, timeout)

    def __enter__(self) -> Concurrency:
        if not self._acquire(None, 1, None):
            raise RateLimited(0, self.peek())  # the line is full
        return self

    def __exit__(self, *exc: object) -> None:
        self._release(None, 1)

    async def __aenter__(self) -> Concurrency:
        if not await self._acquire_async(None, 1, None):
            raise RateLimited(0, self.peek())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._release(None, 1)

    def __repr__(self) -> str:
        return f"Concurrency(max_in_flight={self._max}, in_flight={self.in_flight})"


class KeyedConcurrency(_InFlight, KeyedVerbs[Decision, None]):
    """At most *max_in_flight* slots held at once per key, for at most *max_keys* keys.

    The verbs of `Concurrency` with the key first. Memory is bounded: a key
    with nothing in flight and nobody waiting holds no memory, and at most
    *max_keys* keys hold or wait at once; a request for another key is
    refused (False, a `Decision` with ``remaining`` 0) until one finishes.
    Key None raises ``TypeError`` (as in `KeyedTokenBucket`: it is what a key
    function returns for a missing value, and every such request would share
    one limit) unless made with ``none_key=True``.

    >>> per_user = KeyedConcurrency(2, max_keys=2)
    >>> [per_user.allow(user) for user in ("alice", "alice", "alice", "bob", "carol")]
    [True, True, False, True, False]
    >>> per_user.release("bob"), per_user.allow("carol"), len(per_user)
    (None, True, 2)
    """

    keyed = True

    def __init__(
        self,
        max_in_flight: int,
        *,
        max_keys: int = DEFAULT_MAX_KEYS,
        max_waiters: int = DEFAULT_MAX_WAITERS,
        sleep_or_wake: SleepOrWake | None = None,
        async_sleep: AsyncSleep | None = None,
        none_key: bool = False,
    ) -> None:
        super().__init__(
            max_in_flight, validated_max_keys(max_keys), max_waiters, sleep_or_wake, async_sleep
        )
        self._refuses_none = not validated_flag(none_key, "none_key")

    @property
    def max_keys(self) -> int:
        """The most keys holding slots or waiting at once.

        >>> KeyedConcurrency(2, max_keys=1000).max_keys
        1000
        """
        return self._max_keys

    def in_flight(self, key: Hashable) -> int:
        """Slots of *key* held now.

        >>> per_user = KeyedConcurrency(3)
        >>> per_user.allow("alice", cost=2), per_user.in_flight("alice"), per_user.in_flight("bob")
        (True, 2, 0)
        """
        count = self._counts.get(key)
        return count.held if count is not None else 0

    def _tokens(self, key: Hashable, now: int | None) -> float:
        return float(self._max - self.in_flight(key))  # waiters may still be owed them

    def __len__(self) -> int:
        """Keys holding slots or waiting now.

        >>> per_user = KeyedConcurrency(3)
        >>> per_user.allow("alice"), len(per_user)
        (True, 1)
        """
        return len(self._counts)

    def release(self, key: Hashable, cost: int = 1) -> None:
        """Give back *cost* slots of *key*; ``ValueError`` if fewer are held.

        >>> per_user = KeyedConcurrency(1)
        >>> per_user.allow("alice"), per_user.release("alice"), len(per_user)
        (True, None, 0)
        """
        self._release(key, cost)

    def acquire(self, key: Hashable, cost: int = 1, timeout: float | None = None) -> bool:
        """Block until *cost* slots of *key* are held (True), or *timeout* s pass (False).

        >>> per_user = KeyedConcurrency(1)
        >>> per_user.acquire("alice"), per_user.acquire("alice", timeout=0.01)
        (True, False)
        """
        return self._acquire(key, cost, timeout)

    async def acquire_async(
        self, key: Hashable, cost: int = 1, timeout: float | None = None
    ) -> bool:
        """`acquire` for asyncio; a cancelled waiter holds nothing.

        >>> per_user = KeyedConcurrency(1)
        >>> [asyncio.run(per_user.acquire_async("alice", timeout=0)) for _ in range(2)]
        [True, False]
        """
        return await self._acquire_async(key, cost, timeout)

    def slot(self, key: Hashable, cost: int = 1, timeout: float | None = None) -> Slot:
        """*cost* slots of *key* for a ``with`` / ``async with`` block; `RateLimited` if refused.

        >>> per_user = KeyedConcurrency(1)
        >>> with per_user.slot("alice", timeout=1.0):
        ...     per_user.in_flight("alice")
        1
        """
        return Slot(self, (key,), cost, timeout)

    def __repr__(self) -> str:
        return (
            f"KeyedConcurrency(max_in_flight={self._max}, max_keys={self._max_keys}, "
            f"keys={len(self._counts)})"
        )
