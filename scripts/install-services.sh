#!/usr/bin/env bash
# Install the ictus servers as systemd services: the `ictus` binary under PREFIX/bin,
# its man pages under PREFIX/share/man/man1, and the units of dist/systemd (the name
# server and the clock server's control socket socket-activated; the clock and MIDI
# servers as Type=notify services). doc/services.md says what each unit does.
#
#   scripts/install-services.sh --user   [PREFIX]   (default $HOME/.local; units in
#                                                     ~/.config/systemd/user)
#   scripts/install-services.sh --system [PREFIX]   (default /usr/local; units in
#                                                     /etc/systemd/system; as root)
#
# Then: systemctl [--user] daemon-reload
#       systemctl [--user] enable --now ictus-name-server.socket ictus-clock-server.socket ictus-midi-server.service
#
# ICTUS_BIN=PATH installs that binary instead of building one (cargo build --release);
# ICTUS_UNIT_DIR=DIR puts the units there instead of systemd's directory.
set -euo pipefail

usage() { echo "usage: install-services.sh --user|--system [PREFIX]" >&2; exit 2; }
[ $# -ge 1 ] || usage
case "$1" in
  --user) scope=user; prefix=${2:-$HOME/.local}; unit_dir=${ICTUS_UNIT_DIR:-${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user} ;;
  --system) scope=system; prefix=${2:-/usr/local}; unit_dir=${ICTUS_UNIT_DIR:-/etc/systemd/system} ;;
  *) usage ;;
esac
[ $# -le 2 ] || usage
case "$prefix" in
  /*) ;;
  *) echo "install-services.sh: PREFIX must be an absolute path, not '$prefix'" >&2; exit 2 ;;
esac
case "$prefix" in
  *[!A-Za-z0-9/._+-]*) echo "install-services.sh: PREFIX '$prefix' has characters a unit's ExecStart= would misread" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${ICTUS_BIN:-}
if [ -z "$bin" ]; then
  (cd "$root" && cargo build -p ictus --release --locked)
  bin=${CARGO_TARGET_DIR:-$root/target}/release/ictus
fi

install -d "$prefix/bin" "$prefix/share/man/man1" "$unit_dir"
install -m 0755 "$bin" "$prefix/bin/ictus"
"$prefix/bin/ictus" man --out "$prefix/share/man/man1" >/dev/null
for unit in "$root"/dist/systemd/$scope/*; do
  sed -e "s|@BINDIR@|$prefix/bin|g" "$unit" > "$unit_dir/$(basename "$unit")"
  chmod 0644 "$unit_dir/$(basename "$unit")"
done
ctl="systemctl"; [ "$scope" = user ] && ctl="systemctl --user"
echo "install-services.sh: installed $prefix/bin/ictus, its man pages, and the $scope units in $unit_dir" >&2
echo "install-services.sh: now run: $ctl daemon-reload && $ctl enable --now ictus-name-server.socket ictus-clock-server.socket ictus-midi-server.service" >&2
