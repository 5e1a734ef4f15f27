"""Threads: no token lost and none spent twice, on both implementations."""

from __future__ import annotations

import functools
import sys
import threading
from array import array
from collections.abc import Callable
from types import ModuleType

THREADS = 4


def _run_together(targets: list[Callable[[], None]]) -> None:
    """Run each target in its own thread, switching threads as often as possible."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=target) for target in targets]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)


def _hammer(call: Callable[[], bool], per_thread: int) -> list[int]:
    counts = [0] * THREADS
    start = threading.Barrier(THREADS)

    def run(i: int) -> None:
        start.wait()
        n = 0
        for _ in range(per_thread):
            n += call()
        counts[i] = n

    _run_together([functools.partial(run, i) for i in range(THREADS)])
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
    start = threading.Barrier(THREADS)

    def run(i: int) -> None:
        start.wait()
        for n in range(6_000):
            key = n % 40
            if t.allow(key, cost=3):
                spent[i][key] += 3

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert [sum(s[k] for s in spent) for k in range(40)] == [300] * 40


def test_uint64_batches_without_the_gil_race_single_calls_exactly(impl: ModuleType, clock) -> None:  # type: ignore[no-untyped-def]
    # Batches of uint64 keys charge with the GIL released while two other
    # threads call allow(key) on the same two keys: the single calls must use
    # CAS then (the table is pinned), or a store could overwrite a batch's
    # charge and admit more than capacity.
    keys = array("Q", [0, 1]) * 2048
    t = impl.KeyedTokenBucket(rate=1, capacity=400_000, clock=clock)  # frozen clock
    admitted = [[0, 0] for _ in range(THREADS)]
    start = threading.Barrier(THREADS)

    def batches(i: int) -> None:
        start.wait()
        for _ in range(100):
            decided = t.allow_many(keys)
            admitted[i][0] += sum(decided[0::2])
            admitted[i][1] += sum(decided[1::2])

    def singles(i: int) -> None:
        start.wait()
        for n in range(20_000):
            admitted[i][n % 2] += t.allow(n % 2)

    _run_together([functools.partial(batches if i < 2 else singles, i) for i in range(THREADS)])
    # 429,600 requests per key, of which exactly capacity are admitted.
    assert [sum(a[k] for a in admitted) for k in range(2)] == [400_000] * 2
