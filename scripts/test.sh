#!/usr/bin/env bash
# Runs ephd's whole test suite the way CI does.
#
# The integration tests compare ephd against a stock etcd, drive the stock
# etcdctl, etcd's Go client and a real kube-apiserver, and the etcd-client
# dev-dependency compiles etcd's protos with a system protoc; so this
# installs what is missing first:
#   - the reference programs built from published Go modules with Go 1.26
#     (scripts/install-references.sh: etcd and etcdctl 3.6 and 3.7, kine,
#     kube-apiserver 1.35 and 1.37, the Go drivers in tests/go; cached in
#     ~/.cache/ephd/references, so only a machine's first run builds them),
#   - Debian's etcd 3.4 (scripts/install-etcd.sh: the package, its service
#     never started), for the few tests that compare with 3.4's answers,
#   - promtool, Debian package `prometheus`, whose service is not started
#     (scripts/install-promtool.sh; tests/it/metrics.rs runs etcd's alert
#     rules with it),
#   - protobuf-compiler + libprotobuf-dev (protoc and its well-known types),
#   - etcd3gw from PyPI in a virtualenv (scripts/install-etcd3gw.sh;
#     tests/it/gateway.rs drives ephd's JSON gateway with it),
#   - iproute2, Debian package, when `ip` is missing (tests/it/partition
#     puts cluster members in network namespaces; that needs root).
# Before any test it runs the lint gates, each of which fails the run:
#   - cargo fmt --all -- --check
#   - cargo clippy --workspace --all-targets -- -D warnings
#   - RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace (doc links
#     that resolve to nothing or to private items fail it)
#   - scripts/check-h2-patch.sh (third_party/h2 is h2's release plus
#     third_party/h2/ephd.patch, nothing else)
# Extra arguments are passed to `cargo test`, e.g. `scripts/test.sh --test it`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-references.sh
# Debian's etcd 3.4, for the few cases that still compare with 3.4's answers
# (tests/it/references.rs, debian_etcd_34); its service is never started.
bash scripts/install-etcd.sh
bash scripts/install-promtool.sh
command -v promtool >/dev/null || {
  echo "test.sh: promtool still missing after scripts/install-promtool.sh" >&2
  exit 1
}

bash scripts/install-etcd3gw.sh

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

if ! command -v ip >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends iproute2 >/dev/null
fi

refs=${EPHD_REFERENCES:-$HOME/.cache/ephd/references}/bin
echo "test.sh: $("$refs/etcd-3.6" --version | head -n1); $("$refs/etcdctl-3.6" version | head -n1); $(protoc --version 2>/dev/null || echo "PROTOC=${PROTOC:-}")"
cargo --version

# Lint gates, before the tests so a formatting or clippy failure is reported
# first and loudly instead of after minutes of tests.
gate() { # name command...
  local name=$1
  shift
  echo "test.sh: gate: $*"
  if ! "$@"; then
    echo "test.sh: FAILED gate '$name': $*" >&2
    echo "test.sh: fix it (e.g. \`cargo fmt --all\`, or the clippy or rustdoc findings above) and run again" >&2
    exit 1
  fi
}
for tool in fmt clippy; do
  cargo "$tool" --version >/dev/null 2>&1 || {
    echo "test.sh: FAILED: \`cargo $tool\` is not installed (rustup component add ${tool/fmt/rustfmt})" >&2
    exit 1
  }
done
gate fmt cargo fmt --all -- --check
gate clippy cargo clippy --workspace --all-targets -- -D warnings
gate doc env RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --quiet
gate h2-patch bash scripts/check-h2-patch.sh

if [ "$#" -gt 0 ]; then
  cargo test "$@"
else
  cargo test --workspace --all-targets --no-fail-fast
fi
