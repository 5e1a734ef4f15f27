"""Replay traffic through rate-limiting strategies, in simulated time.

The case study: a public API gets 70-90 req/s, with bursts to 180 req/s
lasting a few seconds after an advertising campaign. It compares a fixed
one-second window of 100, an unbounded queue and a token bucket 100/200, and
settles on a token bucket per client key plus a global limit per instance.
`case_study` generates that traffic (seeded, repeatable); `load_trace` reads
a user's own; `simulate` runs every strategy over it and measures the result.

Time is int ns and never slept: the token-bucket strategies call the real
`TokenBucket` / `KeyedTokenBucket` with ``allow_at`` / ``peek_at``; the fixed
window and the queues are models (a queue is a single server taking
``cost * interval_ns`` per request, first come first served).

>>> result = simulate(case_study(duration_s=30, seed=1))
>>> [s.name for s in result.strategies][:2]
['fixed window', 'unbounded queue']
"""

from __future__ import annotations

import bisect
import csv
import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from ._core import _bucket
from ._core._params import (
    NOW_MAX,
    NS_PER_S,
    RateLike,
    bucket_params,
    validated_capacity,
    validated_cost,
)

__all__ = (
    "Config",
    "Phase",
    "Simulation",
    "StrategyResult",
    "Traffic",
    "case_study",
    "load_trace",
    "render_table",
    "simulate",
    "to_json",
)

NS = NS_PER_S
Progress = Callable[[int], None]  # called with the number of requests just decided
T = TypeVar("T")

# The case study, one 120-second cycle repeated for longer durations. Bursts
# start mid-second so fixed-window boundaries fall inside them.
CYCLE_S = 120
NORMAL_RPS = (70, 90)
BURST_RPS = 180
GREEDY_RPS = 60
CLIENTS = tuple(f"client-{i}" for i in range(1, 9))
GREEDY = "greedy"
# (name, start, end) in seconds within a cycle; "burst" phases run at BURST_RPS
# in total, "greedy" adds GREEDY_RPS from one client on top of normal traffic.
CASE_PHASES: tuple[tuple[str, Fraction, Fraction], ...] = (
    ("normal", Fraction(0), Fraction(41, 2)),
    ("burst 2 s", Fraction(41, 2), Fraction(45, 2)),
    ("normal", Fraction(45, 2), Fraction(81, 2)),
    ("burst 3 s", Fraction(81, 2), Fraction(87, 2)),
    ("normal", Fraction(87, 2), Fraction(60)),
    ("greedy client", Fraction(60), Fraction(90)),
    ("after", Fraction(90), Fraction(120)),
)


@dataclass(frozen=True)
class Phase:
    """A named stretch of traffic ``[start_ns, end_ns)``.

    >>> case_study(duration_s=60).phases[1]
    Phase(name='burst 2 s', start_ns=20500000000, end_ns=22500000000)
    """

    name: str
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class Traffic:
    """Requests sorted by time: parallel lists of ns, key and cost.

    >>> t = Traffic([0, 0, 0], ["a", "a", "b"], [1, 1, 1], 1_000_000_000, "three at once")
    >>> len(t), t
    (3, Traffic('three at once', 3 requests))
    """

    times: list[int]
    keys: list[str]
    costs: list[int]
    duration_ns: int
    description: str
    phases: tuple[Phase, ...] = ()

    def __len__(self) -> int:
        return len(self.times)

    def __repr__(self) -> str:
        return f"Traffic({self.description!r}, {len(self)} requests)"


def case_study(duration_s: int = CYCLE_S, seed: int = 1) -> Traffic:
    """The case study's traffic: 70-90 req/s, bursts to 180 req/s, one greedy client.

    Each second draws its normal rate uniformly from 70-90 and spreads that
    many requests uniformly over the second among eight clients; bursts top
    the total up to 180 req/s for 2 s and 3 s; from 60 s to 90 s one client
    (``greedy``) adds 60 req/s. The pattern repeats every 120 s. Only integer
    draws are used (``randrange``), so a seed gives the same trace everywhere.

    >>> t = case_study(duration_s=60, seed=1)
    >>> len(t), [p.name for p in t.phases]
    (5259, ['normal', 'burst 2 s', 'normal', 'burst 3 s', 'normal'])
    """
    if isinstance(duration_s, bool) or not isinstance(duration_s, int):
        raise TypeError(f"duration must be a whole number of seconds, not {duration_s!r}")
    if not 1 <= duration_s <= 86_400:
        raise ValueError(f"duration must be 1 to 86400 s, got {duration_s}")
    rng = random.Random(seed)
    reqs: list[tuple[int, str]] = []
    phases: list[Phase] = []
    for cycle in range(0, duration_s, CYCLE_S):
        for name, begin_s, end_s in CASE_PHASES:
            start = int((cycle + begin_s) * NS)
            end = min(int((cycle + end_s) * NS), duration_s * NS)
            if start < end:
                phases.append(Phase(name, start, end))
    for sec in range(duration_s):
        lo = sec * NS
        base = rng.randint(*NORMAL_RPS)
        reqs += [
            (lo + rng.randrange(NS), CLIENTS[rng.randrange(len(CLIENTS))]) for _ in range(base)
        ]
        for phase in phases:
            a, b = max(lo, phase.start_ns), min(lo + NS, phase.end_ns)
            if a >= b:
                continue
            if phase.name.startswith("burst"):
                extra = (BURST_RPS - base) * (b - a) // NS
                reqs += [
                    (a + rng.randrange(b - a), CLIENTS[rng.randrange(len(CLIENTS))])
                    for _ in range(extra)
                ]
            elif phase.name == "greedy client":
                extra = GREEDY_RPS * (b - a) // NS
                reqs += [(a + rng.randrange(b - a), GREEDY) for _ in range(extra)]
    reqs.sort()
    return Traffic(
        [t for t, _ in reqs],
        [k for _, k in reqs],
        [1] * len(reqs),
        duration_s * NS,
        f"the case study, {duration_s} s, random seed {seed}",
        tuple(phases),
    )


def load_trace(path: str | Path, duration_s: int | None = None) -> Traffic:
    """Read a CSV of ``timestamp,key,cost`` rows (cost optional, default 1).

    ``timestamp`` is in seconds, a decimal such as ``12.034`` or a Unix time
    such as ``1714000000.250``, read exactly and floored to whole ns. Time 0
    of the simulation is the whole second at or before the first request, so
    fixed windows fall on the trace's own whole seconds. A first row whose
    timestamp is not a number is taken as a header (unless it is the only row).
    Every row needs a key. Rows need not be sorted.
    With *duration_s*, requests from that many seconds on are dropped.

    >>> path = Path(tmp_dir, "trace.csv")   # tmp_dir: a scratch directory
    >>> n = path.write_text("timestamp,key,cost\\n1714000000.25,alice\\n1714000000.5,bob,3\\n")
    >>> t = load_trace(path)
    >>> t.times, t.keys, t.costs, t.duration_ns
    ([250000000, 500000000], ['alice', 'bob'], [1, 3], 1000000000)
    """
    rows: list[tuple[int, str, int, int]] = []  # (ns, key, cost, line)
    name = str(path)
    header: tuple[int, str] | None = None  # a first row that is not a number
    with open(path, newline="", encoding="utf-8") as f:
        for lineno, row in enumerate(csv.reader(f), 1):
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) > 3:
                raise ValueError(f"{name}:{lineno}: expected timestamp,key[,cost], got {row!r}")
            try:
                stamp = Fraction(row[0].strip())
            except (ValueError, ZeroDivisionError):
                if header is None and not rows:
                    header = (lineno, row[0])  # a header, if requests follow it
                    continue
                raise ValueError(f"{name}:{lineno}: timestamp {row[0]!r} is not a number") from None
            if stamp < 0:
                raise ValueError(f"{name}:{lineno}: timestamp {row[0]!r} is negative")
            key = row[1].strip() if len(row) > 1 else ""
            if not key:
                raise ValueError(f"{name}:{lineno}: no key: expected timestamp,key[,cost]")
            cost_text = row[2].strip() if len(row) > 2 and row[2].strip() else "1"
            if not cost_text.isdigit():
                raise ValueError(f"{name}:{lineno}: cost {cost_text!r} is not a whole number >= 0")
            rows.append((int(stamp * NS), key, int(cost_text), lineno))
    if not rows:
        if header is not None:  # a lone row is a request with a bad timestamp, not a header
            raise ValueError(f"{name}:{header[0]}: timestamp {header[1]!r} is not a number")
        raise ValueError(f"{name}: no requests in the trace")
    rows.sort(key=lambda r: r[0])
    origin = rows[0][0] // NS * NS
    last = rows[-1]
    if (last[0] - origin) // NS + 1 > NOW_MAX // NS:
        raise ValueError(
            f"{name}:{last[3]}: timestamp {Fraction(last[0], NS)} s is too far from the first "
            f"request (line {rows[0][3]}, {Fraction(rows[0][0], NS)} s): a trace spans at "
            f"most {NOW_MAX // NS:,} s"
        )
    times = [t - origin for t, _, _, _ in rows]
    keys = [k for _, k, _, _ in rows]
    costs = [c for _, _, c, _ in rows]
    if duration_s is not None:
        cut = bisect.bisect_left(times, duration_s * NS)
        if cut == 0:
            raise ValueError(f"{name}: no requests in the first {duration_s} s")
        times, keys, costs = times[:cut], keys[:cut], costs[:cut]
        end = duration_s * NS
    else:
        end = (times[-1] // NS + 1) * NS
    return Traffic(times, keys, costs, end, f"trace {name}")


@dataclass(frozen=True)
class Config:
    """The limits every strategy gets.

    ``rate``/``capacity`` is the token bucket and the global limit;
    the fixed window admits ``floor(rate)`` tokens per whole second; the
    queues serve ``rate`` tokens/s, the bounded one holding at most
    ``queue_bound`` waiting requests; each client key gets
    ``key_rate``/``key_capacity`` (default a quarter of the global limit).

    >>> sim = simulate(case_study(duration_s=10), Config(rate=100, capacity=200, queue_bound=50))
    >>> sim.bound, sim.key_rate, sim.key_capacity
    (50, Fraction(25, 1), 50)
    """

    rate: RateLike = 100
    capacity: int = 200
    queue_bound: int | None = None
    key_rate: RateLike | None = None
    key_capacity: int | None = None

    def resolved(self) -> tuple[Fraction, int, int, int, Fraction, int]:
        """Validate; return rate, capacity, interval_ns, bound, key rate, key capacity.

        >>> Config(rate=100, capacity=200).resolved()
        (Fraction(100, 1), 200, 10000000, 200, Fraction(25, 1), 50)
        """
        rate, cap, interval, _ = bucket_params(self.rate, self.capacity)
        if rate < 1:
            raise ValueError(f"rate must be >= 1 to simulate a 1-second window, got {self.rate}")
        bound = cap if self.queue_bound is None else validated_capacity(self.queue_bound)
        key_rate = rate / 4 if self.key_rate is None else self.key_rate
        key_cap = max(1, cap // 4) if self.key_capacity is None else self.key_capacity
        key_rate, key_cap, _, _ = bucket_params(key_rate, key_cap)
        return rate, cap, interval, bound, key_rate, key_cap


@dataclass(repr=False)
class StrategyResult:
    """What one strategy did with the traffic.

    ``admitted[i]`` is 1 if request i got through; ``wait_ns[i]`` how long it
    waited first (queues only; 0 otherwise). Counts are requests; the
    ``max_in_1s`` figure is in tokens (cost), comparable with the rate.

    >>> t = Traffic([0, 0, 0], ["a", "a", "b"], [1, 1, 1], 1_000_000_000, "three at once")
    >>> s = simulate(t, Config(rate=1, capacity=2))["token bucket"]
    >>> list(s.admitted), s.passed, s.offered
    ([1, 1, 0], 2, 3)
    """

    name: str
    label: str
    admitted: bytearray
    wait_ns: list[int]
    queued: bool
    bound: int | None = None
    offered: int = 0
    passed: int = 0
    p50_wait_ns: int = 0
    p99_wait_ns: int = 0
    peak_queue: int = 0
    max_in_1s: int = 0
    max_in_1s_at_ns: int = 0
    over_bound_ns: int = 0
    by_phase: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    busiest_key: str = ""
    busiest: tuple[int, int] = (0, 0)  # (admitted, offered) for the busiest key
    others: tuple[int, int] = (0, 0)  # the same for every other key

    def __repr__(self) -> str:
        return f"<StrategyResult {self.label}: {self.passed}/{self.offered} admitted>"

    @property
    def rejected(self) -> int:
        """Requests turned away.

        >>> t = Traffic([0, 0, 0], ["a", "a", "b"], [1, 1, 1], 1_000_000_000, "three at once")
        >>> simulate(t, Config(rate=1, capacity=2))["fixed window"].rejected   # 1 per second
        2
        """
        return self.offered - self.passed

    def pass_times(self, traffic: Traffic) -> list[int]:
        """When each admitted request reached the service (arrival + wait).

        >>> t = Traffic([0, 0, 0], ["a", "a", "b"], [1, 1, 1], 1_000_000_000, "three at once")
        >>> simulate(t, Config(rate=1, capacity=2))["unbounded queue"].pass_times(t)
        [0, 1000000000, 2000000000]
        """
        return [t + w for t, w, a in zip(traffic.times, self.wait_ns, self.admitted) if a]

    def queue_length_at(self, traffic: Traffic, when_ns: int) -> int:
        """Requests waiting in the queue at *when_ns* (0 for a non-queue).

        >>> t = Traffic([0, 0, 0], ["a", "a", "b"], [1, 1, 1], 1_000_000_000, "three at once")
        >>> q = simulate(t, Config(rate=1, capacity=2))["unbounded queue"]
        >>> q.queue_length_at(t, 0), q.queue_length_at(t, 1_500_000_000)
        (2, 1)
        """
        end = bisect.bisect_right(traffic.times, when_ns)
        return sum(
            1
            for t, w, a in zip(traffic.times[:end], self.wait_ns[:end], self.admitted[:end])
            if a and t + w > when_ns
        )


@dataclass(frozen=True)
class Simulation:
    """Every strategy's result over one traffic; ``sim[name]`` picks one.

    >>> t = Traffic([0, 0, 0], ["a", "a", "b"], [1, 1, 1], 1_000_000_000, "three at once")
    >>> sim = simulate(t, Config(rate=1, capacity=2))
    >>> sim["token bucket"].label, sim["token bucket"].passed, sim.capacity
    ('token bucket 1/2', 2, 2)
    """

    traffic: Traffic
    rate: Fraction
    capacity: int
    bound: int
    key_rate: Fraction
    key_capacity: int
    strategies: tuple[StrategyResult, ...]

    def __getitem__(self, name: str) -> StrategyResult:
        for s in self.strategies:
            if s.name == name:
                return s
        raise KeyError(name)


def _ticking(requests: Iterable[T], progress: Progress) -> Iterator[tuple[int, T]]:
    """``enumerate(requests)``, telling *progress* of every 4096 decided and of the rest."""
    i = -1
    for i, request in enumerate(requests):
        yield i, request
        if i & 4095 == 4095:
            progress(4096)
    progress((i + 1) & 4095)


def _fixed_window(tr: Traffic, limit: int, progress: Progress) -> tuple[bytearray, list[int]]:
    admitted = bytearray(len(tr))
    window, used = -1, 0
    for i, (t, c) in _ticking(zip(tr.times, tr.costs), progress):
        w = t // NS
        if w != window:
            window, used = w, 0
        if used + c <= limit:
            used += c
            admitted[i] = 1
    return admitted, [0] * len(tr)


def _queue(
    tr: Traffic, interval: int, bound: int | None, progress: Progress
) -> tuple[bytearray, list[int]]:
    admitted = bytearray(len(tr))
    waits = [0] * len(tr)
    waiting: deque[int] = deque()  # start times of queued requests, ascending (FIFO)
    free_at = 0  # when the server finishes its current backlog
    for i, (t, c) in _ticking(zip(tr.times, tr.costs), progress):
        while waiting and waiting[0] <= t:
            waiting.popleft()
        if bound is not None and len(waiting) >= bound:
            pass  # full: rejected, nothing changes
        else:
            start = free_at if free_at > t else t
            free_at = start + c * interval
            admitted[i] = 1
            if start > t:
                waits[i] = start - t
                waiting.append(start)
    return admitted, waits


def _token_bucket(
    impl: ModuleType, tr: Traffic, rate: Fraction, cap: int, progress: Progress
) -> tuple[bytearray, list[int]]:
    allow = impl.TokenBucket(rate, cap).allow_at
    admitted = bytearray(len(tr))
    for i, (t, c) in _ticking(zip(tr.times, tr.costs), progress):
        if c <= cap and allow(t, c):
            admitted[i] = 1
    return admitted, [0] * len(tr)


def _keyed_global(
    impl: ModuleType,
    tr: Traffic,
    rate: Fraction,
    cap: int,
    key_rate: Fraction,
    key_cap: int,
    progress: Progress,
) -> tuple[bytearray, list[int]]:
    glob = impl.TokenBucket(rate, cap)
    keyed = impl.KeyedTokenBucket(key_rate, key_cap)
    admitted = bytearray(len(tr))
    for i, (t, k, c) in _ticking(zip(tr.times, tr.keys, tr.costs), progress):
        # Both limits or neither: peek first, so a request the global limit
        # turns away does not also cost its client a token.
        if (
            c <= key_cap
            and c <= cap
            and keyed.peek_at(k, t, c).allowed
            and glob.peek_at(t, c).allowed
        ):
            keyed.allow_at(k, t, c)
            glob.allow_at(t, c)
            admitted[i] = 1
    return admitted, [0] * len(tr)


def _percentile(sorted_values: Sequence[int], p: int) -> int:
    """Nearest-rank percentile (an element of the data); 0 for no data."""
    if not sorted_values:
        return 0
    rank = -(-p * len(sorted_values) // 100)  # ceil(p/100 * n)
    return sorted_values[max(rank, 1) - 1]


def _measure(s: StrategyResult, tr: Traffic) -> None:
    s.offered = len(tr)
    s.passed = sum(s.admitted)
    waits = sorted(w for w, a in zip(s.wait_ns, s.admitted) if a)
    s.p50_wait_ns, s.p99_wait_ns = _percentile(waits, 50), _percentile(waits, 99)
    # The most tokens reaching the service in any window [x, x + 1 s).
    passing = sorted(
        (t + w, c) for t, w, c, a in zip(tr.times, s.wait_ns, tr.costs, s.admitted) if a
    )
    lo, total = 0, 0
    for t, c in passing:
        total += c
        while passing[lo][0] <= t - NS:
            total -= passing[lo][1]
            lo += 1
        if total > s.max_in_1s:
            s.max_in_1s, s.max_in_1s_at_ns = total, passing[lo][0]
    if s.queued:
        _measure_queue(s, tr)
    for phase in tr.phases:
        a, b = (
            bisect.bisect_left(tr.times, phase.start_ns),
            bisect.bisect_left(tr.times, phase.end_ns),
        )
        got = sum(s.admitted[a:b])
        worst = max((w for w, ok in zip(s.wait_ns[a:b], s.admitted[a:b]) if ok), default=0)
        off, ok, w = s.by_phase.get(phase.name, (0, 0, 0))
        s.by_phase[phase.name] = (off + b - a, ok + got, max(w, worst))
    counts: dict[str, list[int]] = {}
    for k, a in zip(tr.keys, s.admitted):
        tally = counts.setdefault(k, [0, 0])
        tally[0] += a
        tally[1] += 1
    s.busiest_key = min(counts, key=lambda k: (-counts[k][1], k))
    busy = counts[s.busiest_key]
    s.busiest = (busy[0], busy[1])
    s.others = (s.passed - busy[0], s.offered - busy[1])


def _measure_queue(s: StrategyResult, tr: Traffic) -> None:
    # The queue's length is a step function: +1 when a request that must wait
    # arrives, -1 when it starts. Departures sort before arrivals at one instant.
    events = []
    for t, w, a in zip(tr.times, s.wait_ns, s.admitted):
        if a and w:
            events.append((t, 1))
            events.append((t + w, -1))
    events.sort()
    length = peak = over = 0
    bound = s.bound if s.bound is not None else 0
    prev = 0
    for t, d in events:
        if length > bound:
            over += t - prev
        length += d
        prev = t
        peak = max(peak, length)
    s.peak_queue, s.over_bound_ns = peak, over


def simulate(
    traffic: Traffic,
    config: Config | None = None,
    progress: Progress | None = None,
    impl: ModuleType | None = None,
) -> Simulation:
    """Run every strategy over *traffic* and measure each (see `StrategyResult`).

    *progress* is called with counts of requests decided; *impl* is the
    module whose ``TokenBucket`` / ``KeyedTokenBucket`` to use (default: the
    package's own choice, Cython when built).

    >>> t = Traffic([0, 0, 0], ["a", "a", "b"], [1, 1, 1], 1_000_000_000, "three at once")
    >>> sim = simulate(t, Config(rate=1, capacity=2))
    >>> [(s.name, s.passed) for s in sim.strategies][:4]
    [('fixed window', 1), ('unbounded queue', 3), ('bounded queue', 3), ('token bucket', 2)]
    """
    config = config or Config()
    impl = impl or _bucket
    rate, cap, interval, bound, key_rate, key_cap = config.resolved()
    for c in set(traffic.costs):
        validated_cost(c, cap)
    tick: Progress = progress or (lambda n: None)
    limit = int(rate)  # whole tokens per 1-second window
    runs: list[tuple[str, str, bool, int | None, Callable[[], tuple[bytearray, list[int]]]]] = [
        (
            "fixed window",
            f"fixed window {limit}/1 s",
            False,
            None,
            lambda: _fixed_window(traffic, limit, tick),
        ),
        (
            "unbounded queue",
            f"unbounded queue {_num(rate)}/s",
            True,
            bound,
            lambda: _queue(traffic, interval, None, tick),
        ),
        (
            "bounded queue",
            f"bounded queue {_num(rate)}/s, {bound}",
            True,
            bound,
            lambda: _queue(traffic, interval, bound, tick),
        ),
        (
            "token bucket",
            f"token bucket {_num(rate)}/{cap}",
            False,
            None,
            lambda: _token_bucket(impl, traffic, rate, cap, tick),
        ),
        (
            "per-key + global",
            f"per key {_num(key_rate)}/{key_cap} + {_num(rate)}/{cap}",
            False,
            None,
            lambda: _keyed_global(impl, traffic, rate, cap, key_rate, key_cap, tick),
        ),
    ]
    results = []
    for name, label, queued, qbound, run in runs:
        admitted, waits = run()
        result = StrategyResult(name, label, admitted, waits, queued, qbound)
        _measure(result, traffic)
        results.append(result)
    return Simulation(traffic, rate, cap, bound, key_rate, key_cap, tuple(results))


def _num(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"


def _fmt_wait(ns: int) -> str:
    """A wait for the table: ``0 s`` or seconds to the millisecond.

    >>> _fmt_wait(0), _fmt_wait(1_250_000_000)
    ('0 s', '1.250 s')
    """
    return "0 s" if ns == 0 else f"{ns / NS:.3f} s"


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def render_table(sim: Simulation) -> str:
    """The report printed by ``nanobucket simulate``.

    >>> t = Traffic([0, 0, 0], ["a", "a", "b"], [1, 1, 1], 1_000_000_000, "three at once")
    >>> print(render_table(simulate(t, Config(rate=1, capacity=2))).splitlines()[0])
    three at once: 3 requests from 2 client keys over 1 s
    """
    tr = sim.traffic
    keys = len(set(tr.keys))
    out = [
        f"{tr.description}: {len(tr)} request{'' if len(tr) == 1 else 's'} from {keys} client key"
        f"{'' if keys == 1 else 's'} over {tr.duration_ns / NS:g} s",
        "",
    ]
    head = (
        "strategy",
        "admitted",
        "rejected",
        "p50 wait",
        "p99 wait",
        "peak queue",
        "max in 1 s",
        f"queue > {sim.bound}",
    )
    rows: list[tuple[str, ...]] = [head]
    for s in sim.strategies:
        rows.append(
            (
                s.label,
                _pct(s.passed, s.offered),
                _pct(s.rejected, s.offered),
                _fmt_wait(s.p50_wait_ns),
                _fmt_wait(s.p99_wait_ns),
                str(s.peak_queue) if s.queued else "-",
                str(s.max_in_1s),
                f"{s.over_bound_ns / NS:.1f} s" if s.queued else "-",
            )
        )
    out += _grid(rows)
    out += ["", "max in 1 s: the most tokens that reached the service in any 1-second span."]
    if tr.phases:
        names = list(dict.fromkeys(p.name for p in tr.phases))
        out += ["", "admitted by phase (longest wait in brackets for queues):"]
        rows = [("strategy", *names)]
        for s in sim.strategies:
            cells = []
            for n in names:
                off, ok, worst = s.by_phase[n]
                cells.append(_pct(ok, off) + (f" [{worst / NS:.1f} s]" if s.queued else ""))
            rows.append((s.name, *cells))
        out += _grid(rows)
    busiest = sim.strategies[0].busiest_key
    out += ["", f"busiest client key {busiest!r} vs all the others, admitted:"]
    rows = [("strategy", busiest, "others")]
    for s in sim.strategies:
        rows.append((s.name, _pct(*s.busiest), _pct(*s.others)))
    out += _grid(rows)
    return "\n".join(out) + "\n"


def _grid(rows: Iterable[Sequence[str]]) -> list[str]:
    rows = list(rows)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
        ).rstrip()
        for r in rows
    ]


def to_json(sim: Simulation) -> dict[str, object]:
    """The ``--json`` document: exact counts and ns for every strategy.

    >>> t = Traffic([0, 0, 0], ["a", "a", "b"], [1, 1, 1], 1_000_000_000, "three at once")
    >>> doc = to_json(simulate(t, Config(rate=1, capacity=2)))
    >>> doc["traffic"]["requests"], [s["admitted"] for s in doc["strategies"]]
    (3, [1, 3, 3, 2, 2])
    """
    return {
        "traffic": {
            "description": sim.traffic.description,
            "requests": len(sim.traffic),
            "duration_ns": sim.traffic.duration_ns,
        },
        "strategies": [
            {
                "name": s.name,
                "label": s.label,
                "offered": s.offered,
                "admitted": s.passed,
                "rejected": s.rejected,
                "p50_wait_ns": s.p50_wait_ns,
                "p99_wait_ns": s.p99_wait_ns,
                "peak_queue": s.peak_queue if s.queued else None,
                "max_in_1s": s.max_in_1s,
                "max_in_1s_from_ns": s.max_in_1s_at_ns,
                "over_bound_ns": s.over_bound_ns if s.queued else None,
                "phases": {
                    n: {"offered": o, "admitted": a, "max_wait_ns": w}
                    for n, (o, a, w) in s.by_phase.items()
                },
                "busiest_key": {
                    "key": s.busiest_key,
                    "admitted": s.busiest[0],
                    "offered": s.busiest[1],
                },
                "other_keys": {"admitted": s.others[0], "offered": s.others[1]},
            }
            for s in sim.strategies
        ],
    }
