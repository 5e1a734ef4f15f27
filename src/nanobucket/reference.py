"""The textbook token bucket, as usually written, and in exact arithmetic.

`NaiveBucket` is the common ``allow(now)`` (floats, seconds, cost 1), its
globals turned into attributes; `MonotonicNaiveBucket` is the same reading
``time.monotonic()``, the baseline the benchmarks measure against.
`ExactBucket` is the same algorithm in `Fraction` arithmetic, with integer
nanoseconds and a cost: the model every implementation is tested against.
"""

from __future__ import annotations

import time
from fractions import Fraction

from ._core._params import NS_PER_S, RateLike, rate_fraction


class NaiveBucket:
    """The textbook algorithm in floats: ``allow(now)`` with *now* in seconds.

    >>> b = NaiveBucket(rate=100, capacity=200)
    >>> sum(b.allow(0.0) for _ in range(250))
    200
    """

    def __init__(self, rate: float = 100, capacity: float = 200) -> None:
        self.capacity = capacity
        self.rate = rate
        self.tokens = capacity
        self.last_time = 0.0

    def allow(self, now: float) -> bool:
        """Refill for the time since the last call, then spend one token if there is one.

        >>> b = NaiveBucket(rate=1, capacity=1)
        >>> b.allow(0.0), b.allow(0.5), b.allow(1.5)
        (True, False, True)
        """
        self.tokens = min(self.capacity, self.tokens + (now - self.last_time) * self.rate)
        self.last_time = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class MonotonicNaiveBucket:
    """The textbook algorithm as a class that reads ``time.monotonic()``.

    >>> b = MonotonicNaiveBucket(rate=1, capacity=5)
    >>> sum(b.allow() for _ in range(10))   # a burst: the first 5 pass
    5
    """

    def __init__(self, rate: float = 100, capacity: float = 200) -> None:
        self.capacity = capacity
        self.rate = rate
        self.tokens = capacity
        self.last_time = time.monotonic()

    def allow(self) -> bool:
        """`NaiveBucket.allow` at ``time.monotonic()``.

        >>> b = MonotonicNaiveBucket(rate=1, capacity=1)
        >>> b.allow(), b.allow()
        (True, False)
        """
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.last_time) * self.rate)
        self.last_time = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class ExactBucket:
    """The textbook algorithm in exact rational arithmetic, times in int ns.

    Starts full; ``tokens = min(capacity, tokens + elapsed * rate)``; admits
    iff ``tokens >= cost``. An older *now* adds nothing (elapsed is never
    negative), so replays out of order cannot create tokens.

    >>> b = ExactBucket(rate=100, capacity=200)
    >>> sum(b.allow_at(0) for _ in range(250)), b.allow_at(10_000_000)
    (200, True)
    """

    def __init__(self, rate: RateLike, capacity: int) -> None:
        self.rate = rate_fraction(rate)
        self.capacity = capacity
        self.tokens = Fraction(capacity)
        self.last_time = 0

    def tokens_at(self, now: int) -> Fraction:
        """Tokens at *now* (int ns), exactly; a *now* older than the last call adds nothing.

        >>> b = ExactBucket(rate=3, capacity=1)
        >>> b.allow_at(0), b.tokens_at(100_000_000)
        (True, Fraction(3, 10))
        """
        elapsed = max(0, now - self.last_time)
        return min(Fraction(self.capacity), self.tokens + elapsed * self.rate / NS_PER_S)

    def allow_at(self, now: int, cost: int = 1) -> bool:
        """Spend *cost* tokens at *now* (int ns) if there are that many; True if admitted.

        >>> b = ExactBucket(rate=1, capacity=2)
        >>> b.allow_at(0, cost=2), b.allow_at(500_000_000), b.allow_at(1_000_000_000)
        (True, False, True)
        """
        self.tokens = self.tokens_at(now)
        self.last_time = max(self.last_time, now)
        if self.tokens < cost:
            return False
        self.tokens -= cost
        return True
