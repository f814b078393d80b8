#!/usr/bin/env bash
# Set-up shared by the two commands in the README: everything a fresh Debian machine
# with the Rust toolchain needs for ictus. Idempotent; quiet when there is nothing to do.
set -euo pipefail

need_apt=()
# Debian packages ictus needs. (Later parts add rt-tests, xvfb, …)
for pkg in ${ICTUS_APT_PACKAGES:-}; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "ictus setup: installing Debian packages: ${need_apt[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
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
