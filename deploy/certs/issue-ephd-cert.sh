#!/bin/bash
# Issues ephd's TLS serving certificate from the cluster's etcd CA, so that
# kube-apiserver (which verifies every etcd endpoint, overrides included,
# against --etcd-cafile) accepts it.
#
# Usage (as root on the control-plane node that runs ephd):
#   deploy/certs/issue-ephd-cert.sh --ip 192.0.2.10 [--ip ...] [--dns cp-1 ...]
#
# Options:
#   --ip ADDR        IP SAN (repeatable). 127.0.0.1 is always added.
#   --dns NAME       DNS SAN (repeatable). localhost is always added.
#   --ca-cert FILE   CA certificate  (default /etc/kubernetes/pki/etcd/ca.crt)
#   --ca-key FILE    CA private key  (default /etc/kubernetes/pki/etcd/ca.key)
#   --out DIR        output directory (default /etc/kubernetes/pki/ephd)
#   --owner UID:GID  owner of the output files (default 65532:65532, the
#                    image's user; "" leaves them to the caller)
#   --days N         validity in days (default 365, like kubeadm's certs)
#   --cn NAME        subject CN (default ephd)
#
# Writes DIR/server.crt (0644) and DIR/server.key (0600). Renewal: run it
# again before expiry (kubeadm certs renew does not know about this
# certificate); ephd reloads the files by itself within seconds.
# Check: openssl x509 -noout -enddate -in DIR/server.crt
set -euo pipefail

ca_cert=/etc/kubernetes/pki/etcd/ca.crt
ca_key=/etc/kubernetes/pki/etcd/ca.key
out=/etc/kubernetes/pki/ephd
owner=65532:65532
days=365
cn=ephd
ips=(127.0.0.1)
dnss=(localhost)

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --ip) ips+=("${2:?--ip needs a value}"); shift 2 ;;
    --dns) dnss+=("${2:?--dns needs a value}"); shift 2 ;;
    --ca-cert) ca_cert="${2:?}"; shift 2 ;;
    --ca-key) ca_key="${2:?}"; shift 2 ;;
    --out) out="${2:?}"; shift 2 ;;
    --owner) owner="${2-}"; shift 2 ;;
    --days) days="${2:?}"; shift 2 ;;
    --cn) cn="${2:?}"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
done

if [ "${#ips[@]}" -lt 2 ] && [ "${#dnss[@]}" -lt 2 ]; then
  echo "give at least one --ip or --dns: the host of the URL in --etcd-servers-overrides" >&2
  exit 2
fi
for f in "$ca_cert" "$ca_key"; do
  [ -r "$f" ] || { echo "cannot read $f" >&2; exit 1; }
done

san=""
for ip in "${ips[@]}"; do san+="${san:+,}IP:${ip}"; done
for d in "${dnss[@]}"; do san+="${san:+,}DNS:${d}"; done

umask 077
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cat > "$work/ext.cnf" <<EXT
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth, clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
subjectAltName = ${san}
EXT

# ECDSA P-256, PKCS#8 PEM ("BEGIN PRIVATE KEY"). For RSA instead:
#   openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out ...
# and add keyEncipherment to keyUsage above.
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$work/server.key"
openssl req -new -key "$work/server.key" -subj "/CN=${cn}" -out "$work/server.csr"
openssl x509 -req -in "$work/server.csr" -CA "$ca_cert" -CAkey "$ca_key" \
  -set_serial "0x$(openssl rand -hex 16)" -days "$days" -sha256 \
  -extfile "$work/ext.cnf" -out "$work/server.crt" 2>/dev/null

openssl verify -CAfile "$ca_cert" "$work/server.crt" >/dev/null

mkdir -p "$out"
install -m 0644 "$work/server.crt" "$out/server.crt"
install -m 0600 "$work/server.key" "$out/server.key"
if [ -n "$owner" ]; then
  chown "$owner" "$out" "$out/server.crt" "$out/server.key"
fi
chmod 0755 "$out"

echo "wrote $out/server.crt and $out/server.key (SANs: ${san})"
openssl x509 -noout -subject -issuer -enddate -in "$out/server.crt"
