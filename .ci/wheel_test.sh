#!/usr/bin/env bash
# Build an sdist and a wheel with `python -m build` (the wheel from the
# sdist, as pip would from PyPI), install the wheel -- not editable -- in a
# fresh virtual environment with the test extra, and run the test suite from
# a scratch directory, where `src/` cannot shadow the installed package.
#
#   bash .ci/wheel_test.sh            # uses python3 (PYTHON=... to choose)
#   KEEP=1 bash .ci/wheel_test.sh     # keep the scratch directory
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
python=${PYTHON:-python3}

# Only the files git tracks: no build products (.c, .so) or stray files of
# a used checkout leak into the sdist.
. .ci/scratch.sh
new_scratch wheel
copy_tracked "$work/src"

echo "--- building the sdist and a wheel from it (python -m build)"
"$python" -m venv "$work/build-env"
"$work/build-env/bin/python" -m pip install -q --upgrade pip build
# REQUIRE: a compiler problem fails here, not as a pure-Python wheel.
NANOBUCKET_REQUIRE_EXTENSIONS=1 "$work/build-env/bin/python" -m build --outdir "$work/dist" "$work/src" >"$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log"; exit 1; }
sdist=$(ls "$work"/dist/nanobucket-*.tar.gz)
wheel=$(ls "$work"/dist/nanobucket-*.whl)
echo "sdist: $(basename "$sdist")"
echo "wheel: $(basename "$wheel")"

# The sdist must carry what a build from it needs, and the wheel the
# compiled extensions (a wheel without them would pass the pure-Python half).
tar -tzf "$sdist" >"$work/sdist.txt"
for f in _core/_bucket_c.pyx bench/_floor.pyx _core/_shared_c.pyx _core/_atomic.h _core/_siphash.h py.typed; do
  grep -q "/src/nanobucket/$f\$" "$work/sdist.txt" || { echo "the sdist lacks $f" >&2; exit 1; }
done
"$work/build-env/bin/python" - "$wheel" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
exts = sorted(n for n in names if n.endswith((".so", ".pyd")))
print("wheel extensions:", ", ".join(exts) or "none")
missing = [m for m in ("nanobucket/_core/_bucket_c", "nanobucket/bench/_floor") if not any(m + "." in n for n in exts)]
if missing or "nanobucket/py.typed" not in names:
    sys.exit(f"wheel lacks {missing or 'py.typed'}")
EOF

echo "--- installing the wheel with the test and plot extras in a fresh venv"
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --upgrade pip
"$work/venv/bin/python" -m pip install -q "${wheel}[test,plot]"

# Only the tests, pytest.ini, README.md and docs/ (test_readme and
# test_docs_examples run their examples): no src/ beside them, so
# `import nanobucket` can only find the wheel.
mkdir "$work/run"
(cd "$work/src" && cp -R tests pytest.ini README.md docs "$work/run/")
cd "$work/run"
"$work/venv/bin/python" - <<'EOF'
import nanobucket, nanobucket._core._bucket as sel
print("testing", nanobucket.__file__)
print("implementation:", sel.TokenBucket.__module__)
assert "site-packages" in nanobucket.__file__, "the tests would not test the installed wheel"
assert sel.TokenBucket.__module__ == "nanobucket._core._bucket_c", "the wheel's extension did not load"
EOF
echo "--- the test suite against the installed wheel"
"$work/venv/bin/python" -m pytest -q -p no:cacheprovider
