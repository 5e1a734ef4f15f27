"""Waiting instead of rejecting: ``acquire`` / ``acquire_async`` over a bounded, FIFO line.

Written here; documented and imported as ``nanobucket.waiting``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from .._core import _acquire, _wait
from .._core._acquire import DEFAULT_MAX_WAITERS, Gate, max_wait_ns
from .._core._bucket import TokenBucket
from .._core._limiter import (
    KeyedLimiter,
    Limiter,
    Refundable,
    Reservable,
    is_async,
    is_keyed,
    traits,
)
from .._core._params import int_at_least
from .._core._wait import AsyncSleep, SleepOrWake

__all__ = ("DEFAULT_MAX_WAITERS", "LeakyBucket", "Waiting")

Sleep = Callable[[float], object]


class Waiting:
    """A limiter whose callers wait in a bounded FIFO line: ``acquire`` / ``acquire_async``.

    *limiter* is a ``TokenBucket``, a ``KeyedTokenBucket`` (then the verbs
    take the key first) or an ``all_of``. At most *max_waiters* callers wait
    at once; past it ``acquire`` returns False at once. With ``shape=True``
    callers are released at an even rate with no burst (a leaky bucket).
    Injected sleeps serve tests and simulations. *async_sleep* replaces
    ``asyncio.sleep``; a task moved up in line has its sleep cancelled and
    sleeps again for what is left. A thread sleeps on a bell with
    ``threading.Event``'s ``wait(timeout)`` and ``is_set()``:
    *sleep_or_wake* ``(bell, seconds) -> bool`` replaces that (sleep up to
    *seconds*, less once the bell is set; True if it was). *sleep*
    ``(seconds)`` replaces it by a sleep that nothing cuts short: such a
    thread sleeps out the wait it was given, so a waiter ahead of it that
    gives up gives no tokens back (they would be spent twice). Every other
    attribute is the wrapped limiter's.

    >>> from nanobucket import TokenBucket
    >>> slept = []   # sleep= records each wait instead; the clock stands still at 0
    >>> w = Waiting(TokenBucket(rate=10, capacity=1, clock=lambda: 0), sleep=slept.append)
    >>> w.acquire(), w.acquire(timeout=1.0), slept
    (True, True, [0.1])
    """

    def __init__(
        self,
        limiter: Limiter | KeyedLimiter,
        *,
        max_waiters: int = DEFAULT_MAX_WAITERS,
        shape: bool = False,
        sleep: Sleep | None = None,
        async_sleep: AsyncSleep | None = None,
        sleep_or_wake: SleepOrWake | None = None,
    ) -> None:
        if is_async(limiter):
            raise TypeError(
                f"{type(limiter).__name__} is an asyncio limiter: await its own "
                "acquire_async (Waiting calls a limiter's verbs without awaiting them)"
            )
        if not isinstance(limiter, Reservable) or not isinstance(limiter, Refundable):
            raise TypeError(
                f"{type(limiter).__name__} cannot reserve tokens: Waiting needs an in-process "
                "TokenBucket, KeyedTokenBucket or all_of"
            )
        if not isinstance(shape, bool):
            raise TypeError(f"shape must be a bool, not {type(shape).__name__}")
        for name, fn in (
            ("sleep", sleep),
            ("async_sleep", async_sleep),
            ("sleep_or_wake", sleep_or_wake),
        ):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable, not {type(fn).__name__}")
        if sleep is not None and sleep_or_wake is not None:
            raise TypeError("give sleep or sleep_or_wake, not both")
        self.limiter: Any = limiter
        self.keyed = is_keyed(limiter)
        # An all_of without keyed layers takes no key: learnt once, not per call.
        self._key_optional = traits(limiter).key_optional
        self.shape = shape
        self._gate = Gate(int_at_least(max_waiters, "max_waiters", 0))
        self._sleep_or_wake: SleepOrWake = (
            _wait.PlainSleep(sleep) if sleep is not None else sleep_or_wake or _wait.bell_wait
        )
        self._async_sleep: AsyncSleep = async_sleep if async_sleep is not None else asyncio.sleep

    @property
    def max_waiters(self) -> int:
        """The most callers that may wait at once.

        >>> from nanobucket import TokenBucket
        >>> Waiting(TokenBucket(rate=1, capacity=1), max_waiters=8).max_waiters
        8
        """
        return self._gate.limit

    @property
    def sleep_or_wake(self) -> SleepOrWake:
        """How a waiting thread sleeps: ``sleep_or_wake(bell, seconds)``, from ``sleep=`` or
        ``sleep_or_wake=`` (the default sleeps on *bell*, which a waiter ahead that gives up
        rings). A `LimitedExecutor` over this `Waiting` paces its tasks with it.

        >>> from nanobucket import TokenBucket
        >>> slept = []
        >>> w = Waiting(TokenBucket(rate=10, capacity=1, clock=lambda: 0), sleep=slept.append)
        >>> w.sleep_or_wake(None, 0.5), slept
        (False, [0.5])
        """
        return self._sleep_or_wake

    @property
    def waiters(self) -> int:
        """Callers waiting now.

        >>> from nanobucket import TokenBucket
        >>> bucket = TokenBucket(rate=10, capacity=1, clock=lambda: 0)
        >>> w = Waiting(bucket, sleep=lambda seconds: print("waiting:", w.waiters))
        >>> w.acquire(), w.acquire(), w.waiters
        waiting: 1
        (True, True, 0)
        """
        return self._gate.count

    def _split(self, args: tuple[Any, ...], cost: object) -> tuple[tuple[Hashable, ...], object]:
        if self.keyed:
            if not args and self._key_optional:
                return (None,), cost  # an all_of without keyed layers
            if len(args) != 1:
                raise TypeError(
                    "acquire() of a keyed limiter takes the key first: acquire(key, cost=1)"
                )
            return (args[0],), cost
        if len(args) > 1:
            raise TypeError("acquire() takes at most one positional argument (cost)")
        return (), (args[0] if args else cost)

    def _refused(self, key: tuple[Hashable, ...], cost: object) -> bool:
        """False for a caller the full queue turns away, once its arguments are
        known to be good: with *shape* nothing has checked them yet, and a
        bad cost must raise, not read as a refusal. ``peek`` checks them and
        changes nothing."""
        self.limiter.peek(*key, cost)
        return False

    def acquire(self, *args: Any, cost: int = 1, timeout: float | None = None) -> bool:
        """Block until admitted (True) or refused (False): ``acquire([key,] cost=1, timeout=None)``.

        False at once when the wait would exceed *timeout* seconds or
        *max_waiters* callers are already waiting; nothing is then reserved.

        >>> from nanobucket import KeyedTokenBucket
        >>> w = Waiting(KeyedTokenBucket(rate=1, capacity=1))
        >>> w.acquire("alice"), w.acquire("alice", timeout=0), w.acquire("bob")
        (True, False, True)
        """
        key, c = self._split(args, cost)
        max_wait = max_wait_ns(timeout)
        limiter = self.limiter
        if not self.shape and limiter.allow(*key, c):
            return True  # tokens at hand: no need to count as a waiter
        if not self._gate.enter():
            return self._refused(key, c)
        try:
            return _wait.wait_sync(limiter, key, c, max_wait, self.shape, self._sleep_or_wake).ok
        finally:
            self._gate.leave()

    async def acquire_async(self, *args: Any, cost: int = 1, timeout: float | None = None) -> bool:
        """`acquire` for asyncio; a cancelled waiter gives its tokens back.

        >>> from nanobucket import TokenBucket
        >>> async def nap(seconds): print("asyncio.sleep", seconds)
        >>> w = Waiting(TokenBucket(rate=10, capacity=1, clock=lambda: 0), async_sleep=nap)
        >>> asyncio.run(w.acquire_async()), asyncio.run(w.acquire_async())
        asyncio.sleep 0.1
        (True, True)
        """
        key, c = self._split(args, cost)
        max_wait = max_wait_ns(timeout)
        limiter = self.limiter
        if not self.shape and limiter.allow(*key, c):
            return True
        if not self._gate.enter():
            return self._refused(key, c)
        try:
            reserved = await _wait.wait_async(
                limiter, key, c, max_wait, self.shape, self._async_sleep
            )
            return reserved.ok
        finally:
            self._gate.leave()

    def __enter__(self) -> Waiting:
        """``with w:``: `acquire` one token with no timeout, in line; `RateLimited` past
        *max_waiters*. Leaving gives nothing back. A keyed limiter takes a key: use
        ``with Waiting(OneKey(table, key)):`` or ``acquire(key)``.

        >>> from nanobucket import TokenBucket
        >>> slept = []
        >>> w = Waiting(TokenBucket(rate=10, capacity=1, clock=lambda: 0), sleep=slept.append)
        >>> with w:
        ...     with w:
        ...         slept
        [0.1]
        """
        _acquire.enter(self)
        return self

    def __exit__(self, *exc: object) -> None:
        return None  # a spent token stays spent

    def __aenter__(self) -> Awaitable[Waiting]:
        """``async with w:``: `acquire_async`, as ``with w:`` does `acquire`; cancelled
        (``asyncio.timeout``), the waiter gives its tokens back.

        >>> from nanobucket import TokenBucket
        >>> async def nap(seconds): print("asyncio.sleep", seconds)
        >>> w = Waiting(TokenBucket(rate=10, capacity=1, clock=lambda: 0), async_sleep=nap)
        >>> async def twice():
        ...     async with w:
        ...         async with w:
        ...             return w.peek(cost=0).reset_after_ns   # two tokens owed
        >>> asyncio.run(twice())
        asyncio.sleep 0.1
        200000000
        """
        return _acquire.enter_async(self, (), self)

    def __aexit__(self, *exc: object) -> Awaitable[None]:
        return _acquire.exit_async()

    def __getattr__(self, name: str) -> Any:
        # allow, check, peek, refund, reconfigure, tokens...: the limiter's own
        return getattr(self.limiter, name)

    def __repr__(self) -> str:
        return f"Waiting({self.limiter!r}, max_waiters={self.max_waiters}, shape={self.shape})"


class LeakyBucket(Waiting):
    """A shaper: ``acquire`` releases callers at *rate* per second, evenly, with no burst.

    Request ``i`` of cost ``c`` starts ``c / rate`` seconds after the one
    before it (or at once when the line is empty); *capacity* is only the
    largest cost one request may have. ``allow`` / ``check`` are those of
    the underlying ``TokenBucket`` (they admit a burst): use ``acquire``.

    >>> shaper = LeakyBucket(rate=50)        # one request every 20 ms
    >>> shaper.acquire()
    True
    """

    def __init__(
        self,
        rate: Any,
        capacity: int = 1,
        *,
        max_waiters: int = DEFAULT_MAX_WAITERS,
        clock: Callable[[], int] | None = None,
        sleep: Sleep | None = None,
        async_sleep: AsyncSleep | None = None,
        sleep_or_wake: SleepOrWake | None = None,
    ) -> None:
        super().__init__(
            TokenBucket(rate, capacity, clock=clock),
            max_waiters=max_waiters,
            shape=True,
            sleep=sleep,
            async_sleep=async_sleep,
            sleep_or_wake=sleep_or_wake,
        )
