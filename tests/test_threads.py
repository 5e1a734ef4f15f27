"""Threads: no token lost and none spent twice, on both implementations."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from types import ModuleType

from conftest import run_threads

THREADS = 4


def _hammer(call: Callable[[], bool], per_thread: int) -> list[int]:
    counts = [0] * THREADS

    def run(i: int) -> None:
        counts[i] = sum(call() for _ in range(per_thread))

    run_threads(THREADS, run)
    return counts


def test_four_threads_on_one_bucket_admit_exactly_capacity(impl: ModuleType, clock) -> None:  # type: ignore[no-untyped-def]
    b = impl.TokenBucket(rate=1, capacity=20_000, clock=clock)  # frozen clock
    counts = _hammer(b.allow, 10_000)
    assert sum(counts) == 20_000
    assert b.tokens() == 0.0


def test_four_threads_on_one_key_admit_exactly_capacity(impl: ModuleType, clock) -> None:  # type: ignore[no-untyped-def]
    t = impl.KeyedTokenBucket(rate=1, capacity=20_000, clock=clock)
    counts = _hammer(lambda: t.allow("hot"), 10_000)
    assert sum(counts) == 20_000
    assert t.tokens("hot") == 0.0


def test_four_threads_with_costs_and_many_keys(impl: ModuleType, clock) -> None:  # type: ignore[no-untyped-def]
    # Keys churn through a small table while four threads spend on them:
    # each key's total is still exactly its capacity.
    t = impl.KeyedTokenBucket(rate=1, capacity=300, max_keys=64, clock=clock)
    spent = [[0] * 40 for _ in range(THREADS)]

    def run(i: int) -> None:
        for n in range(6_000):
            key = n % 40
            if t.allow(key, cost=3):
                spent[i][key] += 3

    run_threads(THREADS, run)
    assert [sum(s[k] for s in spent) for k in range(40)] == [300] * 40


def test_uint64_batches_without_the_gil_race_single_calls_exactly(impl: ModuleType, clock) -> None:  # type: ignore[no-untyped-def]
    # Batches of uint64 keys charge with the GIL released while two other
    # threads call allow(key) on the same two keys: the single calls must use
    # CAS then (the table is pinned), or a store could overwrite a batch's
    # charge and admit more than capacity.
    keys = array("Q", [0, 1]) * 2048
    t = impl.KeyedTokenBucket(rate=1, capacity=400_000, clock=clock)  # frozen clock
    admitted = [[0, 0] for _ in range(THREADS)]

    def batches(i: int) -> None:
        for _ in range(100):
            decided = t.allow_many(keys)
            admitted[i][0] += sum(decided[0::2])
            admitted[i][1] += sum(decided[1::2])

    def singles(i: int) -> None:
        for n in range(20_000):
            admitted[i][n % 2] += t.allow(n % 2)

    run_threads(THREADS, lambda i: batches(i) if i < 2 else singles(i))
    # 429,600 requests per key, of which exactly capacity are admitted.
    assert [sum(a[k] for a in admitted) for k in range(2)] == [400_000] * 2
