#!/usr/bin/env bash
# ictus's main job: run the papers' experiments beside today's peers and write a report.
# Quick by default (minutes); pass --full for the papers' scale.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
mode="--quick"
if [ "${1:-}" = "--full" ]; then mode=""; shift; fi
out="${1:-report}"
cargo build --release --locked -p ictus
mkdir -p "$out"
for exp in $(./target/release/ictus bench --list); do
  ./target/release/ictus bench "$exp" $mode --json "$out/$exp.json"
done
echo
echo "ictus: report written to $out/ (JSON and SVG per experiment)"
