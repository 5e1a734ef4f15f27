"""Overhead of ``all_of`` (two layers), ``tiered`` (two plans) and ``acquire`` over one ``allow``.

    python benchmarks/bench_layered.py [--n 200000]

Every call is admitted (the common path). Median of 5 rounds of ``--n``
calls, in ns/call, for the Cython and the pure-Python classes in the same
run; the ratio is against one ``allow`` (``check``, ``peek_at``) of the same
implementation. Goals: ``all_of`` of two layers < 2.5x, ``acquire`` < 2x.
``tiered`` has no goal: it calls the key's ``tier`` function each time.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial
from types import ModuleType

from nanobucket._core import _bucket_c, _bucket_py
from nanobucket.bench.cases import loop_calls
from nanobucket.bench.timer import median_of_rounds
from nanobucket.layered import all_of
from nanobucket.tiered import tiered

RATE = 10**9  # every call admitted
CAPACITY = 10**9
NOW = 10**15  # the explicit time of the peeks (ns)
KEY = "alice"  # on the "pro" plan


def cases(m: ModuleType) -> list[tuple[str, str, Callable[[], object]]]:
    b = m.TokenBucket(RATE, CAPACITY)
    two = all_of(m.TokenBucket(RATE, CAPACITY), m.TokenBucket(RATE, CAPACITY))
    t = m.KeyedTokenBucket(RATE, CAPACITY)
    layered = all_of(m.KeyedTokenBucket(RATE, CAPACITY), m.TokenBucket(RATE, CAPACITY))
    plans = tiered(
        {"free": m.KeyedTokenBucket(RATE, CAPACITY), "pro": m.KeyedTokenBucket(RATE, CAPACITY)},
        tier=lambda key: "pro" if key == KEY else "free",
    )
    return [
        ("TokenBucket.allow()", "base", b.allow),
        ("all_of(bucket, bucket).allow()", "TokenBucket.allow()", two.allow),
        ("TokenBucket.acquire()", "TokenBucket.allow()", b.acquire),
        ("KeyedTokenBucket.allow(key)", "base", partial(t.allow, "alice")),
        (
            "all_of(keyed, bucket).allow(key)",
            "KeyedTokenBucket.allow(key)",
            partial(layered.allow, "alice"),
        ),
        (
            "KeyedTokenBucket.acquire(key)",
            "KeyedTokenBucket.allow(key)",
            partial(t.acquire, "alice"),
        ),
        ("KeyedTokenBucket.check(key)", "base", partial(t.check, "alice")),
        ("KeyedTokenBucket.peek_at(key, now)", "base", partial(t.peek_at, "alice", NOW)),
        ("tiered(2 plans).allow(key)", "KeyedTokenBucket.allow(key)", partial(plans.allow, KEY)),
        ("tiered(2 plans).check(key)", "KeyedTokenBucket.check(key)", partial(plans.check, KEY)),
        (
            "tiered(2 plans).peek_at(key, now)",
            "KeyedTokenBucket.peek_at(key, now)",
            partial(plans.peek_at, KEY, NOW),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    args = parser.parse_args()
    for name, m in (("cython", _bucket_c), ("python", _bucket_py)):
        results: dict[str, float] = {}
        for label, base, call in cases(m):
            results[label] = ns = median_of_rounds(loop_calls(call, args.n).run, args.n)
            ratio = "" if base == "base" else f"  {ns / results[base]:.2f}x {base}"
            print(f"{name:7} {label:34} {ns:8.1f} ns{ratio}")


if __name__ == "__main__":
    main()
