"""``python -m nanobucket bench``: nanobucket beside the floor, the naive bucket and its peers.

Runs every group of `nanobucket.bench.cases` without pytest and prints, for
users (`format_summary`), what was timed, in time per call and calls per
second, against nanobucket's compiled core and named baselines (the pure
Python one, a naive token bucket, a bare ``dict`` lookup, the peer
libraries installed), and the memory per tracked key. ``--dev`` prints the
developers' table instead (`format_table`: medians beside a no-op floor
and the floor plus a clock read, their spread and rounds, and the
project's speed goals). ``--json FILE`` writes every figure for machines;
``--quick`` is a few-second smoke run with small sizes (its figures are not
the published ones).

Every case is timed by `timer.time_trial` and reported as the median of its
rounds (`timer.median_ns`), the one statistic of the table, the JSON and the
goals; the goals themselves are the table `goals.GOALS`.

    python -m nanobucket bench
    python -m nanobucket bench --dev --quick --json bench.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import IO, Any, NoReturn

from .. import __version__
from . import cases
from .goals import GOALS, goals
from .timer import FULL_BUDGET, QUICK_BUDGET, Budget, summarize, time_trial

SCHEMA = 1

__all__ = [
    "FULL_BUDGET",
    "GOALS",
    "QUICK_BUDGET",
    "Budget",
    "build_parser",
    "format_summary",
    "format_table",
    "goals",
    "main",
    "run",
    "summarize",
    "time_trial",
]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, exit status 2: the house rule for bad CLI input.
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(prog: str = "nanobucket bench") -> argparse.ArgumentParser:
    """The ``bench`` command's options (also used by ``nanobucket.cli``)."""
    p = _Parser(
        prog=prog,
        description="Time nanobucket against a no-op floor, the naive token bucket "
        "algorithm and the installed peer libraries; print a table.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes and few rounds: a few seconds, figures not for quoting",
    )
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    p.add_argument(
        "--group",
        action="append",
        metavar="ID",
        dest="groups",
        help="run only this group (repeatable); --list shows the ids",
    )
    p.add_argument("--list", action="store_true", help="list the group ids and exit")
    p.add_argument(
        "--dev",
        action="store_true",
        help="the developers' table: no-op floor, spread, rounds and the speed goals",
    )
    p.add_argument(
        "--no-memory", action="store_true", help="skip the resident-bytes-per-key measurement"
    )
    p.add_argument(
        "--memory-all",
        action="store_true",
        help="also measure bytes per key of the naive bucket and the installed peers "
        "(adds ~10-20 s)",
    )
    return p


# --- progress ----------------------------------------------------------------


class Progress:
    """A bar redrawn in place on a terminal; one plain line per step otherwise."""

    def __init__(self, total: int, stream: IO[str]) -> None:
        self.total = total
        self.done = 0
        self.stream = stream
        self.tty = stream.isatty()

    def start(self, label: str) -> None:
        if self.tty:
            width = 30
            filled = width * self.done // max(self.total, 1)
            line = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {label}"
            self.stream.write("\r\033[K" + line[:110])
            self.stream.flush()

    def finish(self, label: str, outcome: str) -> None:
        self.done += 1
        if not self.tty:
            self.stream.write(f"[{self.done}/{self.total}] {label}: {outcome}\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()


# --- running -----------------------------------------------------------------


def run_group(group: cases.Group, budget: Budget, progress: Progress) -> dict[str, Any]:
    """Time every case of *group*; the result as it appears in the JSON."""
    results: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    for case in group.cases:
        label = f"{group.id}: {case.name}"
        progress.start(label)
        began = time.perf_counter()
        try:
            trial = case.build()
        except cases.Unavailable as exc:
            skipped.append({"name": case.name, "reason": str(exc)})
            progress.finish(label, f"skipped ({exc})")
            continue
        try:
            ns, capped = time_trial(trial, budget)
        finally:
            if trial.close is not None:
                trial.close()
        stats = summarize(ns)
        results.append(
            {
                "name": case.name,
                "role": case.role,
                "ns": stats,
                "rounds": len(ns),
                "calls_per_round": trial.calls,
                "capped": capped,
                "seconds": time.perf_counter() - began,
            }
        )  # set-up included
        del trial  # free its table before the next case is built
        progress.finish(
            label,
            f"{stats['median']:.1f} ns/{group.unit}"
            f"{f' (capped: a round took over {budget.cap:g} s)' if capped else ''}",
        )
    for r in results:
        r["ratios"] = {
            o["name"]: r["ns"]["median"] / o["ns"]["median"]
            for o in results
            if o is not r and o["ns"]["median"] > 0
        }
    return {
        "id": group.id,
        "title": group.title,
        "unit": group.unit,
        "floor": group.floor,
        "results": results,
        "skipped": skipped,
    }


def run_memory(n: int, kinds: Sequence[str], progress: Progress) -> dict[str, Any]:
    """Resident bytes per key for each kind, each measured in a fresh interpreter."""
    per_key: dict[str, float] = {}
    seconds: dict[str, float] = {}
    skipped: list[dict[str, str]] = []
    for kind in kinds:
        label = f"memory: {kind} at {n:,} keys"
        progress.start(label)
        began = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "nanobucket.bench.memory", kind, str(n)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if proc.returncode != 0:
            reason = (proc.stderr.strip().splitlines() or ["failed"])[-1]
            # The child's Unavailable reads as the in-process skips do.
            reason = reason.removeprefix("Unavailable: ")
            skipped.append({"name": kind, "reason": reason})
            progress.finish(label, f"skipped ({reason})")
            continue
        per_key[kind] = float(proc.stdout.strip())
        seconds[kind] = time.perf_counter() - began
        progress.finish(label, f"{per_key[kind]:.1f} bytes/key")
    return {"keys": n, "bytes_per_key": per_key, "seconds": seconds, "skipped": skipped}


def memory_kinds(peers: dict[str, str | None], every: bool) -> list[str]:
    """What the memory measurement covers: ours and a bare dict, or also the others."""
    from .memory import MEMORY_KINDS, MEMORY_MORE  # not at import: `-m ...memory` runs it

    kinds = list(MEMORY_KINDS) + (list(MEMORY_MORE) if every else [])
    return [k for k in kinds if k not in peers or peers[k] is not None]


# --- output ----------------------------------------------------------------


def _fmt_ns(x: float) -> str:
    return f"{x:,.1f}" if x < 1e4 else f"{x:,.0f}"


def format_table(report: dict[str, Any]) -> str:
    """The human-readable report."""
    lines = [
        f"nanobucket {report['nanobucket']} ({report['implementation']}), "
        f"Python {report['python']}, {report['machine']}, {report['cpus']} CPUs"
        f"{', QUICK run (small sizes)' if report['quick'] else ''}",
        "ns: median of the rounds; spread: (p75 - p25) / 2 as % of the median; "
        "x floor / x c: this median over the floor's / nanobucket-c's",
        "",
    ]
    skipped: dict[str, dict[str, None]] = {}  # reason -> names, in order
    for grp in report["groups"]:
        lines.append(f"{grp['title']}  [ns per {grp['unit']}]")
        ref = next((r for r in grp["results"] if r["role"] == "ours"), None)
        lines.append(
            f"  {'contender':<30} {'ns':>10} {'spread':>8} {'x floor':>8} {'x c':>8} {'rounds':>6}"
        )
        for r in grp["results"]:
            ns = r["ns"]
            spread = (ns["p75"] - ns["p25"]) / 2 / ns["median"] * 100 if ns["median"] else 0.0
            xf = r["ratios"].get(grp["floor"], 1.0 if r["name"] == grp["floor"] else None)
            xc = r["ratios"].get(ref["name"], 1.0) if ref else None
            lines.append(
                f"  {r['name']:<30} {_fmt_ns(ns['median']):>10} {spread:>7.1f}% "
                f"{'' if xf is None else f'{xf:.2f}':>8} "
                f"{'' if xc is None else f'{xc:.2f}':>8} {r['rounds']:>6}"
                f"{'  capped: a round took too long' if r['capped'] else ''}"
            )
        for s in grp["skipped"]:
            skipped.setdefault(s["reason"], {})[s["name"]] = None
        lines.append("")
    mem = report.get("memory")
    if mem:
        lines.append(
            f"resident bytes per key at {mem['keys']:,} str keys "
            "(RSS growth while filling, keys created beforehand)"
        )
        for kind, b in mem["bytes_per_key"].items():
            lines.append(f"  {kind:<30} {b:>10.1f}")
        for s in mem["skipped"]:
            skipped.setdefault(s["reason"], {})[s["name"]] = None
        lines.append("")
    # Once per reason, not once per group: a missing peer is one fact.
    for reason, names in skipped.items():
        lines.append(f"skipped, {reason}: {', '.join(names)}")
    if skipped:
        lines.append("")
    lines.append(
        "speed goals of the Cython build on an idle machine (targets, not a test of this "
        "install; a quick or busy run is only indicative)"
    )
    for goal in report["goals"]:
        value = "not measured" if goal["value"] is None else f"{goal['value']:.2f}"
        mark = {True: "met", False: "not met", None: "-"}[goal["met"]]
        lines.append(f"  {mark:<8}{goal['goal']:<62} {value}")
        if "note" in goal:
            lines.append(f"          ({goal['note']})")
    lines.append(f"\n{report['elapsed_s']:.1f} s")
    return "\n".join(lines)


#: Names the user view gives the contenders (others keep their own: the peers').
LABELS = {
    "nanobucket-c": "nanobucket (compiled)",
    "nanobucket-py": "nanobucket (pure Python)",
    "naive": "naive token bucket (Python)",
    "dict.get": "dict.get alone (no limiter)",
    "dict.setdefault": "dict.setdefault alone",
    "dict": "a dict of the keys alone",
    "nanobucket-c allow(key) loop": "nanobucket, a loop of allow(key)",
    "nanobucket-c allow(int) loop": "nanobucket, a loop of allow(int)",
}
#: Developers' rows: the no-op floor and the floor plus a clock read.
DEV_ROLES = ("floor",)
DEV_NAMES = ("floor+clock",)
#: Groups whose rows are developers' (hash flooding: aimed against random keys).
DEV_GROUPS = ("aimed",)


def _label(name: str) -> str:
    if name in LABELS:
        return LABELS[name]
    if name.startswith("nanobucket-c "):
        return "nanobucket (compiled), " + name.removeprefix("nanobucket-c ")
    if name.startswith("nanobucket-py "):
        return "nanobucket (pure Python), " + name.removeprefix("nanobucket-py ")
    return name


def _per_second(ns: float) -> str:
    """Calls per second to 3 significant digits (``26,500,000``): no false precision."""
    if ns <= 0:
        return f"{'-':>14}"
    rate = 1e9 / ns
    return f"{round(rate, 2 - math.floor(math.log10(rate))):>14,.0f}"


def _versus(ns: float, ref: float) -> str:
    if ns <= 0 or ref <= 0:
        return ""
    ratio = ns / ref
    if 0.95 <= ratio <= 1.05:
        return "about the same"
    return f"{ratio:.1f}x slower" if ratio > 1 else f"{1 / ratio:.1f}x faster"


def format_summary(report: dict[str, Any]) -> str:
    """The report for users: per case, time per call, calls per second, and the ratio
    against nanobucket's compiled core (the first of ours in each group)."""
    impl = "compiled" if report["implementation"] == "cython" else "pure Python"
    lines = [
        f"nanobucket {report['nanobucket']} ({impl}), Python {report['python']}, "
        f"{report['machine']}, {report['cpus']} CPUs",
        "Each row: the time one call takes (the median of several rounds on one core), the",
        "calls per second that makes, and how it compares with the first nanobucket row.",
    ]
    if report["quick"]:
        lines.append("A quick run (small sizes, few rounds): the figures only indicate.")
    lines.append("")
    skipped: dict[str, dict[str, None]] = {}  # reason -> names, in order
    for grp in report["groups"]:
        for s in grp["skipped"]:
            skipped.setdefault(s["reason"], {})[s["name"]] = None
        if grp["id"] in DEV_GROUPS:
            continue
        rows = [
            r for r in grp["results"] if r["role"] not in DEV_ROLES and r["name"] not in DEV_NAMES
        ]
        if not rows:
            continue
        # The compiled core; on an install without it, the pure-Python one.
        ref = next((r for r in rows if r["role"] == "ours"), None) or next(
            (r for r in rows if r["role"] == "twin"), None
        )
        unit = grp["unit"]
        lines.append(grp["title"])
        lines.append(
            f"  {'':<40} {'time/' + unit:>10} {unit + 's/s':>14}"
            + ("" if ref is None else f"  vs {_label(ref['name'])}")
        )
        for r in rows:
            ns = r["ns"]["median"]
            versus = "" if ref is None or r is ref else _versus(ns, ref["ns"]["median"])
            lines.append(
                f"  {_label(r['name']):<40} {_fmt_ns(ns) + ' ns':>10} {_per_second(ns)}"
                f"  {versus}".rstrip()
            )
        lines.append("")
    mem = report.get("memory")
    if mem:
        for s in mem["skipped"]:
            skipped.setdefault(s["reason"], {})[s["name"]] = None
        if mem["bytes_per_key"]:
            lines.append(f"memory per tracked key, {mem['keys']:,} keys")
            for kind, b in mem["bytes_per_key"].items():
                lines.append(f"  {_label(kind):<40} {b:>8.0f} bytes")
            lines.append("")
    for reason, names in skipped.items():
        lines.append(f"not measured, {reason}: {', '.join(names)}")
    if skipped:
        lines.append("")
    lines.append(
        "--dev: the developers' table (no-op floor, spread, rounds, hash flooding, speed "
        f"goals). {report['elapsed_s']:.1f} s"
    )
    return "\n".join(lines)


def run(
    quick: bool = False,
    only: Sequence[str] | None = None,
    memory: bool = True,
    memory_all: bool = False,
    progress_stream: IO[str] | None = None,
) -> dict[str, Any]:
    """Run the benchmarks; return the report (the JSON document)."""
    start = time.perf_counter()
    sizes, budget = (cases.QUICK, QUICK_BUDGET) if quick else (cases.FULL, FULL_BUDGET)
    selected = [g for g in cases.groups(sizes) if not only or g.id in only]
    peers = cases.peer_versions()
    kinds = memory_kinds(peers, memory_all) if memory and (not only or "memory" in only) else []
    progress = Progress(
        sum(len(g.cases) for g in selected) + len(kinds), progress_stream or sys.stderr
    )
    groups_out = []
    # Spin first, so the first group does not pay for the CPU leaving a low clock.
    spin_until = time.perf_counter() + (0.05 if quick else 0.3)
    while time.perf_counter() < spin_until:
        pass
    try:
        for g in selected:
            groups_out.append(run_group(g, budget, progress))
        mem = run_memory(sizes.memory_keys, kinds, progress) if kinds else None
    finally:
        progress.close()
    from .._core._bucket import IMPLEMENTATION

    report: dict[str, Any] = {
        "schema": SCHEMA,
        "nanobucket": __version__,
        "implementation": IMPLEMENTATION,
        "floor": "cython" if cases.FLOOR_IS_CYTHON else "python",
        "python": platform.python_version(),
        "machine": f"{platform.system()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "quick": quick,
        "peers": peers,
        "groups": groups_out,
        "memory": mem,
    }
    report["goals"] = goals(report)
    report["elapsed_s"] = time.perf_counter() - start
    return report


def group_ids() -> list[str]:
    return [g.id for g in cases.groups(cases.QUICK)] + ["memory"]


def main(argv: Sequence[str] | None = None, prog: str = "nanobucket bench") -> int:
    """Entry point of ``python -m nanobucket bench`` and ``python -m nanobucket.bench``."""
    parser = build_parser(prog)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    ids = group_ids()
    if args.list:
        print("\n".join(ids))
        return 0
    unknown = [g for g in args.groups or () if g not in ids]
    if unknown:
        parser.error(f"unknown group {unknown[0]!r} (choose from {', '.join(ids)})")
    out: IO[str] | None = None
    if args.json:
        try:
            out = open(args.json, "w")  # noqa: SIM115 - opened early: fail before the long run
        except OSError as exc:
            parser.error(f"cannot write {args.json}: {exc.strerror}")
    try:
        report = run(
            quick=args.quick,
            only=args.groups,
            memory=not args.no_memory,
            memory_all=args.memory_all,
        )
        if out is not None:
            json.dump(report, out, indent=1)
            out.write("\n")
    finally:
        if out is not None:
            out.close()
    print(format_table(report) if args.dev else format_summary(report))
    return 0
