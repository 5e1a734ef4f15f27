"""`nanobucket.explain`: the seed's configuration explained in exact numbers."""

from __future__ import annotations

from fractions import Fraction
from types import ModuleType

import pytest

from nanobucket.explain import explain, fmt, given, render_text, to_json
from nanobucket.reference import ExactBucket

SEED_TEXT = """\
token bucket: rate 100 tokens/s, capacity 200 tokens

  sustained rate           100 req/s
  most in any 1 s          300 requests, not 100: a full bucket, then 1 s of refill
  largest burst            200 requests at once
  refill from empty        2 s
  one token every          10,000,000 ns (0.01 s)

  most admitted in any window of T seconds, both ends counted (capacity + rate * T):
    T =  1 s   300 requests
    T =  2 s   400 requests
    T =  5 s   700 requests
    T = 60 s   6200 requests

  a hard cap of 100 per second instead, with no burst:
    capacity 1: one request every 0.01 s, at most 100 in any window [t, t + 1 s)
    nb.TokenBucket(rate=100, capacity=1), or nb.LeakyBucket(rate=100) to wait

  burst of 180 req/s  drains 80 tokens/s from a full bucket
    bucket empty after     2.5 s (450 requests' worth)
    first rejection        request #449 at ~2.489 s (evenly spaced arrivals)
    then                   100 req/s admitted, 80 req/s rejected
"""


def test_seed_configuration_text() -> None:
    text = render_text(explain(100, 200))
    assert text.startswith(SEED_TEXT)
    summary = " ".join(text[len(SEED_TEXT) :].split())
    assert summary.startswith("The bucket starts full with 200 tokens and refills 100 tokens")
    assert "an empty bucket takes 2 s to refill" in summary
    # The first refusal is before the fluid 2.5 s: the summary says so.
    assert (
        "with evenly spaced arrivals every request passes until request #449 at ~2.489 s, "
        "the first rejected (the bucket runs dry at 2.5 s, but a request "
        "needs a whole token)"
    ) in summary
    assert "instances" not in summary
    assert (
        "For a hard cap of 100 per second instead, give it capacity 1: one request every "
        "0.01 s, no burst."
    ) in summary


def test_one_token_is_singular() -> None:
    text = render_text(explain(1, 1, burst_rps=7))
    lines = text.splitlines()
    assert lines[0] == "token bucket: rate 1 tokens/s, capacity 1 token"
    assert "  largest burst            1 request at once" in lines
    assert "  one token every          1,000,000,000 ns (1 s)" in lines
    summary = " ".join(text.split("\n\n")[-1].split())
    assert summary.startswith(
        "The bucket starts full with 1 token and refills 1 token per second, never past 1; "
        "each request spends 1 token or is rejected. So up to 1 request passes at once,"
    )
    assert "requests" not in text.split("\n\n")[-1].split("A burst")[0]


def test_seed_configuration_json() -> None:
    doc = to_json(explain(100, 200, burst_rps=180))
    assert doc["refill_s"] == "2"
    assert doc["sustained_rps"] == "100"
    assert doc["largest_burst"] == 200
    assert (doc["interval_ns"], doc["tau_ns"], doc["interval_exact"]) == (10**7, 2 * 10**9, True)
    assert doc["max_admitted"] == [
        {"seconds": 1, "requests": 300},
        {"seconds": 2, "requests": 400},
        {"seconds": 5, "requests": 700},
        {"seconds": 60, "requests": 6200},
    ]
    assert doc["burst"] == {
        "rps": "180",
        "drain_per_s": "80",
        "absorbed_s": "2.5",
        "absorbed_requests": "450",
        "first_rejected": 449,
        "first_rejected_s": "112/45",
        "then_admitted_rps": "100",
        "then_rejected_rps": "80",
    }
    # Every rational is a string Fraction reads back exactly.
    burst = doc["burst"]
    assert isinstance(burst, dict)
    assert Fraction(burst["first_rejected_s"]) == Fraction(448, 180)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Fraction(2), "2"),
        (Fraction(5, 2), "2.5"),
        (Fraction(1, 8), "0.125"),
        (Fraction(-3, 40), "-0.075"),
        (Fraction(10, 3), "~3.333"),
        (Fraction(200, 100), "2"),
        (Fraction(112, 45), "~2.489"),
        (Fraction(1, 180), "~0.005556"),
        (Fraction(333_333_334, 10**9), "~0.3333"),  # 9 significant digits: rounded
        (Fraction(123_456, 1000), "123.456"),  # 6: exact
        (Fraction(10**9 + 1, 3), "~333333334"),  # past 4 digits: the nearest whole
        (Fraction(12_345_678), "12345678"),  # whole: exact
    ],
)
def test_fmt_is_exact_where_short_and_rounded_where_not(value: Fraction, text: str) -> None:
    # A decimal with sensible digits: exact when it is whole or short, else
    # rounded to 4 significant digits and marked; the exact form stays in JSON.
    assert fmt(value) == text
    assert Fraction(fmt(value, approx=False)) == value


def test_a_rate_is_printed_as_given() -> None:
    assert given(Fraction(10, 3)) == "10/3 (~3.333)"
    lines = render_text(explain(Fraction(10, 3), 7)).splitlines()
    assert lines[0] == "token bucket: rate 10/3 (~3.333) tokens/s, capacity 7 tokens"
    assert "  sustained rate           ~3.333 req/s" in lines
    assert (
        "    nb.TokenBucket(rate=Fraction(10, 3), capacity=1), or nb.LeakyBucket(rate=Fraction(10, "
        "3)) to wait"
    ) not in lines
    assert lines[lines.index("  a hard cap of 4 per second instead, with no burst:") + 2 :][:2] == [
        "    nb.TokenBucket(rate=Fraction(10, 3), capacity=1), or",
        "    nb.LeakyBucket(rate=Fraction(10, 3)) to wait",
    ]


def test_first_rejection_matches_the_exact_model_and_both_implementations(
    impl: ModuleType,
) -> None:
    # A burst of 200 req/s (one request every 5 ms) from a full 100/200 bucket.
    e = explain(100, 200, burst_rps=200)
    assert e.burst.absorbed_s == 2 and e.burst.first_rejected == 400
    assert e.burst.first_rejected_s == Fraction(399, 200)
    exact = ExactBucket(100, 200)
    real = impl.TokenBucket(rate=100, capacity=200)
    first_exact = next(k for k in range(10_000) if not exact.allow_at(k * 5_000_000))
    first_real = next(k for k in range(10_000) if not real.allow_at(k * 5_000_000))
    assert first_exact + 1 == first_real + 1 == e.burst.first_rejected


def test_max_admitted_is_reached_by_the_exact_model() -> None:
    # Full at 0, then greedy: exactly capacity + rate*T pass in [0, T].
    b = ExactBucket(100, 200)
    admitted = sum(b.allow_at(t) for t in range(0, 10**9 + 1, 1_000_000) for _ in range(3))
    assert admitted == explain(100, 200).max_admitted[0][1] == 300


def test_cost_instances_and_inexact_interval() -> None:
    e = explain(3, 7, cost=2, instances=4, burst_rps=5)
    assert (e.sustained_rps, e.largest_burst, e.refill_s) == (Fraction(3, 2), 3, Fraction(7, 3))
    # Exact: capacity + rate * T less what the interval's rounding up costs
    # (one token every 333,333,334 ns: the 15th arrives after 5 s).
    assert e.max_admitted == ((1, 4), (2, 6), (5, 10), (60, 93))
    assert (e.interval_ns, e.interval_exact) == (333_333_334, False)
    assert e.burst.drain_per_s == 7 and e.burst.absorbed_s == 1 and e.burst.first_rejected == 5
    text = render_text(e)
    assert "  refill from empty        ~2.333 s\n" in text
    assert "  one token every          333,333,334 ns (~0.3333 s) (1/3 s rounded up" in text
    assert "1/3 s rounded up: never faster than asked" in text
    assert "    sustained              6 req/s\n" in text
    assert "    in T = 60 s            372 requests\n" in text
    assert "    for one shared limit   rate 0.75, capacity 1 per instance" in text
    doc = to_json(e)
    assert doc["all_instances"] == {
        "sustained_rps": "6",
        "largest_burst": 12,
        "max_admitted": [{"seconds": t, "requests": n * 4} for t, n in e.max_admitted],
        "shared_limit_per_instance": {"rate": "0.75", "capacity": 1},
    }


def test_burst_within_the_sustained_rate_is_never_rejected() -> None:
    e = explain(100, 200, burst_rps=90)
    assert e.burst.absorbed_s is None and e.burst.first_rejected is None
    assert e.burst.then_rejected_rps == 0
    assert "burst of 90 req/s  never rejected" in render_text(e)
    assert to_json(e)["burst"]["absorbed_s"] is None  # type: ignore[index]


def test_default_burst_is_the_seeds_ratio() -> None:
    assert explain(1000, 50).burst.rps == 1800
    assert explain(Fraction(1, 2), 1).burst.rps == Fraction(9, 10)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"rate": 0, "capacity": 200}, ValueError, "rate must be > 0"),
        ({"rate": float("nan"), "capacity": 200}, ValueError, "finite"),
        ({"rate": 100, "capacity": 0}, ValueError, "capacity must be >= 1"),
        ({"rate": 100, "capacity": 2.5}, TypeError, "capacity must be an int"),
        ({"rate": 100, "capacity": 200, "cost": 201}, ValueError, "exceeds capacity"),
        ({"rate": 100, "capacity": 200, "cost": 0}, ValueError, "cost must be >= 1"),
        ({"rate": 100, "capacity": 200, "instances": 0}, ValueError, "instances must be >= 1"),
        ({"rate": 100, "capacity": 200, "instances": True}, TypeError, "instances must be an int"),
        ({"rate": 100, "capacity": 200, "burst_rps": -1}, ValueError, "burst rate must be > 0"),
        ({"rate": 100, "capacity": 200, "windows": (0,)}, ValueError, "window must be > 0"),
        ({"rate": 100, "capacity": 200, "windows": (0.5,)}, TypeError, "window must be an int"),
    ],
)
def test_bad_input(kwargs: dict[str, object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        explain(**kwargs)  # type: ignore[arg-type]


def _most_in_a_window(times: list[int], window_ns: int, closed: bool) -> int:
    """The most of *times* (sorted) in any window of *window_ns*: [t, t + w] or [t, t + w)."""
    most, j = 0, 0
    for i, t in enumerate(times):
        while j < len(times) and (
            times[j] <= t + window_ns if closed else times[j] < t + window_ns
        ):
            j += 1
        most = max(most, j - i)
    return most


@pytest.mark.parametrize(("rate", "capacity"), [(20, 20), (100, 200), (3, 7), (Fraction(10, 3), 4)])
def test_the_one_second_figures_are_what_a_greedy_client_gets(
    impl: ModuleType, rate: Fraction | int, capacity: int
) -> None:
    # A client asking every millisecond for 10 s: the bucket admits the most
    # explain says in a 1 s window counting both ends, and the recipe (capacity
    # 1, the same rate) the hard cap in every window [t, t + 1 s).
    e = explain(rate, capacity)
    grid = range(0, 10 * 10**9, 10**6)
    bursty, capped = impl.TokenBucket(rate, capacity), impl.TokenBucket(rate, 1)
    bursty_times = [t for t in grid if bursty.allow_at(t)]
    capped_times = [t for t in grid if capped.allow_at(t)]
    assert _most_in_a_window(bursty_times, 10**9, closed=True) == dict(e.max_admitted)[1]
    assert _most_in_a_window(capped_times, 10**9, closed=False) == e.hard_cap_per_s


def test_the_worker_pool_trap() -> None:
    # "20 per second" with capacity 20: any second starts up to 40 jobs.
    e = explain(20, 20, windows=(Fraction(1, 2), 10))
    assert (dict(e.max_admitted)[1], e.hard_cap_per_s) == (40, 20)
    assert e.max_admitted == (
        (Fraction(1, 2), 30),
        (1, 40),
        (2, 60),
        (5, 120),
        (10, 220),
        (60, 1220),
    )
    text = render_text(e)
    assert (
        "  most in any 1 s          40 requests, not 20: a full bucket, then 1 s of refill\n"
        in text
    )
    assert "    T = 0.5 s   30 requests\n    T =  1 s   40 requests\n" in text
    assert (
        "  a hard cap of 20 per second instead, with no burst:\n"
        "    capacity 1: one request every 0.05 s, at most 20 in any window [t, t + 1 s)\n"
        "    nb.TokenBucket(rate=20, capacity=1), or nb.LeakyBucket(rate=20) to wait\n"
    ) in text
    doc = to_json(e)
    assert doc["hard_cap"] == {"capacity": 1, "rate": "20", "most_in_any_second": 20}
    assert doc["max_admitted"][0] == {"seconds": "0.5", "requests": 30}  # type: ignore[index]
    # A bucket with no burst says so instead of giving the recipe.
    lines = render_text(explain(20, 1)).splitlines()
    assert (
        "  no burst above the rate: one request every 0.05 s, at most 20 in any window [t, t + 1 s)"
    ) in lines
    assert not any(line.startswith("  most in any 1 s") for line in lines)
