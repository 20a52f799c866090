#!/usr/bin/env bash
# Installs etcd3gw (the etcd JSON-gateway client OpenStack tooz uses, from
# PyPI) into a virtualenv, for tests/it/gateway.rs, which drives it against
# ephd's client port. Idempotent: an existing venv with etcd3gw is kept.
#
# The venv is ${EPHD_ETCD3GW_VENV:-$HOME/.cache/ephd/etcd3gw-venv}; the
# test reads the same variable. On a clean Debian machine this installs
# python3-venv first (sudo when not root).
set -euo pipefail

venv=${EPHD_ETCD3GW_VENV:-$HOME/.cache/ephd/etcd3gw-venv}
version=2.7.0

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import etcd3gw' 2>/dev/null; then
  exit 0
fi

if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends python3 python3-venv >/dev/null
fi

mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "etcd3gw==$version"
"$venv/bin/python" -c 'import etcd3gw' || {
  echo "install-etcd3gw.sh: etcd3gw still not importable from $venv" >&2
  exit 1
}
echo "install-etcd3gw.sh: etcd3gw $version in $venv"
