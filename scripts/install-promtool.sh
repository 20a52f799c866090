#!/usr/bin/env bash
# Installs Prometheus' `promtool` (Debian package `prometheus`) when missing.
# The metrics test (tests/it/metrics.rs) evaluates etcd's own alert rules
# against ephd's /metrics with `promtool test rules`; nothing else uses it.
#
# Only promtool is wanted, not a Prometheus server: the package's service is
# kept from starting the way scripts/install-etcd.sh keeps etcd's from
# starting (a policy-rc.d that forbids starts while the package installs),
# and if it started anyway it is stopped through its service manager only.
# This script ends no process it did not start and never matches processes
# by name.
set -euo pipefail
if command -v promtool >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
# Exit code 101 from policy-rc.d means "not allowed": invoke-rc.d and
# deb-systemd-invoke install the service without starting it.
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
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null

# Belt and braces, as in install-etcd.sh: a policy-rc.d that was already
# there may allow starts; then stop the packaged service through its own
# service manager (systemd unit, or the init script's pidfile for exactly
# that process).
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  if systemctl is-active --quiet prometheus.service; then
    echo "install-promtool.sh: stopping the packaged prometheus.service" >&2
    $SUDO systemctl stop prometheus.service
  fi
else
  for pidfile in /run/prometheus/prometheus.pid /run/prometheus.pid; do
    if [ -s "$pidfile" ]; then
      echo "install-promtool.sh: stopping the packaged prometheus (pid $(cat "$pidfile"))" >&2
      $SUDO start-stop-daemon --stop --quiet --oknodo --retry=TERM/30/KILL/5 \
        --pidfile "$pidfile" --exec /usr/bin/prometheus
      break
    fi
  done
fi
command -v promtool >/dev/null
