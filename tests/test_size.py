"""`nanobucket size`: the smallest bucket meeting a rejection target, in exact numbers.

The figures are the case study's (120 s, seed 1, 11,884 requests) through
the same `TokenBucket` as `simulate`; the pure-Python run of the suite
checks the twin gives the same ones.
"""

from __future__ import annotations

import itertools
import json
import random
from fractions import Fraction
from pathlib import Path

import pytest

from nanobucket import size as sz
from nanobucket.cli import main
from nanobucket.simulate import Traffic, case_study

S = 1_000_000_000


@pytest.fixture(scope="module")
def case() -> Traffic:
    return case_study()


def _traffic(times_s: list[float], keys: list[str] | None = None) -> Traffic:
    times = [int(t * S) for t in times_s]
    return Traffic(times, keys or ["a"] * len(times), [1] * len(times), 10 * S, "hand")


def test_a_hand_made_trace_gives_the_counts_worked_out_by_hand() -> None:
    # Three at 0 and one at 1 s, rate 1/s: capacity 3 admits all, 2 rejects
    # the third at 0 (the token for 1 s has refilled by then), 1 rejects two.
    t = _traffic([0, 0, 0, 1])
    s = sz.size(t, max_rate=1, max_burst=3, target=Fraction(0))
    assert s.capacity == 3
    assert [(p.capacity, p.rejected) for p in s.curve] == [(1, 2), (2, 1), (3, 0)]
    # Allowed one rejection (a quarter of four): capacity 2 is the smallest.
    assert sz.size(t, 1, 3, Fraction(1, 4)).capacity == 2


def test_a_queue_in_front_rejects_only_what_would_wait_too_long() -> None:
    # Capacity 1, rate 1/s, up to 1 s in the queue: at 0 the first passes,
    # the second waits 1 s, the third would wait 2 s and is rejected.
    point = sz.replay(_traffic([0, 0, 0]), Fraction(1), 1, max_wait_ns=S)
    assert (point.rejected, point.longest_wait_ns) == (1, S)


def test_instances_split_the_limit_and_the_requests_round_robin() -> None:
    # Rate 2/s, capacity 2 over 2 instances: each is 1/s, 1 and gets two of
    # the four requests at 0, admitting one.
    assert sz.replay(_traffic([0, 0, 0, 0]), Fraction(2), 2, instances=2).rejected == 2
    # A share below one token rejects everything.
    assert sz.replay(_traffic([0, 0]), Fraction(2), 2, instances=3).rejected == 2


def test_the_case_study_at_100_200_meets_no_target_and_rejects_the_fewest(case: Traffic) -> None:
    s = sz.size(case, max_rate=100, max_burst=200, instances=4)
    assert (len(case), s.allowed, s.capacity, s.chosen) == (11_884, 11, None, 200)
    assert [(p.capacity, p.rejected) for p in s.curve] == [
        (1, 6084),
        (20, 1575),
        (40, 1515),
        (60, 1455),
        (80, 1395),
        (100, 1335),
        (120, 1275),
        (140, 1215),
        (160, 1155),
        (180, 1112),
        (199, 1074),
        (200, 1072),
    ]
    assert s.by_phase == (
        ("normal", 1),
        ("burst 2 s", 0),
        ("burst 3 s", 54),
        ("greedy client", 1017),
        ("after", 0),
    )
    assert s.by_key == (("greedy", 443, 1800), ("client-3", 87, 1291), ("client-5", 84, 1234))
    # 443 of 1,800 refused (24.6%) against 629 of the other 10,084 (6.2%): it stands out.
    assert sz.dominant_key(s) == "greedy"
    assert s.lowest_rate is None
    assert s.per_instance.rejected == 1077


def test_the_smallest_capacity_is_the_one_a_linear_scan_finds(case: Traffic) -> None:
    # The search assumes rejections never grow with the capacity: check it
    # on the case study, then that it stops where a scan does.
    rejected = [sz.replay(case, Fraction(100), c).rejected for c in range(1, 251)]
    assert all(a >= b for a, b in itertools.pairwise(rejected))
    s = sz.size(case, 100, 200, Fraction(12, 100))
    allowed = int(Fraction(12, 100) * len(case))
    first = next(c for c, r in enumerate(rejected, 1) if r <= allowed)
    assert (s.capacity, allowed, s.rejected(70), s.rejected(69)) == (first, 1426, 1425, 1428)
    assert first == 70


def test_a_downstream_with_room_gets_a_small_bucket_and_a_lower_rate(case: Traffic) -> None:
    s = sz.size(case, max_rate=200, max_burst=400)
    assert (s.capacity, s.rejected(9), s.rejected(8), s.lowest_rate) == (9, 8, 18, 128)


def test_bad_input_is_a_clear_error(case: Traffic) -> None:
    with pytest.raises(ValueError, match="target"):
        sz.size(case, 100, 200, Fraction(3, 2))
    with pytest.raises(ValueError, match="max_wait_ns"):
        sz.size(case, 100, 200, max_wait_ns=-1)
    with pytest.raises(ValueError, match="not a share"):
        sz.parse_share("lots")
    assert sz.parse_share("0.1%") == Fraction(1, 1000)
    assert sz.parse_share("10%") == sz.parse_share("0.1") == Fraction(1, 10)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("10", "'10' is ambiguous: write 10% for a percentage, or a fraction below 1 such as 0.1"),
        ("1", "'1' is ambiguous: write 1% for a percentage, or a fraction below 1 such as 0.01"),
        ("1/3", ""),
    ],
)
def test_a_bare_number_of_1_or_more_is_ambiguous(
    given: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["size", "--max-rate", "100", "--max-burst", "200", "--max-reject", given]
    if not message:  # a fraction below 1 is a share
        assert sz.parse_share(given) == Fraction(1, 3)
        return
    assert main(args) == 2
    assert capsys.readouterr().err == (
        f"nanobucket size: error: argument --max-reject: {message} (see --help)\n"
    )


def test_cli_explains_the_case_study(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["size", "--max-rate", "100", "--max-burst", "200"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1] == (
        "downstream: 100 req/s sustained, 200 at once; target: at most 0.1% rejected (11 requests)"
    )
    assert "        200      1,072    9.02%  <- chosen" in out.splitlines()
    assert "No bucket the downstream can take meets the target: 100/200 rejects the fewest" in out
    assert "\n".join(out.splitlines()[-4:]) == (
        "'greedy' stands out: 24.61% of its requests are rejected, against 6.24% of everyone\n"
        "else's. One bucket for everyone refuses whoever comes when it is empty: 629 of the\n"
        "rejected requests are not from 'greedy'. A per-key limit in front of it keeps one\n"
        "client's excess to that client (`nanobucket simulate` compares the two)."
    )


def test_no_key_is_named_when_none_stands_out() -> None:
    # Four clients alike, 10 req/s each for 10 s, into 20/s: every client
    # loses about half, and none is the greedy one.
    rng = random.Random(1)
    times = [i * S // 40 for i in range(400)]
    keys = [f"client-{k}" for _ in range(100) for k in rng.sample(range(4), 4)]
    t = Traffic(times, keys, [1] * len(times), 10 * S, "four alike")
    s = sz.size(t, max_rate=20, max_burst=10)
    assert sz.dominant_key(s) is None
    assert sz.to_json(s)["dominant_key"] is None
    text = sz.render_text(s)
    assert "greedy" not in text
    assert text.endswith(
        "No key stands out: the most rejected, 'client-0', loses 53.00% of its requests, "
        "against\n46.00% of everyone else's. The traffic as a whole is more than the downstream "
        "takes; a\nper-key limit would not spare the others.\n"
    )


def test_cli_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "size.png"
    args = ["size", "--max-rate", "100", "--max-burst", "200", "--max-reject", "12%"]
    assert main([*args, "--json", "--plot", str(png)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["capacity"], data["allowed_rejections"], data["target"]) == (70, 1426, "3/25")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-rate", "100"], "required: --max-burst"),
        (["--max-rate", "100", "--max-burst", "2", "--max-reject", "120%"], "between 0 and 100%"),
        (["--max-rate", "100", "--max-burst", "2", "--max-wait", "-1"], "must be >= 0 s"),
        (["--max-rate", "100", "--max-burst", "2", "--max-wait", "1e-10"], "whole number of ns"),
        (["--max-rate", "100", "--max-burst", "2", "--trace", "/nonexistent.csv"], "cannot read"),
    ],
)
def test_cli_bad_arguments_exit_2_with_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["size", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nanobucket size: error: ") and message in err
    assert err.count("\n") == 1
