"""TokenBucket: the seed's numbers, rates, the Decision type, on both implementations.

The properties every limiter shares (Decision arithmetic, bursts, peek, the
cost-0 probe, refusals, time going back) are tests/contract's.
"""

from __future__ import annotations

import numbers
from decimal import Decimal
from fractions import Fraction
from types import ModuleType
from typing import Any

import pytest

from nanobucket._core._params import NOW_MAX
from nanobucket.reference import ExactBucket, NaiveBucket

S = 1_000_000_000


def five_fields(d: Any) -> tuple[Any, ...]:
    """A decision's fields in the order `Decision` takes them."""
    return (d.allowed, d.remaining, d.retry_after_ns, d.reset_after_ns, d.limit)


def test_the_seed_as_written_admits_the_same_burst() -> None:
    seed = NaiveBucket(rate=100, capacity=200)
    assert sum(seed.allow(1.0) for _ in range(250)) == 200


def test_empty_bucket_is_full_again_after_exactly_two_seconds(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=100, capacity=200)
    assert b.allow_at(S, cost=200)
    empty = b.peek_at(S, cost=0)
    assert (empty.remaining, empty.reset_after_ns) == (0, 2 * S)
    assert not b.peek_at(3 * S - 1, cost=200).allowed
    assert b.peek_at(3 * S - 1, cost=199).allowed
    assert b.tokens_at(3 * S) == 200.0
    assert b.peek_at(3 * S, cost=200) == b.check_at(3 * S, cost=200)
    assert b.tokens_at(3 * S) == 0.0


def test_150_per_second_for_10_seconds_admits_200_plus_100_times_10(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=100, capacity=200)
    exact = ExactBucket(rate=100, capacity=200)
    times = [k * 10 * S // 1500 for k in range(1501)]  # 150/s over [0, 10 s]
    ours = [b.allow_at(t) for t in times]
    assert ours == [exact.allow_at(t) for t in times]
    assert sum(ours) == 200 + 100 * 10


def test_long_overload_is_held_to_the_rate(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=100, capacity=200)
    # 1000 req/s for 60 s: the burst, then exactly one token per 10 ms.
    admitted = sum(b.allow_at(k * S // 1000) for k in range(60_001))
    assert admitted == 200 + 100 * 60


def test_a_decision_built_from_its_five_fields(impl: ModuleType) -> None:
    d = impl.Decision(False, 0, 5, 2, 200)
    assert five_fields(d) == (False, 0, 5, 2, 200)
    assert (d.retry_after, d.reset_after, bool(d)) == (5e-9, 2e-9, False)
    assert repr(d) == (
        "Decision(allowed=False, remaining=0, retry_after_ns=5, reset_after_ns=2, limit=200)"
    )
    same = impl.Decision(allowed=False, remaining=0, retry_after_ns=5, reset_after_ns=2, limit=200)
    assert d == same and hash(d) == hash(same)
    assert d != impl.Decision(False, 0, 5, 2, 199)
    # Equal to the limiter's own decision with the same fields.
    made = impl.TokenBucket(rate=100, capacity=200).check_at(0)
    assert impl.Decision(True, 199, 0, 10_000_000, 200) == made
    # The fields are a truth value and int64s in both twins: no silent truncation.
    assert impl.Decision([], True, 2, 3, 4) == impl.Decision(False, 1, 2, 3, 4)
    assert impl.Decision(1, 0, 0, 0, 0).allowed is True
    with pytest.raises(TypeError):
        impl.Decision(True, 0.5, 0, 0, 1)
    with pytest.raises(OverflowError):
        impl.Decision(True, 0, 2**63, 0, 1)
    assert impl.Decision(True, 0, 2**63 - 1, -(2**63), 1).reset_after_ns == -(2**63)
    for args, kwargs in [
        ((), {}),
        ((False, 0, 5, 2), {}),
        ((False, 0, 5, 2, 200, 1), {}),
        ((False, 0, 5, 2, 200), {"source": "redis"}),
    ]:
        with pytest.raises(TypeError, match="argument"):
            impl.Decision(*args, **kwargs)


def test_retry_after_is_exact_to_the_nanosecond(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=3, capacity=4)  # 333_333_334 ns per token
    assert b.allow_at(S, cost=4)
    d = b.check_at(S + 7, cost=2)
    assert not d.allowed
    assert d.retry_after_ns == 2 * 333_333_334 - 7
    assert not b.peek_at(S + 7 + d.retry_after_ns - 1, cost=2).allowed
    assert b.check_at(S + 7 + d.retry_after_ns, cost=2).allowed


def test_no_overflow_at_the_ends_of_the_time_range(impl: ModuleType) -> None:
    rate = Fraction(1, 86_400)  # one per day, refill time as long as allowed
    b = impl.TokenBucket(rate=rate, capacity=53_375)
    assert b.allow_at(NOW_MAX, cost=53_375)
    d = b.check_at(NOW_MAX)
    assert (d.allowed, d.retry_after_ns) == (False, 86_400 * S)
    assert d.reset_after_ns == 53_375 * 86_400 * S
    assert b.check_at(0).retry_after_ns == NOW_MAX + 86_400 * S
    fast = impl.TokenBucket(rate=10**9, capacity=1)
    assert fast.allow_at(NOW_MAX) and not fast.allow_at(NOW_MAX)
    assert fast.allow_at(0) is False


def test_rate_can_be_int_float_or_fraction(impl: ModuleType) -> None:
    for rate, interval in (
        (100, 10_000_000),
        (0.1, 10 * S),
        (Fraction(7, 60), 8_571_428_572),
        (2.5, 400_000_000),
        (10**9, 1),
        (Fraction(1, 2), 2 * S),
    ):
        b = impl.TokenBucket(rate=rate, capacity=1)
        assert b.interval_ns == interval
        assert b.allow_at(S) and not b.allow_at(S + interval - 1) and b.allow_at(S + interval)
    assert impl.TokenBucket(rate=100, capacity=200).rate == 100
    assert impl.TokenBucket(rate=100, capacity=200).capacity == 200


class Real32(float):
    """A float subclass, as numpy.float64 is."""


class Quarter:
    """A numbers.Real that is no float: as numpy.float32 is."""

    def __float__(self) -> float:
        return 0.25


numbers.Real.register(Quarter)


def test_rate_is_the_number_given(impl: ModuleType) -> None:
    # rate reads back as the kind given (0.1 == 0.1); the arithmetic is exact.
    for given, interval in (
        (100, 10_000_000),
        (0.1, 10 * S),
        (Real32(100.0), 10_000_000),
        (Quarter(), 4 * S),
        (Decimal("0.1"), 10 * S),
        (Fraction(1, 3), 3 * S),
    ):
        b = impl.TokenBucket(rate=given, capacity=10)
        t = impl.KeyedTokenBucket(rate=given, capacity=10)
        want = 0.25 if isinstance(given, Quarter) else given
        want_type = {Real32: float, Quarter: float}.get(type(given), type(given))
        for lim in (b, t):
            assert (lim.rate, type(lim.rate), lim.interval_ns) == (want, want_type, interval)
    assert impl.TokenBucket(rate=0.1, capacity=1).rate == 0.1
    # A reconfigure re-reads the stored rate: the same exact value.
    b = impl.TokenBucket(rate=0.1, capacity=1)
    b.reconfigure(capacity=2, now=0)
    assert (b.rate, b.interval_ns) == (0.1, 10 * S)


def test_rate_refuses_what_is_not_a_real_number(impl: ModuleType) -> None:
    for bad in (True, b"1", 1j, None):  # text is a rate written out: see test_rate_text
        with pytest.raises(TypeError, match="rate must be a real number"):
            impl.TokenBucket(rate=bad, capacity=1)
    for bad in (float("nan"), float("inf"), Real32("inf")):
        with pytest.raises(ValueError, match="rate must be finite"):
            impl.TokenBucket(rate=bad, capacity=1)


def test_rate_of_numpy_scalars(impl: ModuleType) -> None:
    numpy = pytest.importorskip("numpy")
    assert impl.TokenBucket(rate=numpy.float64(100), capacity=10).rate == 100.0
    assert impl.TokenBucket(rate=numpy.float32(0.5), capacity=10).interval_ns == 2 * S
    assert impl.TokenBucket(rate=numpy.int64(100), capacity=10).interval_ns == 10_000_000


def test_attributes_are_read_only(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=100, capacity=200)
    for name, value in (("rate", 1), ("capacity", 1), ("interval_ns", 1)):
        with pytest.raises(AttributeError):
            setattr(b, name, value)


def test_the_real_clock(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=1, capacity=3)
    assert [b.allow() for _ in range(4)] == [True, True, True, False]
    assert b.allow(cost=0)
    d = b.check()
    assert not d.allowed and 0 < d.retry_after_ns <= S
    assert not b.peek().allowed
    assert 0.0 <= b.tokens() < 1.0


def test_an_injected_clock(impl: ModuleType, clock) -> None:  # type: ignore[no-untyped-def]
    b = impl.TokenBucket(rate=100, capacity=2, clock=clock)
    assert [b.allow(), b.allow(), b.allow()] == [True, True, False]
    clock.advance(10_000_000)
    assert b.check().allowed and not b.peek().allowed
    assert b.tokens() == 0.0
    clock.advance(5_000_000)
    assert b.tokens() == 0.5


def test_repr(impl: ModuleType) -> None:
    assert repr(impl.TokenBucket(rate=100, capacity=200)) == "TokenBucket(rate=100, capacity=200)"
    assert repr(impl.TokenBucket(rate=100, capacity=200).check_at(0)) == (
        "Decision(allowed=True, remaining=199, retry_after_ns=0, "
        "reset_after_ns=10000000, limit=200)"
    )
