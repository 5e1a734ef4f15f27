"""BENCHMARKS.md names, for every figure, the command in ``benchmarks/`` that measures it.

A figure is a table row with a digit in it, or a line giving a number with a
unit (ns, µs, B, x, %, /s, instructions ...). Each one must follow, in its
section, a command: a backticked ``benchmarks/<script>.py ...`` or
``nanobucket bench ...``, inline or in a ``console`` block. The scripts must
exist, the cases and groups they are given must still be the scripts' own,
and each section that holds figures must say when they were measured.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from nanobucket.bench import group_ids

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "BENCHMARKS.md"
BENCHMARKS = ROOT / "benchmarks"

# The wheel's tests run in a copy of tests/ and docs/ alone, without the scripts.
pytestmark = pytest.mark.skipif(
    not (DOC.exists() and BENCHMARKS.is_dir()),
    reason="needs the source tree: BENCHMARKS.md and benchmarks/",
)

ARGS = r"((?:\s+[^\s`|#][^\s`|]*)*)"  # up to a shell comment, a table cell or the code's end
SCRIPT = re.compile(r"benchmarks/([\w.-]+\.py)" + ARGS)
BENCH = re.compile(r"nanobucket bench" + ARGS)
UNIT = re.compile(
    r"(?<![\w.])\d(?:[\d,.]*\d)?\s*(?:ns|µs|us|ms|s|B|bytes|kB|MB|×|x|%|/s|M/s|k|instructions)(?![\w])"
)
HEAD = "## A (2026-12-06)\n\n"  # a section with a date, for the examples below
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def _callgrind_cases() -> set[str]:
    spec = importlib.util.spec_from_file_location("_bench_callgrind", BENCHMARKS / "callgrind.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return set(module.CASES)


def commands_in(line: str) -> list[str]:
    """The benchmark commands a line names: ``callgrind.py c_allow``, ``nanobucket bench --dev``."""
    found = []
    for code in re.findall(r"`([^`]+)`", line) if "`" in line else [line]:
        found += [m.group(1) + m.group(2) for m in SCRIPT.finditer(code)]
        found += ["nanobucket bench" + m.group(1) for m in BENCH.finditer(code)]
    return found


def is_figure(line: str) -> bool:
    """Whether *line* states a measured figure."""
    text = line.strip()
    if text.startswith("|"):
        return not re.fullmatch(r"[|\s:-]+", text) and any(c.isdigit() for c in text)
    return bool(UNIT.search(re.sub(r"`[^`]*`", "", text)))


def check(text: str, cases: set[str], groups: set[str]) -> list[str]:
    """What is wrong with *text* as BENCHMARKS.md: each problem with its line number."""
    problems: list[str] = []
    command: str | None = None
    dated = False
    fenced = False
    carry = ""  # an inline code span not closed yet: a command wrapped over lines
    for number, line in enumerate(text.splitlines(), 1):
        where = f"line {number}: {line.strip()[:70]!r}"
        if line.startswith("```"):
            fenced = not fenced
            continue
        if line.startswith("#") and not fenced:
            command, dated = None, bool(DATE.search(line))
            continue
        dated = dated or bool(DATE.search(line))
        joined = f"{carry} {line}" if carry and not fenced else line
        carry = joined if not fenced and joined.count("`") % 2 else ""
        for found in commands_in(joined) if (fenced or "`" in joined) and not carry else []:
            script, *args = found.split()
            if script == "nanobucket":
                args = args[1:]
                for i, arg in enumerate(args[:-1]):
                    if arg == "--group" and args[i + 1] not in groups:
                        problems.append(f"{where}: no bench group {args[i + 1]!r}")
            elif not (BENCHMARKS / script).is_file():
                problems.append(f"{where}: no benchmarks/{script}")
            elif script == "callgrind.py":
                named = [a for a in args if re.fullmatch(r"[a-z][a-z0-9_]*", a)]
                problems += [f"{where}: no callgrind case {a!r}" for a in named if a not in cases]
            command = found
        if fenced or not is_figure(line):
            continue
        if command is None:
            problems.append(f"{where}: a figure with no command before it in its section")
        elif not dated:
            problems.append(f"{where}: a figure in a section that gives no date")
    return problems


def test_every_figure_names_an_existing_script() -> None:
    assert check(DOC.read_text(encoding="utf-8"), _callgrind_cases(), set(group_ids())) == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (HEAD + "The twin is 1.11x the naive bucket.\n", "no command"),
        (HEAD + "| case | ns |\n|---|---|\n| allow | 37.5 |\n", "no command"),
        ("## A\n\n`python benchmarks/callgrind.py c_allow`: 773 instructions\n", "no date"),
        (HEAD + "`python benchmarks/gone.py`: 40 B per key\n", "no benchmarks/gone.py"),
        (HEAD + "`python benchmarks/callgrind.py c_alow`: 773 instructions\n", "c_alow"),
        (HEAD + "`python -m nanobucket bench --group nope`: 40 ns\n", "'nope'"),
        (  # a command wrapped over two lines is still read whole
            HEAD + "Run `python\nbenchmarks/callgrind.py c_alow`: 773 instructions\n",
            "c_alow",
        ),
        (  # a command in one section does not cover the next one's figures
            HEAD + "`python -m nanobucket bench`\n\n## B (2026-12-06)\n\n| x | 1 |\n",
            "no command",
        ),
    ],
)
def test_drift_is_caught(text: str, problem: str) -> None:
    problems = check(text, _callgrind_cases(), set(group_ids()))
    assert len(problems) == 1 and problem in problems[0], problems


@pytest.mark.parametrize(
    "text",
    [
        HEAD + "`PYTHONHASHSEED=0 python benchmarks/callgrind.py c_allow py_allow`\n\n"
        "| call | instructions |\n|---|---|\n| allow | 773 |\n",
        HEAD + "```console\npython -m nanobucket bench --dev --group memory\n```\n\n"
        "nanobucket-c 40.2 B per key, on 2 cores.\n",
        HEAD + "```console\npython benchmarks/callgrind.py  # every case\n```\n\n"
        "773 instructions\n",
        "## Contents\n\n- [The core](#the-core)\n- [Shared memory](#shared-memory)\n",
    ],
)
def test_figures_with_their_command_pass(text: str) -> None:
    assert check(text, _callgrind_cases(), set(group_ids())) == []
