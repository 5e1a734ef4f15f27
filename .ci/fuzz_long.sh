#!/usr/bin/env bash
# The long fuzz run: every fuzz test with NANOBUCKET_FUZZ_EXAMPLES examples
# (default 2500; the one-call test runs 400 times that), then the total.
# tests/test_outbound_hostile.py adds hostile answers to the outbound clients.
#
#   .ci/fuzz_long.sh                      # 2500 per test: about 1.02 million examples
#   NANOBUCKET_FUZZ_EXAMPLES=100 .ci/fuzz_long.sh   # a quick look
#
# PYTHON picks the interpreter (default: python3) with the test extras installed.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
export NANOBUCKET_FUZZ_EXAMPLES=${NANOBUCKET_FUZZ_EXAMPLES:-2500}
log=$(mktemp "${TMPDIR:-/tmp}/nanobucket-fuzz.XXXXXX")
trap 'rm -f "$log"' EXIT
start=$(date +%s)
set +e
"$python" -m pytest -q -p no:cacheprovider --hypothesis-show-statistics tests/test_fuzz*.py \
  tests/test_outbound_hostile.py "$@" \
  2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
total=$(grep -Eo '^ +- [0-9]+ passing' "$log" | awk '{s += $2} END {print s + 0}')
echo "--- fuzz: $total passing examples in $(( $(date +%s) - start )) s" \
     "(NANOBUCKET_FUZZ_EXAMPLES=$NANOBUCKET_FUZZ_EXAMPLES), pytest exit status $status"
exit "$status"
