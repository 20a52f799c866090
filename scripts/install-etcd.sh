#!/usr/bin/env bash
# Installs stock etcd (server + etcdctl) from Debian's packages when missing,
# without letting the package's init script start a system etcd on :2379.
#
# Why :2379 must stay free: the packaged service listens on 127.0.0.1:2379,
# which is also ephd's default client port (README's `cargo run` and its
# etcdctl examples use it), so a system etcd left running there would make
# ephd fail to bind, or answer etcdctl in ephd's place.
#
# This script ends no process it did not start: it never matches processes by
# name (pkill, killall, or the init script's `stop`, which also ends every
# /usr/bin/etcd by executable path). Tests and other users may run their own
# etcd on this machine at the same time.
set -euo pipefail
if command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
# invoke-rc.d and deb-systemd-invoke ask policy-rc.d before starting a
# service; exit code 101 means "not allowed", so the package's postinst
# installs the service without starting it.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod +x "$policy"
  created_policy=1
fi
cleanup() { if [ "$created_policy" = 1 ]; then $SUDO rm -f "$policy"; fi; }
trap cleanup EXIT
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends etcd-server etcd-client >/dev/null

# Belt and braces: a policy-rc.d that was already there may allow starts. If
# the packaged service did start, stop that service through its service
# manager, which knows exactly which process it started.
stop_packaged_etcd() {
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    # systemd stops the unit's own control group, nothing else.
    if systemctl is-active --quiet etcd.service; then
      echo "install-etcd.sh: stopping the packaged etcd.service" >&2
      $SUDO systemctl stop etcd.service
    fi
    return 0
  fi
  # sysvinit: the init script starts etcd with start-stop-daemon
  # --make-pidfile (init-d-script's default pidfile /run/etcd.pid) as user
  # etcd. Stop only the process in that pidfile, and only if it is that
  # user's /usr/bin/etcd: start-stop-daemon with --pidfile checks just that
  # one PID instead of scanning all processes.
  local pidfile
  for pidfile in /run/etcd.pid /var/run/etcd.pid; do
    if [ -s "$pidfile" ]; then
      echo "install-etcd.sh: stopping the packaged etcd service (pid $(cat "$pidfile"))" >&2
      $SUDO start-stop-daemon --stop --quiet --oknodo --retry=TERM/30/KILL/5 \
        --pidfile "$pidfile" --exec /usr/bin/etcd --user etcd
      return 0
    fi
  done
}
stop_packaged_etcd
command -v etcd >/dev/null && command -v etcdctl >/dev/null
