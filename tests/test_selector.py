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
    assert _run("1") == "python nanobucket._core._bucket_py"


@pytest.mark.c_extension
def test_the_default_is_cython() -> None:
    assert _run(None) == "cython nanobucket._core._bucket_c"
    assert _run("0") == "cython nanobucket._core._bucket_c"
    forced = os.environ.get("NANOBUCKET_NO_EXTENSIONS", "") not in ("", "0")
    assert ("python" if forced else "cython") == nanobucket.IMPLEMENTATION


# A child that cannot import the extensions, as on an install made without a
# C compiler: an import hook refuses them before the finders look.
HIDDEN = """
import sys, warnings
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.endswith(("._bucket_c", "._shared_c", "._floor")):
            raise ImportError("hidden by the test")
sys.meta_path.insert(0, Hide())
"""
BUILD_THREE = """
warnings.simplefilter("always")  # a second warning would show, not be deduplicated
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import nanobucket as nb
    from nanobucket._core._bucket import describe
    nb.TokenBucket(rate=1, capacity=1)  # line 7 of this block
    nb.KeyedTokenBucket(rate=1, capacity=1)
    nb.TokenBucket(rate=2, capacity=2)
for w in caught:
    print(w.category.__name__, w.lineno - FIRST, w.message, sep="|")
print(nb.IMPLEMENTATION, describe(), sep="|")
"""

FALLBACK_WARNING = (
    "nanobucket is running its pure-Python implementation, several times slower than its "
    "C extension, which did not import (ImportError: hidden by the test). Reinstall "
    "nanobucket where a C compiler and the Python headers are available (with "
    "NANOBUCKET_REQUIRE_EXTENSIONS=1, an install that cannot compile fails instead), or "
    "set NANOBUCKET_NO_EXTENSIONS=1 to choose pure Python and silence this warning"
)


def _child(code: str, no_extensions: str | None) -> list[str]:
    env = dict(os.environ)
    env.pop("NANOBUCKET_NO_EXTENSIONS", None)
    if no_extensions is not None:
        env["NANOBUCKET_NO_EXTENSIONS"] = no_extensions
    first = code.count("\n", 0, code.index("BUILD_START")) if "BUILD_START" in code else 0
    proc = subprocess.run(
        [sys.executable, "-c", code.replace("FIRST", str(first))],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return proc.stdout.splitlines()


def test_a_missing_extension_warns_once_when_the_first_limiter_is_built() -> None:
    code = HIDDEN + "# BUILD_START" + BUILD_THREE
    assert _child(code, None) == [
        # Once for three limiters, at the line that built the first (line 7 of the block).
        f"RuntimeWarning|7|{FALLBACK_WARNING}",
        "python|implementation: pure Python, several times slower: the C extension did not "
        "import (ImportError: hidden by the test)",
    ]


def test_a_chosen_pure_python_does_not_warn() -> None:
    # NANOBUCKET_NO_EXTENSIONS=1 (the pure-Python CI run; an install made without
    # the extension on purpose) says nothing, whether the extension is there or not.
    code = HIDDEN + "# BUILD_START" + BUILD_THREE
    assert _child(code, "1") == [
        "python|implementation: pure Python (NANOBUCKET_NO_EXTENSIONS is set)"
    ]
    assert _child("import sys, warnings\n# BUILD_START" + BUILD_THREE, "1") == [
        "python|implementation: pure Python (NANOBUCKET_NO_EXTENSIONS is set)"
    ]


@pytest.mark.c_extension
def test_the_extension_does_not_warn() -> None:
    assert _child("import sys, warnings\n# BUILD_START" + BUILD_THREE, None) == [
        "cython|implementation: Cython extension"
    ]
