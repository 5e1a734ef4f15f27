#!/usr/bin/env bash
# Build the Cython extensions with -fsanitize=address,undefined and run the
# test suite against them, in a throw-away copy of the working tree, so the
# .so files in src/ (which an editable install is using) are never replaced.
#
#   .ci/sanitize.sh                 # every test
#   .ci/sanitize.sh -k "not gunicorn" -x   # arguments go to pytest
#   SANITIZE_REF=HEAD .ci/sanitize.sh       # a commit instead of the working tree
#
# PYTHON picks the interpreter (default: python3); it must have the test
# extras installed (pip install -e '.[test]'). Needs gcc with libasan.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/nanobucket-sanitize.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [ -n "${SANITIZE_REF:-}" ]; then
  echo "--- exporting $SANITIZE_REF to $work"
  git -C "$repo" archive "$SANITIZE_REF" | tar -xf - -C "$work"
else
  echo "--- copying the working tree to $work"
  # Tracked and new files as they are now; ignored ones (.so, .c, build/) stay behind.
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard \
     | xargs -0 tar --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$work"
fi

echo "--- building with NANOBUCKET_SANITIZE=1"
(cd "$work" && NANOBUCKET_SANITIZE=1 "$python" setup.py -q build_ext --inplace >/dev/null)

libasan=$(gcc -print-file-name=libasan.so)
[ -e "$libasan" ] || { echo "no libasan.so from gcc ($libasan)" >&2; exit 1; }

# The copy's src/ comes before any installed nanobucket on sys.path.
export PYTHONPATH="$work/src${PYTHONPATH:+:$PYTHONPATH}"
# The ASan runtime must be loaded first; libstdc++ with it, or ASan cannot
# intercept C++ exceptions thrown by other extensions (matplotlib's).
export LD_PRELOAD="$libasan $(gcc -print-file-name=libstdc++.so)"
# Reports go to files as well, so that one from a child process (a forked
# worker, a gunicorn worker) is seen even when its test swallows stderr.
reports="$work/sanitizer-report"
export ASAN_OPTIONS="detect_leaks=0:log_path=$reports"  # CPython keeps memory until exit by design
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$reports"
export PYTHONMALLOC=malloc                  # Python objects in plain malloc: ASan sees them
export NANOBUCKET_NO_EXTENSIONS=            # the extensions must be the ones under test

"$python" - "$work" <<'PY'
import sys
from nanobucket._core import _bucket_c, _shared_c
from nanobucket.bench import _floor
for module in (_bucket_c, _floor, _shared_c):
    assert module.__file__.startswith(sys.argv[1]), f"{module.__file__} is not the sanitized build"
    with open(module.__file__, "rb") as f:
        assert b"__asan_" in f.read(), f"{module.__file__} is not built with ASan"
print("--- sanitized extensions:", ", ".join(m.__name__ for m in (_bucket_c, _floor, _shared_c)))
PY

echo "--- pytest under ASan + UBSan"
cd "$work"
set +e
"$python" -m pytest -q -p no:cacheprovider "$@"
status=$?
set -e
if compgen -G "$reports.*" >/dev/null; then
  echo "--- sanitizer reports:" >&2
  cat "$reports".* >&2
  exit 1
fi
[ "$status" -eq 0 ] && echo "--- clean: no ASan or UBSan report, every test passed"
exit "$status"
