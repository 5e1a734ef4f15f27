"""Pure-Python token buckets: the readable spec of the Cython implementation.

GCRA (virtual scheduling) over integer nanoseconds. Each bucket is one int,
``tat``, the theoretical arrival time: the bucket holds
``capacity - max(0, tat - now) / interval`` tokens, so ``tat <= now`` means
full and a missing key is a full bucket. A request of ``cost`` is admitted iff
``max(tat, now) + cost * interval - now <= tau`` and then moves ``tat`` there;
a rejected request writes nothing. See ``_params`` for the units and bounds.
"""

from __future__ import annotations

import heapq
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import TYPE_CHECKING

from . import _acquire
from ._decision_py import Decision
from ._gcra_py import carry_over, give_back, reserve, step
from ._limiter import Reservation
from ._params import (
    NOW_MAX,
    RateArg,
    RateLike,
    bucket_params,
    forked_warning,
    kept_capacity,
    none_key_error,
    public_rate,
    unkeyed_cost,
    unkeyed_now,
    unpicklable_error,
    validated_clock,
    validated_cost,
    validated_flag,
    validated_max_keys,
    validated_max_wait,
    validated_now,
    validated_shape,
    validated_timeout,
)
from ._wait import retimed

__all__ = ("Decision", "KeyedTokenBucket", "TokenBucket")

Clock = Callable[[], int]
DEFAULT_MAX_KEYS = 1_000_000

#: Set by the selector (`_bucket`) when this module stands in for the
#: extension that failed to import: called once, when the first limiter is built.
on_first_build: Callable[[], None] | None = None


def first_build() -> None:
    """Call `on_first_build` once (a constructor's path, never a verb's)."""
    global on_first_build  # cleared once, by the first limiter built
    hook, on_first_build = on_first_build, None
    if hook is not None:
        hook()


#: The limiters made in this process (and its parents) that a fork copies,
#: but for those built with per_process=True. In a forked child each gets a
#: `_ForkedLock` (`_after_fork_in_child`): the verbs take their lock as
#: always, so telling a copy apart costs them nothing.
_copied: weakref.WeakSet[_Limits] = weakref.WeakSet()


class _ForkedLock:
    """The lock of a limiter in a process it was copied into: the first use warns, once.

    Then the limiter's own lock is a fresh one (the copied one may have been
    held by a thread that the child does not have).
    """

    __slots__ = ("_fresh", "_owner")

    def __init__(self, owner: _Limits, fresh: threading.Lock | threading.RLock) -> None:
        self._owner = owner
        self._fresh = fresh

    def _first(self) -> threading.Lock | threading.RLock:
        owner = self._owner
        if owner._lock is self:  # two threads at once may both warn: no harm
            owner._lock = self._fresh
            # Name the first caller outside this module, as the Cython twin's warning does.
            frame, level = sys._getframe(1), 2
            while frame.f_back is not None and frame.f_globals.get("__name__") == __name__:
                frame, level = frame.f_back, level + 1
            warnings.warn(forked_warning(type(owner).__name__), RuntimeWarning, stacklevel=level)
        return self._fresh

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._first().acquire(blocking, timeout)

    def release(self) -> None:
        self._fresh.release()

    def __enter__(self) -> bool:
        return self._first().acquire()

    def __exit__(self, *exc: object) -> None:
        self._fresh.release()


def _forked_lock(limiter: _Limits) -> _ForkedLock:
    """A `_ForkedLock` for *limiter*, whose fresh lock is of its own lock's kind."""
    keyed = isinstance(limiter, KeyedTokenBucket)
    return _ForkedLock(limiter, threading.RLock() if keyed else threading.Lock())


def _after_fork_in_child() -> None:
    # One thread, before any other starts: each copied limiter's next use warns.
    for limiter in list(_copied):
        try:
            lock = limiter._lock
        except RuntimeError:  # made by an __init__ that did not complete: never used
            continue
        if not isinstance(lock, _ForkedLock):
            limiter._lock = _forked_lock(limiter)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def slots_for(keys: int) -> int:
    """The Cython table's slot count for *keys* (a power of two, 2/3 load)."""
    n = 8
    while n * 2 // 3 < keys:
        n *= 2
    return n


# -- the rule: the Cython kernel (_gcra.pxd) in Python, under its names ---------
#
# A bucket is one int, tat (ns, never negative). With T ns per token and
# tau = capacity*T, a request of cost*T = cost_t is admitted iff
# max(tat, now) + cost_t - now <= tau, and then tat = max(tat, now) + cost_t.
# The verbs pass slack = tau - cost_t. These functions decide; the classes
# find and hold the tats (an attribute; a dict entry per key) and store what
# the functions return, under their lock. The two hottest paths
# (`TokenBucket.allow`, `KeyedTokenBucket._allow`) inline `step`: there a call
# costs a tenth of the time. tests/test_twins.py holds them to it.


def _clock_reader(clock: Clock | None) -> Clock:
    given = validated_clock(clock)
    if given is None:
        return time.monotonic_ns

    def read() -> int:
        return validated_now(given())

    return read


class _Limits:
    """Rate, capacity and the integers derived from them (changed only by `reconfigure`)."""

    # `_lock`: set last by each subclass's __init__ (and by `_after_fork_in_child`).
    __slots__ = ("__weakref__", "_capacity", "_interval", "_lock", "_per_process", "_rate", "_tau")
    _now: Clock  # each subclass's slot: its clock, read as int ns
    _lock: threading.Lock | threading.RLock | _ForkedLock

    # Each subclass's __init__ checks every argument first (`_new_limits`,
    # then its own), then sets the fields, `_lock` last: an __init__ that
    # raised sets nothing (the verbs raise), and a second __init__ raises.

    def _new_limits(self, rate: RateArg, capacity: int | None) -> tuple[RateLike, int, int, int]:
        try:
            object.__getattribute__(self, "_lock")  # not __getattr__'s answer: is it set?
        except AttributeError:
            limits = _validated(rate, capacity)
            if on_first_build is not None:
                first_build()
            return limits
        raise RuntimeError(f"{type(self).__name__} is already initialised")

    if not TYPE_CHECKING:  # (a __getattr__ would make every attribute one to mypy)

        def __getattr__(self, name: str) -> object:
            # Reached only when a lookup failed: an unset slot is an __init__ that did
            # not complete, which says so as the Cython classes do (not AttributeError).
            if any(name in getattr(cls, "__slots__", ()) for cls in type(self).__mro__):
                raise RuntimeError(
                    f"this {type(self).__name__} is not usable: its __init__ did not complete"
                )
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _set_limits(self, limits: tuple[RateLike, int, int, int], per_process: object) -> None:
        self._per_process = validated_flag(per_process, "per_process")
        self._rate, self._capacity, self._interval, self._tau = limits
        if not self._per_process:
            _copied.add(self)

    @property
    def per_process(self) -> bool:
        """Whether copies in forked processes are meant to count on their own (no warning).

        >>> TokenBucket(rate=1, capacity=1).per_process
        False
        """
        return self._per_process

    @property
    def rate(self) -> RateLike:
        """Tokens per second, the number given: an int, float, Decimal or Fraction.

        The arithmetic uses its exact value (a float's shortest decimal: 0.1 is 1/10).

        >>> TokenBucket(rate=100, capacity=200).rate, TokenBucket(rate=0.1, capacity=1).rate
        (100, 0.1)
        """
        return self._rate

    @property
    def capacity(self) -> int:
        """The most tokens the bucket holds: the largest burst.

        >>> TokenBucket(rate=100, capacity=200).capacity
        200
        """
        return self._capacity

    @property
    def interval_ns(self) -> int:
        """Nanoseconds one token takes to refill (``ceil(1e9 / rate)``).

        >>> TokenBucket(rate=3, capacity=1).interval_ns
        333333334
        """
        return self._interval

    def _cost(self, cost: object) -> int:
        # type(), not cost.__class__: an object can claim to be an int.
        if type(cost) is int and 0 <= cost <= self._capacity:
            return cost
        return validated_cost(cost, self._capacity)

    def _new_params(
        self, rate: RateArg | None, capacity: int | None
    ) -> tuple[RateLike, int, int, int]:
        """Validated ``(public rate, capacity, interval_ns, tau)`` for `reconfigure`."""
        rate = self._rate if rate is None else rate
        return _validated(rate, kept_capacity(rate, capacity, self._capacity))

    def _decision(self, tat: int, after: int, now: int) -> Decision:
        """The Decision of `step` on *tat*, whose result was *after*."""
        # Fields set directly, as the Cython twin's `fill_decision` does: they
        # are int64s by construction, so __init__'s checks would only cost time.
        d = Decision.__new__(Decision)
        d.allowed = allowed = after >= 0
        if allowed:
            tat = after
        d.reset_after_ns = debt = tat - now if tat > now else 0
        d.remaining = (self._tau - debt) // self._interval if debt <= self._tau else 0
        d.retry_after_ns = 0 if allowed else -after
        d.limit = self._capacity
        return d

    def _tokens(self, tat: int, now: int) -> float:
        debt = tat - now if tat > now else 0
        if debt >= self._tau:
            return 0.0
        return (self._tau - debt) / self._interval

    def clock_ns(self) -> int:
        """The bucket's clock now (int ns): the time `reserve` waits are counted on.

        >>> TokenBucket(rate=1, capacity=1, clock=lambda: 42).clock_ns()
        42
        """
        return self._now()


def _validated(rate: object, capacity: object) -> tuple[RateLike, int, int, int]:
    """Validated ``(public rate, capacity, interval_ns, tau)``."""
    exact, cap, interval, tau = bucket_params(rate, capacity)
    return public_rate(rate, exact), cap, interval, tau


class TokenBucket(_Limits):
    """One token bucket: starts full, refills ``rate`` tokens/s up to ``capacity``.

    >>> b = TokenBucket(rate=100, capacity=200)
    >>> sum(b.allow_at(0) for _ in range(250))  # a burst of 250 at one instant
    200
    >>> b = TokenBucket("100/minute")   # a rate as text: its count is the capacity
    >>> b.capacity, b.interval_ns, b.rate
    (100, 600000000, Fraction(5, 3))

    ``with b:`` / ``async with b:`` waits for one token as ``acquire()`` does,
    with no timeout (first in, first out), and raises `RateLimited` only
    when the line of waiters is full; leaving the block gives nothing back.
    A bounded wait is ``acquire(timeout=...)``, or ``async with`` inside
    ``asyncio.timeout(...)`` (cancelled, the wait reserves nothing).

    >>> with TokenBucket(rate=1000, capacity=1, clock=lambda: 0) as b:   # one token spent
    ...     b.tokens()
    0.0
    """

    __slots__ = ("_clock", "_now", "_tat")
    keyed = False  # the verbs take no key (see `KeyedTokenBucket`)

    def __init__(
        self,
        rate: RateArg,
        capacity: int | None = None,
        *,
        clock: Clock | None = None,
        per_process: bool = False,
    ) -> None:
        limits = self._new_limits(rate, capacity)
        clock = validated_clock(clock)  # None: the default clock now (see `nanobucket.testing`)
        now = _clock_reader(clock)
        self._set_limits(limits, per_process)
        self._clock = clock
        self._now = now
        self._tat = 0
        self._lock = threading.Lock()

    def allow(self, cost: int = 1) -> bool:
        """Spend *cost* tokens now if the bucket holds them; True if admitted.

        >>> b = TokenBucket(rate=1, capacity=2, clock=lambda: 0)
        >>> b.allow(), b.allow(), b.allow()
        (True, True, False)
        """
        # `_allow` and its `step` inlined: the pure-Python hot path (see `step`).
        if type(cost) is not int or not 0 <= cost <= self._capacity:
            cost = unkeyed_cost(cost, self._capacity)
        now = self._now()
        lock = self._lock
        lock.acquire()  # cheaper than `with` on the hot path
        try:
            cost_t = cost * self._interval
            tat = self._tat
            base = tat if tat > now else now
            if base - now > self._tau - cost_t:
                return False
            if cost_t:
                self._tat = base + cost_t
            return True
        finally:
            lock.release()

    def allow_at(self, now: int, cost: int = 1) -> bool:
        """`allow` at an explicit time *now* (int ns).

        >>> b = TokenBucket(rate=1, capacity=1)
        >>> b.allow_at(0), b.allow_at(0), b.allow_at(1_000_000_000)   # one token a second
        (True, False, True)
        """
        # validated_now's and _cost's fast paths inlined: they pay for `_allow`'s `step`.
        if type(now) is not int or not 0 <= now <= NOW_MAX:
            now = unkeyed_now(now)
        if type(cost) is not int or not 0 <= cost <= self._capacity:
            cost = unkeyed_cost(cost, self._capacity)
        return self._allow(now, cost)

    def _cost(self, cost: object) -> int:
        if type(cost) is int and 0 <= cost <= self._capacity:
            return cost
        return unkeyed_cost(cost, self._capacity)  # a key where the cost goes says so

    def _allow(self, now: int, cost: int) -> bool:
        with self._lock:  # cost_t inside: a concurrent reconfigure cannot tear interval/tau
            cost_t = cost * self._interval
            tat = step(self._tat, now, cost_t, self._tau - cost_t)
            if tat < 0:
                return False
            self._tat = tat
            return True

    def check(self, cost: int = 1) -> Decision:
        """Like `allow`, but return the whole `Decision`.

        >>> TokenBucket(rate=1, capacity=2, clock=lambda: 0).check(cost=2)
        Decision(allowed=True, remaining=0, retry_after_ns=0, reset_after_ns=2000000000, limit=2)
        """
        return self._check(self._now(), self._cost(cost), True)

    def check_at(self, now: int, cost: int = 1) -> Decision:
        """`check` at an explicit time *now* (int ns).

        >>> b = TokenBucket(rate=1, capacity=2)
        >>> b.check_at(0, cost=2)
        Decision(allowed=True, remaining=0, retry_after_ns=0, reset_after_ns=2000000000, limit=2)
        >>> d = b.check_at(500_000_000)   # half a token back: half a second more to wait
        >>> d.allowed, d.remaining, d.retry_after, d.reset_after
        (False, 0, 0.5, 1.5)
        """
        return self._check(unkeyed_now(now), self._cost(cost), True)

    def peek(self, cost: int = 1) -> Decision:
        """The `Decision` `check` would return now, without spending anything.

        >>> b = TokenBucket(rate=1, capacity=1, clock=lambda: 0)
        >>> b.peek().allowed, b.peek().allowed, b.tokens()
        (True, True, 1.0)
        """
        return self._check(self._now(), self._cost(cost), False)

    def peek_at(self, now: int, cost: int = 1) -> Decision:
        """`peek` at an explicit time *now* (int ns).

        >>> b = TokenBucket(rate=1, capacity=3)
        >>> b.peek_at(0, cost=2).remaining, b.tokens_at(0)   # 1 would remain; 3 still there
        (1, 3.0)
        """
        return self._check(unkeyed_now(now), self._cost(cost), False)

    def _check(self, now: int, cost: int, consume: bool) -> Decision:
        with self._lock:  # cost_t inside: a concurrent reconfigure cannot tear interval/tau
            cost_t = cost * self._interval
            tat = self._tat
            after = step(tat, now, cost_t, self._tau - cost_t)
            if consume and after >= 0:
                self._tat = after
        return self._decision(tat, after, now)

    def tokens(self) -> float:
        """Tokens in the bucket now.

        >>> b = TokenBucket(rate=1, capacity=2, clock=lambda: 0)
        >>> b.tokens(), b.allow(), b.tokens()
        (2.0, True, 1.0)
        """
        return self._tokens(self._tat, self._now())

    def tokens_at(self, now: int) -> float:
        """Tokens in the bucket at *now* (int ns).

        >>> b = TokenBucket(rate=4, capacity=2)
        >>> b.allow_at(0, cost=2), b.tokens_at(0), b.tokens_at(125_000_000)
        (True, 0.0, 0.5)
        """
        return self._tokens(self._tat, unkeyed_now(now))

    def __repr__(self) -> str:
        return f"TokenBucket(rate={self._rate!r}, capacity={self._capacity})"

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # A constructor call plus its word, as the Cython twin's; the maker's pid
        # goes along: a copy unpickled in another process warns as a fork's.
        args = (self._rate, self._capacity, self._clock, self._tat, os.getpid(), self._per_process)
        return _restore_token_bucket, args

    def refund(self, cost: int = 1) -> None:
        """Give back *cost* tokens for work that did not happen (never above capacity).

        >>> b = TokenBucket(rate=1, capacity=2, clock=lambda: 0)
        >>> b.allow(cost=2)   # then the work fails before it starts
        True
        >>> b.refund(cost=2); b.tokens()
        2.0
        """
        self._refund(self._now(), self._cost(cost))

    def refund_at(self, now: int, cost: int = 1) -> None:
        """`refund` at an explicit time *now* (int ns).

        >>> b = TokenBucket(rate=1, capacity=2)
        >>> b.allow_at(0, cost=2)
        True
        >>> b.refund_at(0); b.tokens_at(0)
        1.0
        """
        self._refund(unkeyed_now(now), self._cost(cost))

    def _refund(self, now: int, cost: int) -> None:
        with self._lock:
            self._tat = give_back(self._tat, now, cost * self._interval)

    def reset(self) -> None:
        """Forget the bucket's state: it is full again.

        >>> b = TokenBucket(rate=1, capacity=2)
        >>> b.allow_at(0, cost=2), b.reset(), b.tokens_at(0)
        (True, None, 2.0)
        """
        with self._lock:
            self._tat = 0  # no time is earlier: full at every now

    def reserve(
        self, *, cost: int = 1, max_wait_ns: int = 0, shape: bool = False, now: int | None = None
    ) -> int:
        """Reserve *cost* tokens; the ns to wait before using them, or -1 (nothing reserved).

        Unlike `allow` the bucket may go past empty: the reservation is a
        place in line (the tat), so later callers wait behind it, first in,
        first out. With *shape* the wait ends at the start of the slot (even
        spacing, no burst); otherwise when the bucket holds the tokens.
        Nothing is reserved when the wait would exceed *max_wait_ns*. *now*
        (int ns) is an explicit time, as in `allow_at`.

        >>> b = TokenBucket(rate=1, capacity=1)
        >>> b.reserve(now=0), b.reserve(now=0, max_wait_ns=5 * 10**9), b.reserve(now=0)
        (0, 1000000000, -1)
        """
        cost = self._cost(cost)
        max_wait = validated_max_wait(max_wait_ns)
        shape = validated_shape(shape)
        # Checked like every explicit time (the Cython twin does the same).
        now = self._now() if now is None else validated_now(now)
        with self._lock:
            cost_t = cost * self._interval
            wait, self._tat = reserve(
                self._tat, now, cost_t, cost_t if shape else self._tau, max_wait
            )
            return wait

    def reservation(
        self, *, cost: int = 1, max_wait_ns: int = 0, shape: bool = False, now: int | None = None
    ) -> Reservation:
        """`reserve`, as a `nanobucket.Reservation`: ``ok``, ``delay_ns``, ``cancel()``.

        >>> b = TokenBucket(rate=1, capacity=1)
        >>> r = b.reservation(now=0, max_wait_ns=10**9)
        >>> r.ok, r.delay_ns, b.reservation(now=0).ok, r.cancel_at(0), b.tokens_at(0)
        (True, 0, False, True, 1.0)
        """
        return Reservation.take(self, (), cost, max_wait_ns, shape, now)

    def reconfigure(
        self, rate: RateArg | None = None, capacity: int | None = None, *, now: int | None = None
    ) -> None:
        """Change the rate and/or the capacity, keeping the bucket's state.

        The tokens the bucket holds at *now* (default: its clock) carry over
        as they are, capped at the new capacity; a full bucket whose capacity
        grows keeps its tokens and refills the rest at the new rate. It is
        atomic with respect to every other verb, on every build: each
        decision is made with the old parameters or with the new ones, on
        the tokens as they were or as carried over. Callers waiting in line
        (``acquire``, `Waiting`) move with the tokens they reserved: woken
        earlier by a faster rate, later by a slower one, and refused at once
        when that is past their timeout. A rate written as text
        (``"200/minute"``) brings its count as the capacity, unless *capacity*
        is given; otherwise a capacity left out stays as it is.

        >>> b = TokenBucket(rate=1, capacity=4)
        >>> b.allow_at(0, cost=3)
        True
        >>> b.reconfigure(rate=10, capacity=2, now=0)   # the 1 token left stays
        >>> b.rate, b.capacity, b.tokens_at(0), b.tokens_at(100_000_000)
        (10, 2, 1.0, 2.0)
        """
        new_rate, cap, interval, tau = self._new_params(rate, capacity)
        now = self._now() if now is None else validated_now(now)
        with retimed(self, now), self._lock:
            self._tat = carry_over(self._tat, now, self._interval, self._tau, interval, tau)
            self._rate, self._capacity, self._interval, self._tau = new_rate, cap, interval, tau

    def acquire(self, cost: int = 1, timeout: float | None = None) -> bool:
        """Wait (block the thread) until *cost* tokens are spent, or *timeout* s pass.

        Waiters are served first in, first out; False at once when the wait
        would exceed *timeout* or too many waiters are queued (see `waiting`).

        >>> b = TokenBucket(rate=1000, capacity=1, clock=lambda: 0)
        >>> b.acquire(), b.acquire(timeout=0), b.acquire(timeout=1.0)   # the last sleeps 1 ms
        (True, False, True)
        """
        if type(cost) is not int or not 0 <= cost <= self._capacity:  # as `allow` does
            cost = unkeyed_cost(cost, self._capacity)
        if timeout is not None:
            validated_timeout(timeout)
        if self._allow(self._now(), cost):
            return True
        return _acquire.acquire_slow(self, (), cost, timeout)

    def acquire_async(self, cost: int = 1, timeout: float | None = None) -> Awaitable[bool]:
        """`acquire` for asyncio: ``await b.acquire_async()``; cancellation reserves nothing.

        >>> import asyncio
        >>> b = TokenBucket(rate=1000, capacity=1, clock=lambda: 0)
        >>> asyncio.run(b.acquire_async()), asyncio.run(b.acquire_async(timeout=0))
        (True, False)
        """
        return _acquire.acquire_async(self, (), cost, timeout)

    def __enter__(self) -> TokenBucket:
        _acquire.enter(self)
        return self

    def __exit__(self, *exc: object) -> None:
        return None  # a spent token stays spent

    def __aenter__(self) -> Awaitable[TokenBucket]:
        return _acquire.enter_async(self, (), self)

    def __aexit__(self, *exc: object) -> Awaitable[None]:
        return _acquire.exit_async()


def _restore_token_bucket(
    rate: RateLike,
    capacity: int,
    clock: Clock | None,
    tat: int,
    pid: int | None = None,
    per_process: bool = False,
) -> TokenBucket:
    """A `TokenBucket` as pickled: its parameters and its word (and where it was pickled)."""
    b = TokenBucket(rate, capacity, clock=clock, per_process=per_process)
    b._tat = tat
    if pid is not None and pid != os.getpid():
        b._lock = _forked_lock(b)  # its first use warns, as a fork's copy's
    return b


class KeyedTokenBucket(_Limits):
    """A token bucket per key, in a table of at most ``max_keys`` buckets.

    A full bucket and a missing key are the same state, so full buckets are
    dropped without loss. When a new key arrives at a table holding
    ``max_keys`` buckets, the full ones are dropped; if fewer than an eighth
    were full, the buckets closest to full are forgiven (dropped: their
    clients get back the few tokens they still owed) until an eighth of the
    table is free. Memory never grows past the bound.

    Key None is refused (`TypeError`): it is what a key function returns for
    a value that is missing, and every such request would share one bucket.
    With ``none_key=True`` None is a key like any other.

    >>> t = KeyedTokenBucket(rate=1, capacity=2)
    >>> [t.allow_at("alice", 0), t.allow_at("alice", 0), t.allow_at("alice", 0)]
    [True, True, False]
    >>> t.allow_at("bob", 0)
    True
    >>> KeyedTokenBucket("10 per second", capacity=20).interval_ns   # a rate as text
    100000000
    """

    __slots__ = (
        "_floor",
        "_max_keys",
        "_max_slots",
        "_none_key",
        "_now",
        "_room",
        "_slots",
        "_tats",
    )
    keyed = True  # the verbs take the key first

    def __init__(
        self,
        rate: RateArg,
        capacity: int | None = None,
        *,
        max_keys: int = DEFAULT_MAX_KEYS,
        clock: Clock | None = None,
        none_key: bool = False,
        per_process: bool = False,
    ) -> None:
        limits = self._new_limits(rate, capacity)
        max_keys = validated_max_keys(max_keys)
        now = _clock_reader(clock)
        none_key = validated_flag(none_key, "none_key")
        self._set_limits(limits, per_process)
        self._max_keys = max_keys
        self._none_key = none_key
        self._now = now
        self._tats: dict[Hashable, int] = {}
        # The sweep schedule of the Cython table (open addressing at 2/3 load
        # of a power-of-two slot count), kept here so that both hold the same
        # keys at every moment and decide alike even at the bound.
        self._slots = 8
        self._max_slots = slots_for(self._max_keys)
        self._room = min(self._slots * 2 // 3, self._max_keys)
        # The latest tat of a full bucket dropped so far: a missing key starts
        # from it, so an explicit time older than a dropped state cannot find
        # a fresh bucket (time going backwards never creates tokens).
        self._floor = 0
        # Re-entrant: a key's __eq__ or __hash__ may call back into this table.
        self._lock = threading.RLock()

    @property
    def max_keys(self) -> int:
        """The most buckets the table holds.

        >>> KeyedTokenBucket(rate=1, capacity=2, max_keys=1000).max_keys
        1000
        """
        return self._max_keys

    @property
    def none_key(self) -> bool:
        """Whether None is a key (``none_key=True``); else a verb given None raises.

        >>> KeyedTokenBucket(rate=1, capacity=2).none_key
        False
        """
        return self._none_key

    def _refuse_none(self, key: Hashable) -> None:
        """Raise for key None, unless the table takes it (off the hot path: see `_allow`)."""
        if key is None and not self._none_key:
            raise none_key_error(type(self).__name__)

    def allow(self, key: Hashable, cost: int = 1) -> bool:
        """Spend *cost* tokens from *key*'s bucket now; True if admitted.

        >>> t = KeyedTokenBucket(rate=1, capacity=1, clock=lambda: 0)
        >>> t.allow("alice"), t.allow("alice"), t.allow("bob")
        (True, False, True)
        """
        if type(cost) is not int or not 0 <= cost <= self._capacity:
            cost = validated_cost(cost, self._capacity)
        return self._allow(key, self._now(), cost)

    def allow_at(self, key: Hashable, now: int, cost: int = 1) -> bool:
        """`allow` at an explicit time *now* (int ns).

        >>> t = KeyedTokenBucket(rate=1, capacity=1)
        >>> t.allow_at("alice", 0), t.allow_at("alice", 0), t.allow_at("alice", 1_000_000_000)
        (True, False, True)
        """
        return self._allow(key, validated_now(now), self._cost(cost))

    def allow_many(self, keys: Iterable[Hashable], cost: int = 1) -> bytearray:
        """Decide a batch in order at one instant; ``bytearray`` of 1 (admitted) / 0.

        The same as ``allow_at(key, now, cost)`` for each key in turn, with one
        clock reading for the whole batch. *keys* is any iterable of keys; a
        buffer of unsigned 64-bit ints (``array('Q')``, numpy ``uint64``)
        means those ints, and the Cython table decides it without building
        an int object per key and with the GIL released while it charges.

        >>> t = KeyedTokenBucket(rate=1, capacity=2, clock=lambda: 0)
        >>> list(t.allow_many(["alice", "alice", "alice", "bob"]))
        [1, 1, 0, 1]
        >>> from array import array
        >>> list(t.allow_many(array("Q", [7, 7, 7, 8])))   # uint64: the buckets of ints 7, 8
        [1, 1, 0, 1]
        """
        return self._allow_many(keys, self._now(), self._cost(cost))

    def allow_many_at(self, keys: Iterable[Hashable], now: int, cost: int = 1) -> bytearray:
        """`allow_many` at an explicit time *now* (int ns).

        >>> t = KeyedTokenBucket(rate=1, capacity=1)
        >>> list(t.allow_many_at(["alice", "bob", "alice"], 0))
        [1, 1, 0]
        """
        return self._allow_many(keys, validated_now(now), self._cost(cost))

    def _allow_many(self, keys: Iterable[Hashable], now: int, cost: int) -> bytearray:
        if isinstance(keys, (str, bytes)):
            raise TypeError("keys must be a sequence of keys, not a single str or bytes")
        keys = list(keys)
        for key in keys:  # a bad key fails the batch before any token is spent
            hash(key)
            self._refuse_none(key)
        allow = self._allow
        return bytearray([allow(key, now, cost) for key in keys])

    def _allow(self, key: Hashable, now: int, cost: int) -> bool:
        tats = self._tats
        lock = self._lock
        lock.acquire()  # cheaper than `with` on the hot path
        try:
            cost_t = cost * self._interval  # inside: reconfigure cannot tear interval/tau
            tat = tats.get(key)
            missing = tat is None
            if tat is None:
                # Checked for a missing key only: a refused None is never
                # in the table, and a key found costs nothing more.
                if key is None:
                    self._refuse_none(key)
                tat = self._floor
            # `step` inlined: the keyed hot path (see `step`).
            base = tat if tat > now else now
            if base - now > self._tau - cost_t:
                return False
            if cost_t:
                # Only a key that is charged takes a place in the table.
                if missing and len(tats) >= self._room:
                    self._make_room(now)
                tats[key] = base + cost_t
            return True
        finally:
            lock.release()

    def check(self, key: Hashable, cost: int = 1) -> Decision:
        """Like `allow`, but return the whole `Decision`.

        >>> KeyedTokenBucket(rate=1, capacity=2, clock=lambda: 0).check("alice", cost=2)
        Decision(allowed=True, remaining=0, retry_after_ns=0, reset_after_ns=2000000000, limit=2)
        """
        return self._check(key, self._now(), self._cost(cost), True)

    def check_at(self, key: Hashable, now: int, cost: int = 1) -> Decision:
        """`check` at an explicit time *now* (int ns).

        >>> t = KeyedTokenBucket(rate=1, capacity=2)
        >>> t.check_at("alice", 0, cost=2)
        Decision(allowed=True, remaining=0, retry_after_ns=0, reset_after_ns=2000000000, limit=2)
        >>> d = t.check_at("alice", 500_000_000)   # half a token back: half a second to wait
        >>> d.allowed, d.remaining, d.retry_after, d.reset_after
        (False, 0, 0.5, 1.5)
        """
        return self._check(key, validated_now(now), self._cost(cost), True)

    def peek(self, key: Hashable, cost: int = 1) -> Decision:
        """The `Decision` `check` would return now, without spending anything.

        >>> t = KeyedTokenBucket(rate=1, capacity=1, clock=lambda: 0)
        >>> t.peek("alice").allowed, t.peek("alice").allowed, len(t)
        (True, True, 0)
        """
        return self._check(key, self._now(), self._cost(cost), False)

    def peek_at(self, key: Hashable, now: int, cost: int = 1) -> Decision:
        """`peek` at an explicit time *now* (int ns).

        >>> t = KeyedTokenBucket(rate=1, capacity=3)
        >>> t.peek_at("alice", 0, cost=2).remaining, t.tokens_at("alice", 0)
        (1, 3.0)
        """
        return self._check(key, validated_now(now), self._cost(cost), False)

    def _check(self, key: Hashable, now: int, cost: int, consume: bool) -> Decision:
        tats = self._tats
        with self._lock:  # cost_t inside: a concurrent reconfigure cannot tear interval/tau
            cost_t = cost * self._interval
            tat = tats.get(key)
            missing = tat is None
            if tat is None:
                self._refuse_none(key)
                tat = self._floor
            after = step(tat, now, cost_t, self._tau - cost_t)
            if consume and after >= 0 and cost_t:  # a place only when charged (`_allow`)
                if missing and len(tats) >= self._room:
                    self._make_room(now)
                tats[key] = after
        return self._decision(tat, after, now)

    def tokens(self, key: Hashable) -> float:
        """Tokens in *key*'s bucket now.

        >>> t = KeyedTokenBucket(rate=1, capacity=2, clock=lambda: 0)
        >>> t.allow("alice"), t.tokens("alice"), t.tokens("bob")
        (True, 1.0, 2.0)
        """
        return self.tokens_at(key, self._now())

    def tokens_at(self, key: Hashable, now: int) -> float:
        """Tokens in *key*'s bucket at *now* (int ns).

        >>> t = KeyedTokenBucket(rate=4, capacity=2)
        >>> t.allow_at("alice", 0, cost=2)
        True
        >>> t.tokens_at("alice", 0), t.tokens_at("alice", 125_000_000), t.tokens_at("bob", 0)
        (0.0, 0.5, 2.0)
        """
        now = validated_now(now)
        self._refuse_none(key)
        with self._lock:
            tat = self._tats.get(key, self._floor)
        return self._tokens(tat, now)

    def __len__(self) -> int:
        """Keys whose buckets are not full (still owing tokens) now.

        >>> t = KeyedTokenBucket(rate=1, capacity=2, clock=lambda: 0)
        >>> t.allow("alice"), t.allow("bob", cost=0), len(t)   # a cost-0 probe takes no place
        (True, True, 1)
        """
        now = self._now()
        with self._lock:
            return sum(1 for tat in self._tats.values() if tat > now)

    def __reduce__(self) -> tuple[object, ...]:
        raise unpicklable_error("KeyedTokenBucket")

    def _make_room(self, now: int) -> None:
        # Called with the lock held when the table is at its room. Full
        # buckets go (lossless); at max_keys, so does the eighth closest to
        # full (forgiven), so that the next max_keys/8 new keys insert in
        # O(1); then the room doubles if the survivors fill half of it.
        tats = self._tats
        full = [key for key, tat in tats.items() if tat <= now]
        for key in full:
            self._floor = max(self._floor, tats.pop(key))
        excess = len(tats) - (self._max_keys - max(1, self._max_keys // 8))
        if excess > 0:
            # Closest to full first; among equals, the earliest to arrive
            # (nsmallest is stable, a dict keeps arrival order: the Cython
            # table's order, so both forgive the same keys).
            for key in heapq.nsmallest(excess, tats, key=tats.__getitem__):
                del tats[key]
        if len(tats) > self._room // 2 and self._slots < self._max_slots:
            self._slots *= 2
        self._room = min(self._slots * 2 // 3, self._max_keys)

    def __repr__(self) -> str:
        return (
            f"KeyedTokenBucket(rate={self._rate!r}, capacity={self._capacity}, "
            f"max_keys={self._max_keys}{', none_key=True' if self._none_key else ''})"
        )

    def refund(self, key: Hashable, cost: int = 1) -> None:
        """Give back *cost* tokens to *key*'s bucket.

        Never above capacity; a key not in the table gets nothing.

        >>> t = KeyedTokenBucket(rate=1, capacity=2, clock=lambda: 0)
        >>> t.allow("alice", cost=2)   # then the work fails before it starts
        True
        >>> t.refund("alice", cost=2); t.tokens("alice")
        2.0
        """
        self._refund(key, self._now(), self._cost(cost))

    def refund_at(self, key: Hashable, now: int, cost: int = 1) -> None:
        """`refund` at an explicit time *now* (int ns).

        >>> t = KeyedTokenBucket(rate=1, capacity=2)
        >>> t.allow_at("alice", 0, cost=2)
        True
        >>> t.refund_at("alice", 0); t.tokens_at("alice", 0)
        1.0
        """
        self._refund(key, validated_now(now), self._cost(cost))

    def _refund(self, key: Hashable, now: int, cost: int) -> None:
        self._refuse_none(key)
        tats = self._tats
        with self._lock:
            tat = tats.get(key)
            if tat is not None:  # a missing key is full: nothing to give back
                tats[key] = give_back(tat, now, cost * self._interval)

    def reset(self, key: Hashable) -> None:
        """Forget *key*'s bucket: the next decision sees it full.

        >>> t = KeyedTokenBucket(rate=1, capacity=2)
        >>> t.allow_at("alice", 0, cost=2), t.reset("alice"), t.tokens_at("alice", 0)
        (True, None, 2.0)
        """
        hash(key)  # an unhashable key raises, as in every verb
        self._refuse_none(key)
        now = self._now()
        tats = self._tats
        with self._lock:
            if key in tats:
                tats[key] = 0  # no time is earlier: full at every now
            elif self._floor > 0:  # a missing key is not full (see reconfigure)
                if len(tats) >= self._room:
                    self._make_room(now)
                tats[key] = 0

    def reserve(
        self,
        key: Hashable,
        *,
        cost: int = 1,
        max_wait_ns: int = 0,
        shape: bool = False,
        now: int | None = None,
    ) -> int:
        """`TokenBucket.reserve` for *key*'s bucket.

        >>> t = KeyedTokenBucket(rate=1, capacity=1)
        >>> t.reserve("alice", now=0), t.reserve("alice", now=0, max_wait_ns=10**9)
        (0, 1000000000)
        """
        cost = self._cost(cost)
        max_wait = validated_max_wait(max_wait_ns)
        shape = validated_shape(shape)
        # Checked like every explicit time (the Cython twin does the same).
        now = self._now() if now is None else validated_now(now)
        self._refuse_none(key)
        tats = self._tats
        with self._lock:
            cost_t = cost * self._interval
            tat = tats.get(key)
            if tat is None:
                tat = self._floor
                if len(tats) >= self._room:
                    self._make_room(now)
            wait, after = reserve(tat, now, cost_t, cost_t if shape else self._tau, max_wait)
            if wait >= 0 and cost_t:  # a place only when charged (`_allow`)
                tats[key] = after
            return wait

    def reservation(
        self,
        key: Hashable,
        *,
        cost: int = 1,
        max_wait_ns: int = 0,
        shape: bool = False,
        now: int | None = None,
    ) -> Reservation:
        """`reserve` for *key*, as a `nanobucket.Reservation`: ``ok``, ``delay_ns``, ``cancel()``.

        >>> t = KeyedTokenBucket(rate=1, capacity=1)
        >>> r = t.reservation("alice", now=0)
        >>> r.ok, t.tokens_at("alice", 0), r.cancel_at(0), t.tokens_at("alice", 0)
        (True, 0.0, True, 1.0)
        """
        return Reservation.take(self, (key,), cost, max_wait_ns, shape, now)

    def reconfigure(
        self, rate: RateArg | None = None, capacity: int | None = None, *, now: int | None = None
    ) -> None:
        """Change the rate and/or the capacity of every bucket, keeping their state.

        Each bucket's tokens at *now* (default: the clock) carry over as they
        are, capped at the new capacity -- keys not in the table too (they
        were full: with a larger capacity they keep the old capacity's tokens
        and refill the rest). Takes time in proportion to the table's size,
        and excludes every other keyed verb meanwhile, on every build.
        Callers waiting in line move with their tokens, as in
        `TokenBucket.reconfigure`.

        >>> t = KeyedTokenBucket(rate=1, capacity=4)
        >>> t.allow_at("alice", 0, cost=3)
        True
        >>> t.reconfigure(rate=10, capacity=2, now=0)   # alice's 1 token stays; bob is full
        >>> t.tokens_at("alice", 0), t.tokens_at("alice", 100_000_000), t.tokens_at("bob", 0)
        (1.0, 2.0, 2.0)
        """
        new_rate, cap, interval, tau = self._new_params(rate, capacity)
        now = self._now() if now is None else validated_now(now)
        with retimed(self, now), self._lock:
            old_interval, old_tau = self._interval, self._tau
            tats = self._tats
            for key, tat in tats.items():
                tats[key] = carry_over(tat, now, old_interval, old_tau, interval, tau)
            self._floor = carry_over(self._floor, now, old_interval, old_tau, interval, tau)
            self._rate, self._capacity, self._interval, self._tau = new_rate, cap, interval, tau

    def acquire(self, key: Hashable, cost: int = 1, timeout: float | None = None) -> bool:
        """Wait (block the thread) until *cost* tokens of *key* are spent, or *timeout* s pass.

        >>> t = KeyedTokenBucket(rate=1000, capacity=1, clock=lambda: 0)
        >>> t.acquire("alice"), t.acquire("alice", timeout=0), t.acquire("alice", timeout=1.0)
        (True, False, True)
        """
        cost = self._cost(cost)
        if timeout is not None:
            validated_timeout(timeout)
        if self._allow(key, self._now(), cost):
            return True
        return _acquire.acquire_slow(self, (key,), cost, timeout)

    def acquire_async(
        self, key: Hashable, cost: int = 1, timeout: float | None = None
    ) -> Awaitable[bool]:
        """`acquire` for asyncio: ``await t.acquire_async(key)``.

        >>> import asyncio
        >>> t = KeyedTokenBucket(rate=1000, capacity=1, clock=lambda: 0)
        >>> asyncio.run(t.acquire_async("alice")), asyncio.run(t.acquire_async("alice", timeout=0))
        (True, False)
        """
        return _acquire.acquire_async(self, (key,), cost, timeout)
