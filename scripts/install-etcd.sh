#!/usr/bin/env bash
# Installs stock etcd (server + etcdctl) from Debian's packages when missing,
# without letting the package's init script start a system etcd on :2379.
set -euo pipefail
if command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
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
# Belt and braces: if a service did start anyway, stop it so :2379 stays free.
if command -v systemctl >/dev/null 2>&1; then $SUDO systemctl stop etcd 2>/dev/null || true; fi
$SUDO pkill -x etcd 2>/dev/null || true
command -v etcd >/dev/null && command -v etcdctl >/dev/null
