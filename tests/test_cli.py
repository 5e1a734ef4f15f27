"""The ``nanobucket`` command: real processes for the entry points, exact output."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import types
from pathlib import Path

import pytest
from test_simulate import check_seed_table

import nanobucket
from nanobucket.__main__ import main
from nanobucket.explain import explain, render_text

BIN = Path(sys.executable).parent
# What the child processes below print for their implementation: the
# pure-Python CI run sets NANOBUCKET_NO_EXTENSIONS=1, which they inherit.
IMPLEMENTATION_LINE = (
    "implementation: Cython extension"
    if nanobucket.IMPLEMENTATION == "cython"
    else "implementation: pure Python (NANOBUCKET_NO_EXTENSIONS is set)"
)
ENV = {**os.environ, "COLUMNS": "80"}


def run(
    *args: str, prog: tuple[str, ...] = (sys.executable, "-m", "nanobucket"), timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prog, *args], capture_output=True, text=True, timeout=timeout, env=ENV, check=False
    )


def test_console_script_and_module_run_explain() -> None:
    # The report, then a line naming the implementation (see test_version).
    want = render_text(explain(100, 200)) + f"\n{IMPLEMENTATION_LINE}\n"
    script = run("explain", "--rate", "100", "--capacity", "200", prog=(str(BIN / "nanobucket"),))
    module = run("explain", "--rate", "100", "--capacity", "200")
    assert (script.returncode, script.stdout, script.stderr) == (0, want, "")
    assert (module.returncode, module.stdout, module.stderr) == (0, want, "")
    assert "  refill from empty        2 s\n" in want


def test_explain_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["explain", "--rate", "1/3", "--capacity", "2", "--instances", "3", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert (doc["rate"], doc["refill_s"], doc["interval_ns"]) == ("1/3", "6", 3_000_000_000)
    assert doc["all_instances"]["shared_limit_per_instance"] == {"rate": "1/9", "capacity": 0}
    assert doc["burst"]["rps"] == "0.6"  # 1.8 x 1/3


def test_explain_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["explain", "--rate", "0.5", "--capacity", "10", "--cost", "2", "--burst-rps", "1"])
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith(
        "token bucket: rate 0.5 tokens/s, capacity 10 tokens (cost 2 tokens each)\n"
    )
    assert "  sustained rate           0.25 req/s\n" in out
    assert "  refill from empty        20 s\n" in out
    assert "    first rejection        request #7 at 6 s" in out


def test_simulate_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate"]) == 0
    captured = capsys.readouterr()
    check_seed_table(captured.out)
    assert captured.err == ""  # no progress bar when stdout is not a terminal
    assert "simulating" not in captured.out


def test_simulate_options_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "simulate",
                "--duration",
                "30",
                "--seed",
                "7",
                "--rate",
                "120",
                "--capacity",
                "240",
                "--queue-bound",
                "50",
                "--key-rate",
                "10",
                "--key-capacity",
                "20",
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    names = [s["label"] for s in doc["strategies"]]
    assert names == [
        "fixed window 120/1 s",
        "unbounded queue 120/s",
        "bounded queue 120/s, 50",
        "token bucket 120/240",
        "per key 10/20 + 120/240",
    ]
    assert doc["traffic"]["description"] == "the case study, 30 s, random seed 7"
    assert doc["traffic"]["duration_ns"] == 30_000_000_000
    assert doc["strategies"][2]["peak_queue"] == 50


def test_simulate_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    # 150 requests in 1 s from one key, then 50 from another.
    rows = [f"{i / 150:.6f},a" for i in range(150)] + [f"{1 + i / 50:.6f},b" for i in range(50)]
    trace.write_text("timestamp,key,cost\n" + "\n".join(rows) + "\n")
    assert main(["simulate", "--trace", str(trace), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by = {s["name"]: s for s in doc["strategies"]}
    assert doc["traffic"]["requests"] == 200
    assert by["fixed window"]["admitted"] == 150  # 100 of a, then 50 of b
    assert by["token bucket"]["admitted"] == 200
    assert by["per-key + global"]["busiest_key"] == {"key": "a", "admitted": 74, "offered": 150}


def test_simulate_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim.png"
    assert main(["simulate", "--duration", "30", "--plot", str(out)]) == 0
    assert capsys.readouterr().out.endswith(f"\nplot written to {out}\n")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1200, 1400)


def test_plot_without_matplotlib_is_one_line(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from nanobucket.__main__ import main\n"
        f"sys.exit(main(['simulate', '--plot', {str(tmp_path / 'x.png')!r}]))\n"
    )
    proc = run(prog=(sys.executable, "-c", code))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        "nanobucket simulate: error: --plot needs matplotlib, which is not installed: "
        "pip install 'nanobucket[plot]'\n"
    )
    assert not (tmp_path / "x.png").exists()


def test_progress_bar_only_on_a_terminal() -> None:
    # A run long enough for the bar (43 000 requests), on a real pseudo-terminal.
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nanobucket", "simulate", "--duration", "440"],
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        env=ENV,
    )
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        if not ready:
            proc.kill()
            pytest.fail("no output from the simulation within 60 s")
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the follower side closed: the process is done
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    text = b"".join(chunks).decode()
    assert "\rsimulating [##############################] 100%" in text
    assert "the case study, 440 s, random seed 1" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "nanobucket: error: the following arguments are required: COMMAND (see --help)"),
        (["frob"], "nanobucket: error: argument COMMAND: invalid choice: 'frob'"),
        (
            ["explain", "--capacity", "2"],
            "nanobucket explain: error: the following arguments are required: --rate (see --help)",
        ),
        (
            ["explain", "--rate", "0", "--capacity", "2"],
            "nanobucket explain: error: argument --rate: rate must be > 0, got 0 (see --help)",
        ),
        (
            ["explain", "--rate", "nan", "--capacity", "2"],
            "nanobucket explain: error: argument --rate: 'nan' is not a number such as 100",
        ),
        (
            ["explain", "--rate", "1/0", "--capacity", "2"],
            "nanobucket explain: error: argument --rate: '1/0' is not a number",
        ),
        (
            ["explain", "--rate", "1e10", "--capacity", "2"],
            "nanobucket explain: error: argument --rate: rate must be at most 1e9 per second",
        ),
        (
            ["explain", "--rate", "1", "--capacity", "2.5"],
            "nanobucket explain: error: argument --capacity: '2.5' is not a whole number",
        ),
        (
            ["explain", "--rate", "1", "--capacity", "2", "--cost", "3"],
            "nanobucket explain: error: cost 3 exceeds capacity 2: it could never be admitted",
        ),
        (
            ["explain", "--rate", "1", "--capacity", "2", "--instances", "0"],
            "nanobucket explain: error: argument --instances: must be >= 1, got 0",
        ),
        (
            ["simulate", "--duration", "0"],
            "nanobucket simulate: error: argument --duration: must be >= 1, got 0",
        ),
        (
            ["simulate", "--duration", "100000"],
            "nanobucket simulate: error: duration must be 1 to 86400 s, got 100000",
        ),
        (
            ["simulate", "--rate", "0.5"],
            "nanobucket simulate: error: rate must be >= 1 to simulate a 1-second window, got 1/2",
        ),
        (
            ["simulate", "--trace", "/nonexistent/t.csv"],
            "nanobucket simulate: error: cannot read trace: No such file or directory",
        ),
        (
            ["simulate", "--trace", "t.csv", "--seed", "3"],
            "nanobucket simulate: error: --seed applies to the generated case study",
        ),
        (
            ["simulate", "--plot", "/nonexistent/x.png"],
            "nanobucket simulate: error: argument --plot: '/nonexistent/x.png': directory",
        ),
        (["simulate", "--bogus"], "nanobucket: error: unrecognized arguments: --bogus"),
    ],
)
def test_bad_arguments_are_one_line_and_status_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(message)
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_bad_trace_is_one_line_in_a_real_process(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("0,a\n0.5,b,lots\n")
    proc = run("simulate", "--trace", str(trace))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        f"nanobucket simulate: error: {trace}:2: cost 'lots' is not a whole number >= 0\n"
    )


def test_help_for_each_command() -> None:
    for argv in (["--help"], ["explain", "--help"], ["simulate", "--help"]):
        proc = run(*argv)
        assert proc.returncode == 0 and proc.stderr == ""
        assert proc.stdout.startswith("usage: nanobucket")
    assert "--burst-rps" in run("explain", "--help").stdout
    assert "--trace FILE.csv" in run("simulate", "--help").stdout


def test_version_names_the_implementation() -> None:
    proc = run("--version")
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0,
        f"nanobucket {nanobucket.__version__}, {IMPLEMENTATION_LINE}\n",
        "",
    )


def test_bench_passes_its_arguments_through(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    bench = types.ModuleType("nanobucket.bench")

    def bench_main(argv: list[str]) -> int:
        seen.append(argv)
        return 3

    bench.main = bench_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nanobucket.bench", bench)
    assert main(["bench", "--quick", "-k", "allow", "--help"]) == 3
    assert seen == [["--quick", "-k", "allow", "--help"]]


def test_bench_missing_is_one_line() -> None:
    code = (
        "import sys; sys.modules['nanobucket.bench'] = None\n"
        "from nanobucket.__main__ import main\n"
        "sys.exit(main(['bench', '--quick']))\n"
    )
    proc = run(prog=(sys.executable, "-c", code))
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        proc.stderr
        == "nanobucket bench: error: the bench command is not available in this version\n"
    )
