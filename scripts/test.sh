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
# One Ceph cluster for the test binaries that need one (crates/objstore,
# servers/mars-server), each working in a pool of its own, instead of one start each
# (10-50 s apiece on a loaded two-core machine). Its owner is a watcher of this script:
# however the script ends (kill -9 included), the owner goes and scripts/ceph.sh's watcher
# takes the cluster down. Where Ceph is not installed, the tests say they were skipped.
ceph_dir="${TMPDIR:-/tmp}/ictus-ceph-shared-$$"
ceph_owner=""
ceph_env=()
cleanup() {
  [ ! -e "$ceph_dir" ] || ./scripts/ceph.sh down "$ceph_dir" >&2 || true
  [ -z "$ceph_owner" ] || kill "$ceph_owner" 2>/dev/null || true
  [ -z "${out:-}" ] || rm -rf "$out"
}
trap cleanup EXIT
if command -v ceph-mon >/dev/null 2>&1; then
  (while kill -0 $$ 2>/dev/null; do sleep 1; done) &
  ceph_owner=$!
  ceph_up=$(./scripts/ceph.sh up "$ceph_dir" --owner "$ceph_owner")
  echo "$ceph_up" >&2
  ceph_env=("ICTUS_TEST_CEPH_CONF=$(sed -n 's/^conf=//p' <<<"$ceph_up")")
fi
env "${ceph_env[@]}" cargo test --workspace --locked
if [ -n "$ceph_owner" ]; then
  step "the shared Ceph cluster's end: its OSD, then its owner, killed with SIGKILL (crates/objstore)"
  env "${ceph_env[@]}" ICTUS_TEST_CEPH_OWNER="$ceph_owner" cargo test --locked -p ictus-objstore --test cluster
  ceph_owner=""
fi

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
for exp in $(./target/release/ictus bench --list); do
  step "ictus bench $exp --quick"
  ./target/release/ictus bench "$exp" --quick --json "$out/$exp.json"
  test -s "$out/$exp.json"
done
