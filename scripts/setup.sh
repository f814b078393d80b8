#!/usr/bin/env bash
# Set-up shared by the two commands in the README: everything a fresh Debian machine
# with the Rust toolchain needs for ictus. Idempotent; quiet when there is nothing to do.
set -euo pipefail

need_apt=()
# Debian packages ictus needs: rt-tests gives cyclictest, the peer of the timing
# experiments (alarm, midi); openttd-openmsx gives real multi-track MIDI files (GPL-2,
# read in place by crates/midi/tests/smf_damaged.rs, never copied into the repository),
# whose every prefix the Standard MIDI File reader must refuse. ICTUS_APT_PACKAGES adds
# more.
for pkg in rt-tests openttd-openmsx ${ICTUS_APT_PACKAGES:-}; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "ictus setup: installing Debian packages: ${need_apt[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

# Transparent huge pages for shared memory, for regions that ask (madvise): ictus's
# out-of-line buffers of 2 MiB and more ask, and then a 16 MiB region is 8 pages to
# map, unmap and free instead of 4096 (~35x cheaper). `advise` changes nothing for
# memory that does not ask. Needs root; ICTUS_NO_SYSTEM_TUNING=1 leaves it alone.
thp=/sys/kernel/mm/transparent_hugepage/shmem_enabled
if [ -z "${ICTUS_NO_SYSTEM_TUNING:-}" ] && [ -w "$thp" ] && grep -q '\[never\]' "$thp"; then
  echo "ictus setup: enabling shared-memory huge pages for regions that ask (shmem_enabled=advise)" >&2
  echo advise > "$thp" || echo "ictus setup: could not set $thp; large out-of-line messages stay on 4 KiB pages" >&2
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "ictus setup: cargo is not on PATH; install the Rust toolchain (rustup) first" >&2
  exit 1
fi
for comp in rustfmt clippy; do
  if ! cargo "${comp/rustfmt/fmt}" --version >/dev/null 2>&1; then
    echo "ictus setup: adding the $comp component" >&2
    rustup component add "$comp"
  fi
done
