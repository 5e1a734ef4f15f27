"""NANOBUCKET_NO_EXTENSIONS switches the package to pure Python."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import nanobucket

CODE = "import nanobucket as nb; print(nb.IMPLEMENTATION, nb.TokenBucket.__module__)"


def _run(env_value: str | None) -> str:
    env = dict(os.environ)
    env.pop("NANOBUCKET_NO_EXTENSIONS", None)
    if env_value is not None:
        env["NANOBUCKET_NO_EXTENSIONS"] = env_value
    return subprocess.run(
        [sys.executable, "-c", CODE], env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def test_the_env_var_gives_pure_python() -> None:
    assert _run("1") == "python nanobucket._bucket_py"


@pytest.mark.c_extension
def test_the_default_is_cython() -> None:
    assert _run(None) == "cython nanobucket._bucket_c"
    assert _run("0") == "cython nanobucket._bucket_c"
    forced = os.environ.get("NANOBUCKET_NO_EXTENSIONS", "") not in ("", "0")
    assert ("python" if forced else "cython") == nanobucket.IMPLEMENTATION
