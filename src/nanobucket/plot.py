"""Draw a `Simulation`: per strategy, load, admitted, rejected and queue over time.

matplotlib is optional (the ``plot`` extra); `require_matplotlib` says so in
one line before any work is done.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from ._core._params import NS_PER_S
from .simulate import Phase, Simulation, StrategyResult

_UNSHADED = {"normal", "after"}  # the case study's phases drawn without a band

__all__ = ("PlotUnavailable", "plot_simulation", "require_matplotlib", "time_axis")

INSTALL_HINT = "pip install 'nanobucket[plot]'"


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib() -> ModuleType:
    """Import matplotlib with a file-only backend, or raise `PlotUnavailable`."""
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable(
            f"--plot needs matplotlib, which is not installed: {INSTALL_HINT}"
        ) from None
    matplotlib.use("Agg")  # no display needed: we only write files
    return matplotlib


def _per_second(times: list[int], seconds: int) -> list[int]:
    counts = [0] * seconds
    for t in times:
        i = t // NS_PER_S
        if 0 <= i < seconds:
            counts[i] += 1
    return _closed(counts)


def _closed(series: list[int]) -> list[int]:
    # A "post" step draws value i over [i, i+1): repeat the last one so the
    # final second is drawn to the right edge.
    return series + series[-1:]


def _queue_series(s: StrategyResult, sim: Simulation, seconds: int) -> list[int]:
    # The longest the queue got in each second: +1 on arrival of a request
    # that must wait, -1 when it starts; departures first at the same instant.
    events = sorted(
        ev
        for t, w, a in zip(sim.traffic.times, s.wait_ns, s.admitted)
        if a and w
        for ev in ((t, 1), (t + w, -1))
    )
    peak = [0] * seconds
    length = 0
    sec = 0
    for t, d in events:
        while sec < seconds and (sec + 1) * NS_PER_S <= t:
            sec += 1
            if sec < seconds:
                peak[sec] = length
        length += d
        if sec < seconds:
            peak[sec] = max(peak[sec], length)
    return _closed(peak)


def time_axis(seconds: int, phases: tuple[Phase, ...]) -> tuple[list[int] | None, str]:
    """The x ticks (None: matplotlib's own) and the x label for a trace of *seconds*.

    >>> time_axis(5, ())
    ([0, 1, 2, 3, 4, 5], 'time (s)')
    >>> from nanobucket.simulate import case_study
    >>> time_axis(120, case_study().phases)[1]
    'time (s); shaded: burst 2 s, burst 3 s, greedy client'
    """
    step = next((st for top, st in ((20, 1), (100, 5), (300, 10)) if seconds <= top), None)
    ticks = None if step is None else list(range(0, seconds + 1, step))
    shaded = list(dict.fromkeys(p.name for p in phases if p.name not in _UNSHADED))
    return ticks, "time (s)" + (f"; shaded: {', '.join(shaded)}" if shaded else "")


def plot_simulation(sim: Simulation, path: str | Path) -> None:
    """Write a PNG of *sim* to *path*: one panel per strategy, per-second counts."""
    require_matplotlib()
    import matplotlib.pyplot as plt

    tr = sim.traffic
    seconds = max(1, -(-tr.duration_ns // NS_PER_S))
    xs = list(range(seconds + 1))
    offered = _per_second(tr.times, seconds)
    n = len(sim.strategies)
    fig, axes = plt.subplots(n, 1, figsize=(12, 2.6 * n + 1), sharex=True, squeeze=False)
    top = max(*offered, int(sim.rate)) * 1.15
    for ax, s in zip((row[0] for row in axes), sim.strategies):
        passed = _per_second(s.pass_times(tr), seconds)
        rejected = _per_second([t for t, a in zip(tr.times, s.admitted) if not a], seconds)
        for phase in tr.phases:
            if phase.name not in _UNSHADED:
                ax.axvspan(
                    phase.start_ns / NS_PER_S,
                    phase.end_ns / NS_PER_S,
                    color="#f3e6b3",
                    alpha=0.6,
                    lw=0,
                )
        ax.fill_between(xs, offered, step="post", color="#cccccc", label="offered")
        ax.step(xs, passed, where="post", color="#1a7f37", lw=1.6, label="reached the service")
        ax.step(xs, rejected, where="post", color="#cf222e", lw=1.2, label="rejected")
        ax.axhline(float(sim.rate), color="black", ls="--", lw=0.8, label=f"{float(sim.rate):g}/s")
        ax.set_ylim(0, top)
        ax.set_ylabel("requests / s")
        ax.set_title(
            f"{s.label}: admitted {100 * s.passed / s.offered:.1f}%, "
            f"p99 wait {s.p99_wait_ns / NS_PER_S:.2f} s, max in 1 s {s.max_in_1s}",
            loc="left",
            fontsize=10,
        )
        handles, labels = ax.get_legend_handles_labels()
        if s.queued:
            qax = ax.twinx()
            qax.step(
                xs,
                _queue_series(s, sim, seconds),
                where="post",
                color="#0969da",
                lw=1.4,
                label="queue length (right)",
            )
            qax.set_ylabel("queued requests", color="#0969da")
            qax.set_ylim(bottom=0, top=max(s.peak_queue, sim.bound) * 1.15)
            qh, ql = qax.get_legend_handles_labels()
            handles, labels = handles + qh, labels + ql
        ax.legend(handles, labels, loc="upper left", fontsize=8, ncol=5, framealpha=0.9)
        ax.grid(axis="y", alpha=0.3)
    ticks, label = time_axis(seconds, tr.phases)
    axes[-1][0].set_xlabel(label)
    axes[-1][0].set_xlim(0, seconds)
    if ticks is not None:  # bursts are a few seconds long: ticks close enough to see them
        axes[-1][0].set_xticks(ticks)
    fig.suptitle(tr.description, fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
