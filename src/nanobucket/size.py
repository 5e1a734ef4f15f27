"""Choose a token bucket's size from traffic, within what the downstream can take.

The downstream (a database, an external API) sustains ``max_rate`` requests
per second and takes at most ``max_burst`` at once, so a bucket in front of
it has a rate of at most ``max_rate`` and a capacity of at most
``max_burst``. `size` replays the traffic through the exact bucket (the
same `TokenBucket` that `simulate` uses, on the trace's own times) and
finds the smallest capacity, at ``max_rate``, whose rejections stay within
the target; it also gives the curve of rejections against capacity and
what N instances with local buckets would admit.

Why ``max_rate``/``max_burst`` rejects the fewest: with requests of cost 1,
a token bucket admits every request that fits, as early as it can, so no
limiter whose admissions stay within ``max_burst + max_rate * T`` in every
window ``T`` admits more of the same traffic. What it still rejects is
traffic the downstream cannot take; a lower rate or a smaller bucket only
rejects more. With a queue in front (``max_wait_ns``) a request waits, up
to that long, for its token instead of being rejected.

>>> from nanobucket.simulate import Traffic
>>> t = Traffic([0, 0, 0, 10**9], ["a"] * 4, [1] * 4, 2 * 10**9, "four")
>>> s = size(t, max_rate=1, max_burst=3, target=Fraction(0))
>>> s.capacity, s.rejected(2), s.rejected(3)
(3, 1, 0)
"""

from __future__ import annotations

import bisect
import textwrap
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from ._core import _bucket
from ._core._params import NS_PER_S, bucket_params, int_at_least
from .simulate import Traffic

__all__ = ("Point", "Sizing", "dominant_key", "parse_share", "render_text", "size", "to_json")

CURVE_POINTS = 10  # capacities between 1 and max_burst in the curve


@dataclass(frozen=True)
class Point:
    """One replay: the requests a bucket of *capacity* rejects, and the longest wait.

    >>> from nanobucket.simulate import Traffic
    >>> t = Traffic([0, 0, 0, 10**9], ["a"] * 4, [1] * 4, 2 * 10**9, "four")
    >>> size(t, max_rate=1, max_burst=3).curve[0]
    Point(capacity=1, rejected=2, longest_wait_ns=0)
    """

    capacity: int
    rejected: int
    longest_wait_ns: int = 0


@dataclass(frozen=True)
class Sizing:
    """What `size` found (see the module docstring).

    >>> from nanobucket.simulate import Traffic
    >>> t = Traffic([0, 0, 0, 10**9], ["a"] * 4, [1] * 4, 2 * 10**9, "four")
    >>> s = size(t, max_rate=1, max_burst=3, target=Fraction(1, 4))
    >>> s.capacity, [p.rejected for p in s.curve]
    (2, [2, 1, 0])
    """

    traffic: Traffic
    max_rate: Fraction
    max_burst: int
    max_wait_ns: int
    target: Fraction  # the share of requests that may be rejected
    capacity: int | None  # the smallest meeting the target at max_rate; None: none does
    curve: tuple[Point, ...]  # ascending capacity, max_burst last
    lowest_rate: int | None  # the lowest whole rate meeting the target at max_burst
    by_phase: tuple[tuple[str, int], ...]  # rejections at the chosen capacity, per phase
    by_key: tuple[tuple[str, int, int], ...]  # (key, rejected, requests), most rejected first
    instances: int
    per_instance: Point  # N instances, each rate/N and capacity/N, round robin

    @property
    def allowed(self) -> int:
        """The most requests the target lets be rejected.

        >>> from nanobucket.simulate import Traffic
        >>> t = Traffic([0, 0, 0, 10**9], ["a"] * 4, [1] * 4, 2 * 10**9, "four")
        >>> size(t, max_rate=1, max_burst=3, target=Fraction(1, 4)).allowed
        1
        """
        return int(self.target * len(self.traffic))

    @property
    def chosen(self) -> int:
        """The capacity recommended: the smallest meeting the target, else max_burst.

        >>> from nanobucket.simulate import Traffic
        >>> t = Traffic([0, 0, 0, 0], ["a"] * 4, [1] * 4, 10**9, "four at once")
        >>> s = size(t, max_rate=1, max_burst=3, target=Fraction(0))
        >>> s.capacity, s.chosen
        (None, 3)
        """
        return self.max_burst if self.capacity is None else self.capacity

    def rejected(self, capacity: int) -> int:
        """Rejections of a bucket of *capacity* at max_rate (replayed if not in the curve).

        >>> from nanobucket.simulate import Traffic
        >>> t = Traffic([0, 0, 0, 10**9], ["a"] * 4, [1] * 4, 2 * 10**9, "four")
        >>> size(t, max_rate=1, max_burst=3).rejected(2)
        1
        """
        for p in self.curve:
            if p.capacity == capacity:
                return p.rejected
        return replay(self.traffic, self.max_rate, capacity, self.max_wait_ns).rejected


def parse_share(text: str) -> Fraction:
    """A share of requests, exactly: a percentage (``0.1%``, ``10%``) or a fraction below 1
    (``0.001``, ``1/1000``).

    A bare number of 1 or more is refused: ``10`` may mean 10% or ten times
    every request, and read as a fraction it is the latter (1000%).

    >>> parse_share("0.1%"), parse_share("1/1000"), parse_share("0"), parse_share("10%")
    (Fraction(1, 1000), Fraction(1, 1000), Fraction(0, 1), Fraction(1, 10))
    >>> parse_share("10")
    Traceback (most recent call last):
    ...
    ValueError: '10' is ambiguous: write 10% for a percentage, or a fraction below 1 such as 0.1
    """
    raw = text.strip()
    percent = raw.endswith("%")
    try:
        value = Fraction(raw[:-1].strip() if percent else raw)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"{text!r} is not a share such as 0.1% or 0.001") from None
    if percent:
        value /= 100
    elif 1 <= value <= 100:
        fraction = value / 100
        as_decimal = f"{float(fraction):g}" if Fraction(f"{float(fraction):g}") == fraction else ""
        raise ValueError(
            f"{raw!r} is ambiguous: write {raw}% for a percentage, or a fraction below 1"
            + (f" such as {as_decimal}" if as_decimal else "")
        )
    if not 0 <= value <= 1:
        raise ValueError(f"a share must be between 0 and 100%, got {text!r}")
    return value


def replay(
    traffic: Traffic, rate: Fraction, capacity: int, max_wait_ns: int = 0, instances: int = 1
) -> Point:
    """Decide every request of *traffic* with a bucket *rate*/*capacity* (each of
    *instances* taking every N-th request, round robin, with rate/N and capacity/N)."""
    rate_each, cap_each = rate / instances, capacity // instances
    if cap_each < 1:
        return Point(capacity, len(traffic))
    bucket_params(rate_each, cap_each)  # a clear error for a rate too small to represent
    buckets = [_bucket.TokenBucket(rate_each, cap_each, clock=_no_clock) for _ in range(instances)]
    reserve: list[Callable[..., int]] = [b.reserve for b in buckets]
    rejected = longest = 0
    for i, (t, cost) in enumerate(zip(traffic.times, traffic.costs)):
        if cost > cap_each:
            rejected += 1
            continue
        wait = reserve[i % instances](cost=cost, max_wait_ns=max_wait_ns, now=t)
        if wait < 0:
            rejected += 1
        elif wait > longest:
            longest = wait
    return Point(capacity, rejected, longest)


def _no_clock() -> int:  # pragma: no cover - every call gives its time
    raise AssertionError("size replays on the trace's own times")


def size(
    traffic: Traffic,
    max_rate: object,
    max_burst: object,
    target: Fraction = Fraction(1, 1000),
    max_wait_ns: int = 0,
    instances: int = 1,
) -> Sizing:
    """Size a bucket for *traffic* in front of a downstream of *max_rate*/*max_burst*.

    *target* is the share of requests that may be rejected; *max_wait_ns* a
    queue's longest wait (0: no queue); *instances* how many processes
    would each hold a local share of the limit.

    >>> from nanobucket.simulate import Traffic
    >>> t = Traffic([0, 0, 0, 10**9], ["a"] * 4, [1] * 4, 2 * 10**9, "four")
    >>> s = size(t, max_rate=1, max_burst=3, target=Fraction(1, 4), instances=2)
    >>> s.capacity, s.per_instance.rejected
    (2, 2)
    """
    rate, burst, _, _ = bucket_params(max_rate, max_burst)
    if not 0 <= target <= 1:
        raise ValueError(f"target must be a share in [0, 1], got {target}")
    if max_wait_ns.__class__ is not int or max_wait_ns < 0:
        raise ValueError(f"max_wait_ns must be an int >= 0, got {max_wait_ns!r}")
    int_at_least(instances, "instances", 1)
    allowed = int(target * len(traffic))
    points: dict[int, Point] = {}

    def at(capacity: int) -> Point:
        if capacity not in points:
            points[capacity] = replay(traffic, rate, capacity, max_wait_ns)
        return points[capacity]

    best = at(burst)
    capacity: int | None = None
    if best.rejected <= allowed:
        # Rejections fall as the capacity grows: the smallest meeting the target.
        lo, hi = 1, burst
        while lo < hi:
            mid = (lo + hi) // 2
            if at(mid).rejected <= allowed:
                hi = mid
            else:
                lo = mid + 1
        capacity = lo
    chosen = burst if capacity is None else capacity
    # The curve: evenly spaced capacities, and the choice with one token less.
    shown = {max(1, burst * i // CURVE_POINTS) for i in range(CURVE_POINTS + 1)}
    shown |= {chosen, max(1, chosen - 1)}
    lowest_rate = _lowest_rate(traffic, rate, burst, max_wait_ns, allowed)
    by_phase, by_key = _breakdown(traffic, rate, chosen, max_wait_ns)
    return Sizing(
        traffic,
        rate,
        burst,
        max_wait_ns,
        target,
        capacity,
        tuple(at(c) for c in sorted(shown)),
        lowest_rate,
        by_phase,
        by_key,
        instances,
        replay(traffic, rate, chosen, max_wait_ns, instances),
    )


def _lowest_rate(
    traffic: Traffic, rate: Fraction, burst: int, max_wait_ns: int, allowed: int
) -> int | None:
    """The lowest whole rate at most *rate* meeting the target with *burst*, or None."""
    top = int(rate)
    if top < 1 or replay(traffic, Fraction(top), burst, max_wait_ns).rejected > allowed:
        return None
    lo, hi = 1, top
    while lo < hi:
        mid = (lo + hi) // 2
        if replay(traffic, Fraction(mid), burst, max_wait_ns).rejected <= allowed:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _breakdown(
    traffic: Traffic, rate: Fraction, capacity: int, max_wait_ns: int
) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int, int], ...]]:
    """Rejections of the bucket per named phase of *traffic* (summed over its
    repeats), and per key (the three most rejected)."""
    bucket = _bucket.TokenBucket(rate, capacity, clock=_no_clock)
    starts = [p.start_ns for p in traffic.phases]
    phases: dict[str, int] = {p.name: 0 for p in traffic.phases}
    keys: Counter[str] = Counter()
    for t, key, cost in zip(traffic.times, traffic.keys, traffic.costs):
        if cost > capacity or bucket.reserve(cost=cost, max_wait_ns=max_wait_ns, now=t) < 0:
            keys[key] += 1
            if traffic.phases:
                phases[traffic.phases[max(0, bisect.bisect_right(starts, t) - 1)].name] += 1
    requests = Counter(traffic.keys)
    top = sorted(keys.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    return tuple(phases.items()), tuple((k, n, requests[k]) for k, n in top)


def dominant_key(s: Sizing) -> str | None:
    """The most rejected key, if it stands out from the rest; else None.

    It stands out when its requests are refused at least twice as often as
    everyone else's together, and it has at least a tenth of all the
    rejections: then a per-key limit in front would keep its excess to it.
    Keys refused about alike name no one (the load as a whole is too much).

    >>> from nanobucket.simulate import Traffic
    >>> times = [0] * 6 + [2 * 10**9, 4 * 10**9]   # "a": six at once; "b": one every 2 s
    >>> t = Traffic(times, ["a"] * 6 + ["b"] * 2, [1] * 8, 5 * 10**9, "")
    >>> dominant_key(size(t, max_rate=1, max_burst=2, target=Fraction(0)))
    'a'
    """
    if not s.by_key:
        return None
    key, refused, requests = s.by_key[0]
    total = s.rejected(s.chosen)
    rest, rest_requests = total - refused, len(s.traffic) - requests
    if rest_requests == 0 or 10 * refused < total:
        return None
    # refused/requests >= 2 * rest/rest_requests, in integers.
    return key if refused * rest_requests >= 2 * rest * requests else None


def _num(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.2f}%" if whole else "0%"


def _target(target: Fraction) -> str:
    return f"{float(target * 100):g}%"


def _para(text: str) -> list[str]:
    return textwrap.wrap(text, width=88)


def render_text(s: Sizing) -> str:
    """The report: the curve, the choice and why, the phases, the keys, the instances.

    >>> from nanobucket.simulate import Traffic
    >>> t = Traffic([0, 0, 0, 10**9], ["a"] * 4, [1] * 4, 2 * 10**9, "four")
    >>> print(render_text(size(t, max_rate=1, max_burst=3, target=Fraction(1, 4))))
    four: 4 requests over 2 s
    downstream: 1 req/s sustained, 3 at once; target: at most 25% rejected (1 request)
    <BLANKLINE>
    a bucket at 1/s, by capacity:
       capacity   rejected    share
              1          2   50.00%
              2          1   25.00%  <- chosen
              3          0    0.00%
    <BLANKLINE>
    Choose 1/s, capacity 2: the smallest bucket that meets the target (1 rejected, 25.00%).
    Capacity 1 would reject 2 (50.00%); a larger one only lets bigger bursts reach the
    downstream.
    <BLANKLINE>
    rejected by 1/2, the most rejected keys:
      a                        1 of 4 (25.00%)
    <BLANKLINE>
    """
    n = len(s.traffic)
    rate = _num(s.max_rate)
    queue = f", waiting up to {s.max_wait_ns / NS_PER_S:g} s" if s.max_wait_ns else ""
    lines = [
        f"{s.traffic.description}: {n:,} requests over {s.traffic.duration_ns / NS_PER_S:g} s",
        f"downstream: {rate} req/s sustained, {s.max_burst} at once; target: at most "
        f"{_target(s.target)} rejected ({s.allowed:,} "
        f"request{'' if s.allowed == 1 else 's'}){queue}",
        "",
        f"a bucket at {rate}/s, by capacity:",
        f"  {'capacity':>9}  {'rejected':>9}  {'share':>7}"
        + ("  longest wait" if s.max_wait_ns else ""),
    ]
    for p in s.curve:
        mark = "  <- chosen" if p.capacity == s.chosen else ""
        wait = f"  {p.longest_wait_ns / NS_PER_S:10.3f} s" if s.max_wait_ns else ""
        lines.append(
            f"  {p.capacity:>9,}  {p.rejected:>9,}  {_share(p.rejected, n):>7}{wait}{mark}"
        )
    lines.append("")
    chosen = s.rejected(s.chosen)
    if s.capacity is not None:
        why = (
            f"Choose {rate}/s, capacity {s.capacity}: the smallest bucket that meets the "
            f"target ({chosen:,} rejected, {_share(chosen, n)})."
        )
        if s.capacity > 1:
            less = s.rejected(s.capacity - 1)
            why += (
                f" Capacity {s.capacity - 1} would reject {less:,} ({_share(less, n)}); "
                f"a larger one only lets bigger bursts reach the downstream."
            )
    else:
        why = (
            f"No bucket the downstream can take meets the target: {rate}/{s.max_burst} "
            f"rejects the fewest ({chosen:,}, {_share(chosen, n)}), and every smaller "
            f"bucket rejects more (above)."
        )
        if not s.max_wait_ns and set(s.traffic.costs) <= {1}:
            why += (
                f" It admits every request that fits within {s.max_burst} + {rate} x T in "
                f"every window of T seconds, as early as it can, so no limiter within the "
                f"downstream's limits admits more: the rest is traffic the downstream "
                f"cannot take."
            )
    lines += _para(why)
    if s.lowest_rate is not None and s.lowest_rate < s.max_rate:
        lines += _para(
            f"With capacity {s.max_burst}, a rate of {s.lowest_rate}/s already meets the target."
        )
    if s.by_phase:
        lines += ["", f"rejected by {rate}/{s.chosen}, by phase of the traffic:"]
        lines += [f"  {name:<16} {count:>9,}" for name, count in s.by_phase]
    if s.by_key and chosen:
        lines += ["", f"rejected by {rate}/{s.chosen}, the most rejected keys:"]
        lines += [
            f"  {key:<16} {count:>9,} of {total:,} ({_share(count, total)})"
            for key, count, total in s.by_key
        ]
        if s.capacity is None and s.by_key[0][1] < chosen:
            lines += _para(_who(s, chosen))
    if s.instances > 1:
        k, p = s.instances, s.per_instance
        lines.append("")
        lines += _para(
            f"{k} instances each holding {rate}/{s.chosen} locally would let up to "
            f"{k * s.chosen:,} at once and {_num(k * s.max_rate)}/s reach the downstream. "
            f"Each holding its share ({_num(s.max_rate / k)}/{s.chosen // k}), with "
            f"requests spread round robin, they reject {p.rejected:,} ({_share(p.rejected, n)})"
            f" against {chosen:,} for one shared bucket."
        )
    return "\n".join(lines) + "\n"


def _who(s: Sizing, chosen: int) -> str:
    """Whether one key's excess is the trouble (`dominant_key`), in words."""
    key, refused, requests = s.by_key[0]
    rest = chosen - refused
    if dominant_key(s) == key:
        return (
            f"{key!r} stands out: {_share(refused, requests)} of its requests are rejected, "
            f"against {_share(rest, len(s.traffic) - requests)} of everyone else's. One "
            f"bucket for everyone refuses whoever comes when it is empty: {rest:,} of the "
            f"rejected requests are not from {key!r}. A per-key limit in front of it keeps "
            f"one client's excess to that client (`nanobucket simulate` compares the two)."
        )
    return (
        f"No key stands out: the most rejected, {key!r}, loses {_share(refused, requests)} "
        f"of its requests, against {_share(rest, len(s.traffic) - requests)} of everyone "
        f"else's. The traffic as a whole is more than the downstream takes; a per-key "
        f"limit would not spare the others."
    )


def to_json(s: Sizing) -> dict[str, object]:
    """The sizing as JSON-ready data (rationals as exact strings, times in int ns).

    >>> from nanobucket.simulate import Traffic
    >>> t = Traffic([0, 0, 0, 10**9], ["a"] * 4, [1] * 4, 2 * 10**9, "four")
    >>> data = to_json(size(t, max_rate=1, max_burst=3, target=Fraction(1, 4)))
    >>> data["target"], data["chosen_capacity"], data["curve"][1]
    ('1/4', 2, {'capacity': 2, 'rejected': 1, 'longest_wait_ns': 0})
    """
    return {
        "traffic": s.traffic.description,
        "requests": len(s.traffic),
        "max_rate": str(s.max_rate),
        "max_burst": s.max_burst,
        "max_wait_ns": s.max_wait_ns,
        "target": str(s.target),
        "allowed_rejections": s.allowed,
        "capacity": s.capacity,
        "chosen_capacity": s.chosen,
        "lowest_rate": s.lowest_rate,
        "curve": [
            {"capacity": p.capacity, "rejected": p.rejected, "longest_wait_ns": p.longest_wait_ns}
            for p in s.curve
        ],
        "rejected_by_phase": dict(s.by_phase),
        "most_rejected_keys": [
            {"key": k, "rejected": n, "requests": total} for k, n, total in s.by_key
        ],
        "dominant_key": dominant_key(s),
        "instances": s.instances,
        "rejected_per_instance_split": s.per_instance.rejected,
    }


def plot_sizing(s: Sizing, path: str | Path) -> None:
    """Draw the rejections against capacity (PNG; needs matplotlib)."""
    from .plot import require_matplotlib

    require_matplotlib()
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    caps = [p.capacity for p in s.curve]
    ax.plot(caps, [p.rejected for p in s.curve], marker="o")
    ax.axhline(s.allowed, linestyle="--", color="grey", label=f"target ({_target(s.target)})")
    ax.axvline(s.chosen, linestyle=":", color="green", label=f"chosen ({s.chosen})")
    ax.set_xlabel("capacity (tokens)")
    ax.set_ylabel("requests rejected")
    ax.set_title(f"rejected at {_num(s.max_rate)}/s by capacity: {s.traffic.description}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
