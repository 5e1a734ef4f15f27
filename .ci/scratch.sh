# Sourced by the .ci scripts that work in a throw-away copy of the tree.
#
# new_scratch NAME: a new temporary directory in $work (removed on exit
# unless KEEP=1). copy_tracked DEST: the files git tracks, as they are in
# the working tree (no build products such as .c or .so), into DEST.

new_scratch() {
  work=$(mktemp -d "${TMPDIR:-/tmp}/nanobucket-$1.XXXXXX")
  if [ -z "${KEEP:-}" ]; then trap 'rm -rf "$work" 2>/dev/null || true' EXIT; fi
}

copy_tracked() {
  mkdir -p "$1"
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z | xargs -0 cp --parents -t "$1"
  else
    cp -R . "$1"
  fi
}
