"""Resident memory per key of each contender: run in a fresh process per figure.

``python -m nanobucket.bench.memory KIND N`` prints the bytes per key that
*KIND* (`MEMORY_KINDS`, `MEMORY_MORE`) adds for *N* str keys.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Sequence
from typing import Any

from .cases import KEYED, NaiveKeyed, _impl, peer_keyed


def rss_bytes() -> int:
    """Resident set size of this process now (peak on systems without /proc)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # pragma: no cover - not Linux
        scale = 1 if os.uname().sysname == "Darwin" else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


MEMORY_KINDS = ("nanobucket-c", "nanobucket-py", "dict")
MEMORY_MORE = ("naive", "token-bucket", "throttled-py")  # slow to fill: on request


def memory_per_key(kind: str, n: int) -> float:
    """Resident bytes per tracked key for *n* str keys; run it in a fresh process.

    The keys are created before the first reading, so their own memory is
    not counted: what remains is what the limiter adds per key.
    """
    rate, capacity = KEYED
    keys = [f"user:{i:07d}" for i in range(n)]
    f: Callable[[Any], object]
    if kind == "dict":  # a bare dict of key -> int: the least a Python table costs
        table: dict[str, int] = {}
        base = time.monotonic_ns()

        def f(k: str) -> None:
            table[k] = base + len(table)  # distinct ints, as a tat per key would be
    elif kind == "naive":
        f = NaiveKeyed(rate, capacity).allow
    elif kind.startswith("nanobucket-"):
        f = _impl(kind[len("nanobucket-") :]).KeyedTokenBucket(rate, capacity, max_keys=n).allow
    else:
        f = peer_keyed(kind, rate, capacity, max_keys=n)[0]
    before = rss_bytes()
    for k in keys:
        f(k)
    after = rss_bytes()
    tracked = getattr(getattr(f, "__self__", None), "__len__", None)
    if tracked is not None and kind.startswith("nanobucket-") and tracked() != n:
        raise AssertionError(f"{kind} tracks {tracked()} of {n} keys: not a per-key figure")
    return (after - before) / n


def _memory_main(argv: Sequence[str]) -> None:
    """``python -m nanobucket.bench.memory KIND N``: print bytes per key (for bench)."""
    print(f"{memory_per_key(argv[0], int(argv[1])):.2f}")


if __name__ == "__main__":
    import sys

    _memory_main(sys.argv[1:])
