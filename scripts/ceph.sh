#!/usr/bin/env bash
# A single-machine Ceph cluster for the MARS cluster's tests and experiment (issue 20):
#
#   scripts/ceph.sh up DIR [--osds N] [--store bluestore|memstore] [--timeout SECONDS] [--owner PID] [--addr IPV4] [--wait-mgr]
#   scripts/ceph.sh status DIR
#   scripts/ceph.sh down DIR
#   scripts/ceph.sh pool DIR NAME      (a pool of its own for one test on a shared cluster)
#   scripts/ceph.sh unpool DIR NAME
#
# `up` makes DIR (it must not exist, or be empty) and puts everything there: the
# configuration, the monitor's, manager's and OSDs' data, sockets, pid files, logs and
# crash reports. Nothing goes to /etc/ceph or /var/lib/ceph, no systemd, no cephadm.
# One monitor and one manager on 127.0.0.1 (the monitor's two ports picked free at run
# time), N OSDs (1 to 3), one pool `ictus` (size = N, 8 placement groups), auth none.
# `--addr` puts the daemons on another local address instead (public_addr): a bridge's,
# so that clients in other network namespaces reach them.
# It returns once RADOS serves: every OSD up, the pool made, and a probe object written,
# read back and removed through it. The manager is started but not waited for: RADOS
# reads and writes never go through it (it gathers PG statistics, serves `ceph -s`'s PG
# lines and its Python modules), and its start was most of a loaded machine's wait (66 s
# once at load ~20). `--wait-mgr` also waits for HEALTH_OK and the manager available, as
# before. It prints `conf=DIR/ceph.conf`, `pool=ictus` and the time taken.
# A failure (missing package, port taken, daemon dead, time-out) says which and where
# its log is, and tears down what was started.
#
# Stores: BlueStore (the default) is what production runs; each OSD's block device is a
# sparse file of 1 GiB in DIR, so only written bytes take disk. MemStore keeps objects
# in the OSD's memory: faster to start, but test data would live in RAM.
#
# With `--owner PID`, a watcher started with the cluster runs `down` once process PID
# is gone, however it ended (`kill -9` included): a test that dies leaves nothing behind.
#
# `down` stops every daemon by the pid it recorded (SIGTERM, then SIGKILL after a
# grace), checks none is left, and removes DIR. `status` prints `ceph -s` and which
# daemons run. DIR must be one `up` made (it holds `ictus-ceph.conf`'s marker), so
# `down` never removes a directory it did not make.
set -euo pipefail

die() { echo "ceph.sh: $*" >&2; exit 1; }
usage() { die "usage: $0 up DIR [--osds 1..3] [--store bluestore|memstore] [--timeout S] [--owner PID] [--addr IPV4] [--wait-mgr] | status DIR | down DIR | pool DIR NAME | unpool DIR NAME"; }

[ $# -ge 2 ] || usage
cmd=$1
dir=$2
shift 2
pool_name=""
case "$cmd" in
  pool|unpool)
    [ $# -eq 1 ] || usage
    pool_name=$1
    shift
    # A pool name that no shell, path or Ceph command line misreads.
    [[ "$pool_name" =~ ^[a-z0-9][a-z0-9_-]{0,62}$ ]] || die "pool name must be 1-63 of a-z 0-9 _ - (got '$pool_name')"
    [ "$pool_name" != ictus ] || die "pool ictus is the cluster's own; name another"
    ;;
esac
marker=ictus-ceph-cluster

osds=1
store=bluestore
# Generous: a start takes 17-56 s on a loaded two-core VM and once missed 90 s at load ~20;
# this is a watchdog, not a target.
timeout=240
owner=""
addr=127.0.0.1
wait_mgr=""
while [ $# -gt 0 ]; do
  case "$1" in
    --osds) osds=${2:-}; shift 2 || usage ;;
    --store) store=${2:-}; shift 2 || usage ;;
    --timeout) timeout=${2:-}; shift 2 || usage ;;
    --owner) owner=${2:-}; shift 2 || usage ;;
    --addr) addr=${2:-}; shift 2 || usage ;;
    --wait-mgr) wait_mgr=1; shift ;;
    *) usage ;;
  esac
done
case "$osds" in 1|2|3) ;; *) die "--osds must be 1, 2 or 3 (got '$osds')" ;; esac
case "$store" in bluestore|memstore) ;; *) die "--store must be bluestore or memstore (got '$store')" ;; esac
case "$timeout" in ''|*[!0-9]*) die "--timeout must be a whole number of seconds (got '$timeout')" ;; esac
case "$owner" in ''|[1-9]*) ;; *) die "--owner must be a process id (got '$owner')" ;; esac
case "$owner" in *[!0-9]*) die "--owner must be a process id (got '$owner')" ;; esac
[ -z "$owner" ] || kill -0 "$owner" 2>/dev/null || die "--owner $owner: no such process"
[ "$timeout" -ge 5 ] && [ "$timeout" -le 3600 ] || die "--timeout must be 5 to 3600 seconds (got $timeout)"
[[ "$addr" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]] || die "--addr must be an IPv4 address (got '$addr')"

conf="$dir/ceph.conf"
cephcli() { timeout 30 ceph -c "$conf" --connect-timeout 10 "$@"; }

# Every daemon this cluster started, by the pid recorded when it was started.
pids() {
  local f
  for f in "$dir"/run/*.pid; do
    [ -e "$f" ] || continue
    echo "$(basename "$f" .pid) $(cat "$f")"
  done
}

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }

stop_all() {
  local name pid left deadline
  while read -r name pid; do
    alive "$pid" && kill -TERM "$pid" 2>/dev/null || true
  done < <(pids)
  deadline=$((SECONDS + 15))
  while :; do
    left=""
    while read -r name pid; do
      alive "$pid" && left="$left $name($pid)"
    done < <(pids)
    [ -z "$left" ] && break
    if [ $SECONDS -ge $deadline ]; then
      echo "ceph.sh: still running after 15 s, killing:$left" >&2
      while read -r name pid; do alive "$pid" && kill -KILL "$pid" 2>/dev/null || true; done < <(pids)
      sleep 1
      break
    fi
    sleep 0.2
  done
  while read -r name pid; do
    alive "$pid" && die "$name (pid $pid) survived SIGKILL; $dir left in place"
  done < <(pids)
  return 0
}

is_ours() { [ -f "$dir/$marker" ]; }

# A loopback TCP port no socket uses, picked at random below the kernel's ephemeral range
# (ip_local_port_range): a port inside it can be taken at any moment by some process's
# outgoing connection, which is how a CI run once lost the monitor's port. Every TCP socket
# counts, not only listeners (a connected socket's local port also makes bind fail).
# Another process can still take the port between here and the monitor's bind: `up`
# then picks new ports and starts the monitor again (three tries).
free_port() {
  local used p i lo hi
  read -r lo hi </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || { lo=32768; hi=60999; }
  # Ports 10000 .. lo-1, or above the range if it starts too low to leave room.
  local base=10000 span=$((lo - 10000))
  if [ "$span" -lt 2000 ]; then base=$((hi + 1)); span=$((65535 - hi)); fi
  [ "$span" -ge 100 ] || die "no room for the monitor's ports outside the ephemeral range $lo-$hi"
  used=$(ss -Htan 2>/dev/null | awk '{print $4}' | sed 's/.*://' | sort -u)
  for i in $(seq 1 200); do
    p=$((base + (RANDOM * 32768 + RANDOM) % span))
    grep -qx "$p" <<<"$used" || { echo "$p"; return 0; }
  done
  die "no free TCP port found between $base and $((base + span - 1))"
}

# Starts daemon $1 (name for logs/pids) with the command that follows, in the
# foreground of a background job, so its pid is ours to stop.
start() {
  local name=$1
  shift
  "$@" -f </dev/null >>"$dir/log/$name.out" 2>&1 &
  echo $! >"$dir/run/$name.pid"
}

# Fails with the daemon's log if it died.
check_alive() {
  local name=$1 pid
  pid=$(cat "$dir/run/$name.pid")
  if ! alive "$pid"; then
    echo "ceph.sh: $name (pid $pid) exited; the end of its log ($dir/log/$name.log):" >&2
    tail -n 15 "$dir/log/$name.log" "$dir/log/$name.out" 2>/dev/null >&2 || true
    if grep -qs 'Address already in use\|unable to bind' "$dir/log/$name.log" "$dir/log/$name.out"; then
      echo "ceph.sh: $name could not bind its port: the port is in use" >&2
    fi
    return 1
  fi
}

# One object written, read back and removed through RADOS (the `rados` tool, C++: no
# Python start-up per call); prints why not on failure.
probe() {
  local obj=ictus-ready-probe
  timeout 20 rados -c "$conf" -p ictus put "$obj" "$dir/probe.in" || { echo "write failed"; return 1; }
  timeout 20 rados -c "$conf" -p ictus get "$obj" "$dir/probe.out" || { echo "read failed"; return 1; }
  cmp -s "$dir/probe.in" "$dir/probe.out" || { echo "read back other bytes than written"; return 1; }
  timeout 20 rados -c "$conf" -p ictus rm "$obj" || { echo "remove failed"; return 1; }
  rm -f "$dir/probe.out"
}

fail_up() {
  echo "ceph.sh: up failed: $*" >&2
  stop_all || true
  if [ -n "${ICTUS_CEPH_KEEP_FAILED:-}" ]; then
    echo "ceph.sh: ICTUS_CEPH_KEEP_FAILED set: $dir kept for inspection" >&2
  else
    rm -rf "$dir"
  fi
  exit 1
}

up() {
  local missing="" tool
  for tool in ceph-mon ceph-mgr ceph-osd ceph rados monmaptool ss timeout cmp; do
    command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
  done
  [ -z "$missing" ] || die "missing:$missing — install the Debian packages ceph-mon ceph-mgr ceph-osd ceph-common (scripts/setup.sh does)"
  if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
    die "$dir exists and is not empty; give a new directory (or run 'down' on a cluster there)"
  fi
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  conf="$dir/ceph.conf"
  touch "$dir/$marker"
  mkdir -p "$dir/run" "$dir/log" "$dir/crash" "$dir/mon.a" "$dir/mgr.x"
  trap 'fail_up "interrupted"' INT TERM

  local t0=$SECONDS fsid v2 v1
  fsid=$(cat /proc/sys/kernel/random/uuid)
  local try=0 deadline
  while :; do
    try=$((try + 1))
    v2=$(free_port)
    v1=$(free_port)
    [ "$v1" != "$v2" ] || v1=$(free_port)
    # A failed try's monitor left its store and logs: start clean.
    rm -rf "$dir/mon.a" "$dir/monmap" "$dir/log/mon.a.log" "$dir/log/mon.a.out" "$dir/run/mon.a.pid"
    mkdir -p "$dir/mon.a"

    cat >"$conf" <<EOF
# Made by scripts/ceph.sh up: a throw-away single-machine cluster; everything in $dir.
[global]
fsid = $fsid
mon_host = [v2:$addr:$v2,v1:$addr:$v1]
public_addr = $addr
cluster_addr = $addr
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
# Pacific warns about insecure global_id reclaim until it is refused (HEALTH_WARN otherwise).
auth_allow_insecure_global_id_reclaim = false
mon_warn_on_insecure_global_id_reclaim_allowed = false
# One machine: replicas on distinct OSDs, not hosts; pools of size N (1 allowed).
osd_crush_chooseleaf_type = 0
osd_pool_default_size = $osds
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = false
# The shared disk is often more than 70 % full: warn at 2 %, stop at 1 %.
mon_data_avail_warn = 2
mon_data_avail_crit = 1
run_dir = $dir/run
admin_socket = $dir/run/\$name.asok
log_file = $dir/log/\$name.log
crash_dir = $dir/crash
mon_data = $dir/\$name
mgr_data = $dir/\$name
osd_data = $dir/\$name
osd_objectstore = $store
bluestore_block_create = true
bluestore_block_size = 1073741824
memstore_device_bytes = 1073741824
# Small memory: this machine is shared.
osd_memory_target = 939524096
bluestore_cache_autotune = false
bluestore_cache_size = 134217728
client_mount_timeout = 15

[client]
log_file = $dir/log/client.\$pid.log
admin_socket =
EOF

    monmaptool --create --fsid "$fsid" --addv a "[v2:$addr:$v2,v1:$addr:$v1]" "$dir/monmap" >"$dir/log/monmaptool.out" 2>&1 \
      || fail_up "monmaptool failed: $(cat "$dir/log/monmaptool.out")"
    ceph-mon -c "$conf" -i a --mkfs --monmap "$dir/monmap" >"$dir/log/mon.a.mkfs.out" 2>&1 \
      || fail_up "ceph-mon --mkfs failed: $(tail -n 5 "$dir/log/mon.a.mkfs.out")"
    start mon.a ceph-mon -c "$conf" -i a
    deadline=$((SECONDS + timeout))
    until cephcli mon stat >/dev/null 2>&1; do
      if ! check_alive mon.a; then
        if [ "$try" -lt 3 ] && grep -qs 'Address already in use\|unable to bind' "$dir/log/mon.a.log" "$dir/log/mon.a.out"; then
          echo "ceph.sh: try $try: another process took port $v2 or $v1; picking new ports" >&2
          continue 2
        fi
        fail_up "the monitor died (ports v2 $v2, v1 $v1)"
      fi
      [ $SECONDS -lt $deadline ] || fail_up "the monitor did not answer within ${timeout} s (log $dir/log/mon.a.log)"
      sleep 0.3
    done
    break
  done
  local t_mon=$((SECONDS - t0))
  start mgr.x ceph-mgr -c "$conf" -i x

  local i uuid id
  for i in $(seq 1 "$osds"); do
    uuid=$(cat /proc/sys/kernel/random/uuid)
    id=$(cephcli osd new "$uuid" 2>"$dir/log/osd-new.err") || fail_up "ceph osd new failed: $(cat "$dir/log/osd-new.err")"
    mkdir -p "$dir/osd.$id"
    ceph-osd -c "$conf" -i "$id" --mkfs --osd-uuid "$uuid" >"$dir/log/osd.$id.mkfs.out" 2>&1 \
      || fail_up "ceph-osd --mkfs failed for osd.$id: $(tail -n 5 "$dir/log/osd.$id.mkfs.out")"
    start "osd.$id" ceph-osd -c "$conf" -i "$id"
  done

  local t_osd=$((SECONDS - t0)) t_up="" t_mgr="" t_io=""
  local st health up_osds name mgr pool_made="" io_ok="" io_err="not tried (OSDs not up)"
  printf 'ictus ceph.sh probe %s\n' "$fsid" >"$dir/probe.in"
  while :; do
    for name in mon.a mgr.x $(seq -f 'osd.%g' 0 $((osds - 1))); do
      check_alive "$name" || fail_up "$name died"
    done
    # One status call a round (each `ceph` call is a Python start-up: CPU the daemons need).
    st=$(cephcli status -f json 2>/dev/null | tr -d ' \n' || true)
    up_osds=$(sed -n 's/.*"num_up_osds":\([0-9]*\).*/\1/p' <<<"$st")
    health=$(sed -n 's/.*"health":{"status":"\([A-Z_]*\)".*/\1/p' <<<"$st")
    mgr=$(sed -n 's/.*"mgrmap":{"available":\([a-z]*\).*/\1/p' <<<"$st")
    if [ -z "$pool_made" ] && [ "${up_osds:-0}" -eq "$osds" ]; then
      cephcli osd pool create ictus 8 8 >/dev/null 2>&1 \
        && cephcli osd pool application enable ictus rados >/dev/null 2>&1 && pool_made=1
    fi
    [ -n "$t_up" ] || [ "${up_osds:-0}" -ne "$osds" ] || t_up=$((SECONDS - t0))
    [ -n "$t_mgr" ] || [ "$mgr" != true ] || t_mgr=$((SECONDS - t0))
    # RADOS serves when an object can be written, read back and removed (a write to a
    # placement group still peering waits; the time-out bounds it).
    if [ -n "$pool_made" ] && [ -z "$io_ok" ]; then
      if io_err=$(probe 2>&1); then
        io_ok=1
        t_io=$((SECONDS - t0))
      fi
    fi
    if [ -n "$io_ok" ] && { [ -z "$wait_mgr" ] || { [ "$health" = HEALTH_OK ] && [ "$mgr" = true ]; }; }; then
      break
    fi
    if [ $SECONDS -ge $deadline ]; then
      if [ -z "$io_ok" ]; then
        fail_up "RADOS did not serve within ${timeout} s: ${up_osds:-0} of $osds OSD(s) up, pool ictus ${pool_made:+made}${pool_made:-not made}, probe object: ${io_err:-no answer} (logs in $dir/log)"
      fi
      fail_up "no HEALTH_OK with the manager available within ${timeout} s (--wait-mgr): health '${health:-no answer}' ($(cephcli health 2>/dev/null || echo 'no answer')), ${up_osds:-0} OSD(s) up, manager available: ${mgr:-no answer} (logs in $dir/log)"
    fi
    sleep 0.5
  done
  trap - INT TERM
  if [ -n "$owner" ]; then
    # Detached from this script's output, so whoever waits for it is not held.
    setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec bash "$2" down "$3"' \
      watcher "$owner" "$(cd "$(dirname "$0")" && pwd)/$(basename "$0")" "$dir" </dev/null >>"$dir/log/watcher.out" 2>&1 &
    echo $! >"$dir/watcher.pid"
  fi
  echo "conf=$conf"
  echo "pool=ictus"
  echo "osds=$osds store=$store ready_s=$((SECONDS - t0))"
  echo "phases_s=monitor:$t_mon,osds_made:$t_osd,osds_up:$t_up,rados_io:$t_io,manager:${t_mgr:-not_waited}"
}

case "$cmd" in
  up) up ;;
  status)
    is_ours || die "$dir holds no cluster made by '$0 up'"
    while read -r name pid; do
      if alive "$pid"; then echo "$name pid $pid running"; else echo "$name pid $pid NOT running"; fi
    done < <(pids)
    cephcli -s || die "the cluster does not answer"
    ;;
  down)
    [ -e "$dir" ] || exit 0
    is_ours || die "$dir holds no cluster made by '$0 up'; not removing it"
    # The owner's watcher is not needed any more (unless it is what runs this).
    if [ -f "$dir/watcher.pid" ]; then
      w=$(cat "$dir/watcher.pid")
      [ "$w" = "$$" ] || [ "$w" = "$PPID" ] || { alive "$w" && kill -TERM "$w" 2>/dev/null || true; }
    fi
    stop_all
    rm -rf "$dir"
    ;;
  pool)
    is_ours || die "$dir holds no cluster made by '$0 up'"
    cephcli osd pool create "$pool_name" 8 8 >/dev/null || die "creating pool $pool_name failed"
    cephcli osd pool application enable "$pool_name" rados >/dev/null || die "enabling pool $pool_name failed"
    echo "pool=$pool_name"
    ;;
  unpool)
    is_ours || die "$dir holds no cluster made by '$0 up'"
    cephcli osd pool delete "$pool_name" "$pool_name" --yes-i-really-really-mean-it >/dev/null 2>&1 \
      || die "deleting pool $pool_name failed"
    ;;
  *) usage ;;
esac
