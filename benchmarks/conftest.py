"""pytest-benchmark suite: every group of `nanobucket.bench.cases`, one test per case.

    pytest benchmarks/ --benchmark-only
    NANOBUCKET_BENCH_QUICK=1 pytest benchmarks/ --benchmark-only   # small sizes, 3 rounds
    NANOBUCKET_BENCH_ROUNDS=15 pytest benchmarks/ --benchmark-only  # more rounds (default 9)

Each round is one loop of ``calls_per_round`` calls (see each result's
extra_info); all the cases of a group use the same loop and the same count,
so their times compare directly. At the end a summary prints each median per
call and as a multiple of the group's floor (a no-op Cython method called
the same way).
"""

from __future__ import annotations

from typing import Any

import pytest


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = getattr(config, "_benchmarksession", None)  # pytest-benchmark's own state
    done = [b for b in getattr(session, "benchmarks", ()) if b.stats is not None]
    if not done:
        return
    tr = terminalreporter
    tr.section("nanobucket: ns per call (median) and multiple of the group's floor")
    by_group: dict[str, list[Any]] = {}
    for b in done:
        by_group.setdefault(b.group, []).append(b)
    for group, items in by_group.items():
        tr.write_line(group)
        per = {
            b.extra_info["case"]: b.stats.median * 1e9 / b.extra_info["calls_per_round"]
            for b in items
        }
        floor = per.get("floor")
        for b in items:
            ns = per[b.extra_info["case"]]
            ratio = f"{ns / floor:8.2f}x floor" if floor else ""
            tr.write_line(f"  {b.extra_info['case']:<32} {ns:10.1f} ns {ratio}")
