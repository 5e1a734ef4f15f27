"""Validation and integer parameters shared by both implementations.

A limiter is reduced to two integers, both in nanoseconds:

* ``interval_ns`` -- the time one token takes to refill, ``ceil(1e9 / rate)``.
  When ``1e9 / rate`` is whole this is exact; otherwise rounding *up* makes
  the bucket refill a hair slower than asked, never faster (conservative).
  The shortfall is below ``rate / 1e9`` tokens per token: under one token
  per million for every rate up to 1000/s, whatever its fraction.
* ``tau_ns`` -- ``capacity * interval_ns``, the time an empty bucket takes to
  fill again.

State is one ``tat`` (theoretical arrival time) per bucket, an int64 in ns.
Times are ints in ``[0, NOW_MAX]`` and ``tau_ns <= TAU_MAX``, so every sum
the algorithm forms stays below ``2**63`` (146 years of uptime).
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from numbers import Rational

NS_PER_S = 1_000_000_000
NOW_MAX = (1 << 62) - 1
TAU_MAX = 1 << 62
RATE_MAX = NS_PER_S  # one token per nanosecond: finer is not representable
MAX_KEYS = (1 << 31) - 1  # the Cython table indexes its entries with int32

RateLike = int | float | Fraction | Decimal


def rate_fraction(rate: object) -> Fraction:
    """Return *rate* (tokens per second) as an exact positive Fraction."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float, Rational, Decimal)):
        raise TypeError(f"rate must be an int, float or Fraction, not {type(rate).__name__}")
    if isinstance(rate, float):
        if not math.isfinite(rate):
            raise ValueError(f"rate must be finite, got {rate!r}")
        # The decimal the user wrote (0.1), not the binary float's expansion.
        value = Fraction(repr(rate))
    elif isinstance(rate, Decimal):
        if not rate.is_finite():
            raise ValueError(f"rate must be finite, got {rate!r}")
        value = Fraction(rate)
    else:
        value = Fraction(rate)
    if value <= 0:
        raise ValueError(f"rate must be > 0, got {rate!r}")
    if value > RATE_MAX:
        raise ValueError(f"rate must be at most 1e9 per second, got {rate!r}")
    return value


def check_capacity(capacity: object) -> int:
    """Return *capacity* as an int >= 1, or raise."""
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise TypeError(f"capacity must be an int, not {type(capacity).__name__}")
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity!r}")
    return int(capacity)


def bucket_params(rate: object, capacity: object) -> tuple[Fraction, int, int, int]:
    """Validate and return ``(rate, capacity, interval_ns, tau_ns)``."""
    exact = rate_fraction(rate)
    cap = check_capacity(capacity)
    interval = math.ceil(NS_PER_S / exact)
    tau = cap * interval
    if tau > TAU_MAX:
        raise ValueError(
            # Decimal: a capacity of 10**400 must not overflow a float in the message.
            f"capacity / rate = {Decimal(tau) / NS_PER_S:.3g} s to refill: "
            f"more than {TAU_MAX / NS_PER_S / 86400 / 365.25:.0f} years"
        )
    return exact, cap, interval, tau


def check_cost(cost: object, capacity: int) -> int:
    """Return *cost* as an int in ``[0, capacity]``, or raise."""
    if isinstance(cost, bool) or not isinstance(cost, int):
        raise TypeError(f"cost must be an int, not {type(cost).__name__}")
    if cost < 0:
        raise ValueError(f"cost must be >= 0, got {cost!r}")
    if cost > capacity:
        raise ValueError(f"cost {cost!r} exceeds capacity {capacity}: it could never be admitted")
    return int(cost)


def check_now(now: object) -> int:
    """Return *now* (int ns) if in ``[0, NOW_MAX]``, or raise."""
    if isinstance(now, bool) or not isinstance(now, int):
        raise TypeError(f"now must be an int of nanoseconds, not {type(now).__name__}")
    if now < 0 or now > NOW_MAX:
        raise ValueError(f"now must be in [0, 2**62) ns, got {now!r}")
    return int(now)


def check_max_keys(max_keys: object) -> int:
    """Return *max_keys* as an int >= 1, or raise."""
    if isinstance(max_keys, bool) or not isinstance(max_keys, int):
        raise TypeError(f"max_keys must be an int, not {type(max_keys).__name__}")
    if max_keys < 1 or max_keys > MAX_KEYS:
        raise ValueError(f"max_keys must be in [1, 2**31 - 1], got {max_keys!r}")
    return int(max_keys)
