#!/usr/bin/env bash
# Set-up shared by the two commands in the README: everything a fresh Debian machine
# with the Rust toolchain needs for ictus. Idempotent; quiet when there is nothing to do.
set -euo pipefail

need_apt=()
# Debian packages ictus needs: rt-tests gives cyclictest, the peer of the timing
# experiments (alarm, midi); xvfb gives the X server the display server's tests and
# experiment start on a display of their own (MIT-SHM included); openttd-openmsx gives
# real multi-track MIDI files (GPL-2, read in place by crates/midi/tests/smf_damaged.rs,
# never copied into the repository), whose every prefix the Standard MIDI File reader
# must refuse. For MARS (ictus bench mars and its tests): nginx-light and fio are the
# peers (nginx sendfile; background readers), curl checks the HTTP server byte for byte,
# e2fsprogs (mkfs.ext4) and util-linux (losetup) build the slow disk. For the Unix
# server: proot is the peer of `ictus bench unix` (ptrace-based user-space chroot);
# busybox-static is the static binary the Unix server's tests run (a program with raw
# syscall instructions and no dynamic loader); make builds the compile benchmarks. gcc,
# g++ and pkg-config build the C programs of those tests and the C library's C and C++
# examples against its header and pkg-config file in crates/capi/tests (gcc brings
# libasan, for the runs under AddressSanitizer). GStreamer decodes compressed clips for
# `ictus play` and is the peer of `ictus bench tactus`: the libraries and headers
# gstreamer-rs builds against (with pkg-config), the tools (gst-launch-1.0 makes the
# tests' clips), and the plugins for MP4/MKV/WebM, VP8, Vorbis (base, good), the
# decoders of H.264, MPEG-4 part 2, AAC and friends (libav), and x264enc (ugly; with
# MPEG-2 video, AC-3 and AMR decoders): cli/tests/play.rs makes its MP4 clip with it,
# H.264 and AAC as users have them, because Debian's avenc_mpeg4 (libav 1.22.0) stamps
# every frame with an overflowed time and mp4mux then writes a file nothing plays.
# systemd gives systemd-socket-activate and systemd-analyze: the servers' socket
# activation and readiness are tested with them, and the units checked, without systemd
# running (cli/tests/services.rs). ICTUS_APT_PACKAGES adds more.
for pkg in rt-tests xvfb openttd-openmsx nginx-light fio curl e2fsprogs util-linux proot busybox-static gcc g++ make \
  pkg-config libgstreamer1.0-dev libgstreamer-plugins-base1.0-dev gstreamer1.0-tools gstreamer1.0-plugins-base \
  gstreamer1.0-plugins-good gstreamer1.0-libav gstreamer1.0-plugins-ugly systemd ${ICTUS_APT_PACKAGES:-}; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
# Ceph for MARS across machines (issue 20): scripts/ceph.sh runs a throw-away
# single-machine cluster (monitor, manager, OSDs on sparse files) for the tests and the
# experiment; crates/objstore loads librados and libradosstriper at run time (the -dev
# packages give the headers its declarations follow). Without recommends: 98 packages,
# ~290 MB, instead of the dashboard's and cephadm's Python stacks.
need_ceph=()
for pkg in ceph-mon ceph-mgr ceph-osd ceph-common librados-dev libradosstriper-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_ceph+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ] || [ ${#need_ceph[@]} -gt 0 ]; then
  echo "ictus setup: installing Debian packages: ${need_apt[*]} ${need_ceph[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  if [ ${#need_apt[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
  fi
  if [ ${#need_ceph[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_ceph[@]}"
  fi
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
