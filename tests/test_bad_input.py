"""Every bad input of DESIGN.md gets a clear TypeError or ValueError."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from types import ModuleType

import pytest

from nanobucket._core._params import NOW_MAX


@pytest.mark.parametrize(
    ("rate", "error"),
    [
        (0, ValueError),
        (-1, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (-math.inf, ValueError),
        (0.0, ValueError),
        (-0.0, ValueError),
        (Fraction(-1, 3), ValueError),
        (2 * 10**9, ValueError),
        (Decimal("NaN"), ValueError),
        (True, TypeError),
        ("100", ValueError),  # text with no unit (see test_rate_text)
        (None, TypeError),
        (1 + 2j, TypeError),
        ([100], TypeError),
    ],
)
def test_bad_rate(impl: ModuleType, rate: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="rate"):
        impl.TokenBucket(rate=rate, capacity=1)
    with pytest.raises(error, match="rate"):
        impl.KeyedTokenBucket(rate=rate, capacity=1)


@pytest.mark.parametrize(
    ("capacity", "error"),
    [
        (0, ValueError),
        (-5, ValueError),
        (200.0, TypeError),
        (2.5, TypeError),
        (True, TypeError),
        ("200", TypeError),
        (None, TypeError),
        (Fraction(200), TypeError),
    ],
)
def test_bad_capacity(impl: ModuleType, capacity: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="capacity"):
        impl.TokenBucket(rate=1, capacity=capacity)
    with pytest.raises(error, match="capacity"):
        impl.KeyedTokenBucket(rate=1, capacity=capacity)


def test_refill_longer_than_the_time_range(impl: ModuleType) -> None:
    with pytest.raises(ValueError, match="years"):
        impl.TokenBucket(rate=Fraction(1, 86_400), capacity=10**6)
    with pytest.raises(ValueError, match="years"):
        impl.TokenBucket(rate=1, capacity=10**30)


@pytest.mark.parametrize(
    ("cost", "error"),
    [
        (-1, ValueError),
        (201, ValueError),
        (10**30, ValueError),
        (-(10**30), ValueError),
        (1.0, TypeError),
        (True, TypeError),
        (False, TypeError),
        ("1", TypeError),
        (None, TypeError),
        (Fraction(1), TypeError),
    ],
)
def test_bad_cost(impl: ModuleType, cost: object, error: type[Exception]) -> None:
    b = impl.TokenBucket(rate=100, capacity=200)
    t = impl.KeyedTokenBucket(rate=100, capacity=200)
    calls: list[Callable[[], object]] = [
        lambda: b.allow(cost=cost),
        lambda: b.allow_at(0, cost),
        lambda: b.check(cost),
        lambda: b.check_at(0, cost),
        lambda: b.peek(cost),
        lambda: b.peek_at(0, cost),
        lambda: t.allow("k", cost),
        lambda: t.allow_at("k", 0, cost),
        lambda: t.check("k", cost),
        lambda: t.check_at("k", 0, cost),
        lambda: t.peek("k", cost),
        lambda: t.allow_many(["k"], cost),
        lambda: t.allow_many_at(["k"], 0, cost),
    ]
    for call in calls:
        with pytest.raises(error, match="cost"):
            call()
    assert b.tokens_at(0) == 200.0 and t.tokens_at("k", 0) == 200.0


@pytest.mark.parametrize(
    ("now", "error"),
    [
        (-1, ValueError),
        (NOW_MAX + 1, ValueError),
        (2**63 - 1, ValueError),
        (-(2**63), ValueError),
        (10**40, ValueError),
        (1.5, TypeError),
        (True, TypeError),
        ("0", TypeError),
        (None, TypeError),
    ],
)
def test_bad_time(impl: ModuleType, now: object, error: type[Exception]) -> None:
    b = impl.TokenBucket(rate=100, capacity=200)
    t = impl.KeyedTokenBucket(rate=100, capacity=200)
    calls: list[Callable[[], object]] = [
        lambda: b.allow_at(now),
        lambda: b.check_at(now),
        lambda: b.peek_at(now),
        lambda: b.tokens_at(now),
        lambda: t.allow_at("k", now),
        lambda: t.check_at("k", now),
        lambda: t.peek_at("k", now),
        lambda: t.tokens_at("k", now),
        lambda: t.allow_many_at(["k"], now),
    ]
    for call in calls:
        with pytest.raises(error, match="now"):
            call()
    bad_clock = impl.TokenBucket(rate=100, capacity=200, clock=lambda: now)
    with pytest.raises(error, match="now"):
        bad_clock.allow()


def _not_keyed(kind: str, where: str) -> str:
    return (
        "TokenBucket is not keyed (one bucket for every caller), so its verbs take no key: "
        f"got {kind} where {where} goes; for a bucket per key use KeyedTokenBucket"
    )


@pytest.mark.parametrize(
    ("key", "kind"),
    [("alice", "a str"), (b"alice", "bytes"), (("alice", 1), "a tuple"), (None, "None")],
)
def test_a_key_given_to_an_unkeyed_bucket_says_so(impl: ModuleType, key: object, kind: str) -> None:
    # A str, bytes, tuple or None (a header that is absent) where an unkeyed
    # verb's first argument goes is a key, never a cost or a time.
    b = impl.TokenBucket(rate=1, capacity=1)
    by_cost: list[Callable[[], object]] = [
        lambda: b.allow(key),
        lambda: b.check(key),
        lambda: b.peek(key),
        lambda: b.refund(key),
        lambda: b.acquire(key),
        lambda: asyncio.run(b.acquire_async(key)),
    ]
    by_now: list[Callable[[], object]] = [
        lambda: b.allow_at(key, 0),
        lambda: b.check_at(key, 0),
        lambda: b.peek_at(key, 0),
        lambda: b.refund_at(key),
        lambda: b.tokens_at(key),
    ]
    for calls, where in ((by_cost, "cost"), (by_now, "now")):
        for call in calls:
            with pytest.raises(TypeError) as info:
                call()
            assert str(info.value) == _not_keyed(kind, where)
    assert b.tokens_at(0) == 1.0  # nothing was spent
    # Other wrong types keep their message, and a keyed table is not concerned.
    with pytest.raises(TypeError, match=r"^cost must be an int, not float$"):
        b.allow(1.5)
    with pytest.raises(TypeError, match=r"^cost must be an int, not str$"):
        impl.KeyedTokenBucket(rate=1, capacity=1).allow("alice", "bob")


def test_an_int_subclass_is_a_number_but_bool_is_not(impl: ModuleType) -> None:
    class Count(int):
        pass

    b = impl.TokenBucket(rate=Count(100), capacity=Count(200))
    assert b.allow_at(Count(0), Count(200))
    assert not b.allow_at(Count(0), Count(1))


def test_unhashable_key(impl: ModuleType) -> None:
    t = impl.KeyedTokenBucket(rate=1, capacity=1)
    for call in (t.allow, t.check, t.peek, t.tokens):
        with pytest.raises(TypeError, match="unhashable"):
            call(["a", "list"])
    with pytest.raises(TypeError, match="unhashable"):
        t.allow_at({"a": 1}, 0)


@pytest.mark.parametrize(
    ("max_keys", "error"),
    [
        (0, ValueError),
        (-1, ValueError),
        (2**41, ValueError),
        (1.5, TypeError),
        (True, TypeError),
        (None, TypeError),
    ],
)
def test_bad_max_keys(impl: ModuleType, max_keys: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="max_keys"):
        impl.KeyedTokenBucket(rate=1, capacity=1, max_keys=max_keys)


def test_clock_must_be_callable_and_return_int_ns(impl: ModuleType) -> None:
    with pytest.raises(TypeError, match="clock"):
        impl.TokenBucket(rate=1, capacity=1, clock=5)
    with pytest.raises(TypeError, match="now"):
        impl.TokenBucket(rate=1, capacity=1, clock=lambda: 1.5).allow()

    def broken() -> int:
        raise RuntimeError("clock broke")

    b = impl.TokenBucket(rate=1, capacity=1, clock=broken)
    with pytest.raises(RuntimeError, match="clock broke"):
        b.allow()


def test_arguments_are_checked(impl: ModuleType) -> None:
    with pytest.raises(TypeError):
        impl.TokenBucket(100, 200, 5)  # clock is keyword-only
    with pytest.raises(TypeError):
        impl.TokenBucket(rate=100)
    b = impl.TokenBucket(rate=100, capacity=200)
    with pytest.raises(TypeError):
        b.allow(1, 2)
    with pytest.raises(TypeError):
        b.allow(weight=1)
