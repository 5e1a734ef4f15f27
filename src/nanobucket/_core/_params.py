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

Every number is read once, as the exact value it holds, and that value is
both checked and used: an int subclass is its int value (its ``__int__``,
``__index__`` or comparisons are never asked, so they cannot pass the check
with one value and be used with another), and the type test is on
``type()``, which an object cannot fake by claiming a ``__class__``.
"""

from __future__ import annotations

import math
import operator
import re
import time
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from numbers import Rational, Real

NS_PER_S = 1_000_000_000
NOW_MAX = (1 << 62) - 1
TAU_MAX = 1 << 62
RATE_MAX = NS_PER_S  # one token per nanosecond: finer is not representable
MAX_KEYS = (1 << 31) - 1  # the Cython table indexes its entries with int32
FOREVER_NS = 1 << 62  # a wait "as long as it takes" (146 years): within every backend's range

RateLike = int | float | Fraction | Decimal
RateArg = RateLike | str  # a rate as given: tokens per second, or text ("100/minute")
Clock = Callable[[], int]


def exact_int(value: object, name: str, kind_name: str = "an int") -> int:
    """Return *value*, an int (or int subclass, not bool), as the exact int it holds, or raise."""
    kind = type(value)
    if kind is int:
        return value  # type: ignore[return-value]
    if kind is bool or not issubclass(kind, int):
        raise TypeError(f"{name} must be {kind_name}, not {kind.__name__}")
    # int's own __index__, explicitly: the value as an exact int, whatever
    # the subclass's __index__ or __int__ would say.
    return int.__index__(value)  # type: ignore[arg-type]


def int_at_least(value: object, name: str, minimum: int) -> int:
    """Return *value*, an int (not bool) >= *minimum*, as the exact int it holds, or raise."""
    number = exact_int(value, name)
    if number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number!r}")
    return number


def real_seconds(value: object, name: str) -> int | float:
    """Return *value*, an int or float of seconds (not bool), or raise TypeError.

    The range is the caller's: each duration has its own.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    return value


def validated_timeout(timeout: object) -> float | None:
    """Return *timeout* (seconds, >= 0, or None for no limit), or raise.

    >>> validated_timeout(1), validated_timeout(None)
    (1.0, None)
    >>> validated_timeout(-1)
    Traceback (most recent call last):
    ...
    ValueError: timeout must be >= 0 seconds, got -1
    """
    if timeout is None:
        return None
    kind = type(timeout)  # not isinstance: an object can claim a __class__
    if kind is bool or not issubclass(kind, (int, float)):
        raise TypeError(f"timeout must be a number of seconds or None, not {kind.__name__}")
    # The value itself, read once: a subclass's __float__ or __index__ is not asked.
    if issubclass(kind, float):
        seconds = float.__float__(timeout)  # type: ignore[arg-type]
    else:
        try:
            seconds = float(exact_int(timeout, "timeout"))
        except OverflowError:
            seconds = math.inf  # more seconds than a float holds: no limit
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout!r}")
    return seconds


#: The clock a limiter built without ``clock=`` reads: None is the monotonic
#: clock; `nanobucket.testing` installs a manual one for a test's limiters.
_default_clock: Clock | None = None


def install_default_clock(clock: Clock | None) -> Clock | None:
    """Make *clock* the one limiters built from now on without ``clock=`` read; return the last."""
    global _default_clock
    if clock is not None:
        validated_clock(clock)
    last, _default_clock = _default_clock, clock
    return last


def validated_clock(clock: object) -> Clock | None:
    """Return *clock*, a callable returning int ns, or raise; None is the default clock
    (the monotonic clock, which None stands for, unless `install_default_clock` put another)."""
    if clock is None:
        return _default_clock
    if not callable(clock):
        raise TypeError(f"clock must be a callable returning int ns, not {type(clock).__name__}")
    return clock


def clock_or_monotonic(clock: object) -> Clock:
    """*clock* validated as `validated_clock` does; None is ``time.monotonic_ns``."""
    return time.monotonic_ns if clock is None else validated_clock(clock)  # type: ignore[return-value]


def rate_fraction(rate: object) -> Fraction:
    """Return *rate* (tokens per second, or text such as ``"100/minute"``) as an exact
    positive Fraction."""
    kind = type(rate)
    value: Fraction
    if issubclass(kind, str):
        value = rate_text(str.__str__(rate))[0]  # its text, not a subclass's
    elif kind is bool or not issubclass(kind, (int, Real, Decimal)):
        raise TypeError(
            f"rate must be a real number of tokens per second (an int, float, Fraction, "
            f"Decimal or other numbers.Real) or a rate written as text such as "
            f"{RATE_TEXT_EXAMPLES}, not {kind.__name__}"
        )
    elif issubclass(kind, int):
        value = Fraction(exact_int(rate, "rate"))
    elif not issubclass(kind, (Rational, Decimal)):
        # A float, or another Real (numpy.float32, ...): its float value, read once.
        if issubclass(kind, float):
            number = float.__float__(rate)  # not a subclass's say
        else:
            number = float(rate)  # type: ignore[arg-type]
        if not math.isfinite(number):
            raise ValueError(f"rate must be finite, got {number!r}")
        # The decimal the user wrote (0.1), not the binary float's expansion.
        value = Fraction(float.__repr__(number))
    elif issubclass(kind, Decimal):
        decimal = Decimal(rate)  # type: ignore[arg-type]  # of a subclass: its value, copied
        if not decimal.is_finite():
            raise ValueError(f"rate must be finite, got {decimal!r}")
        value = Fraction(decimal)
    else:
        # Any Rational (Fraction, a subclass, a registered type): each part
        # read once, then normalised (Fraction(x) alone would keep x's parts
        # as they are, even a zero or negative denominator).
        numerator = operator.index(rate.numerator)  # type: ignore[attr-defined]
        denominator = operator.index(rate.denominator)  # type: ignore[attr-defined]
        if denominator <= 0:
            raise ValueError(f"rate must have a denominator > 0, got {denominator}")
        value = Fraction(numerator, denominator)
    if value <= 0:
        raise ValueError(f"rate must be > 0, got {rate!r}")
    if value > RATE_MAX:
        raise ValueError(f"rate must be at most 1e9 per second, got {rate!r}")
    return value


# A rate written as text, as settings, environment variables and the other
# Python limiters hold it: a count, "/" or "per", an optional multiple, a unit.
# Only units of one fixed length: a month or a year is not one.
_UNIT_SECONDS = {
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    "w": 604800, "week": 604800, "weeks": 604800,
}  # fmt: skip
# No two runs of spaces side by side, so a long text fails in linear time;
# numbers of at most 20 digits (past 1e9 tokens per second anyway).
_RATE_TEXT = re.compile(
    r"\s*(\d{1,20})\s*(?:/|per)\s*(?:(\d{1,20})\s*)?([a-z]+)\s*", re.IGNORECASE | re.ASCII
)
RATE_TEXT_EXAMPLES = "'100/minute', '10 per second', '5/s' or '2 per 5 seconds'"


def is_rate_text(value: object) -> bool:
    """Whether *value* is meant as a rate written as text: a str that starts with a digit.

    No dotted path or other name does, so a setting that takes either can tell them apart.

    >>> is_rate_text(" 100/minute"), is_rate_text("myapp.limits.api")
    (True, False)
    """
    return isinstance(value, str) and value.lstrip()[:1].isdigit()


def rate_text(text: str) -> tuple[Fraction, int]:
    """``(rate, count)`` of a rate written as text: exact tokens per second, and the count.

    ``"<count>/<unit>"`` or ``"<count> per <n> <units>"``, in any case and
    spacing; the units are second, minute, hour, day and week (``s``,
    ``sec``, ``m``, ``min``, ``h``, ``hr``, ``d``, ``w``; a plural takes an s).

    >>> rate_text("100/minute"), rate_text("2 per 5 seconds")
    ((Fraction(5, 3), 100), (Fraction(2, 5), 2))
    >>> rate_text("100/fortnight")
    Traceback (most recent call last):
    ...
    ValueError: rate '100/fortnight' cannot be read: ... e.g. '100/minute', ...
    """
    match = _RATE_TEXT.fullmatch(text)
    unit = match[3].lower() if match else ""
    if match is None or unit not in _UNIT_SECONDS:
        raise ValueError(f"rate {text!r} cannot be read: {_rate_text_error(text, unit)}")
    count, multiple = int(match[1]), int(match[2] or 1)
    if count < 1 or multiple < 1:
        raise ValueError(
            f"rate {text!r} admits nothing: the count and the time must both be "
            f"at least 1, e.g. {RATE_TEXT_EXAMPLES}"
        )
    return Fraction(count, multiple * _UNIT_SECONDS[unit]), count


def _rate_text_error(text: str, unit: str) -> str:
    """What is wrong with *text*, which `rate_text` did not read (*unit*: its unit, if any)."""
    if unit.startswith(("month", "mo", "year", "yr", "y")):
        return "a month or a year has no fixed length; write it in days, e.g. '10000 per 30 days'"
    if text.strip().isdigit():
        return f"it has no time unit, e.g. '{text.strip()}/second' or '{text.strip()}/minute'"
    if any(sep in text for sep in ",;|"):
        return (
            "it holds several rates; give one, and for several limits at once "
            "use all_of(KeyedTokenBucket('10/second'), KeyedTokenBucket('100/minute'))"
        )
    return (
        "write a whole count, '/' or 'per', and a unit (second, minute, hour, day, week, "
        f"or s, sec, m, min, h, hr, d, w), e.g. {RATE_TEXT_EXAMPLES}"
    )


def public_rate(rate: object, exact: Fraction) -> RateLike:
    """The ``rate`` a limiter reports for *rate*: the kind of number given, of value *exact*.

    An int as an int, a float (or another Real) as a float, a Decimal as a
    Decimal, a Fraction (or other Rational) as the exact Fraction. Never the
    object given: a reconfigure re-reads the stored rate, and it must be the
    value that was checked. The arithmetic uses *exact* throughout. A rate
    written as text is the exact number it stands for: an int if whole, else the Fraction.

    >>> public_rate("100/minute", Fraction(5, 3)), public_rate("5/s", Fraction(5))
    (Fraction(5, 3), 5)
    """
    kind = type(rate)
    if issubclass(kind, str):
        return exact.numerator if exact.denominator == 1 else exact
    if issubclass(kind, int):
        return exact.numerator
    if issubclass(kind, Rational):
        return exact
    if issubclass(kind, Decimal):
        return Decimal(rate)  # type: ignore[arg-type]  # its value, copied (exact)
    return float(exact)  # the float given: exact holds its shortest decimal


def stored_rate(exact: Fraction) -> RateLike:
    """The ``rate`` of a limiter known only by its exact value (a shared table opened).

    An int if whole, a float if one prints as that value (0.1), else the Fraction.
    """
    if exact.denominator == 1:
        return exact.numerator
    number = float(exact)
    return number if Fraction(repr(number)) == exact else exact


def kept_capacity(rate: object, capacity: int | None, current: int) -> int | None:
    """The capacity a reconfigure to *rate* and *capacity* (None: unchanged) checks.

    Left out, the capacity stays *current*, but for a rate written as text,
    which brings its own count: after ``reconfigure(rate="200/minute")`` a
    bucket has the limits ``TokenBucket("200/minute")`` has.

    >>> kept_capacity(5, None, 20), kept_capacity("200/minute", None, 20), kept_capacity(5, 7, 20)
    (20, None, 7)
    """
    return current if capacity is None and not isinstance(rate, str) else capacity


def validated_capacity(capacity: object) -> int:
    """Return *capacity* as an int >= 1, or raise."""
    return int_at_least(capacity, "capacity", 1)


def bucket_params(rate: object, capacity: object = None) -> tuple[Fraction, int, int, int]:
    """Validate and return ``(rate, capacity, interval_ns, tau_ns)``.

    A rate written as text brings its capacity, the count, unless one is given:

    >>> bucket_params("100/minute"), bucket_params("1/3s", 5)
    ((Fraction(5, 3), 100, 600000000, 60000000000), (Fraction(1, 3), 5, 3000000000, 15000000000))
    """
    if capacity is None and isinstance(rate, str):
        exact, cap = rate_text(str.__str__(rate))
        if exact > RATE_MAX:
            raise ValueError(f"rate must be at most 1e9 per second, got {rate!r}")
    else:
        exact = rate_fraction(rate)
        if capacity is None:
            raise TypeError(
                "capacity is missing: give the burst a bucket holds (capacity=...), or "
                "write the rate as text, whose count is the capacity ('100/minute': 100)"
            )
        cap = validated_capacity(capacity)
    interval = math.ceil(NS_PER_S / exact)
    tau = cap * interval
    if tau > TAU_MAX:
        raise ValueError(
            # Decimal: a capacity of 10**400 must not overflow a float in the message.
            f"capacity / rate = {Decimal(tau) / NS_PER_S:.3g} s to refill: "
            f"more than {TAU_MAX / NS_PER_S / 86400 / 365.25:.0f} years"
        )
    return exact, cap, interval, tau


def validated_cost(cost: object, capacity: int) -> int:
    """Return *cost* as an int in ``[0, capacity]``, or raise."""
    value = int_at_least(cost, "cost", 0)
    if value > capacity:
        raise ValueError(f"cost {value!r} exceeds capacity {capacity}: it could never be admitted")
    return value


def not_a_key(value: object, name: str, owner: str = "TokenBucket") -> None:
    """Raise the TypeError of a key given to an unkeyed limiter, if *value* looks like one.

    *value* came where *owner*'s *name* (``cost``, or ``now`` in the ``_at``
    verbs) goes. A str, bytes, tuple or None is what a key usually is (a
    name, an address, a header, a composite key, a header that is absent)
    and never a cost or a time: ``TokenBucket(...).allow("alice")`` is a
    keyed call on an unkeyed bucket. An int key cannot be told from a cost.

    >>> not_a_key(5, "cost")  # an int: a cost (an int key cannot be told from one)
    >>> not_a_key("alice", "cost")
    Traceback (most recent call last):
    ...
    TypeError: TokenBucket is not keyed (...): got a str where cost goes; for a bucket per ...
    """
    if value is None or isinstance(value, (str, bytes, bytearray, tuple)):
        kind = "None" if value is None else type(value).__name__
        kind = kind if kind in ("None", "bytes") else f"a {kind}"
        raise TypeError(
            f"{owner} is not keyed (one bucket for every caller), so its verbs take no key: "
            f"got {kind} where {name} goes; for a bucket per key use Keyed{owner}"
        )


def unkeyed_cost(cost: object, capacity: int) -> int:
    """`validated_cost` for an unkeyed bucket, whose first argument a key may land in."""
    not_a_key(cost, "cost")
    return validated_cost(cost, capacity)


def unkeyed_now(now: object) -> int:
    """`validated_now` for an unkeyed bucket's ``_at`` verbs (``allow_at("alice", t)``)."""
    not_a_key(now, "now")
    return validated_now(now)


def validated_now(now: object) -> int:
    """Return *now* (int ns) if in ``[0, NOW_MAX]``, or raise."""
    if type(now) is int and 0 <= now <= NOW_MAX:
        return now
    value = exact_int(now, "now", "an int of nanoseconds")
    if value < 0 or value > NOW_MAX:
        raise ValueError(f"now must be in [0, 2**62) ns, got {value!r}")
    return value


def validated_max_wait(max_wait_ns: object) -> int:
    """Return *max_wait_ns* (int ns >= 0; past 2**62, as long as it takes), or raise.

    >>> validated_max_wait(5), validated_max_wait(1 << 70) == FOREVER_NS
    (5, True)
    >>> validated_max_wait(-1)
    Traceback (most recent call last):
    ...
    ValueError: max_wait_ns must be >= 0, got -1
    """
    value = exact_int(max_wait_ns, "max_wait_ns", "an int of nanoseconds")
    if value < 0:
        raise ValueError(f"max_wait_ns must be >= 0, got {value!r}")
    return min(value, FOREVER_NS)


def validated_shape(shape: object) -> bool:
    """Return *shape*, a bool, or raise TypeError."""
    if type(shape) is not bool:
        raise TypeError(f"shape must be a bool, not {type(shape).__name__}")
    return shape


def validated_flag(value: object, name: str) -> bool:
    """Return *value*, a bool, or raise TypeError."""
    if type(value) is not bool:
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return value


def none_key_error(owner: str) -> TypeError:
    """The error of key None given to a keyed table not built with ``none_key=True``.

    None is what a key function returns for a value that is missing (an
    absent header, an anonymous user's id): taken as a key, every such
    request would share one bucket, silently.

    >>> print(none_key_error("KeyedTokenBucket"))
    key is None: KeyedTokenBucket refuses it, as every request whose key is missing (...) ...
    """
    return TypeError(
        f"key is None: {owner} refuses it, as every request whose key is missing (an absent "
        "header, an anonymous user) would share one bucket; pass a key, or build it "
        "with none_key=True to give None a bucket of its own"
    )


FORKED_FIX = (
    "for one limit across a machine's processes use a SharedKeyedTokenBucket (made before "
    "the fork, or opened by name), across machines a nanobucket.redis.RedisTokenBucket"
)


def forked_warning(owner: str) -> str:
    """The warning of an in-process limiter's first decision in a process it was copied into.

    A fork (or an unpickling elsewhere) copies the buckets: each process then
    counts on its own copy, and N processes admit up to N times the limit.

    >>> print(forked_warning("KeyedTokenBucket"))
    this KeyedTokenBucket was made in another process (before a fork): ... N times its limit; ...
    """
    return (
        f"this {owner} was made in another process (before a fork): each process that "
        f"uses it counts on a copy of its own, so N processes admit up to N times its "
        f"limit; {FORKED_FIX}; for a limit of each process on its own, make it in each "
        "process, or build it with per_process=True"
    )


def unpicklable_error(owner: str) -> TypeError:
    """The error of pickling a keyed table (for a ``spawn`` process, a queue, a file).

    >>> print(unpicklable_error("KeyedTokenBucket"))
    a KeyedTokenBucket cannot be pickled: a copy in another process would count ... limit; ...
    """
    return TypeError(
        f"a {owner} cannot be pickled: a copy in another process would count on its own, "
        f"so N processes would admit up to N times its limit; {FORKED_FIX}; for a limit "
        "of each process on its own, make one in each process"
    )


def validated_max_keys(max_keys: object) -> int:
    """Return *max_keys* as an int >= 1, or raise."""
    value = exact_int(max_keys, "max_keys")
    if value < 1 or value > MAX_KEYS:
        raise ValueError(f"max_keys must be in [1, 2**31 - 1], got {value!r}")
    return value


# A name in the header fields (a policy's, a plan's, a layer's) is sent as a
# structured-field String: printable ASCII, with '"' and '\\' refused rather
# than escaped, so every client reads the name as written.
NAME_CHARS = frozenset(chr(c) for c in range(0x20, 0x7F)) - {'"', "\\"}


def validated_name(name: object, what: str) -> str:
    """Return *name*, a valid name for the ``RateLimit-Policy`` fields, or raise ValueError.

    *what* says whose name it is in the error (``"a plan name"``).

    >>> validated_name("per-client", "a layer name")
    'per-client'
    """
    if not isinstance(name, str) or not name or any(c not in NAME_CHARS for c in name):
        raise ValueError(
            f"{what} must be a non-empty string of printable ASCII without '\"' "
            f"or '\\' (it names the RateLimit-Policy), got {name!r}"
        )
    return name
