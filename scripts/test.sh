#!/usr/bin/env bash
# The test command: format, lints, the whole test suite, and every experiment once in
# --quick mode as a smoke test. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

step() { printf '\n== %s\n' "$*" >&2; }

step "format"
cargo fmt --all -- --check

step "clippy (-D warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "tests"
cargo test --workspace --locked

step "experiments, quick (smoke)"
cargo build --release --locked -p ictus
out="${TMPDIR:-/tmp}/ictus-smoke.$$"
mkdir -p "$out"
trap 'rm -rf "$out"' EXIT
for exp in $(./target/release/ictus bench --list); do
  step "ictus bench $exp --quick"
  ./target/release/ictus bench "$exp" --quick --json "$out/$exp.json"
  test -s "$out/$exp.json"
done
