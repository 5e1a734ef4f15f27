"""Shared-memory table speed: per call against the in-process table, and 1 vs 2 processes.

    python benchmarks/bench_shared.py [percall|full|scaling] [--keys 100000] [--n 1000000]

``percall``: keyed ``allow(key)`` over ``--keys`` distinct str keys, every
one a live bucket for the whole run (rate 1/s, a capacity no run exhausts:
every call admitted, no slot ever reclaimed, so it measures lookups), with
both tables sized for ``--keys``. The keys are asked in insertion order,
then shuffled; median of 5 rounds of ``--n`` calls each, for the in-process
``KeyedTokenBucket`` (Cython and pure Python) and the
``SharedKeyedTokenBucket``, in the same run; prints ns/call and the ratio
shared / in-process Cython for each order (goal <= 1.3).

``full``: a table whose every slot holds a live bucket (frozen time): the
cost of refusing a new key, which scans its whole window of slots.

``scaling``: 1 then 2 forked processes call ``allow`` on one shared table
for ``--seconds`` each; prints decisions/s and the ratio (goal >= 1.6 on 2
cores), for distinct keys per process and for one hot key they all hit.
"""

from __future__ import annotations

import argparse
import os
import random
import time
import uuid
from collections.abc import Callable

from nanobucket._core import _bucket_c, _bucket_py
from nanobucket.bench.timer import median_of_rounds
from nanobucket.shared import PROBE, SharedKeyedTokenBucket

# percall: each call spends 1 s of a bucket holding 10**9 s, so every
# bucket stays live (owing tokens) for the whole run and none is reclaimed.
RATE = 1
CAPACITY = 10**9
# scaling: every call admitted, buckets full again at once (slots reused).
FAST_RATE = 10**9
FAST_CAPACITY = 10**9


def median_ns_per_call(allow: Callable[[object], object], keys: list[str], n: int) -> float:
    # The untimed warm-up round inserts every key: the rounds measure lookups.
    reps = range(max(1, n // len(keys)))

    def run() -> None:
        for _ in reps:
            for k in keys:
                allow(k)

    return median_of_rounds(run, len(reps) * len(keys))


def percall(args: argparse.Namespace) -> None:
    keys = [f"user-{i}" for i in range(args.keys)]
    shuffled = random.Random(1).sample(keys, len(keys))
    print(f"allow(key), {args.keys} live str keys, median of 5 rounds (ns/call):")
    for order, asked in (("insertion order", keys), ("shuffled", shuffled)):
        c = _bucket_c.KeyedTokenBucket(rate=RATE, capacity=CAPACITY, max_keys=args.keys)
        py = _bucket_py.KeyedTokenBucket(rate=RATE, capacity=CAPACITY, max_keys=args.keys)
        name = f"nanobucket-bench-{uuid.uuid4().hex}"
        table = SharedKeyedTokenBucket.create(
            name, rate=RATE, capacity=CAPACITY, max_keys=args.keys
        )
        try:
            for k in keys:  # every table learns the keys in insertion order
                c.allow(k)
                py.allow(k)
                table.allow(k)
            rows = [
                (
                    "in-process KeyedTokenBucket (Cython)",
                    median_ns_per_call(c.allow, asked, args.n),
                ),
                ("SharedKeyedTokenBucket", median_ns_per_call(table.allow, asked, args.n)),
                (
                    "in-process KeyedTokenBucket (pure Python)",
                    median_ns_per_call(py.allow, asked, args.n // 10),
                ),
            ]
        finally:
            table.unlink()
            table.close()
        print(f" {order}:")
        for row, ns in rows:
            print(f"  {row:44s} {ns:8.1f}")
        print(f"  shared / in-process Cython: {rows[1][1] / rows[0][1]:.2f}x (goal <= 1.3x)")


def full(args: argparse.Namespace) -> None:
    table = SharedKeyedTokenBucket.create_anonymous(rate=1, capacity=2, max_keys=4096)
    with table:
        # Every slot live at time 0: a key that finds no room is refused, and
        # once 1,000 new keys in a row are, no slot is left.
        key, refused_in_a_row = 0, 0
        while refused_in_a_row < 1000:
            refused_in_a_row = 0 if table.allow_at(key, 0) else refused_in_a_row + 1
            key += 1
        new = list(range(key, key + 1000))
        assert table.allow_many_at(new, 0).count(0) == len(new)
        ns = median_of_rounds(lambda: table.allow_many_at(new, 0), len(new))
    print(
        f"a new key refused by a table of {table.slot_count} live slots "
        f"(window {min(PROBE, table.slot_count)}): {ns:.0f} ns, median of 5 rounds"
    )


def run(
    table: SharedKeyedTokenBucket, procs: int, seconds: float, hot: bool
) -> tuple[float, float]:
    """Decisions per wall second, and per CPU second, of *procs* processes calling allow.

    The second figure does not depend on other load on the machine: if two
    processes each decide as many per CPU second as one alone, they share
    nothing that slows them, and on two idle cores reach twice the rate.
    """
    start = time.monotonic_ns() + 200_000_000
    end = start + int(seconds * 1e9)
    pipes = []
    for i in range(procs):
        r, w = os.pipe()
        if os.fork() == 0:
            os.close(r)
            keys = ["hot"] * 100 if hot else [f"p{i}-user-{j}" for j in range(1000)]
            allow = table.allow
            calls = 0
            while time.monotonic_ns() < start:
                pass
            cpu = time.process_time_ns()
            while time.monotonic_ns() < end:
                for k in keys:
                    allow(k)
                calls += len(keys)
            cpu = time.process_time_ns() - cpu
            os.write(w, f"{calls} {cpu}".encode())
            os._exit(0)
        os.close(w)
        pipes.append(r)
    total = cpu_ns = 0
    for r in pipes:
        calls, cpu = (int(x) for x in os.read(r, 64).split())
        total += calls
        cpu_ns += cpu
        os.close(r)
        os.wait()
    return total / seconds, total / (cpu_ns / 1e9)


def scaling(args: argparse.Namespace, table: SharedKeyedTokenBucket) -> None:
    print(
        f"forked processes calling allow for {args.seconds} s each; load average "
        f"{os.getloadavg()[0]:.2f} (wall figures need idle cores; per-CPU-s ones do not):"
    )
    for hot in (False, True):
        one, one_cpu = run(table, 1, args.seconds, hot)
        two, two_cpu = run(table, 2, args.seconds, hot)
        label = "one hot key" if hot else "distinct keys"
        print(
            f"  {label:14s} decisions/s     1 process {one:12,.0f}   2 processes {two:12,.0f}"
            f"   {two / one:.2f}x (goal >= 1.6x)"
        )
        print(
            f"  {'':14s} per CPU second  1 process {one_cpu:12,.0f}   2 processes "
            f"{two_cpu:12,.0f} each: 2 processes = {2 * two_cpu / one_cpu:.2f}x one "
            f"on 2 idle cores"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "what", nargs="?", choices=["percall", "full", "scaling", "all"], default="all"
    )
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    print(f"cpus: {os.cpu_count()}")
    if args.what in ("percall", "all"):
        percall(args)
    if args.what in ("full", "all"):
        full(args)
    if args.what in ("scaling", "all"):
        name = f"nanobucket-bench-{uuid.uuid4().hex}"
        table = SharedKeyedTokenBucket.create(
            name, rate=FAST_RATE, capacity=FAST_CAPACITY, max_keys=10_000
        )
        try:
            scaling(args, table)
        finally:
            table.unlink()
            table.close()


if __name__ == "__main__":
    main()
