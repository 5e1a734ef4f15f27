"""The ``nanobucket`` command: ``explain``, ``simulate``, ``size`` and ``bench``.

Bad arguments print one line, ``nanobucket <command>: error: ...``, on
stderr and exit with status 2: never a usage dump, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, NoReturn, TextIO

from . import __version__
from ._core._bucket import describe
from ._core._params import NS_PER_S, is_rate_text, rate_fraction

__all__ = ("main",)


class _UsageError(Exception):
    """A bad argument found after parsing: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, with errors in one line (the usage is one ``--help`` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class _Version(argparse.Action):
    """``--version``: one line, never wrapped (argparse's own wraps at the terminal's width)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> NoReturn:
        sys.stdout.write(f"nanobucket {__version__}, {describe()}\n")
        parser.exit(0)


def _rate(text: str) -> Fraction:
    try:
        value: Fraction | str = Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        if not _is_text(text):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number such as 100, 0.5 or 1/3, nor a rate such as 100/minute"
            ) from None
        value = text  # a rate written as text: "100/minute"
    try:
        return rate_fraction(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace(repr(value), text)) from None


def _rate_or_text(text: str) -> Fraction | str:
    """A rate: a number (as `_rate` reads it), or text such as ``100/minute``, kept as text
    (its count is the capacity when none is given)."""
    value = _rate(text)
    return text if _is_text(text) else value


def _is_text(text: str) -> bool:
    """Whether *text* is a rate written with a unit (``100/minute``), not a number (``1/3``)."""
    return is_rate_text(text) and any(c.isalpha() for c in text)


def _count(minimum: int) -> type[int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip().replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = "int"
    return parse  # type: ignore[return-value]


def _output_file(text: str) -> str:
    parent = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"{text!r}: directory {parent!r} does not exist")
    return text


def _share(text: str) -> Fraction:
    from .size import parse_share

    try:
        return parse_share(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> Fraction:
    try:
        value = Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 s, got {text}")
    return value


def _window(text: str) -> Fraction:
    value = _seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0 s, got 0")
    return value


# An option's row: its name, its type, its default (or _REQUIRED) and its help.
_Option = tuple[str, Callable[[str], Any], Any, str]
_REQUIRED = object()  # the default of an option that must be given


def _options(parser: argparse.ArgumentParser, *rows: _Option) -> None:
    """Declare one ``--option`` per row, in order (the order ``--help`` lists them)."""
    for name, kind, default, text in rows:
        required = default is _REQUIRED
        parser.add_argument(
            name, type=kind, required=required, default=None if required else default, help=text
        )


def _traffic_arguments(parser: argparse.ArgumentParser) -> None:
    """--duration, --seed and --trace: the traffic `simulate` and `size` replay."""
    _options(
        parser,
        (
            "--duration",
            _count(1),
            None,
            "seconds of traffic (default 120; with --trace: the whole trace)",
        ),
        ("--seed", _count(0), None, "random seed (default 1)"),
    )
    parser.add_argument(
        "--trace",
        metavar="FILE.csv",
        default=None,
        help="replay rows of timestamp,key[,cost]; timestamp in seconds "
        "(decimal or Unix time), cost default 1, optional header row",
    )


def _output_arguments(parser: argparse.ArgumentParser, *, json: str, plot: str = "") -> None:
    """--plot (where *plot* says what it draws) and --json, each command's last options."""
    if plot:
        parser.add_argument("--plot", metavar="OUT.png", type=_output_file, default=None, help=plot)
    parser.add_argument("--json", action="store_true", help=json)


def _traffic(args: argparse.Namespace) -> Any:
    """The case study, or the user's trace."""
    from . import simulate as sim_mod

    if args.trace is None:
        return sim_mod.case_study(
            sim_mod.CYCLE_S if args.duration is None else args.duration,
            1 if args.seed is None else args.seed,
        )
    if args.seed is not None:
        raise _UsageError("--seed applies to the generated case study, not to --trace")
    try:
        return sim_mod.load_trace(args.trace, args.duration)
    except OSError as exc:
        raise _UsageError(f"cannot read trace: {exc.strerror}: {args.trace!r}") from None


def _need_matplotlib(args: argparse.Namespace) -> None:
    if args.plot:
        from .plot import PlotUnavailable, require_matplotlib

        try:
            require_matplotlib()  # before the work, not after it
        except PlotUnavailable as exc:
            raise _UsageError(str(exc)) from None


def _build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and documentation)."""
    parser = _Parser(
        prog="nanobucket",
        description="Explain a token-bucket limit, simulate strategies on traffic, size a "
        "bucket from traffic, benchmark.",
    )
    parser.add_argument(
        "--version", action=_Version, nargs=0, help="show the version and implementation, and exit"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    ex = sub.add_parser(
        "explain",
        help="what a rate/capacity admits, in exact numbers",
        description="Explain a token bucket: sustained rate, largest burst, refill time, the "
        "most admitted in T seconds (and how to cap any second at the rate), how long a "
        "burst is absorbed, what N instances admit. "
        "Numbers are exact (fractions where needed).",
    )
    _options(
        ex,
        (
            "--rate",
            _rate_or_text,
            _REQUIRED,
            "tokens per second (100, 0.5, 1/3), or text (100/minute, '10 per second')",
        ),
        (
            "--capacity",
            _count(1),
            None,
            "bucket size in tokens (default with a rate as text: its count)",
        ),
        ("--cost", _count(1), 1, "tokens per request (default 1)"),
        ("--instances", _count(1), 1, "processes each holding such a bucket locally (default 1)"),
        (
            "--burst-rps",
            _rate,
            None,
            "a burst to judge, requests/s (default 1.8 x the sustained rate, "
            "the case study's 180 against 100)",
        ),
    )
    ex.add_argument(
        "--window",
        metavar="SECONDS",
        type=_window,
        action="append",
        default=[],
        help="also give the most admitted in any window of this many seconds (repeatable; "
        "1, 2, 5 and 60 are always given)",
    )
    _output_arguments(ex, json="print JSON (rationals as exact strings)")

    sim = sub.add_parser(
        "simulate",
        help="replay traffic through five limiting strategies, in simulated time",
        description="Replay traffic through a fixed 1-second window, an unbounded queue, a "
        "bounded queue, a token bucket and a per-key + global token bucket, and compare them. "
        "The default traffic is the case study (70-90 req/s, bursts to 180 req/s, one "
        "greedy client), random but repeatable (--seed); --trace replays your own.",
    )
    _options(
        sim,
        ("--rate", _rate, Fraction(100), "limit in tokens/s for every strategy (default 100)"),
        ("--capacity", _count(1), 200, "token bucket size (default 200)"),
        (
            "--queue-bound",
            _count(1),
            None,
            "most waiting requests in the bounded queue (default: capacity)",
        ),
        ("--key-rate", _rate, None, "per-key rate (default rate/4)"),
        ("--key-capacity", _count(1), None, "per-key capacity (default capacity/4)"),
    )
    _traffic_arguments(sim)
    _output_arguments(
        sim,
        json="print JSON with exact counts and ns",
        plot="draw load, admitted, rejected and queue per strategy (needs "
        "matplotlib: pip install 'nanobucket[plot]')",
    )

    sz = sub.add_parser(
        "size",
        help="the smallest bucket that meets a rejection target, from traffic",
        description="Replay traffic through the exact token bucket at the downstream's "
        "sustained rate and find the smallest capacity, within the most the downstream takes "
        "at once, whose rejections meet the target; print the curve of rejections against "
        "capacity, where they fall, and what N instances with local buckets admit. The "
        "default traffic is the case study; --trace replays your own.",
    )
    _options(
        sz,
        ("--max-rate", _rate, _REQUIRED, "requests/s the downstream sustains (the bucket's rate)"),
        (
            "--max-burst",
            _count(1),
            _REQUIRED,
            "requests the downstream takes at once (the largest capacity)",
        ),
        (
            "--max-reject",
            _share,
            Fraction(1, 1000),
            "the share that may be rejected: a percentage such as 0.1%% (the default) or "
            "10%%, or a fraction below 1 such as 0.001 (a bare 10 is refused as ambiguous)",
        ),
        (
            "--max-wait",
            _seconds,
            Fraction(0),
            "seconds a request may wait in a queue in front (default 0: no queue)",
        ),
        ("--instances", _count(1), 1, "processes that would each hold a local share (default 1)"),
    )
    _traffic_arguments(sz)
    _output_arguments(
        sz,
        json="print JSON with exact counts",
        plot="draw rejections against capacity (needs matplotlib)",
    )

    sub.add_parser(
        "bench",
        help="benchmarks (arguments are passed to nanobucket.bench)",
        add_help=False,
    )
    return parser


def _explain(args: argparse.Namespace, out: TextIO) -> int:
    from .explain import explain, render_text, to_json

    if args.capacity is None and not isinstance(args.rate, str):
        raise _UsageError(
            "the following arguments are required: --capacity (or give --rate as text, "
            "such as 100/minute, whose count is the capacity)"
        )
    e = explain(
        args.rate, args.capacity, args.cost, args.instances, args.burst_rps, tuple(args.window)
    )
    if args.json:
        out.write(json.dumps(to_json(e), indent=2) + "\n")
    else:  # the limiter's speed, not the figures (exact either way), depends on it
        out.write(f"{render_text(e)}\n{describe()}\n")
    return 0


def _simulate(args: argparse.Namespace, out: TextIO) -> int:
    from . import simulate as sim_mod

    _need_matplotlib(args)
    traffic = _traffic(args)
    config = sim_mod.Config(
        args.rate, args.capacity, args.queue_bound, args.key_rate, args.key_capacity
    )
    with _ProgressBar(5 * len(traffic), enabled=out.isatty() and sys.stderr.isatty()) as bar:
        result = sim_mod.simulate(traffic, config, bar.advance)
    out.write(
        json.dumps(sim_mod.to_json(result), indent=2) + "\n"
        if args.json
        else sim_mod.render_table(result)
    )
    if args.plot:
        from .plot import plot_simulation

        plot_simulation(result, args.plot)
        if not args.json:
            out.write(f"\nplot written to {args.plot}\n")
    return 0


def _size(args: argparse.Namespace, out: TextIO) -> int:
    from . import size as size_mod

    _need_matplotlib(args)
    wait_ns = args.max_wait * NS_PER_S
    if wait_ns.denominator != 1:
        raise _UsageError(f"--max-wait must be a whole number of ns, got {args.max_wait} s")
    sizing = size_mod.size(
        _traffic(args),
        args.max_rate,
        args.max_burst,
        args.max_reject,
        int(wait_ns),
        args.instances,
    )
    out.write(
        json.dumps(size_mod.to_json(sizing), indent=2) + "\n"
        if args.json
        else size_mod.render_text(sizing)
    )
    if args.plot:
        size_mod.plot_sizing(sizing, args.plot)
        if not args.json:
            out.write(f"\nplot written to {args.plot}\n")
    return 0


class _ProgressBar:
    """A one-line bar on stderr, drawn only for a terminal and for long runs."""

    MIN_WORK = 200_000  # below this the run is over before a bar is worth drawing

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = max(total, 1)
        self.enabled = enabled and total >= self.MIN_WORK
        self.done = 0
        self.shown = -1

    def advance(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        pct = min(100, 100 * self.done // self.total)
        if pct != self.shown:
            self.shown = pct
            filled = pct * 30 // 100
            sys.stderr.write(f"\rsimulating [{'#' * filled}{'.' * (30 - filled)}] {pct:3d}%")
            sys.stderr.flush()

    def __enter__(self) -> _ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled and self.shown >= 0:
            sys.stderr.write("\r" + " " * 50 + "\r")  # leave the terminal clean
            sys.stderr.flush()


def _bench(argv: list[str]) -> int:
    # Imported only when asked for: it needs the optional `bench` extra.
    try:
        bench = importlib.import_module("nanobucket.bench")
    except ModuleNotFoundError as exc:
        if exc.name == "nanobucket.bench":
            raise _UsageError("the bench command is not available in this version") from None
        raise _UsageError(
            f"bench needs {exc.name!r}, which is not installed: pip install 'nanobucket[bench]'"
        ) from None
    return int(bench.main(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``nanobucket`` command with *argv* (default ``sys.argv[1:]``); return the status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = args_list[0] if args_list else ""
    commands = ("explain", "simulate", "size", "bench")
    prog = f"nanobucket {command}" if command in commands else "nanobucket"
    try:
        if command == "bench":  # everything after it belongs to the bench command
            return _bench(args_list[1:])
        try:
            args = _build_parser().parse_args(args_list)
        except SystemExit as exc:  # --help, --version, or a usage error already printed
            return exc.code if isinstance(exc.code, int) else 2
        if args.command == "explain":
            return _explain(args, sys.stdout)
        if args.command == "size":
            return _size(args, sys.stdout)
        return _simulate(args, sys.stdout)
    except (_UsageError, ValueError) as exc:  # ValueError: a bad combination of arguments
        sys.stderr.write(f"{prog}: error: {exc}\n")
        return 2
    except BrokenPipeError:  # `nanobucket simulate | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        return 130
