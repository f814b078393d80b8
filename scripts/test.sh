#!/usr/bin/env bash
# The test command: format, lints, the whole test suite, and every experiment once in
# --quick mode as a smoke test. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

# A fresh clone builds once: incremental caches would only take disk, which CI machines
# can be short of.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi

step() { printf '\n== %s\n' "$*" >&2; }

step "format"
cargo fmt --all -- --check

step "clippy (-D warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "tests"
cargo test --workspace --locked

step "loom: the shared-memory ring and wake-up protocol, every interleaving"
# --cfg loom rebuilds every crate, so it gets a target directory of its own.
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --locked -p ictus-shm --release --test loom

step "fuzz: every parser of untrusted input (cargo-fuzz targets), ${ICTUS_FUZZ_SECONDS:-20} s each"
if cargo +nightly --version >/dev/null 2>&1; then
  if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz
  fi
  for target in $(cd fuzz && cargo +nightly fuzz list); do
    corpus="$(mktemp -d)"
    mkdir -p "fuzz/corpus/$target"
    # New inputs go to a scratch corpus; the committed seeds are read, never written.
    (cd fuzz && cargo +nightly fuzz run "$target" "$corpus" "corpus/$target" -- \
      -max_total_time="${ICTUS_FUZZ_SECONDS:-20}")
    rm -rf "$corpus"
  done
else
  echo "skipped: no nightly toolchain here (the corpus is still replayed by the tests)" >&2
fi

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
