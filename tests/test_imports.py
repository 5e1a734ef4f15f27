"""Every module imports on its own, first, in a fresh interpreter, with warnings as errors.

An import cycle hidden by the order in which a test session happens to
import modules shows up here as an ImportError (a partly initialised
module); a deprecation in an import path, as an error.
"""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys

import pytest

import nanobucket

#: The compiled modules: absent, or not to be loaded, in a pure-Python run.
COMPILED = {"nanobucket._bucket_c", "nanobucket._shared_c", "nanobucket.bench._floor"}
MODULES = [
    "nanobucket",
    *sorted(
        m.name
        for m in pkgutil.walk_packages(nanobucket.__path__, "nanobucket.")
        if not (os.environ.get("NANOBUCKET_NO_EXTENSIONS") and m.name in COMPILED)
    ),
]
#: ``-I`` drops PYTHONPATH, so the directory that holds the package under test goes in by hand.
SRC = os.path.dirname(os.path.dirname(os.path.abspath(nanobucket.__file__)))


@pytest.mark.parametrize("module", MODULES)
def test_the_module_imports_first_and_alone(module: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            "-W",
            "error",
            "-c",
            f"import sys; sys.path.insert(0, {SRC!r}); import {module}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_every_module_is_listed() -> None:
    assert {
        "nanobucket.redis",
        "nanobucket.redis._sync",
        "nanobucket.bench.cases",
        "nanobucket.asgi",
        "nanobucket.waiting",
    } <= set(MODULES)
