#!/usr/bin/env bash
# Coverage of the .py and the .pyx files together, failing under 90% total.
#
# The extensions are rebuilt with Cython line tracing (NANOBUCKET_CYTHON_TRACE=1)
# in a scratch COPY of the repository with its own virtual environment: the
# .so files of the working tree, which other runs may be using, are never
# touched. coverage.py reads the .pyx through the Cython.Coverage plugin (wrapped);
# the settings are [tool.coverage.*] in pyproject.toml.
#
#   bash .ci/coverage.sh              # uses python3 (PYTHON=... to choose)
#   KEEP=1 bash .ci/coverage.sh       # keep the scratch copy (htmlcov/ etc.)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}

. .ci/scratch.sh
new_scratch coverage
copy_tracked "$work/repo"
cd "$work/repo"

echo "--- building the extensions with Cython line tracing (in $work/repo)"
"$python" -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install -q --upgrade pip
# Cython in the venv itself: coverage's Cython.Coverage plugin imports it.
"$py" -m pip install -q "Cython>=3.1" "setuptools>=77" "coverage>=7.10"
# ...wrapped so that a .pxd is reported the same under every hash seed.
cp .ci/cython_pxd_coverage.py "$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
NANOBUCKET_CYTHON_TRACE=1 "$py" -m pip install -q --no-build-isolation -e ".[test,plot]"
# In place, so each .c (which the plugin maps back to its .pyx) sits beside its .so.
NANOBUCKET_CYTHON_TRACE=1 "$py" setup.py -q build_ext --inplace
"$py" - <<'EOF'
import nanobucket._core._bucket as sel
assert sel.IMPLEMENTATION == "cython", "the traced extension did not load"
print("implementation:", sel.TokenBucket.__module__, "from", __import__("nanobucket").__file__)
EOF

echo "--- the test suite under coverage (both implementations)"
"$py" -m coverage erase
# Line tracing calls Python code (the tracer) at every line of the .pyx,
# where the GIL can pass to another thread: that breaks the premise of the
# keyed table (no Python code runs between finding a slot and using it), so
# the thread stress tests (and the tests marked gil_atomic) run in the
# untraced suites of .ci/run, not here; so do the tests that bound the
# wall-clock time of Python code to tenths of a second (wall_clock), which
# line tracing slows several times; so do the tests that start threads in a
# spawned child (threads_in_child): in such a child, Cython's coverage plugin
# crashed the process when a thread was first traced.
# A failing test fails the script, after the report: the figure is still shown.
tests=0
"$py" -m coverage run -m pytest -q -p no:cacheprovider \
  --ignore=tests/test_freethreading.py --ignore=tests/test_threads.py \
  -m "not gil_atomic and not wall_clock and not threads_in_child" || tests=$?
"$py" -m coverage combine -q

echo "--- coverage of .py and .pyx together (fails under 90%)"
"$py" -m coverage report
exit "$tests"
