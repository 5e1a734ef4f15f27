"""Fuzzing the limiters built on the core: all_of, Waiting / LeakyBucket, the shared table.

Hostile arguments as in ``test_fuzz.py``: only TypeError / ValueError may
come out, and the decisions must equal those of the same construction over
the other implementation (or over a ``KeyedTokenBucket`` for the shared
table). Redis is left out here: its arguments go through the same
``_params`` checks, and each example would need a server round trip.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanobucket._core import _bucket_py
from nanobucket.layered import all_of
from nanobucket.waiting import LeakyBucket, Waiting

from fuzz_values import (
    IMPLS,
    NOW_MAX,
    _bucket_c,
    cost_error,
    decision_tuple,
    fuzz,
    hashable,
    hostile,
    int_in,
    maybe,
    normal,
    now_error,
    outcome,
)

VALID_NOW = st.one_of(st.integers(0, 10**10), st.integers(NOW_MAX - 10**9, NOW_MAX))


@fuzz(200)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["allow_at", "check_at", "peek_at", "tokens_at", "refund_at"]),
            st.one_of(st.sampled_from(["a", "b", 1]), st.sampled_from([[], {}])),
            maybe(VALID_NOW),
            maybe(st.integers(0, 6)),
        ),
        min_size=1,
        max_size=15,
    )
)
def test_all_of_agrees_across_implementations(ops: list[tuple[str, Any, Any, Any]]) -> None:
    """all_of(keyed 5/s cap 4, plain 2/s cap 6): C layers == Python layers.

    A rejected request charges no layer.
    """
    limits = [
        all_of(impl.KeyedTokenBucket(rate=5, capacity=4), impl.TokenBucket(rate=2, capacity=6))
        for impl in IMPLS
    ]
    for verb, key, now, cost in ops:
        expected = set()
        for error in (now_error(now), None if verb == "tokens_at" else cost_error(cost, 4)):
            if error is not None:
                expected.add(error)
        if not hashable(key):
            expected.add(TypeError)
        before = [
            [lim.tokens_at(key, now) for _ in (0,)] if not expected else None for lim in limits
        ]
        args = (key, now) if verb == "tokens_at" else (key, now, cost)
        results = [outcome(functools.partial(getattr(lim, verb), *args)) for lim in limits]
        for kind, value in results:
            if expected:
                assert kind == "err" and value in expected, (verb, key, now, cost, results)
            else:
                assert kind == "ok", (verb, key, now, cost, results)
        if len(expected) <= 1:
            firsts = [
                normal(r)
                if not hasattr(r[1], "decisions")
                else ("ok", decision_tuple(r[1]), r[1].layer)
                for r in results
            ]
            assert all(f == firsts[0] for f in firsts), results
        if not expected and verb in ("allow_at", "check_at") and not bool(results[0][1]):
            # All or nothing: a rejected request left every layer as it was.
            assert [[lim.tokens_at(key, now)] for lim in limits] == before


@fuzz(200)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.sampled_from(["a", "b", 1, None]), st.sampled_from([[], {}]), hostile),
            maybe(st.integers(0, 7)),
            st.sampled_from([0, 0, 1, 10**8, 10**9]),
        ),
        min_size=1,
        max_size=15,
    ),
    VALID_NOW,
)
def test_all_of_allow_on_one_clock_agrees_across_implementations(
    ops: list[tuple[Any, Any, int]], start: int
) -> None:
    """all_of(keyed cap 4, plain cap 6, keyed cap 2).allow(key, cost) on one clock.

    Over Cython layers this is one Cython call (AllowAll); over Python layers
    the general path: the same answers, the same errors, the same tokens.
    """
    now = [start]

    def clock() -> int:
        return now[0]

    limits = [
        all_of(
            impl.KeyedTokenBucket(rate=5, capacity=4, clock=clock),
            impl.TokenBucket(rate=2, capacity=6, clock=clock),
            impl.KeyedTokenBucket(rate=1, capacity=2, clock=clock),
        )
        for impl in IMPLS
    ]
    for key, cost, step in ops:
        now[0] = min(now[0] + step, NOW_MAX)
        results = [outcome(functools.partial(lim.allow, key, cost)) for lim in limits]
        assert all(r == results[0] for r in results), (key, cost, results)
        assert results[0][0] == "ok" or results[0][1] in (TypeError, ValueError), results
        tokens = [
            [lim.layers[1].tokens()] + [lim.layers[i].tokens(k) for i in (0, 2) for k in ("a", 1)]
            for lim in limits
        ]
        assert all(t == tokens[0] for t in tokens), tokens


@fuzz(200)
@given(
    max_waiters=maybe(st.integers(0, 5)),
    shape=st.one_of(st.booleans(), hostile),
    sleep=st.sampled_from([None, "x", 5]),
    timeout=maybe(st.floats(0, 10)),
    cost=maybe(st.integers(0, 3)),
)
def test_waiting_arguments(
    max_waiters: Any, shape: Any, sleep: Any, timeout: Any, cost: Any
) -> None:
    """Waiting(...) and acquire(): the documented errors; the same waits on both implementations."""
    expected: set[type[Exception]] = set()
    if (e := int_in(max_waiters, 0, float("inf"))) is not None:
        expected.add(e)
    if not isinstance(shape, bool):
        expected.add(TypeError)
    if sleep is not None:
        expected.add(TypeError)
    waits: list[list[float]] = []
    for impl in IMPLS:
        slept: list[float] = []
        bucket = impl.TokenBucket(rate=10, capacity=2, clock=lambda: 0)
        made = outcome(
            lambda: Waiting(
                bucket,
                max_waiters=max_waiters,
                shape=shape,
                sleep=slept.append if sleep is None else sleep,
            )
        )
        if expected:
            assert made[0] == "err" and made[1] in expected, made
            continue
        assert made[0] == "ok", made
        w = made[1]
        call_errors: set[type[Exception]] = set()
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float))
        ):
            call_errors.add(TypeError)
        elif (isinstance(timeout, float) and (math.isnan(timeout) or timeout < 0)) or (
            isinstance(timeout, int) and timeout < 0
        ):
            call_errors.add(ValueError)
        if (e := cost_error(cost, 2)) is not None:
            call_errors.add(e)
        got = [outcome(lambda: w.acquire(cost=cost, timeout=timeout)) for _ in range(4)]
        for kind, value in got:
            if call_errors:
                assert kind == "err" and value in call_errors, got
            else:
                assert kind == "ok" and isinstance(value, bool), got
        waits.append([*slept, *(r[1] for r in got if r[0] == "ok")])
    if len(waits) == 2:
        assert waits[0] == waits[1]


@fuzz(100)
@given(
    rate=maybe(st.integers(1, 1000)),
    capacity=maybe(st.integers(1, 5)),
    max_waiters=maybe(st.integers(0, 5)),
)
def test_leaky_bucket_arguments(rate: Any, capacity: Any, max_waiters: Any) -> None:
    from fuzz_values import limits_errors

    expected = limits_errors(rate, capacity)
    if (e := int_in(max_waiters, 0, float("inf"))) is not None:
        expected.add(e)
    made = outcome(
        lambda: LeakyBucket(
            rate, capacity, max_waiters=max_waiters, clock=lambda: 0, sleep=lambda s: None
        )
    )
    if expected:
        assert made[0] == "err" and made[1] in expected, made
    else:
        # Shaping passes every caller through the line: max_waiters=0 refuses all.
        assert made[0] == "ok" and made[1].acquire() is (max_waiters != 0)


shared = pytest.importorskip("nanobucket.shared") if _bucket_c is not None else None


@pytest.fixture
def shared_table(tmp_path: Any) -> Any:
    if _bucket_c is None or shared is None or shared._Base is None:
        if os.environ.get("CI"):
            pytest.fail("the shared-memory extension is not built (CI must test it)")
        pytest.skip("the shared-memory extension is not built")
    table = shared.SharedKeyedTokenBucket.create(
        path=tmp_path / "fuzz.table", rate=5, capacity=4, max_keys=64
    )
    yield table
    table.unlink()
    table.close()


SHARED_KEYS = st.one_of(
    st.sampled_from(["a", b"a", 1, -1, 2**64, "é" * 300, b"", ""]),
    st.integers(),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.sampled_from([1.0, True, None, ("a",), [], object()]),
)


RUNS = itertools.count()


@fuzz(200)
@given(data=st.data())
def test_shared_table_matches_keyed_bucket(shared_table: Any, data: st.DataObject) -> None:
    """Shared table == pure-Python KeyedTokenBucket, key for key.

    Keys other than str, bytes and int: TypeError.
    """
    # One table for all examples (a file per example is slow): each example
    # uses keys no earlier one used, behind a fresh prefix.
    model = _bucket_py.KeyedTokenBucket(rate=5, capacity=4)
    run = next(RUNS)
    # Each example starts 10 s after the last one began, when every bucket
    # an earlier example touched is full again (a refill takes 0.8 s): its
    # slots are free to reclaim, so the table never fills up with them.
    now = run * 10_000_000_000
    for _ in range(data.draw(st.integers(1, 12), label="steps")):
        key = data.draw(SHARED_KEYS, label="key")
        gap = data.draw(st.integers(0, 3), label="gap")
        cost = data.draw(maybe(st.integers(0, 4)), label="cost")
        verb = data.draw(st.sampled_from(["allow_at", "check_at", "peek_at", "tokens_at"]))
        now += gap * 100_000_000
        real_key: Any = key
        if isinstance(key, (str, bytes)):
            real_key = (
                f"{run}:".encode() + (key.encode() if isinstance(key, str) else key)
                if isinstance(key, bytes)
                else f"{run}:{key}"
            )
        elif isinstance(key, int) and not isinstance(key, bool):
            real_key = str((run, key))
        args = (real_key, now) if verb == "tokens_at" else (real_key, now, cost)
        got = outcome(lambda: getattr(shared_table, verb)(*args))
        if not isinstance(key, (str, bytes, int)) or isinstance(key, bool):
            also = cost_error(cost, 4) if verb != "tokens_at" else None
            assert got[0] == "err" and got[1] in {TypeError, also}, (key, got)
            continue
        want = outcome(lambda: getattr(model, verb)(*args))
        if verb != "tokens_at" and cost_error(cost, 4) is not None:
            assert got[0] == "err" and got[1] is cost_error(cost, 4), got
            continue
        assert normal(got) == normal(want), (verb, key, now, cost, got, want)
