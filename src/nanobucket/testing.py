"""Testing support: limits turned off, and a manual clock for every limiter a test builds.

* `disabled()`: a block (or, with ``NANOBUCKET_DISABLED=1`` in the
  environment at import, the whole run) in which every HTTP integration
  (the ASGI and WSGI middlewares, the FastAPI dependency, Django's
  middleware and decorator, the DRF throttle) and every ``@limit`` function
  admits without deciding: no 429, no ``RateLimited``, no rate-limit header
  fields, no token spent, no counter or hook. A limiter called by your own
  code (``bucket.allow()``, ``Waiting``, an outbound client's pacing) still
  counts: the switch is for the integrations, not the limiters.
* `FakeClock` and `use_clock()`: limiters built inside the block without a
  ``clock=`` of their own (in-process ``TokenBucket`` and
  ``KeyedTokenBucket``, on either implementation, and the shared-memory
  tables) read the manual clock, which moves only by ``advance``. A limiter
  built before the block keeps its clock; a Redis limiter decides on the
  server's clock and is not affected.
* The pytest fixtures ``fake_clock`` and ``limits_disabled``: add
  ``pytest_plugins = ["nanobucket.testing"]`` to your ``conftest.py``.

>>> import nanobucket as nb
>>> with use_clock() as clock:
...     bucket = nb.TokenBucket(rate=1, capacity=2)
>>> [bucket.allow() for _ in range(3)]
[True, True, False]
>>> clock.advance(1)
>>> bucket.allow(), bucket.allow()
(True, False)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from fractions import Fraction
from numbers import Real

from ._compose import switch
from ._core._params import NOW_MAX, NS_PER_S, install_default_clock, validated_now

__all__ = ("FakeClock", "disabled", "use_clock")


class FakeClock:
    """A manual clock: a callable returning int ns that moves only when told.

    >>> clock = FakeClock()
    >>> clock.advance(0.25)
    >>> clock(), clock.now_ns
    (250000000, 250000000)
    """

    __slots__ = ("now_ns",)

    def __init__(self, start_ns: int = 0) -> None:
        #: The time it reads, int ns.
        self.now_ns = validated_now(start_ns)

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float | int | Fraction | Decimal) -> None:
        """Move the clock *seconds* forward (a real number or Decimal >= 0, to the nearest ns).

        >>> clock = FakeClock()
        >>> clock.advance(Fraction(1, 3)); clock()
        333333333
        >>> clock.advance(-1)
        Traceback (most recent call last):
        ...
        ValueError: a clock only moves forward: seconds must be >= 0, got -1
        """
        if isinstance(seconds, bool) or not isinstance(seconds, (Real, Decimal)):
            raise TypeError(f"seconds must be a real number, not {type(seconds).__name__}")
        if not isinstance(seconds, int) and not math.isfinite(seconds):
            raise ValueError(f"seconds must be finite, got {seconds!r}")
        if seconds < 0:
            raise ValueError(f"a clock only moves forward: seconds must be >= 0, got {seconds!r}")
        self.advance_ns(round(Fraction(seconds) * NS_PER_S))

    def advance_ns(self, ns: int) -> None:
        """Move the clock *ns* nanoseconds forward (an int >= 0).

        >>> clock = FakeClock(5)
        >>> clock.advance_ns(10); clock()
        15
        """
        if isinstance(ns, bool) or not isinstance(ns, int):
            raise TypeError(f"ns must be an int, not {type(ns).__name__}")
        if ns < 0:
            raise ValueError(f"a clock only moves forward: ns must be >= 0, got {ns!r}")
        if self.now_ns + ns > NOW_MAX:
            raise ValueError(f"the clock would pass 2**62 ns ({self.now_ns} + {ns})")
        self.now_ns += ns

    def __repr__(self) -> str:
        return f"FakeClock(now_ns={self.now_ns})"


@contextmanager
def use_clock(clock: Callable[[], int] | None = None) -> Iterator[Callable[[], int]]:
    """Limiters built in the block without ``clock=`` read *clock* (default: a new `FakeClock`).

    Yields the clock. Blocks nest; each restores the clock it found. The
    clock is the process's, not the thread's: limiters another thread
    builds meanwhile read it too.

    >>> import nanobucket as nb
    >>> with use_clock(FakeClock(start_ns=7)) as clock:
    ...     nb.KeyedTokenBucket(rate=1, capacity=1).clock_ns()
    7
    """
    chosen = FakeClock() if clock is None else clock
    last = install_default_clock(chosen)
    try:
        yield chosen
    finally:
        install_default_clock(last)


@contextmanager
def disabled() -> Iterator[None]:
    """Every HTTP integration and ``@limit`` admits without deciding in the block.

    Blocks nest; each restores what it found (``NANOBUCKET_DISABLED=1`` at
    import turns it on for the whole process instead).

    >>> from nanobucket import limit, TokenBucket
    >>> @limit(TokenBucket(rate=1, capacity=1))
    ... def ping() -> str: return "pong"
    >>> with disabled():
    ...     [ping() for _ in range(3)]
    ['pong', 'pong', 'pong']
    >>> ping.limiter.tokens() == 1.0      # nothing was spent
    True
    """
    last = switch.turn_off(True)
    try:
        yield
    finally:
        switch.turn_off(last)


try:
    import pytest
except ImportError:  # pragma: no cover - the fixtures need pytest, the rest does not
    pass
else:

    @pytest.fixture(name="fake_clock")
    def _fake_clock() -> Iterator[FakeClock]:
        """A `FakeClock` that every limiter the test builds without ``clock=`` reads."""
        with use_clock(FakeClock()) as clock:
            assert isinstance(clock, FakeClock)
            yield clock

    @pytest.fixture(name="limits_disabled")
    def _limits_disabled() -> Iterator[None]:
        """Every HTTP integration and ``@limit`` admits without deciding during the test."""
        with disabled():
            yield
