"""`nanobucket.simulate`: the seed's case study, with its conclusions in exact numbers."""

from __future__ import annotations

import bisect
import re
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from nanobucket.simulate import (
    Config,
    Simulation,
    Traffic,
    _percentile,
    case_study,
    load_trace,
    render_table,
    simulate,
    to_json,
)

S = 1_000_000_000


@pytest.fixture(scope="module")
def seed_run() -> Simulation:
    return simulate(case_study(120, seed=1))


def _admitted_between(sim: Simulation, name: str, a: int, b: int) -> int:
    times = sim[name].pass_times(sim.traffic)
    return bisect.bisect_left(times, b) - bisect.bisect_left(times, a)


def test_case_study_traffic_is_the_seeds_and_repeatable() -> None:
    tr = case_study(120, seed=1)
    assert len(tr) == 11884
    assert tr.times[:3] == [1_701_610, 13_208_723, 27_322_286]
    assert tr.times == sorted(tr.times) and set(tr.costs) == {1}
    keys = Counter(tr.keys)
    assert keys["greedy"] == 1800 and len(keys) == 9
    # 70-90 req/s normally; 180 req/s in the bursts.
    per_second = Counter(t // S for t in tr.times)
    assert min(per_second[s] for s in range(20)) >= 70
    assert max(per_second[s] for s in range(20)) <= 90
    assert [per_second[s] for s in (41, 42)] == [180, 180]
    assert case_study(120, seed=1).times == tr.times
    assert case_study(120, seed=2).times != tr.times
    # Longer runs repeat the 120 s cycle (with fresh random draws).
    assert [p.name for p in case_study(240).phases].count("burst 3 s") == 2


def test_seed_numbers(seed_run: Simulation) -> None:
    got = {
        s.name: (s.passed, s.p50_wait_ns, s.p99_wait_ns, s.peak_queue, s.max_in_1s, s.over_bound_ns)
        for s in seed_run.strategies
    }
    assert got == {
        "fixed window": (10312, 0, 0, 0, 161, 0),
        "unbounded queue": (11884, 2_237_709_918, 12_023_959_344, 1216, 100, 61_875_621_615),
        "bounded queue": (10814, 389_840_926, 1_999_460_756, 200, 100, 0),
        "token bucket": (10812, 0, 0, 0, 196, 0),
        "per-key + global": (10807, 0, 0, 0, 196, 0),
    }


def test_fixed_window_rejects_part_of_a_safe_short_burst(seed_run: Simulation) -> None:
    # The 2 s burst at 180 req/s (359 requests) is within capacity + rate*2 = 400:
    # the token bucket admits all of it, the fixed window turns 108 away.
    assert seed_run["token bucket"].by_phase["burst 2 s"] == (359, 359, 0)
    assert seed_run["fixed window"].by_phase["burst 2 s"] == (359, 251, 0)
    # It starts mid-window, so admissions straddle the boundary: 161 in one second.
    fw = seed_run["fixed window"]
    assert (fw.max_in_1s, fw.max_in_1s_at_ns) == (161, 40_472_184_709)


def test_fixed_window_admits_twice_the_limit_around_a_boundary() -> None:
    # Quiet, then 100 requests in the last 0.1 s of a window and 100 in the
    # first 0.1 s of the next: all 200 pass within 0.2 s.
    times = [900_000_000 + i * 1_000_000 for i in range(200)]
    tr = Traffic(times, ["k"] * 200, [1] * 200, 2 * S, "boundary")
    fw = simulate(tr)["fixed window"]
    assert (fw.passed, fw.max_in_1s) == (200, 200)
    # Another 100 in the rest of the second window are all rejected.
    times2 = times + [1_200_000_000 + i * 1_000_000 for i in range(100)]
    tr2 = Traffic(times2, ["k"] * 300, [1] * 300, 2 * S, "boundary")
    assert simulate(tr2)["fixed window"].passed == 200


def test_unbounded_queue_grows_under_sustained_overload(seed_run: Simulation) -> None:
    q = seed_run["unbounded queue"]
    tr = seed_run.traffic
    lengths = [q.queue_length_at(tr, t * S) for t in range(60, 95, 5)]
    assert lengths == [0, 178, 373, 590, 791, 1018, 1213]
    worst = [
        max(
            q.wait_ns[
                bisect.bisect_left(tr.times, a * S) : bisect.bisect_left(tr.times, (a + 5) * S)
            ]
        )
        for a in range(60, 90, 5)
    ]
    assert worst == sorted(worst) and len(set(worst)) == len(worst)  # strictly growing
    assert worst[-1] > 12 * S
    # Long after the overload, users still wait: 625 queued at the end.
    assert q.queue_length_at(tr, 120 * S) == 625
    assert q.passed == q.offered  # it never rejects: it only delays


def test_token_bucket_absorbs_a_short_burst_and_holds_long_overload(seed_run: Simulation) -> None:
    tb = seed_run["token bucket"]
    assert tb.by_phase["burst 2 s"] == (359, 359, 0)
    # A 3 s burst outlasts the 2.5 s a full bucket covers at 180 req/s.
    assert tb.by_phase["burst 3 s"] == (550, 496, 0)
    per_second = [
        _admitted_between(seed_run, "token bucket", k * S, (k + 1) * S) for k in range(60, 90)
    ]
    assert per_second[:6] == [143, 133, 134, 137, 131, 120]  # the bucket's 200 spent
    assert all(96 <= n <= 103 for n in per_second[6:])
    assert sum(per_second[6:]) == 2398  # 24 s at 100/s
    # Nothing ever exceeds capacity + rate*T.
    assert _admitted_between(seed_run, "token bucket", 60 * S, 90 * S) == 3196 <= 200 + 100 * 30


def test_bounded_queue_waits_at_most_bound_over_rate(seed_run: Simulation) -> None:
    bq = seed_run["bounded queue"]
    assert bq.peak_queue == 200
    assert max(bq.wait_ns) < 2 * S
    assert bq.over_bound_ns == 0


def test_per_key_limit_stops_one_greedy_client_starving_the_others(
    seed_run: Simulation,
) -> None:
    tb, pk = seed_run["token bucket"], seed_run["per-key + global"]
    assert tb.busiest_key == pk.busiest_key == "greedy"
    # A single bucket shares the limit by arrival: the greedy client takes its share.
    assert (tb.busiest, tb.others) == ((1357, 1800), (9455, 10084))
    # Per key 25/50: the greedy client gets at most 50 + 25*30 tokens, others nearly all.
    assert (pk.busiest, pk.others) == ((798, 1800), (10009, 10084))
    assert pk.busiest[0] <= 50 + 25 * 30  # its bucket plus 30 s of refill


def test_both_implementations_decide_the_same(impl: ModuleType, seed_run: Simulation) -> None:
    mine = simulate(seed_run.traffic, impl=impl)
    assert [s.admitted for s in mine.strategies] == [s.admitted for s in seed_run.strategies]


def check_seed_table(text: str) -> None:
    """The seed run's table (120 s, seed 1), as rendered and as the CLI prints it."""
    lines = text.splitlines()
    assert lines[0] == (
        "the case study, 120 s, random seed 1: 11884 requests from 9 client keys over 120 s"
    )
    assert lines[2].split() == [
        "strategy",
        "admitted",
        "rejected",
        "p50",
        "wait",
        "p99",
        "wait",
        "peak",
        "queue",
        "max",
        "in",
        "1",
        "s",
        "queue",
        ">",
        "200",
    ]
    assert lines[3].split() == [
        "fixed",
        "window",
        "100/1",
        "s",
        "86.8%",
        "13.2%",
        "0",
        "s",
        "0",
        "s",
        "-",
        "161",
        "-",
    ]
    assert lines[4].split()[3:] == [
        "100.0%",
        "0.0%",
        "2.238",
        "s",
        "12.024",
        "s",
        "1216",
        "100",
        "61.9",
        "s",
    ]
    assert lines[6].split() == [
        "token",
        "bucket",
        "100/200",
        "91.0%",
        "9.0%",
        "0",
        "s",
        "0",
        "s",
        "-",
        "196",
        "-",
    ]
    assert lines[7].split()[:5] == ["per", "key", "25/50", "+", "100/200"]
    assert "unbounded queue   100.0% [2.5 s]  100.0% [1.6 s]" in text
    assert "per-key + global   44.3%   99.3%" in text


def test_table_shows_the_numbers(seed_run: Simulation) -> None:
    check_seed_table(render_table(seed_run))


def test_json(seed_run: Simulation) -> None:
    doc = to_json(seed_run)
    tb = doc["strategies"][3]  # type: ignore[index]
    assert tb["name"] == "token bucket" and tb["admitted"] == 10812 and tb["rejected"] == 1072
    assert tb["phases"]["burst 2 s"] == {"offered": 359, "admitted": 359, "max_wait_ns": 0}
    assert doc["strategies"][0]["peak_queue"] is None  # type: ignore[index]


def test_costs_count_as_tokens() -> None:
    # Three requests of cost 60 at one instant: a 100/200 bucket takes 3, the
    # 100-token fixed window takes 1, max_in_1s counts tokens.
    tr = Traffic([0, 0, 0, 0], ["a", "a", "b", "b"], [60, 60, 60, 60], S, "costs")
    sim = simulate(tr)
    assert sim["token bucket"].passed == 3 and sim["token bucket"].max_in_1s == 180
    assert sim["fixed window"].passed == 1
    # Per key 25/50: a cost of 60 exceeds a key's whole bucket: never admitted.
    assert sim["per-key + global"].passed == 0
    q = sim["unbounded queue"]
    assert q.wait_ns == [0, 600_000_000, 1_200_000_000, 1_800_000_000]


def test_trace_file(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "timestamp,key,cost\n"
        "1714000001.5,bob,2\n"
        "1714000000.25,alice\n"
        "1714000000.000000001,alice,1\n"
        "\n"
        "1714000002,carol,\n"
    )
    tr = load_trace(path)
    assert tr.times == [1, 250_000_000, 1_500_000_000, 2 * S]
    assert tr.keys == ["alice", "alice", "bob", "carol"]
    assert tr.costs == [1, 1, 2, 1]
    assert tr.duration_ns == 3 * S
    cut = load_trace(path, duration_s=2)
    assert cut.times == [1, 250_000_000, 1_500_000_000] and cut.duration_ns == 2 * S


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("", "no requests"),
        ("1,a\nx,a\n", "t.csv:2: timestamp 'x' is not a number"),
        ("1,a,-1\n", "t.csv:1: cost '-1' is not a whole number"),
        ("1,a,1.5\n", "t.csv:1: cost '1.5'"),
        ("-1,a\n", "t.csv:1: timestamp '-1' is negative"),
        ("1,a,1,extra\n", "t.csv:1: expected timestamp,key"),
        # A row with no key was a request of key "" before.
        ("1,a\n2\n", "t.csv:2: no key: expected timestamp,key"),
        ("1, ,2\n", "t.csv:1: no key"),
        # A lone row that is no request was taken as a header ("no requests").
        ("1.5s,a\n", "t.csv:1: timestamp '1.5s' is not a number"),
        # Time beyond the clock's range was an internal "now must be in [0, 2**62) ns".
        (
            "0,a\n5000000000,b\n",
            re.escape(
                "t.csv:2: timestamp 5000000000 s is too far from the first request "
                "(line 1, 0 s): a trace spans at most 4,611,686,018 s"
            ),
        ),
    ],
)
def test_bad_trace(tmp_path: Path, body: str, match: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(body)
    with pytest.raises(ValueError, match=match):
        load_trace(path)


def test_plot_time_axis_fits_the_trace() -> None:
    # A 5 s trace had one tick (every 10 s) and the case study's label.
    from nanobucket.plot import time_axis

    assert time_axis(5, ()) == ([0, 1, 2, 3, 4, 5], "time (s)")
    assert time_axis(60, ())[0] == list(range(0, 61, 5))
    ticks, label = time_axis(120, case_study().phases)
    assert ticks == list(range(0, 121, 10))
    assert label == "time (s); shaded: burst 2 s, burst 3 s, greedy client"
    assert time_axis(3600, ()) == (None, "time (s)")


def test_bad_config() -> None:
    tr = Traffic([0], ["a"], [300], S, "x")
    with pytest.raises(ValueError, match="exceeds capacity 200"):
        simulate(tr)
    with pytest.raises(ValueError, match="rate must be >= 1"):
        simulate(Traffic([0], ["a"], [1], S, "x"), Config(rate=0.5))
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        simulate(Traffic([0], ["a"], [1], S, "x"), Config(key_capacity=0))
    with pytest.raises(ValueError, match="duration must be 1 to 86400 s"):
        case_study(0)
    with pytest.raises(TypeError, match="whole number of seconds"):
        case_study(1.5)  # type: ignore[arg-type]


def test_percentile_is_nearest_rank() -> None:
    data = list(range(1, 101))
    assert (_percentile(data, 50), _percentile(data, 99), _percentile(data, 100)) == (50, 99, 100)
    assert _percentile([7], 99) == 7 and _percentile([], 50) == 0
