"""What a token-bucket configuration admits, in exact numbers.

What does a limit of rate 100/s and capacity 200 let through, and for how
long does it absorb a burst? `explain` answers that for any numbers, in exact
rational arithmetic (`Fraction`), so 200 / 100 prints as ``2 s``, never
``1.9999 s``. The report prints each value with `fmt`: exactly when it is a
whole number or a short decimal (``2``, ``2.5``), else rounded to 4
significant digits (``~2.489``); a rate as given, ``10/3 (~3.333)``
(`given`). In JSON, rational values are exact strings that
``fractions.Fraction`` parses back; counts are ints.

>>> e = explain(100, 200)
>>> fmt(e.refill_s), e.largest_burst, fmt(e.burst.absorbed_s)
('2', 200, '2.5')
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from fractions import Fraction

from ._core._params import (
    NS_PER_S,
    RateArg,
    RateLike,
    bucket_params,
    int_at_least,
    rate_fraction,
    validated_cost,
)

__all__ = (
    "WINDOWS_S",
    "BurstAnswer",
    "Explanation",
    "explain",
    "fmt",
    "given",
    "render_text",
    "to_json",
)

WINDOWS_S = (1, 2, 5, 60)
# The case study's campaign bursts reach 180 req/s against a limit of 100: 1.8x.
DEFAULT_BURST_FACTOR = Fraction(9, 5)


def fmt(value: Fraction | int, approx: bool = True) -> str:
    """Render *value* for reading: ``2``, ``2.5``, or ``~3.333`` (4 significant digits).

    A whole number, or a decimal of at most 6 significant digits, is
    printed exactly; any other value rounded, marked ``~``. With
    ``approx=False`` the value is exact whatever it takes: a decimal when
    one ends, else ``p/q`` (the JSON's form, which ``Fraction`` reads back).

    >>> fmt(Fraction(5, 2)), fmt(Fraction(112, 45)), fmt(Fraction(333333334, 10**9))
    ('2.5', '~2.489', '~0.3333')
    >>> fmt(Fraction(10, 3), approx=False), fmt(Fraction(1, 8), approx=False)
    ('10/3', '0.125')
    """
    value = Fraction(value)
    exact = _exact(value)
    short = "/" not in exact and len(exact.lstrip("-0.").replace(".", "")) <= 6
    if not approx or value.denominator == 1 or short:
        return exact
    x = float(value)
    places = 3 - math.floor(math.log10(abs(x)))  # 4 significant digits
    text = f"{x:.{max(places, 0)}f}"
    return "~" + (text.rstrip("0").rstrip(".") if "." in text else text)


def _exact(value: Fraction) -> str:
    """*value* exactly: ``2``, ``2.5`` (a decimal that ends), else ``p/q``."""
    if value.denominator == 1:
        return str(value.numerator)
    den = value.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    if den != 1:
        return f"{value.numerator}/{value.denominator}"
    places = max(twos, fives)  # a terminating decimal: all of it, nothing rounded
    scaled = abs(value.numerator) * 10**places // value.denominator
    sign = "-" if value < 0 else ""
    whole, frac = divmod(scaled, 10**places)
    return f"{sign}{whole}.{frac:0{places}d}".rstrip("0")


def given(value: Fraction) -> str:
    """A value the user sets (a rate): exact, with a decimal beside a fraction.

    >>> given(Fraction(10, 3)), given(Fraction(5, 2))
    ('10/3 (~3.333)', '2.5')
    """
    exact = _exact(value)
    return exact if "/" not in exact else f"{exact} ({fmt(value)})"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@dataclass(frozen=True)
class BurstAnswer:
    """How a burst at ``rps`` requests/s, starting from a full bucket, is treated.

    ``absorbed_s`` is None when the burst is within the sustained rate (never
    rejected). Otherwise the bucket drains at ``drain_per_s`` tokens/s and is
    empty after ``absorbed_s``; from then on ``then_admitted_rps`` pass and
    ``then_rejected_rps`` are turned away. With requests evenly spaced at
    ``1/rps`` from t = 0, the first rejected one is number
    ``first_rejected`` (1-based), at ``first_rejected_s``.

    >>> b = explain(100, 200, burst_rps=180).burst
    >>> fmt(b.drain_per_s), fmt(b.absorbed_s), b.first_rejected, fmt(b.then_rejected_rps)
    ('80', '2.5', 449, '80')
    >>> explain(100, 200, burst_rps=90).burst.absorbed_s is None   # within the rate
    True
    """

    rps: Fraction
    drain_per_s: Fraction
    absorbed_s: Fraction | None
    absorbed_requests: Fraction | None
    first_rejected: int | None
    first_rejected_s: Fraction | None
    then_admitted_rps: Fraction
    then_rejected_rps: Fraction


@dataclass(frozen=True)
class Explanation:
    """Exact figures for one configuration (see `explain`).

    >>> e = explain(100, 200)
    >>> e.sustained_rps, e.largest_burst, e.refill_s, e.interval_ns
    (Fraction(100, 1), 200, Fraction(2, 1), 10000000)
    """

    rate: Fraction
    capacity: int
    cost: int
    instances: int
    interval_ns: int
    tau_ns: int
    sustained_rps: Fraction
    largest_burst: int
    refill_s: Fraction
    max_admitted: tuple[tuple[Fraction | int, int], ...]  # (T seconds, requests)
    burst: BurstAnswer
    summary: str
    #: The most requests a bucket of capacity ``cost`` (one request, no burst)
    #: at the same rate admits in any 1-second window [t, t + 1 s): the hard
    #: cap per second of the recipe `render_text` gives.
    hard_cap_per_s: int = 0

    @property
    def interval_exact(self) -> bool:
        """True if one token is a whole number of ns (no rounding at all).

        >>> explain(100, 200).interval_exact, explain(3, 2).interval_exact   # 1/3 s is not
        (True, False)
        """
        return Fraction(NS_PER_S) / self.rate == self.interval_ns


def _burst(rate: Fraction, capacity: int, cost: int, rps: Fraction) -> BurstAnswer:
    drain = rps * cost - rate
    if drain <= 0 or cost == 0:
        return BurstAnswer(rps, max(drain, Fraction(0)), None, None, None, None, rps, Fraction(0))
    absorbed = capacity / drain
    # Request k (0-based) arrives at k/rps and finds capacity - k*cost +
    # k*rate/rps tokens; it is admitted iff that is >= cost.
    k = math.floor((capacity - cost) * rps / drain) + 1
    admitted_rps = rate / cost
    return BurstAnswer(
        rps, drain, absorbed, absorbed * rps, k + 1, k / rps, admitted_rps, rps - admitted_rps
    )


def explain(
    rate: RateArg,
    capacity: int | None = None,
    cost: int = 1,
    instances: int = 1,
    burst_rps: RateLike | None = None,
    windows: tuple[Fraction | int, ...] = (),
) -> Explanation:
    """Explain a bucket of *rate* tokens/s and *capacity* tokens, exactly.

    *rate* may be text (``"100/minute"``), whose count is the capacity
    unless one is given.

    *cost* is tokens per request, *instances* the number of processes each
    holding such a bucket locally, *burst_rps* the burst to judge (default
    1.8 x the sustained request rate, the case study's 180 against 100),
    *windows* more window lengths in seconds for `max_admitted` (beside 1,
    2, 5 and 60).

    >>> e = explain(100, 200, burst_rps=180)
    >>> e.max_admitted
    ((1, 300), (2, 400), (5, 700), (60, 6200))
    >>> e.burst.first_rejected, fmt(e.burst.first_rejected_s, approx=False)
    (449, '112/45')
    >>> explain("100/minute").max_admitted[-1]   # (T, most in any T s, both ends counted)
    (60, 200)
    """
    exact, cap, interval, tau = bucket_params(rate, capacity)
    cost = validated_cost(cost, cap)
    if cost == 0:
        raise ValueError("cost must be >= 1 to explain a limit (cost 0 is a free probe)")
    instances = int_at_least(instances, "instances", 1)
    sustained = exact / cost
    bps = sustained * DEFAULT_BURST_FACTOR if burst_rps is None else _positive(burst_rps)
    largest = cap // cost
    lengths = sorted({*WINDOWS_S, *(_window(t) for t in windows)})
    # Admissions a_1..a_m in a window need m * cost * interval <= a_m - a_1 + tau
    # (GCRA), and a full bucket then a greedy client reaches it: exact, and
    # capacity + rate * T when one token is a whole number of ns.
    most = tuple((t, math.floor((tau + t * NS_PER_S) / (cost * interval))) for t in lengths)
    burst = _burst(exact, cap, cost, bps)
    partial = Explanation(
        exact,
        cap,
        cost,
        instances,
        interval,
        tau,
        sustained,
        largest,
        Fraction(cap) / exact,
        most,
        burst,
        "",
        # Capacity `cost`: one request at t, then one each cost*interval;
        # those in [t, t + 1 s) are ceil(1 s / (cost * interval)).
        -(-NS_PER_S // (cost * interval)),
    )
    return Explanation(**{**partial.__dict__, "summary": _summary(partial)})


def _window(value: object) -> Fraction | int:
    """A window length in seconds: a number > 0, as an int when whole."""
    if isinstance(value, bool) or not isinstance(value, (int, Fraction)):
        raise TypeError(
            f"a window must be an int or Fraction of seconds, not {type(value).__name__}"
        )
    if value <= 0:
        raise ValueError(f"a window must be > 0 s, got {value}")
    t = Fraction(value)
    return t.numerator if t.denominator == 1 else t


def _positive(value: RateLike) -> Fraction:
    try:  # the same checks as a rate: a finite number > 0
        return rate_fraction(value)
    except ValueError as exc:
        raise ValueError(str(exc).replace("rate", "burst rate", 1)) from None


def _summary(e: Explanation) -> str:
    tokens = f"{given(e.rate)} {'token' if e.rate == 1 else 'tokens'} per second"
    text = (
        f"The bucket starts full with {_plural(e.capacity, 'token')} and refills {tokens}, "
        f"never past {e.capacity}; each request spends {_plural(e.cost, 'token')} or is "
        f"rejected. So up to {_plural(e.largest_burst, 'request')} "
        f"{'passes' if e.largest_burst == 1 else 'pass'} at once, but over time no more than "
        f"{fmt(e.sustained_rps)} per second: an empty bucket takes {fmt(e.refill_s)} s to "
        f"refill, and any 1 s admits at most {_per_second(e)} (capacity plus one second "
        f"of refill). "
    )
    if e.capacity > e.cost:
        text += (
            f"For a hard cap of {e.hard_cap_per_s} per second instead, give it capacity "
            f"{e.cost}: one request every {fmt(_spacing(e))} s, no burst. "
        )
    b = e.burst
    if b.absorbed_s is None:
        text += f"A burst of {fmt(b.rps)} req/s is within the sustained rate and is never rejected."
    else:
        text += (
            f"A burst of {fmt(b.rps)} req/s drains it by {fmt(b.drain_per_s)} tokens/s: "
            f"with evenly spaced arrivals every request passes until request "
            f"#{b.first_rejected} at {fmt(b.first_rejected_s or 0)} s, the first rejected "
            f"(the bucket runs dry at {fmt(b.absorbed_s)} s, but a request needs a whole "
            f"token); after that "
            f"{fmt(b.then_admitted_rps)} req/s pass and {fmt(b.then_rejected_rps)} req/s are "
            "rejected until the burst ends."
        )
    if e.instances > 1:
        n = e.instances
        text += (
            f" With {n} instances each holding its own bucket, together they admit up to "
            f"{fmt(e.sustained_rps * n)} req/s and {e.largest_burst * n} at once: for one shared "
            f"limit use a shared store (Redis) or give each instance rate {given(e.rate / n)} "
            f"and capacity {e.capacity // n}."
        )
    return text


def _per_second(e: Explanation) -> int:
    """The most admitted in any 1 s (`max_admitted`'s row for T = 1)."""
    return dict(e.max_admitted)[1]


def _spacing(e: Explanation) -> Fraction:
    """Seconds between requests at the sustained rate: cost * interval."""
    return Fraction(e.cost * e.interval_ns, NS_PER_S)


def _code(rate: Fraction) -> str:
    """*rate* as Python source: ``100``, ``2.5``, or ``Fraction(10, 3)``."""
    text = fmt(rate, approx=False)
    return text if "/" not in text else f"Fraction({rate.numerator}, {rate.denominator})"


def _hard_cap(e: Explanation) -> list[str]:
    """The lines on a hard per-second cap: the recipe when the bucket has a burst."""
    pace = (
        f"one request every {fmt(_spacing(e))} s, at most {e.hard_cap_per_s} in any "
        "window [t, t + 1 s)"
    )
    if e.capacity == e.cost:
        return [f"  no burst above the rate: {pace}"]
    wider = "" if e.cost == 1 else f", capacity={e.cost}"
    bucket = f"nb.TokenBucket(rate={_code(e.rate)}, capacity={e.cost})"
    shaper = f"nb.LeakyBucket(rate={_code(e.rate)}{wider}) to wait"
    code = [f"    {bucket}, or {shaper}"]
    if len(code[0]) > 78:  # a Fraction rate: one per line
        code = [f"    {bucket}, or", f"    {shaper}"]
    return [
        f"  a hard cap of {e.hard_cap_per_s} per second instead, with no burst:",
        f"    capacity {e.cost}: {pace}",
        *code,
    ]


def render_text(e: Explanation) -> str:
    """The human-readable report printed by ``nanobucket explain``.

    >>> print(render_text(explain(100, 200)).splitlines()[0])
    token bucket: rate 100 tokens/s, capacity 200 tokens
    """
    b = e.burst
    unit = "" if e.cost == 1 else f" (cost {e.cost} tokens each)"
    # The trap of "N per second": with a burst, any second admits far more than N.
    second = (
        [
            f"  most in any 1 s          {_per_second(e)} requests, not "
            f"{e.hard_cap_per_s}: a full bucket, then 1 s of refill"
        ]
        if e.capacity > e.cost
        else []
    )
    lines = [
        f"token bucket: rate {given(e.rate)} tokens/s, "
        f"capacity {_plural(e.capacity, 'token')}{unit}",
        "",
        f"  sustained rate           {fmt(e.sustained_rps)} req/s",
        *second,
        f"  largest burst            {_plural(e.largest_burst, 'request')} at once",
        f"  refill from empty        {fmt(e.refill_s)} s",
        f"  one token every          {e.interval_ns:,} ns "
        f"({fmt(Fraction(e.interval_ns, NS_PER_S))} s)"
        + (
            ""
            if e.interval_exact
            else f" (1/{fmt(e.rate, approx=False)} s rounded up: never faster than asked)"
        ),
        "",
        "  most admitted in any window of T seconds, both ends counted (capacity + rate * T):"
        if e.interval_exact
        else "  most admitted in any window of T seconds, both ends counted:",
    ]
    for t, n in e.max_admitted:
        lines.append(f"    T = {fmt(t):>2} s   {_plural(n, 'request')}")
    lines += ["", *_hard_cap(e), ""]
    if b.absorbed_s is None:
        lines.append(f"  burst of {fmt(b.rps)} req/s  never rejected (within the sustained rate)")
    else:
        lines += [
            f"  burst of {fmt(b.rps)} req/s  drains {fmt(b.drain_per_s)} tokens/s"
            " from a full bucket",
            f"    bucket empty after     {fmt(b.absorbed_s)} s ({fmt(b.absorbed_requests or 0)}"
            " requests' worth)",
            f"    first rejection        request #{b.first_rejected} at "
            f"{fmt(b.first_rejected_s or 0)} s (evenly spaced arrivals)",
            f"    then                   {fmt(b.then_admitted_rps)} req/s admitted, "
            f"{fmt(b.then_rejected_rps)} req/s rejected",
        ]
    if e.instances > 1:
        n = e.instances
        lines += [
            "",
            f"  {n} instances, each with its own local bucket, together admit:",
            f"    sustained              {fmt(e.sustained_rps * n)} req/s",
            f"    at once                {e.largest_burst * n} requests",
        ]
        lines += [
            f"    in T = {fmt(t):>2} s            {m * n} requests" for t, m in e.max_admitted
        ]
        lines.append(
            f"    for one shared limit   rate {given(e.rate / n)}, capacity {e.capacity // n}"
            " per instance, or a shared store"
        )
    lines += ["", *_wrap(e.summary, 78)]
    return "\n".join(lines) + "\n"


def _seconds(t: Fraction | int) -> int | str:
    """A window length in JSON: an int, or an exact string (``"1/2"``) for a fraction."""
    return t if isinstance(t, int) else fmt(t, approx=False)


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width)


def to_json(e: Explanation) -> dict[str, object]:
    """The ``--json`` document: rationals as exact strings, counts as ints.

    >>> doc = to_json(explain(3, 2))
    >>> doc["refill_s"], doc["largest_burst"], Fraction(doc["refill_s"])
    ('2/3', 2, Fraction(2, 3))
    """
    b = e.burst

    def q(value: Fraction | None) -> str | None:
        return None if value is None else fmt(value, approx=False)

    n = e.instances
    return {
        "rate": q(e.rate),
        "capacity": e.capacity,
        "cost": e.cost,
        "instances": n,
        "interval_ns": e.interval_ns,
        "tau_ns": e.tau_ns,
        "interval_exact": e.interval_exact,
        "sustained_rps": q(e.sustained_rps),
        "largest_burst": e.largest_burst,
        "refill_s": q(e.refill_s),
        "max_admitted": [{"seconds": _seconds(t), "requests": m} for t, m in e.max_admitted],
        "hard_cap": {
            "capacity": e.cost,
            "rate": q(e.rate),
            "most_in_any_second": e.hard_cap_per_s,
        },
        "burst": {
            "rps": q(b.rps),
            "drain_per_s": q(b.drain_per_s),
            "absorbed_s": q(b.absorbed_s),
            "absorbed_requests": q(b.absorbed_requests),
            "first_rejected": b.first_rejected,
            "first_rejected_s": q(b.first_rejected_s),
            "then_admitted_rps": q(b.then_admitted_rps),
            "then_rejected_rps": q(b.then_rejected_rps),
        },
        "all_instances": {
            "sustained_rps": q(e.sustained_rps * n),
            "largest_burst": e.largest_burst * n,
            "max_admitted": [
                {"seconds": _seconds(t), "requests": m * n} for t, m in e.max_admitted
            ],
            "shared_limit_per_instance": {"rate": q(e.rate / n), "capacity": e.capacity // n},
        },
        "summary": e.summary,
    }
