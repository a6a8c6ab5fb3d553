#!/usr/bin/env bash
# Two builds of the extension, side by side: runs a benchmark command with each build's
# domino_ops/_C*.so installed in turn, alternating for ROUNDS rounds (so machine noise hits
# both alike), then puts back the extension that was installed. Prints each run's output
# under a header naming the build.
#
#   benchmarks/compare_builds.sh OLD.so NEW.so ROUNDS command [args...]
#   e.g. (after saving build/*/_C*.so of each version):
#   benchmarks/compare_builds.sh /tmp/old.so /tmp/new.so 3 .venv/bin/python benchmarks/bench_attention.py --skip-model
#
# Pause background jobs first (kill -STOP): they share the cores.
set -euo pipefail
if [ $# -lt 4 ]; then
  sed -n '2,10p' "$0"
  exit 2
fi
old=$1 new=$2 rounds=$3
shift 3
installed=$(.venv/bin/python -c "import domino_ops, pathlib; print(next(pathlib.Path(domino_ops.__file__).parent.glob('_C*.so')))")
backup=$(mktemp)
cp "$installed" "$backup"
trap 'cp "$backup" "$installed"; rm -f "$backup"' EXIT
for ((i = 1; i <= rounds; i++)); do
  for build in old new; do
    so=${!build}
    cp "$so" "$installed"
    echo "=== round $i, $build build ($so)"
    "$@"
  done
done
