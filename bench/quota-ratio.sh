#!/usr/bin/env bash
# Accounted memory (what the stored data's memory bound limits, exported as
# ephd_store_memory_bytes) against the real memory it stands for: ephd's RSS
# growth.
#
# For each shape it starts a fresh release ephd on loopback (quota off, so
# nothing is refused), loads it with ephd-bench, and prints one Markdown row:
# RSS growth over the empty server, accounted bytes, and their ratio (below
# 1.0 means the quota over-counts, the safe side). Shapes:
#   lease     N node-Lease-like objects, 1 version each, 300-byte values
#   event     N Event-like objects with a lease per 1000, 700-byte values
#   history   N puts of 300-byte values over N/10 keys: 10 versions a key
# Env: N (default 500000), CLIENTS (100). Bounded: each load has a
# 10-minute limit; the servers it started are killed on exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N=${N:-500000}
CLIENTS=${CLIENTS:-100}
cargo build --release -p ephd -p ephd-bench >/dev/null
EPHD=${EPHD:-target/release/ephd}
BENCH=target/release/ephd-bench
PID=
cleanup() { [[ -n $PID ]] && kill "$PID" 2>/dev/null || true; }
trap cleanup EXIT

free_port() { python3 bench/free_ports.py; } # below the ephemeral range
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }

echo "| shape | objects | versions | RSS growth MB | accounted MB | RSS / accounted |"
echo "|---|---:|---:|---:|---:|---:|"
for shape in lease event history; do
  PORT=$(free_port)
  "$EPHD" --listen-client-urls "http://127.0.0.1:$PORT" --quota-backend-bytes -1 --log-level warn >/dev/null 2>&1 &
  PID=$!
  wait_port "$PORT"
  sleep 0.5
  base=$(rss_kb "$PID")
  case $shape in
    lease)
      timeout 600 "$BENCH" --endpoints "127.0.0.1:$PORT" --json --no-progress --clients "$CLIENTS" \
        --total "$N" put --sequential-keys --key-space "$N" --prefix /registry/leases/kube-node-lease/ \
        --key-size 48 --val-size 300 >/dev/null ;;
    event)
      timeout 600 "$BENCH" --endpoints "127.0.0.1:$PORT" --json --no-progress --clients "$CLIENTS" \
        --total "$N" event-churn --watchers 0 --val-size 700 --ttl 3660 >/dev/null ;;
    history)
      timeout 600 "$BENCH" --endpoints "127.0.0.1:$PORT" --json --no-progress --clients "$CLIENTS" \
        --total "$N" put --sequential-keys --key-space $((N / 10)) --prefix /registry/leases/kube-node-lease/ \
        --key-size 48 --val-size 300 >/dev/null ;;
  esac
  sleep 2
  rss=$(rss_kb "$PID")
  db=$(python3 -c '
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
print(next(l.split()[1] for l in text.splitlines() if l.startswith("ephd_store_memory_bytes ")))' "$PORT")
  python3 - "$shape" "$N" "$base" "$rss" "$db" <<'PY'
import sys
shape, n, base, rss, db = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
grown = (rss - base) * 1024
print(f"| {shape} | {n if shape != 'history' else n // 10:,} | {n:,} | {grown/1e6:,.0f} | {db/1e6:,.0f} | {grown/db:.2f} |")
PY
  kill "$PID"; wait "$PID" 2>/dev/null || true
  PID=
done
