#!/usr/bin/env bash
# Builds the reference programs that ephd's tests and benchmarks compare
# against, from published Go modules, and caches them between runs:
#
#   etcd-3.6, etcdctl-3.6, etcdutl-3.6, benchmark-3.6   references/etcd-3.6
#   etcd-3.7, etcdctl-3.7                  references/etcd-3.7
#   kine                                   references/kine
#   kube-apiserver-1.35, kube-apiserver-1.37   references/kube-apiserver-*
#   clientv3-driver, storage-conformance.test, kube-driver   tests/go/*
#
# Each references/* directory is a go.mod of ours that requires the
# published module at one version (kube-apiserver's with `replace` lines
# for its staging modules); none of their code is in this repository.
#
# The binaries go to $EPHD_REFERENCES/bin (default ~/.cache/ephd/references).
# A binary is rebuilt only when the go.mod, go.sum or sources it is built from
# changed (a stamp of their hash sits beside it), so a second run takes a
# second. The tests find the binaries in the same place and fail loudly when
# one is missing.
#
# Needs Go >= 1.26 (/usr/local/go/bin/go or `go` on PATH) and the Go module
# proxy; kine's SQLite driver needs a C compiler (cgo).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
out=${EPHD_REFERENCES:-$HOME/.cache/ephd/references}/bin
mkdir -p "$out"

go=""
for candidate in "$(command -v go 2>/dev/null || true)" /usr/local/go/bin/go; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] &&
    "$candidate" version | grep -Eq 'go1\.(2[6-9]|[3-9][0-9])'; then
    go=$candidate
    break
  fi
done
if [ -z "$go" ]; then
  echo "install-references.sh: Go 1.26 or newer is needed (looked on PATH and at /usr/local/go/bin/go)" >&2
  exit 1
fi
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

# build NAME DIR PACKAGE [test]: builds PACKAGE within module DIR into
# $out/NAME unless DIR's stamp is unchanged.
build() {
  local name=$1 dir=$2 package=$3 kind=${4:-}
  local stamp
  stamp=$(cd "$dir" && find . -name '*.go' -o -name go.mod -o -name go.sum | LC_ALL=C sort |
    xargs cat | { cat; "$go" version; echo "$package $kind"; } | sha256sum | cut -d' ' -f1)
  if [ -x "$out/$name" ] && [ "$(cat "$out/$name.stamp" 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  echo "install-references.sh: building $name ($package)" >&2
  local started=$SECONDS
  if [ "$kind" = test ]; then
    (cd "$dir" && "$go" test -c -trimpath -o "$out/$name.new" "$package")
  else
    (cd "$dir" && "$go" build -trimpath -o "$out/$name.new" "$package")
  fi
  mv "$out/$name.new" "$out/$name"
  echo "$stamp" >"$out/$name.stamp"
  echo "install-references.sh: built $name in $((SECONDS - started)) s" >&2
}

refs=$root/references
build etcd-3.6 "$refs/etcd-3.6" go.etcd.io/etcd/server/v3
build etcdctl-3.6 "$refs/etcd-3.6" go.etcd.io/etcd/etcdctl/v3
build etcdutl-3.6 "$refs/etcd-3.6" go.etcd.io/etcd/etcdutl/v3
build benchmark-3.6 "$refs/etcd-3.6" go.etcd.io/etcd/v3/tools/benchmark
build etcd-3.7 "$refs/etcd-3.7" go.etcd.io/etcd/server/v3
build etcdctl-3.7 "$refs/etcd-3.7" go.etcd.io/etcd/etcdctl/v3
build kine "$refs/kine" github.com/k3s-io/kine
build kube-apiserver-1.35 "$refs/kube-apiserver-1.35" k8s.io/kubernetes/cmd/kube-apiserver
build kube-apiserver-1.37 "$refs/kube-apiserver-1.37" k8s.io/kubernetes/cmd/kube-apiserver

tests=$root/tests/go
build clientv3-driver "$tests/clientv3-driver" .
build kube-driver "$tests/kube-driver" .
build storage-conformance.test "$tests/storage-conformance" . test
