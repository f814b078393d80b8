#!/usr/bin/env bash
# Build and install the C library of ictus: libictus.so and libictus.a under
# PREFIX/lib, ictus.h under PREFIX/include, ictus.pc under PREFIX/lib/pkgconfig.
#
#   scripts/install-c.sh [PREFIX]      (default: $HOME/.local)
#   PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs ictus
set -euo pipefail

prefix=${1:-$HOME/.local}
case "$prefix" in
  /*) ;;
  *) echo "install-c.sh: PREFIX must be an absolute path, not '$prefix'" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cargo build -p ictus-c --release --locked
version=$(cargo pkgid -p ictus-c | sed 's/.*[#@]//')
target=${CARGO_TARGET_DIR:-$root/target}/release

install -d "$prefix/lib/pkgconfig" "$prefix/include"
install -m 0755 "$target/libictus.so" "$prefix/lib/libictus.so"
install -m 0644 "$target/libictus.a" "$prefix/lib/libictus.a"
install -m 0644 crates/capi/include/ictus.h "$prefix/include/ictus.h"
sed -e "s|@PREFIX@|$prefix|" -e "s|@LIBDIR@|$prefix/lib|" -e "s|@INCLUDEDIR@|$prefix/include|" \
    -e "s|@VERSION@|$version|" crates/capi/ictus.pc.in > "$prefix/lib/pkgconfig/ictus.pc"
echo "install-c.sh: installed libictus $version under $prefix" >&2
