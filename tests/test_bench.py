"""Smoke test of ``python -m nanobucket.bench``: structure and arithmetic, never timings."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from nanobucket import bench
from nanobucket.bench import cases

GROUP_IDS = [
    "allow_allowing",
    "allow_rejecting",
    "check",
    "keyed_small",
    "keyed_large",
    "first_touch",
    "eviction",
    "allow_many_str",
    "allow_many_u64",
    "keyed_shuffled",
    "aimed",
]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, str]:
    """One real ``--quick --json`` run in a child process: (report, stdout, stderr)."""
    path = tmp_path_factory.mktemp("bench") / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "nanobucket.bench", "--quick", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(path.read_text()), proc.stdout, proc.stderr


def test_report_header(quick_run: tuple[dict[str, Any], str, str]) -> None:
    report, _, _ = quick_run
    assert report["schema"] == 1
    assert report["quick"] is True
    assert report["cpus"] == os.cpu_count()
    assert set(report["peers"]) == set(cases.PEERS)
    assert [g["id"] for g in report["groups"]] == GROUP_IDS


def test_every_case_is_measured_or_skipped_with_a_reason(
    quick_run: tuple[dict[str, Any], str, str],
) -> None:
    report, _, _ = quick_run
    for built, group in zip(cases.groups(cases.QUICK), report["groups"]):
        names = [r["name"] for r in group["results"]] + [s["name"] for s in group["skipped"]]
        assert sorted(names) == sorted(c.name for c in built.cases), group["id"]
        assert len(set(names)) == len(names)  # unique within the group
        assert all(s["reason"] for s in group["skipped"])
        measured = {r["name"] for r in group["results"]}
        assert group["floor"] in measured
        if cases.FLOOR_IS_CYTHON or os.environ.get("CI"):
            assert report["floor"] == "cython"
        # the implementations themselves never skip (buffer cases may, with a reason)
        assert {r["role"] for r in group["results"]} >= {"floor", "ours", "twin"}
        for name, version in report["peers"].items():
            in_group = name in measured or name in {s["name"] for s in group["skipped"]}
            if version is not None and in_group:
                assert name in measured, (group["id"], name)


def test_figures_are_consistent(quick_run: tuple[dict[str, Any], str, str]) -> None:
    report, _, _ = quick_run
    for group in report["groups"]:
        by_name = {r["name"]: r for r in group["results"]}
        for r in group["results"]:
            ns = r["ns"]
            assert 0 < ns["min"] <= ns["p25"] <= ns["median"] <= ns["p75"] <= ns["max"]
            assert r["rounds"] >= (
                1 if r["capped"] else min(bench.QUICK_BUDGET.lo, bench.QUICK_BUDGET.lo_slow)
            )
            assert r["calls_per_round"] > 0
            assert r["capped"] in (True, False)
            # a ratio to every other contender of the group, and it is ns / ns
            assert set(r["ratios"]) == set(by_name) - {r["name"]}
            for other, ratio in r["ratios"].items():
                expected = ns["median"] / by_name[other]["ns"]["median"]
                assert math.isclose(ratio, expected, rel_tol=1e-12), (group["id"], other)
        # every contender of a group runs the same number of calls per round
        assert len({r["calls_per_round"] for r in group["results"]}) == 1


def test_memory_per_key(quick_run: tuple[dict[str, Any], str, str]) -> None:
    report, _, _ = quick_run
    mem = report["memory"]
    assert mem["keys"] == cases.QUICK.memory_keys
    assert set(mem["bytes_per_key"]) | {s["name"] for s in mem["skipped"]} == {
        "nanobucket-c",
        "nanobucket-py",
        "dict",
    }
    assert "nanobucket-py" in mem["bytes_per_key"]
    assert all(b > 0 for b in mem["bytes_per_key"].values())


def test_goals_agree_with_the_figures(quick_run: tuple[dict[str, Any], str, str]) -> None:
    report, _, _ = quick_run
    goals = report["goals"]
    assert len(goals) == 14
    groups = {
        g["id"]: {r["name"]: r["ns"]["median"] for r in g["results"]} for g in report["groups"]
    }
    by_text = {g["goal"]: g for g in goals}
    first_touch = next(g for g in goals if g["goal"].startswith("first touch"))
    assert first_touch["value"] == groups["first_touch"]["nanobucket-c"]
    # The clock-inclusive goals: the floor plus one clock read, measured in this run.
    single = groups["allow_allowing"]
    clocked = by_text["single allow(): x (floor + one clock read) <= 1.2"]
    assert clocked["value"] == single["nanobucket-c"] / single["floor+clock"]
    clock_ns = max(single["floor+clock"] - single["floor"], 0.0)
    keyed = groups["keyed_small"]
    assert by_text["keyed allow(key), small table: x (dict.get + one clock read) <= 1.3"][
        "value"
    ] == keyed["nanobucket-c"] / (keyed["dict.get"] + clock_ns)
    shuffled = groups["keyed_shuffled"]
    assert by_text[
        "keyed allow(key), 1M keys in random order: x (dict.get + one clock read) <= 1.3"
    ]["value"] == shuffled["nanobucket-c"] / (shuffled["dict.get"] + clock_ns)
    aimed = groups["aimed"]
    assert by_text["hash flooding: aimed keys x random keys, worst kind <= 2.0"]["value"] == max(
        aimed[name] / aimed[name[: -len("aimed")] + "random"]
        for name in aimed
        if name.endswith(": aimed")
    )
    plain = by_text["single allow(): x floor <= 1.2"]
    assert ("note" in plain) is (single["floor+clock"] / single["floor"] > 1.2)
    plain = by_text["keyed allow(key), small table: x dict.get <= 1.3"]
    assert ("note" in plain) is ((keyed["dict.get"] + clock_ns) / keyed["dict.get"] > 1.3)
    for goal in goals:
        if goal["value"] is None:
            assert goal["met"] is None
        elif goal["op"] == "<=":
            assert goal["met"] is (goal["value"] <= goal["limit"])
        else:
            assert goal["met"] is (goal["value"] >= goal["limit"])


def test_table_and_plain_progress(quick_run: tuple[dict[str, Any], str, str]) -> None:
    report, out, err = quick_run
    # The default output is the users' (see test_the_users_summary_exactly).
    assert out == bench.format_summary(report) + "\n"
    for group in report["groups"]:
        assert (group["title"] in out) is (group["id"] != "aimed")
        assert group["title"] in bench.format_table(report)
    assert "memory per tracked key, 50,000 keys" in out
    assert "resident bytes per key at 50,000 str keys" in bench.format_table(report)
    total = (
        sum(len(g["results"]) + len(g["skipped"]) for g in report["groups"])
        + len(report["memory"]["bytes_per_key"])
        + len(report["memory"]["skipped"])
    )
    lines = err.splitlines()
    # not a terminal: one plain line per step, no carriage returns
    assert lines[0].startswith(f"[1/{total}] allow_allowing: floor: ")
    assert lines[-1].startswith(f"[{total}/{total}] memory: ")
    assert "\r" not in err


def test_progress_bar_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    p = bench.Progress(4, stream)
    p.start("a")
    p.finish("a", "1 ns")
    p.start("b")
    p.close()
    assert stream.getvalue() == (
        "\r\033[K[" + "." * 30 + "] 0/4 a\r\033[K[" + "#" * 7 + "." * 23 + "] 1/4 b\r\033[K"
    )


def test_summarize_uses_quartiles() -> None:
    assert bench.summarize([5.0, 1.0, 3.0, 2.0, 4.0]) == {
        "median": 3.0,
        "p25": 2.0,
        "p75": 4.0,
        "min": 1.0,
        "max": 5.0,
    }
    assert bench.summarize([7.0]) == {"median": 7.0, "p25": 7.0, "p75": 7.0, "min": 7.0, "max": 7.0}


def test_list_groups(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--list"]) == 0
    assert capsys.readouterr().out.split() == [*GROUP_IDS, "memory"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--group", "nope"], "unknown group 'nope'"),
        (["--json", "/nonexistent-dir/x.json"], "cannot write /nonexistent-dir/x.json"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_bad_input_is_one_line_and_status_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("nanobucket bench: error: ") and message in err


def test_one_group_without_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "one.json"
    assert bench.main(["--quick", "--no-memory", "--group", "check", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert [g["id"] for g in report["groups"]] == ["check"]
    assert report["memory"] is None
    names = [r["name"] for r in report["groups"][0]["results"]]
    assert names[:5] == ["floor", "floor+clock", "nanobucket-c", "nanobucket-py", "naive"]
    assert "single check() -> Decision, admitted" in capsys.readouterr().out


def test_dev_prints_the_developers_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--quick", "--no-memory", "--group", "check", "--dev"]) == 0
    out = capsys.readouterr().out
    assert "  contender                              ns   spread  x floor      x c rounds" in out
    assert "speed goals of the Cython build" in out


def _result(name: str, role: str, ns: float) -> dict[str, Any]:
    return {"name": name, "role": role, "ns": {"median": ns, "p25": ns, "p75": ns}, "rounds": 9}


def test_the_users_summary_exactly() -> None:
    report: dict[str, Any] = {
        "nanobucket": "0.1.0",
        "implementation": "cython",
        "python": "3.11.7",
        "machine": "Linux x86_64",
        "cpus": 2,
        "quick": False,
        "elapsed_s": 61.04,
        "groups": [
            {
                "id": "keyed_small",
                "title": "keyed allow(key), 100,000 str keys round-robin",
                "unit": "call",
                "floor": "floor",
                "results": [
                    _result("floor", "floor", 18.0),
                    _result("nanobucket-c", "ours", 50.0),
                    _result("nanobucket-py", "twin", 650.0),
                    _result("dict.get", "baseline", 30.0),
                    _result("naive", "naive", 352.0),
                    _result("token-bucket", "peer", 51.0),
                ],
                "skipped": [{"name": "limits-fixed", "reason": "not installed"}],
            },
            {
                "id": "aimed",
                "title": "hash flooding",
                "unit": "call",
                "floor": "floor",
                "results": [_result("int: aimed", "ours", 80.0)],
                "skipped": [],
            },
        ],
        "memory": {
            "keys": 1_000_000,
            "bytes_per_key": {"nanobucket-c": 40.4, "dict": 79.0},
            "skipped": [],
        },
        "goals": [],
    }
    assert bench.format_summary(report) == (
        "nanobucket 0.1.0 (compiled), Python 3.11.7, Linux x86_64, 2 CPUs\n"
        "Each row: the time one call takes (the median of several rounds on one core), the\n"
        "calls per second that makes, and how it compares with the first nanobucket row.\n"
        "\n"
        "keyed allow(key), 100,000 str keys round-robin\n"
        "                                            time/call        calls/s"
        "  vs nanobucket (compiled)\n"
        "  nanobucket (compiled)                       50.0 ns     20,000,000\n"
        "  nanobucket (pure Python)                   650.0 ns      1,540,000  13.0x slower\n"
        "  dict.get alone (no limiter)                 30.0 ns     33,300,000  1.7x faster\n"
        "  naive token bucket (Python)                352.0 ns      2,840,000  7.0x slower\n"
        "  token-bucket                                51.0 ns     19,600,000  about the same\n"
        "\n"
        "memory per tracked key, 1,000,000 keys\n"
        "  nanobucket (compiled)                          40 bytes\n"
        "  a dict of the keys alone                       79 bytes\n"
        "\n"
        "not measured, not installed: limits-fixed\n"
        "\n"
        "--dev: the developers' table (no-op floor, spread, rounds, hash flooding, speed "
        "goals). 61.0 s"
    )


def test_memory_kinds() -> None:
    peers = {"token-bucket": "0.4.0", "throttled-py": None}
    assert bench.memory_kinds(peers, every=False) == ["nanobucket-c", "nanobucket-py", "dict"]
    assert bench.memory_kinds(peers, every=True) == [
        "nanobucket-c",
        "nanobucket-py",
        "dict",
        "naive",
        "token-bucket",
    ]


def test_a_round_over_the_cap_ends_the_case() -> None:
    calls: list[int] = []

    def run() -> None:
        calls.append(1)
        time.sleep(0.02)  # at least 0.02 s: over the 0.01 s cap

    ns, capped = bench.time_trial(cases.Trial(run, 1), bench.Budget(0.01, 3, 5, cap=0.01))
    assert capped is True
    assert len(calls) == 2  # the warm-up round, then one timed round
    assert len(ns) == 1 and ns[0] >= 0.02e9

    fast, capped = bench.time_trial(
        cases.Trial(lambda: None, 1, warmed=True), bench.Budget(0.0, 3, 5)
    )
    assert capped is False and len(fast) == 3  # warmed: no warm-up round, lo rounds


def test_without_the_extension_every_cython_case_is_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A pure-Python install: no _bucket_c. Each case that needs it is skipped
    # with one reason; before, first_touch raised mid-run from its reset().
    monkeypatch.setattr(cases, "_bucket_c", None)
    progress = bench.Progress(1, io.StringIO())
    needs_c = {
        "first_touch": ["nanobucket-c"],
        "eviction": ["nanobucket-c"],
        "aimed": None,  # every case but the floor and the pure-Python twin
    }
    for group in cases.groups(cases.QUICK):
        if group.id not in needs_c:
            continue
        out = bench.run_group(group, bench.Budget(0.0, 1, 1), progress)
        skipped = {s["name"] for s in out["skipped"]}
        want = needs_c[group.id]
        if want is None:
            want = [
                c.name
                for c in group.cases
                if c.name not in {"floor", "int: aimed, pure-Python twin"}
            ]
        assert set(want) <= skipped
        assert {s["reason"] for s in out["skipped"] if s["name"] in want} == {
            "the Cython extension is not built"
        }


def test_table_says_each_skip_reason_once() -> None:
    peer = "not installed (pip install 'nanobucket[bench]')"
    report: dict[str, Any] = {
        "nanobucket": "0",
        "implementation": "python",
        "python": "3",
        "machine": "m",
        "cpus": 2,
        "quick": True,
        "elapsed_s": 1.0,
        "memory": None,
        "groups": [
            {
                "title": t,
                "unit": "call",
                "floor": "floor",
                "results": [],
                "skipped": [
                    {"name": "token-bucket", "reason": peer},
                    {"name": "limits-fixed", "reason": peer},
                ],
            }
            for t in ("one", "two")
        ],
        "goals": [
            {
                "goal": "single allow(): x floor <= 1.2",
                "op": "<=",
                "limit": 1.2,
                "value": 2.5,
                "met": False,
            }
        ],
    }
    text = bench.format_table(report)
    assert text.count("not installed") == 1
    assert f"skipped, {peer}: token-bucket, limits-fixed" in text.splitlines()
    assert "MISSED" not in text
    assert "  not met single allow(): x floor <= 1.2" in text
    assert "targets, not a test of this install" in text
