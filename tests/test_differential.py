"""Random traces: Cython == pure Python == the exact rational model, decision for decision."""

from __future__ import annotations

from array import array
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from nanobucket._core import _bucket_py
from nanobucket._core._params import RateLike
from nanobucket.reference import ExactBucket

try:
    from nanobucket._core import _bucket_c
except ImportError:  # pragma: no cover
    _bucket_c = None  # type: ignore[assignment]

IMPLS = [m for m in (_bucket_c, _bucket_py) if m is not None]
S = 1_000_000_000
# Rates whose token interval is a whole number of nanoseconds: exact.
WHOLE_RATES: list[RateLike] = [
    1,
    4,
    100,
    1000,
    10**6,
    Fraction(1, 2),
    Fraction(1, 86_400),
    10**9,
    3125,
]
# Rates whose interval is not whole: rounded conservatively.
ODD_RATES: list[RateLike] = [3, 7, Fraction(7, 60), 0.3, 333, Fraction(10**6, 7)]


# A rate, a capacity and (time, cost) events at increasing times from 1 s.
Trace = tuple[RateLike, int, list[tuple[int, int]]]


@st.composite
def traces(draw: st.DrawFn, rates: list[RateLike]) -> Trace:
    rate = draw(st.sampled_from(rates))
    capacity = draw(st.integers(1, 40))
    interval = -(-S * Fraction(1) // Fraction(rate))
    steps = draw(
        st.lists(
            st.tuples(st.integers(0, int(interval) * 3), st.integers(0, capacity)),
            min_size=1,
            max_size=400,
        )
    )
    now, events = S, []
    for gap, cost in steps:
        now += gap
        events.append((now, cost))
    return rate, capacity, events


@settings(max_examples=150, deadline=None)
@given(traces(WHOLE_RATES))
def test_whole_ns_rates_agree_with_the_exact_model(trace: Trace) -> None:
    rate, capacity, events = trace
    exact = ExactBucket(rate, capacity)
    expected = [exact.allow_at(now, cost) for now, cost in events]
    for impl in IMPLS:
        b = impl.TokenBucket(rate=rate, capacity=capacity)
        assert [b.allow_at(now, cost) for now, cost in events] == expected
        t = impl.KeyedTokenBucket(rate=rate, capacity=capacity, max_keys=4)
        assert [t.allow_at("k", now, cost) for now, cost in events] == expected


@settings(max_examples=100, deadline=None)
@given(traces(WHOLE_RATES))
def test_decisions_match_the_exact_model_field_by_field(trace: Trace) -> None:
    rate, capacity, events = trace
    exact = ExactBucket(rate, capacity)
    buckets = [impl.TokenBucket(rate=rate, capacity=capacity) for impl in IMPLS]
    interval = S / exact.rate
    for now, cost in events:
        decisions = [b.check_at(now, cost) for b in buckets]
        allowed = exact.allow_at(now, cost)
        tokens = exact.tokens
        for d in decisions:
            assert d == decisions[0]
            assert d.allowed is allowed
            assert d.remaining == int(tokens)  # floor: tokens >= 0
            assert d.reset_after_ns == (capacity - tokens) * interval
            if not allowed:
                assert d.retry_after_ns == (cost - tokens) * interval


@settings(max_examples=150, deadline=None)
@given(traces(ODD_RATES))
def test_odd_rates_never_admit_what_the_exact_model_rejects(trace: Trace) -> None:
    rate, capacity, events = trace
    results = []
    for impl in IMPLS:
        b = impl.TokenBucket(rate=rate, capacity=capacity)
        # The exact bucket, charged with our admissions, must afford each one.
        exact = ExactBucket(rate, capacity)
        ours = []
        for now, cost in events:
            admitted = b.allow_at(now, cost)
            if admitted:
                assert exact.allow_at(now, cost)
            ours.append(admitted)
        results.append(ours)
    assert all(r == results[0] for r in results)


def test_odd_rates_fall_short_by_less_than_one_token_per_million() -> None:
    for rate in (3, Fraction(7, 60), 0.3, 999):
        exact_rate = ExactBucket(rate, 1).rate
        for impl in IMPLS:
            b = impl.TokenBucket(rate=rate, capacity=1000)
            # Spend every token as soon as it exists, 10**6 tokens in all.
            now, spent = 0, 0
            while spent < 10**6:
                d = b.check_at(now, cost=1000)
                if d.allowed:
                    spent += 1000
                else:
                    now += d.retry_after_ns
            # The exact model, full at 0, could have given capacity + rate * now.
            shortfall = 1000 + Fraction(now) * exact_rate / S - spent
            assert 0 <= shortfall <= Fraction(spent, 10**6), (rate, float(shortfall))


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(WHOLE_RATES + ODD_RATES),
    st.integers(1, 30),
    st.lists(st.integers(0, 3 * S), min_size=1, max_size=300),
)
def test_any_window_admits_at_most_capacity_plus_rate_times_t(
    rate: object, capacity: int, gaps: list[int]
) -> None:
    exact_rate = ExactBucket(rate, capacity).rate  # type: ignore[arg-type]
    for impl in IMPLS:
        b = impl.TokenBucket(rate=rate, capacity=capacity)
        now, admitted = 0, []
        for gap in gaps:
            now += gap // 50
            if b.allow_at(now):
                admitted.append(now)
        for i in range(len(admitted)):
            for j in range(i, len(admitted)):
                window = Fraction(admitted[j] - admitted[i], S)
                assert j - i + 1 <= capacity + exact_rate * window


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 20_000_000), st.integers(0, 3)), max_size=200
    ),
    st.integers(1, 16),
)
def test_keyed_tables_agree_with_each_other_and_with_single_buckets(
    steps: list[tuple[int, int, int]],
    max_keys: int,
) -> None:
    if _bucket_c is None:  # pragma: no cover
        return
    c = _bucket_c.KeyedTokenBucket(rate=100, capacity=3, max_keys=max_keys)
    py = _bucket_py.KeyedTokenBucket(rate=100, capacity=3, max_keys=max_keys)
    now = 0
    singles: dict[int, _bucket_py.TokenBucket] = {}
    for key, gap, cost in steps:
        now += gap
        dc, dp = c.check_at(key, now, cost), py.check_at(key, now, cost)
        assert dc == dp
        if max_keys >= 6:  # never at the bound: each key behaves as its own bucket
            single = singles.setdefault(key, _bucket_py.TokenBucket(rate=100, capacity=3))
            assert single.check_at(now, cost) == dp


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 6), max_size=40), min_size=1, max_size=8),
    st.integers(0, 3),
)
def test_allow_many_equals_allow_for_each_key_in_turn(batches: list[list[int]], cost: int) -> None:
    for impl in IMPLS:
        batched = impl.KeyedTokenBucket(rate=10, capacity=5, max_keys=100)
        single = impl.KeyedTokenBucket(rate=10, capacity=5, max_keys=100)
        for i, batch in enumerate(batches):
            now = i * 37_000_000
            keys = [f"key-{k}" for k in batch]
            assert list(batched.allow_many_at(keys, now, cost)) == [
                int(single.allow_at(key, now, cost)) for key in keys
            ]
            ints = array("Q", batch)
            assert list(batched.allow_many_at(ints, now, cost)) == [
                int(single.allow_at(k, now, cost)) for k in batch
            ]
