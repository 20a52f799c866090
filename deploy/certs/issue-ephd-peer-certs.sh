#!/bin/bash
# Issues the peer certificates of a three- (or five-) member ephd cluster
# from a peer CA of ephd's own, creating that CA on first use.
#
# Why a CA of its own, not the kubeadm etcd CA: with
# --peer-client-cert-auth, every certificate the peer CA signed may send
# Raft messages, and whoever can send them can rewrite the store. The etcd
# CA also signs kube-apiserver's etcd client certificate and etcd's own
# certificates, and ephd does not check peer certificate names
# (--peer-cert-allowed-cn is not built), so sharing it would let all of
# them in.
#
# Usage (on one machine, then copy each member's files to its node):
#   deploy/certs/issue-ephd-peer-certs.sh --out ./ephd-peer \
#       --member cp-1=192.0.2.10 --member cp-2=192.0.2.11 --member cp-3=192.0.2.12
#   # then, for each member NAME on its node:
#   #   /etc/kubernetes/pki/ephd/peer-ca.crt   <- ./ephd-peer/ca.crt
#   #   /etc/kubernetes/pki/ephd/peer.crt      <- ./ephd-peer/NAME.crt
#   #   /etc/kubernetes/pki/ephd/peer.key      <- ./ephd-peer/NAME.key (0600, owner 65532)
#
# Options:
#   --out DIR               where the CA and the certificates go (created)
#   --member NAME=ADDR      a member and the IP or DNS name of its peer URL
#                           (repeatable; ADDR may start with "*." for a
#                           StatefulSet's headless Service domain)
#   --days N                validity of the member certificates (default 365)
#
# Writes DIR/ca.crt and DIR/ca.key (the CA: keep ca.key off the nodes), and
# DIR/NAME.crt, DIR/NAME.key per member, each valid for serverAuth and
# clientAuth (a member presents the same certificate both ways, as etcd's
# peers do). Run it again with the same --out to renew: the CA is reused.
set -euo pipefail

out=""
days=365
members=()

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:?--out needs a value}"; shift 2 ;;
    --member) members+=("${2:?--member needs NAME=ADDR}"); shift 2 ;;
    --days) days="${2:?}"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
done
[ -n "$out" ] || { echo "--out is required" >&2; exit 2; }
[ "${#members[@]}" -gt 0 ] || { echo "give every member with --member NAME=ADDR" >&2; exit 2; }

umask 077
mkdir -p "$out"
if [ ! -s "$out/ca.crt" ] || [ ! -s "$out/ca.key" ]; then
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$out/ca.key"
  openssl req -x509 -new -key "$out/ca.key" -subj "/CN=ephd-peer-ca" -days 3650 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$out/ca.crt"
  echo "created the peer CA $out/ca.crt (keep $out/ca.key safe, off the nodes)"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for m in "${members[@]}"; do
  name="${m%%=*}"
  addr="${m#*=}"
  if [ -z "$name" ] || [ -z "$addr" ] || [ "$name" = "$m" ]; then
    echo "--member $m is not NAME=ADDR" >&2
    exit 2
  fi
  if [[ "$addr" =~ ^[0-9.]+$ ]] || [[ "$addr" == *:* ]]; then
    san="IP:${addr}"
  else
    san="DNS:${addr}"
  fi
  cat > "$work/ext.cnf" <<EXT
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth, clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
subjectAltName = ${san}
EXT
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$work/$name.key"
  openssl req -new -key "$work/$name.key" -subj "/CN=${name}" -out "$work/$name.csr"
  openssl x509 -req -in "$work/$name.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days "$days" -sha256 \
    -extfile "$work/ext.cnf" -out "$work/$name.crt" 2>/dev/null
  openssl verify -CAfile "$out/ca.crt" "$work/$name.crt" >/dev/null
  install -m 0644 "$work/$name.crt" "$out/$name.crt"
  install -m 0600 "$work/$name.key" "$out/$name.key"
  echo "wrote $out/$name.crt and $out/$name.key (SAN ${san})"
done
