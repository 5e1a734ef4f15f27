"""What an install of nanobucket declares (its extras), and how it builds without a compiler."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest


def test_the_integrations_have_extras() -> None:
    from importlib.metadata import metadata

    meta = metadata("nanobucket")
    extras = set(meta.get_all("Provides-Extra") or ())
    assert {"redis", "fastapi", "django", "prometheus", "otel", "test", "plot", "bench"} <= extras
    requires = set(meta.get_all("Requires-Dist") or ())
    assert {
        'redis>=5; extra == "redis"',
        'fastapi; extra == "fastapi"',
        'django; extra == "django"',
        'prometheus_client; extra == "prometheus"',
        'opentelemetry-api; extra == "otel"',
    } <= requires


ROOT = Path(__file__).resolve().parent.parent


def _tree_copy(dest: Path) -> Path:
    """The source tree as it is now (no .c, .so or build/), under *dest*.

    The files git tracks when ROOT is a git work tree; otherwise (the coverage
    stage runs in a plain copy) everything but build products and caches.
    """
    git = shutil.which("git")
    listed = subprocess.run(
        [git or "false", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False
    )
    if listed.returncode != 0:
        build_products = shutil.ignore_patterns(
            ".git", ".venv", "build", "dist", "htmlcov", "__pycache__", "*.egg-info",
            "*.so", "*.c", ".coverage*",
        )  # fmt: skip
        shutil.copytree(ROOT, dest, ignore=build_products)
        return dest
    for name in filter(None, listed.stdout.split(b"\0")):
        src = ROOT / os.fsdecode(name)
        if src.is_file():
            (dest / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / os.fsdecode(name))
    return dest


def _wheel(tree: Path, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NANOBUCKET_")}
    environ.update(env, CC="/bin/false")  # a compiler that always fails
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-v",
            "--no-build-isolation",
            "--no-deps",
            "-w",
            str(out),
            str(tree),
        ],
        capture_output=True,
        text=True,
        env=environ,
        timeout=300,
        check=False,
    )


@pytest.mark.skipif(
    not (ROOT / "setup.py").exists(),
    reason="needs the source tree (the wheel's tests run without it)",
)
def test_without_a_compiler_the_build_falls_back_to_pure_python(tmp_path: Path) -> None:
    pytest.importorskip("Cython")
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:  # the build-system requirement
        pytest.skip(f"the build needs setuptools>=77 installed, not {setuptools.__version__}")
    tree = _tree_copy(tmp_path / "src")
    built = _wheel(tree, tmp_path / "dist")
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    log = built.stdout + built.stderr
    assert log.count("*** WARNING: nanobucket's C extensions could not be compiled") == 1
    # Before the compiler's silent minute, the build says what it is doing.
    compiling = "*** nanobucket: compiling nanobucket's C extensions (about a minute)... ***"
    assert log.count(compiling) == 1
    assert log.index(compiling) < log.index("*** WARNING: nanobucket's C extensions")
    assert "NANOBUCKET_REQUIRE_EXTENSIONS=1 to make this an error" in log
    (wheel,) = (tmp_path / "dist").glob("nanobucket-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if n.endswith((".so", ".pyd"))] == []
    assert "nanobucket/_core/_bucket_py.py" in names
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    which = subprocess.run(
        [
            sys.executable,
            "-c",
            "import nanobucket._core._bucket as s; print(s.TokenBucket.__module__)",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
        cwd=tmp_path,
        timeout=60,
        check=True,
    )
    assert which.stdout.strip() == "nanobucket._core._bucket_py"

    # Asked for the extensions, the same build fails loudly.
    shutil.rmtree(tree / "build", ignore_errors=True)
    strict = _wheel(tree, tmp_path / "dist2", NANOBUCKET_REQUIRE_EXTENSIONS="1")
    assert strict.returncode != 0
    assert "could not be compiled" not in strict.stdout + strict.stderr
    assert not (tmp_path / "dist2").exists() or not list((tmp_path / "dist2").glob("*.whl"))
