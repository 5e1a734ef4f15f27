"""Hostile values and independent oracles for the fuzz suites (``test_fuzz*.py``).

The oracles restate DESIGN.md's rules for each argument without importing
``_params``, so a validation bug there cannot hide itself: every argument is
either valid or names the one exception type it must raise.

``NANOBUCKET_FUZZ_EXAMPLES=N`` sets every fuzz test's example count (the
long run); unset, each test keeps its small default so the suite stays fast.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from nanobucket._core import _bucket_py

try:
    from nanobucket._core import _bucket_c as _bucket_c  # noqa: PLC0414 - an explicit re-export (mypy)
except ImportError:  # pragma: no cover - a pure-Python install
    _bucket_c = None  # type: ignore[assignment]

# The implementations the fuzz suites run side by side.
IMPLS: list[Any] = [m for m in (_bucket_c, _bucket_py) if m is not None]


NS = 1_000_000_000
NOW_MAX = (1 << 62) - 1
TAU_MAX = 1 << 62
LONG_RUN = int(os.environ.get("NANOBUCKET_FUZZ_EXAMPLES", "0") or 0)


def fuzz(default: int, long_factor: int = 1) -> settings:
    """Hypothesis settings: *default* examples, or ``NANOBUCKET_FUZZ_EXAMPLES`` times *long_factor*.

    The factor lets a cheap test (one call per example) run many more
    examples than a costly one (a trace) in the same long run.
    """
    return settings(
        max_examples=LONG_RUN * long_factor or default,
        deadline=None,
        database=None,  # reproducible from the printed seed; no .hypothesis/ in the tree
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.function_scoped_fixture,
        ],
    )


class Int(int):
    """An int subclass: a number like any other int."""


class Indexable:
    """Has ``__index__`` but is no int: DESIGN wants ints, so TypeError."""

    def __index__(self) -> int:
        return 1


class Floaty:
    """Has ``__float__`` but is no number."""

    def __float__(self) -> float:
        return 1.0


EDGE_INTS = [
    0,
    1,
    -1,
    2,
    199,
    200,
    201,
    2**31 - 1,
    2**31,
    2**32,
    2**53,
    2**53 + 1,
    NOW_MAX - 1,
    NOW_MAX,
    NOW_MAX + 1,
    2**62 + 1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    -(2**63),
    -(2**63) - 1,
    -(2**64),
    10**30,
    -(10**30),
    10**400,
]
EDGE_FLOATS = [
    math.nan,
    -math.nan,
    math.inf,
    -math.inf,
    -0.0,
    0.0,
    5e-324,
    1e-9,
    0.5,
    1.0,
    1e9,
    1e9 + 1,
    2.0**63,
    1e308,
]

numbers = st.one_of(
    st.sampled_from(EDGE_INTS),
    st.integers(),
    st.integers(-3, 300),
    st.sampled_from(EDGE_FLOATS),
    st.floats(),
    st.builds(Int, st.integers(-3, 2**63)),
    st.fractions(),
    st.decimals(allow_nan=True, allow_infinity=True, places=None),
)
junk = st.one_of(
    st.booleans(),
    st.none(),
    st.text(max_size=3),
    st.binary(max_size=3),
    st.complex_numbers(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        [[], {}, (), [1], (1,), Indexable(), Floaty(), object(), "1", b"1", Decimal("sNaN")]
    ),
)
hostile = st.one_of(numbers, junk)


def maybe(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly *valid*, sometimes anything hostile."""
    return st.one_of(valid, valid, valid, hostile)


def hashable(key: object) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True


def int_in(value: object, lo: int, hi: float) -> type[Exception] | None:
    """The error an int argument in ``[lo, hi]`` must raise, or None if *value* is valid."""
    if isinstance(value, bool) or not isinstance(value, int):
        return TypeError
    return None if lo <= value <= hi else ValueError


def cost_error(cost: object, capacity: int) -> type[Exception] | None:
    return int_in(cost, 0, capacity)


def now_error(now: object) -> type[Exception] | None:
    return int_in(now, 0, NOW_MAX)


# A rate written as text: a count, "/" or "per", an optional multiple, a unit
# of a fixed length (its plural too, but for the one-letter ones).
_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800}
_UNITS = {
    **{name: n for name, n in _SECONDS.items()},
    **{name + "s": n for name, n in _SECONDS.items()},
    "sec": 1,
    "secs": 1,
    "min": 60,
    "mins": 60,
    "hr": 3600,
    "hrs": 3600,
    "s": 1,
    "m": 60,
    "h": 3600,
    "d": 86400,
    "w": 604800,
}
_TEXT = re.compile(
    r"[ \t\n\r\f\v]*([0-9]+)[ \t\n\r\f\v]*(?:/|per)[ \t\n\r\f\v]*"
    r"([0-9]*)[ \t\n\r\f\v]*([A-Za-z]+)[ \t\n\r\f\v]*",
    re.IGNORECASE,
)


def text_rate(text: str) -> tuple[Fraction, int] | None:
    """``(exact rate, count)`` of a rate written as text, or None if it is not one."""
    m = _TEXT.fullmatch(text)
    if m is None or m[3].lower() not in _UNITS or int(m[1]) < 1 or int(m[2] or 1) < 1:
        return None
    return Fraction(int(m[1]), int(m[2] or 1) * _UNITS[m[3].lower()]), int(m[1])


def rate_exact(rate: object) -> Fraction | type[Exception]:
    """*rate* as an exact Fraction, or the error it must raise."""
    if isinstance(rate, str):
        parsed = text_rate(rate)
        if parsed is None or parsed[0] > NS:
            return ValueError
        return parsed[0]
    if isinstance(rate, bool) or not isinstance(rate, (int, float, Fraction, Decimal)):
        return TypeError
    if isinstance(rate, float):
        if not math.isfinite(rate):
            return ValueError
        value = Fraction(repr(rate))  # the decimal the user wrote
    elif isinstance(rate, Decimal):
        if not rate.is_finite():
            return ValueError
        value = Fraction(rate)
    else:
        value = Fraction(rate)
    if value <= 0 or value > NS:
        return ValueError
    return value


def limits_errors(rate: object, capacity: object) -> set[type[Exception]]:
    """Every error a constructor given *rate* and *capacity* may raise (empty: valid)."""
    errors: set[type[Exception]] = set()
    exact = rate_exact(rate)
    if isinstance(exact, type):
        errors.add(exact)
    elif capacity is None and isinstance(rate, str):
        capacity = capacity_of(rate, None)  # the count
    cap_error = int_in(capacity, 1, math.inf)
    if cap_error is not None:
        errors.add(cap_error)
    if not errors:
        assert isinstance(exact, Fraction) and isinstance(capacity, int)
        if capacity * math.ceil(NS / exact) > TAU_MAX:
            errors.add(ValueError)
    return errors


def capacity_of(rate: object, capacity: object) -> object:
    """The capacity a limiter given *rate* and *capacity* (valid) has: text brings its count."""
    if capacity is None and isinstance(rate, str) and (parsed := text_rate(rate)) is not None:
        return parsed[1]
    return capacity


def interval_of(rate: object) -> int:
    exact = rate_exact(rate)
    assert isinstance(exact, Fraction)
    return math.ceil(NS / exact)


class KeyError_(Exception):
    """What a hostile key's own ``__hash__`` / ``__eq__`` raises."""


class BadHash:
    """A key whose ``__hash__`` raises: that error must come out unchanged."""

    def __hash__(self) -> int:
        raise KeyError_("hash")


class Colliding:
    """Keys that all hash alike, equal when their names are."""

    def __init__(self, name: object) -> None:
        self.name = name

    def __hash__(self) -> int:
        return 42

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Colliding) and other.name == self.name


class BadEq(Colliding):
    """`Colliding` keys whose ``__eq__`` raises (unless identical)."""

    __hash__ = Colliding.__hash__  # defining __eq__ alone would unset it

    def __eq__(self, other: object) -> bool:
        raise KeyError_("eq")


class NotEqual:
    """Equal to nothing, itself included (like NaN): every lookup is by identity."""

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        return False


nested = st.recursive(
    st.one_of(
        st.integers(),
        st.text(max_size=4),
        st.binary(max_size=4),
        st.none(),
        st.floats(allow_nan=False),
    ),
    lambda inner: st.one_of(st.tuples(inner, inner), st.frozensets(inner, max_size=3)),
    max_leaves=12,
)
keys = st.one_of(
    st.sampled_from(
        [
            "a",
            "b",
            b"a",
            1,
            1.0,
            True,
            0,
            -0.0,
            0.0,
            False,
            "",
            b"",
            (),
            None,
            2**64,
            -(2**63),
            10**40,
            math.inf,
        ]
    ),
    st.integers(),
    st.integers(0, 2**64),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.integers(0, 100_000).map(lambda n: "k" * n),  # long str keys
    st.integers(0, 100_000).map(lambda n: b"\0" * n),
    nested,
)
unhashable = st.sampled_from([[], {}, set(), ["a"], ({},), bytearray(b"x")])


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """``("ok", result)`` or ``("err", exception type)``: what a call did."""
    try:
        return ("ok", fn())
    except Exception as exc:
        return ("err", type(exc))


def decision_tuple(d: Any) -> tuple[Any, ...]:
    return (bool(d.allowed), d.remaining, d.retry_after_ns, d.reset_after_ns, d.limit)


def normal(result: tuple[str, Any]) -> tuple[str, Any]:
    """*result* with Decisions as plain tuples (C and Python Decisions compare equal anyway)."""
    kind, value = result
    if kind == "ok" and hasattr(value, "retry_after_ns"):
        return kind, decision_tuple(value)
    if kind == "ok" and isinstance(value, bytearray):
        return kind, bytes(value)
    return result
