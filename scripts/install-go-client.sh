#!/usr/bin/env bash
# Installs what tests/it/go_client needs to build its driver offline when it
# is missing: Debian's Go 1.19 (golang-1.19-go, the go tool at
# /usr/lib/go-1.19/bin/go) and etcd 3.4's Go sources with clientv3 and every
# library they import (golang-etcd-server-dev, under /usr/share/gocode).
#
# Why Debian's packages: the driver is built in GOPATH mode over
# /usr/share/gocode, so the build needs no module proxy and no network, and
# the client is the etcd 3.4 clientv3 (with its grpc-go balancer and retry
# interceptor) that matches the etcd 3.4 server the tests compare against.
# The packages hold sources only: installing them starts no service.
set -euo pipefail
GO=/usr/lib/go-1.19/bin/go
CLIENTV3=/usr/share/gocode/src/go.etcd.io/etcd/clientv3
if [ -x "$GO" ] && [ -d "$CLIENTV3" ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends golang-1.19-go golang-etcd-server-dev >/dev/null
[ -x "$GO" ] && [ -d "$CLIENTV3" ] || {
  echo "install-go-client.sh: $GO or $CLIENTV3 still missing after apt-get install" >&2
  exit 1
}
