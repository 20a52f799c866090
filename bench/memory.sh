#!/usr/bin/env bash
# Memory per stored object, ephd against stock etcd, measured side by side.
#
# For each server and each shape it starts a fresh server on loopback
# (etcd's data dir on tmpfs), loads N objects with ephd-bench, and reads the
# server's resident set (VmRSS) and peak (VmHWM) from /proc. Shapes:
#   lease  N node-Lease-like objects: 1 version each, ~300-byte values
#   event  N Event-like objects with a shared lease per 1000, ~700-byte values
# Prints one Markdown table row per (shape, server) and the ratio to the raw
# key+value bytes, measured after the load (all history retained, as between
# kube-apiserver's 5-minute compactions) and again after compacting at the
# current revision (latest versions only). Env: N (default 1000000),
# CLIENTS (100).
# Bounded: each load has a 10-minute limit; servers are killed on exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N=${N:-1000000}
CLIENTS=${CLIENTS:-100}
bash scripts/install-references.sh
REFS=${EPHD_REFERENCES:-$HOME/.cache/ephd/references}/bin
cargo build --release -p ephd -p ephd-bench >/dev/null
EPHD=target/release/ephd
BENCH=target/release/ephd-bench
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf /dev/shm/ephd-mem-etcd; }
trap cleanup EXIT

# N distinct free ports below the ephemeral range, in one call (two separate
# picks could return the same port: neither is held until its server binds it).
free_ports() { python3 bench/free_ports.py "$1"; }
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
hwm_kb() { awk '/^VmHWM/ {print $2}' "/proc/$1/status"; }
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }

start() { # server -> sets PID, PORT
  local peer
  read -r PORT peer < <(free_ports 2)
  if [[ $1 == etcd ]]; then
    rm -rf /dev/shm/ephd-mem-etcd
    "$REFS/etcd-3.6" --name m --data-dir /dev/shm/ephd-mem-etcd --listen-client-urls "http://127.0.0.1:$PORT" \
      --advertise-client-urls "http://127.0.0.1:$PORT" --listen-peer-urls "http://127.0.0.1:$peer" \
      --initial-advertise-peer-urls "http://127.0.0.1:$peer" --initial-cluster "m=http://127.0.0.1:$peer" \
      --quota-backend-bytes 8589934592 --log-level error >/dev/null 2>&1 &
  else
    "$EPHD" --listen-client-urls "http://127.0.0.1:$PORT" --log-level warn >/dev/null 2>&1 &
  fi
  PID=$!
  PIDS+=("$PID")
  wait_port "$PORT"
  sleep 0.5
}

echo "| shape | server | objects | raw key+value MB | RSS MB, with history | RSS MB, compacted | peak RSS MB | compacted RSS / raw | bytes per object, compacted |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
for shape in lease event; do
  for server in etcd ephd; do
    start "$server"
    base=$(rss_kb "$PID")
    if [[ $shape == lease ]]; then
      out=$(timeout 600 "$BENCH" --endpoints "127.0.0.1:$PORT" --json --no-progress --clients "$CLIENTS" \
        --total "$N" put --sequential-keys --key-space "$N" --prefix /registry/leases/kube-node-lease/ \
        --key-size 48 --val-size 300)
    else
      out=$(timeout 600 "$BENCH" --endpoints "127.0.0.1:$PORT" --json --no-progress --clients "$CLIENTS" \
        --total "$N" event-churn --watchers 0 --val-size 700 --ttl 3660)
    fi
    raw=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(r.get("ops",0)*(r.get("key_size",0)+r.get("val_size",0)))' "$out")
    sleep 1
    rss_hist=$(rss_kb "$PID")
    rev=$("$REFS/etcdctl-3.6" --endpoints="127.0.0.1:$PORT" endpoint status -w json |
      python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["Status"]["header"]["revision"])')
    "$REFS/etcdctl-3.6" --endpoints="127.0.0.1:$PORT" --command-timeout=120s compact "$rev" --physical >/dev/null
    sleep 3
    rss=$(rss_kb "$PID"); hwm=$(hwm_kb "$PID")
    python3 - "$shape" "$server" "$N" "$raw" "$base" "$rss" "$hwm" "$rss_hist" <<'PY'
import sys
shape, server = sys.argv[1], sys.argv[2]
n, raw, base, rss, hwm, hist = (int(x) for x in sys.argv[3:9])
grown = (rss - base) * 1024
print(f"| {shape} | {server} | {n:,} | {raw/1e6:,.0f} | {hist/1024:,.0f} | {rss/1024:,.0f} | {hwm/1024:,.0f} | {grown/raw:.2f}x | {grown/n:,.0f} |")
PY
    kill "$PID"; wait "$PID" 2>/dev/null || true
  done
done
