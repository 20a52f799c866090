#!/usr/bin/env bash
# Runs ephd's whole test suite the way CI does.
#
# The integration tests compare ephd against a stock etcd and drive the
# stock etcdctl, and the etcd-client dev-dependency compiles etcd's protos
# with a system protoc; so this installs what is missing first:
#   - etcd-server + etcd-client (scripts/install-etcd.sh),
#   - protobuf-compiler + libprotobuf-dev (protoc and its well-known types).
# Extra arguments are passed to `cargo test`, e.g. `scripts/test.sh --test it`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-etcd.sh
command -v etcd >/dev/null && command -v etcdctl >/dev/null || {
  echo "test.sh: etcd/etcdctl still missing after scripts/install-etcd.sh" >&2
  exit 1
}

install_protoc() {
  if command -v protoc >/dev/null 2>&1 && [ -e /usr/include/google/protobuf/descriptor.proto ]; then
    return 0
  fi
  local sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends protobuf-compiler libprotobuf-dev >/dev/null
}
if [ -z "${PROTOC:-}" ]; then
  install_protoc
fi

echo "test.sh: $(etcd --version | head -n1); $(etcdctl version | head -n1); $(protoc --version 2>/dev/null || echo "PROTOC=${PROTOC:-}")"
cargo --version

if [ "$#" -gt 0 ]; then
  cargo test "$@"
else
  cargo test --all-targets --no-fail-fast
fi
