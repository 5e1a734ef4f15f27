"""The one timer of the benchmarks and the one statistic they report.

`time_trial` times every case of ``python -m nanobucket bench``; `median_ns`
is the figure reported for it everywhere (the table, the JSON, the goals,
the pytest-benchmark suite's ``ns_per_*``): the median of the rounds, which
one descheduled round cannot move, unlike the mean or the minimum. The
quartiles are kept only to show the spread.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .cases import Trial


@dataclass(frozen=True)
class Budget:
    """Timing effort per case: rounds run until *seconds* pass, within [lo, hi].

    A case whose rounds take over ``seconds / lo`` each (a slow peer, a
    million keys) runs ``lo_slow`` rounds instead of ``lo``.
    """

    seconds: float
    lo: int
    hi: int
    lo_slow: int = 3
    # A round longer than this is a pathology to report, not to repeat: the
    # case stops after it (and is marked "capped") so the run stays bounded.
    cap: float = 5.0


FULL_BUDGET = Budget(0.25, 5, 101)
QUICK_BUDGET = Budget(0.03, 3, 9, cap=2.0)


def time_trial(trial: Trial, budget: Budget) -> tuple[list[float], bool]:
    """ns per call (or key) of each round, after one untimed warm-up round.

    The collector is off for the whole case, as in `timeit`: it would charge
    one contender for another's garbage, and collecting between rounds would
    evict the caches the rounds are meant to find warm. Returns the figures
    and whether a round over ``budget.cap`` cut the case short.
    """
    out: list[float] = []
    spent = 0.0
    # Unless set-up already did the work once, the first round warms caches
    # and the branch predictor, and is dropped.
    rounds = 0 if trial.warmed else -1
    lo = budget.lo
    gc.collect()
    gc.disable()
    try:
        while rounds < lo or (spent < budget.seconds and rounds < budget.hi):
            if trial.reset is not None:
                trial.reset()
            t0 = time.perf_counter_ns()
            trial.run()
            elapsed = time.perf_counter_ns() - t0
            if elapsed / 1e9 > budget.seconds / budget.lo:
                lo = min(lo, budget.lo_slow)
            if rounds >= 0:
                out.append(elapsed / trial.calls)
                spent += elapsed / 1e9
            rounds += 1
            if elapsed / 1e9 > budget.cap and out:
                return out, True
    finally:
        gc.enable()
    return out, False


def summarize(ns: Sequence[float]) -> dict[str, float]:
    """Median, quartiles and extremes of per-round figures."""
    q1, _, q3 = (
        statistics.quantiles(ns, n=4, method="inclusive") if len(ns) > 1 else (ns[0], ns[0], ns[0])
    )
    return {"median": median_ns(ns), "p25": q1, "p75": q3, "min": min(ns), "max": max(ns)}


def median_ns(ns: Sequence[float]) -> float:
    """The reported figure of a case: the median of its per-round figures."""
    return statistics.median(ns)


def median_of_rounds(run: Callable[[], object], calls: int, rounds: int = 5) -> float:
    """ns per call of *run* (one round of *calls* calls): `time_trial`, *rounds* rounds.

    For the stand-alone scripts in ``benchmarks/``, which time a round they
    build themselves rather than a case of `nanobucket.bench.cases`.
    """
    ns, _ = time_trial(Trial(run, calls), Budget(0.0, rounds, rounds, lo_slow=rounds))
    return median_ns(ns)
