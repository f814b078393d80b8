#!/usr/bin/env bash
# ictus's main job: run the papers' experiments beside today's peers and write a report
# (`ictus testbed`): report.md, testbed.json, and each experiment's JSON, table and plots.
# Quick by default (minutes); --full runs them at the papers' scale.
#
#   ./scripts/testbed.sh [--full] [DIR]      (DIR defaults to report/)
#
# Ctrl-C stops the running experiment and still writes the report of what finished.
set -euo pipefail
cd "$(dirname "$0")/.."

mode="--quick"
out="report"
for arg in "$@"; do
  case "$arg" in
    --full) mode="" ;;
    --quick) mode="--quick" ;;
    -h | --help)
      sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    -*)
      echo "testbed.sh: unknown option $arg (try --help)" >&2
      exit 2
      ;;
    *) out="$arg" ;;
  esac
done

./scripts/setup.sh
cargo build --release --locked -p ictus

mkdir -p "$out"
# A report left by an earlier run must not pass for this one's if this one fails early.
rm -f "$out/report.md"
status=0
./target/release/ictus testbed $mode --out "$out" || status=$?

report="$(cd "$out" && pwd)/report.md"
echo
if [ -f "$report" ]; then
  echo "ictus: the report is $report"
  echo "       (beside it: testbed.json, and each experiment's JSON, table and SVG plots)"
else
  echo "ictus: the testbed failed before writing a report (exit status $status)" >&2
fi
exit "$status"
