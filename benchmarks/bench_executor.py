"""LimitedExecutor at 1,000/s with 8 threads: the admitted rate and the fullest windows.

A thread pool of 8 behind a ``LimitedExecutor`` on ``TokenBucket(rate=1000,
capacity=10)``; one thread submits 2 ms tasks as fast as ``submit`` lets it
(``max_pending=64``: the queue never empties). Each start is stamped
(``time.monotonic_ns``) when the pacing thread hands the task to the pool.

- admitted: starts in the run / (capacity + rate * run's length), the share of
  what the bucket allows that actually started (>= 99% wanted);
- for each window length T: the most starts in any window [s, s + T] against
  the bound capacity + rate * T (never above it wanted).

Medians of ``--runs`` runs (the window maxima: also the worst run).

    PYTHONPATH=src python benchmarks/bench_executor.py [--runs 3] [--seconds 3]
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import nanobucket as nb

RATE, CAPACITY, THREADS, MAX_PENDING = 1000, 10, 8, 64
WINDOWS = (0.001, 0.01, 0.1, 1.0)


class Stamping(Executor):
    """The wrapped pool: records when each task is handed to it."""

    def __init__(self, pool: Executor) -> None:
        self.pool = pool
        self.starts: list[int] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.starts.append(time.monotonic_ns())
        return self.pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.pool.shutdown(wait=wait, cancel_futures=cancel_futures)


def fullest(starts: list[int], seconds: float) -> int:
    """The most starts in any closed window of *seconds* (starts sorted)."""
    width = round(seconds * 1e9)
    return max(bisect.bisect_right(starts, s + width) - i for i, s in enumerate(starts))


def run(seconds: float) -> tuple[float, dict[float, int], int]:
    rec = Stamping(ThreadPoolExecutor(THREADS))
    bucket = nb.TokenBucket(rate=RATE, capacity=CAPACITY)
    with nb.LimitedExecutor(rec, bucket, max_pending=MAX_PENDING) as pool:
        t0 = time.monotonic_ns()
        end = t0 + round(seconds * 1e9)
        while time.monotonic_ns() < end:
            pool.submit(time.sleep, 0.002)  # blocks while 64 wait to start
        pool.shutdown(cancel_futures=True)
    starts = sorted(s for s in rec.starts if t0 <= s <= end)
    admitted = len(starts) / (CAPACITY + RATE * (end - t0) / 1e9)
    return admitted, {t: fullest(starts, t) for t in WINDOWS}, len(starts)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    shares: list[float] = []
    maxima: dict[float, list[int]] = {t: [] for t in WINDOWS}
    for n in range(args.runs):
        share, most, count = run(args.seconds)
        shares.append(share)
        for t in WINDOWS:
            maxima[t].append(most[t])
        fills = ", ".join(f"{t * 1000:g} ms: {most[t]}" for t in WINDOWS)
        print(f"run {n + 1}: {count} starts in {args.seconds:g} s, {share:.2%} of allowed; "
              f"fullest windows {fills}")  # fmt: skip
    print(f"\n{RATE}/s, capacity {CAPACITY}, {THREADS} threads, {args.runs} runs of "
          f"{args.seconds:g} s: admitted {statistics.median(shares):.2%} of the allowed rate "
          f"(median; min {min(shares):.2%})")  # fmt: skip
    print("| window T | bound capacity + rate*T | most starts (median) | most (worst run) |")
    print("|---|---:|---:|---:|")
    for t in WINDOWS:
        bound = CAPACITY + round(RATE * t)
        print(f"| {t * 1000:g} ms | {bound} | {statistics.median(maxima[t]):g} | "
              f"{max(maxima[t])} |")  # fmt: skip


if __name__ == "__main__":
    main()
