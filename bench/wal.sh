#!/usr/bin/env bash
# What the write-ahead log costs: ephd with --wal none, buffered and fsync
# and stock etcd 3.6, side by side, each with its data directory on the
# same disk, under ephd-bench's put (100 clients, 1 KiB values) and
# lease-heartbeat workloads.
#
# Every run gets a fresh server and data directory; the order of the
# servers rotates every repeat. Prints one Markdown table of medians (put/s,
# server CPU per put, heartbeat p99) with the ratios the BENCHMARKS.md
# section quotes. Writes nothing into the repository.
#
# Environment:
#   REPEATS=3        runs per server and workload
#   TOTAL=100000     ops per run
#   CLIENTS=100      put clients
#   DISK_DIR=/var/tmp   where the data directories go: a disk, not tmpfs
#   SERVERS="ephd-none ephd-buffered ephd-fsync etcd-3.6"
#   EPHD, EPHD_BENCH, EPHD_REFERENCES as in compare.sh
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPEATS=${REPEATS:-3}
TOTAL=${TOTAL:-100000}
CLIENTS=${CLIENTS:-100}
DISK_DIR=${DISK_DIR:-/var/tmp}
SERVERS=${SERVERS:-ephd-none ephd-buffered ephd-fsync etcd-3.6}
EPHD=${EPHD:-$ROOT/target/release/ephd}
BENCH=${EPHD_BENCH:-$ROOT/target/release/ephd-bench}
REFS=${EPHD_REFERENCES:-$HOME/.cache/ephd/references}/bin
PORTS=$(python3 "$ROOT/bench/free_ports.py" 2)
CLIENT_PORT=${PORTS%% *}
PEER_PORT=${PORTS##* }

if [[ $(stat -f -c %T "$DISK_DIR") == tmpfs ]]; then
  echo "DISK_DIR=$DISK_DIR is tmpfs: the log must go to a disk" >&2
  exit 1
fi
for bin in "$EPHD" "$BENCH"; do
  [[ -x $bin ]] || { echo "missing $bin: cargo build --release" >&2; exit 1; }
done
if [[ $SERVERS == *etcd-3.6* && ! -x $REFS/etcd-3.6 ]]; then
  echo "missing $REFS/etcd-3.6: scripts/install-references.sh" >&2
  exit 1
fi

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
ENDPOINT=127.0.0.1:$CLIENT_PORT

start() { # server datadir; sets SERVER_PID
  local url=http://$ENDPOINT
  case $1 in
    ephd-*)
      "$EPHD" --data-dir "$2" --wal "${1#ephd-}" --listen-client-urls "$url" \
        --advertise-client-urls "$url" >"$OUT/server.log" 2>&1 &
      ;;
    etcd-3.6)
      "$REFS/etcd-3.6" --data-dir "$2" --listen-client-urls "$url" \
        --advertise-client-urls "$url" \
        --listen-peer-urls "http://127.0.0.1:$PEER_PORT" \
        --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
        --initial-cluster "default=http://127.0.0.1:$PEER_PORT" \
        >"$OUT/server.log" 2>&1 &
      ;;
  esac
  SERVER_PID=$!
}

ready() {
  for _ in $(seq 100); do
    "$BENCH" put --endpoints "$ENDPOINT" --total 1 --clients 1 --conns 1 \
      --no-progress >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server did not come up:" >&2
  cat "$OUT/server.log" >&2
  return 1
}

run() { # workload server repeat
  local dir pid
  dir=$(mktemp -d "$DISK_DIR/ephd-wal-bench.XXXXXX")
  start "$2" "$dir"
  pid=$SERVER_PID
  ready
  case $1 in
    put)
      "$BENCH" put --endpoints "$ENDPOINT" --clients "$CLIENTS" --total "$TOTAL" \
        --server-pid "$pid" --json --no-progress
      ;;
    heartbeat)
      "$BENCH" lease-heartbeat --endpoints "$ENDPOINT" --total "$TOTAL" \
        --server-pid "$pid" --json --no-progress
      ;;
  esac | tail -1 | python3 -c 'import json,sys; r=json.load(sys.stdin); r.update(workload=sys.argv[1], server=sys.argv[2], repeat=int(sys.argv[3])); print(json.dumps(r))' "$1" "$2" "$3" >>"$OUT/runs.jsonl"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
}

read -r -a servers <<<"$SERVERS"
for repeat in $(seq "$REPEATS"); do
  for workload in put heartbeat; do
    n=${#servers[@]}
    for i in $(seq 0 $((n - 1))); do
      server=${servers[$(((i + repeat) % n))]}
      echo "[wal] repeat $repeat $workload $server" >&2
      run "$workload" "$server" "$repeat"
    done
  done
done

python3 - "$OUT/runs.jsonl" "$SERVERS" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
servers = sys.argv[2].split()
def med(workload, server, key):
    vals = [r[key] for r in runs if r["workload"] == workload and r["server"] == server and not r.get("errors")]
    return statistics.median(vals) if vals else float("nan")
print(f"put: {runs[0]['clients']} clients, {runs[0]['val_size']} B values; medians of {max(r['repeat'] for r in runs)} runs\n")
print("| server | put/s | server CPU µs/put | heartbeat/s | heartbeat p99 ms |")
print("|---|---:|---:|---:|---:|")
for s in servers:
    print(f"| {s} | {med('put', s, 'ops_per_s'):,.0f} | {med('put', s, 'server_cpu_us_per_op'):.1f} | "
          f"{med('heartbeat', s, 'ops_per_s'):,.0f} | {med('heartbeat', s, 'lat_p99_ms'):.1f} |")
def ratio(a, b, key="ops_per_s", workload="put"):
    return med(workload, a, key) / med(workload, b, key)
print()
if "ephd-buffered" in servers and "ephd-none" in servers:
    print(f"- buffered / none: put/s {ratio('ephd-buffered', 'ephd-none'):.2f}, "
          f"CPU per put {ratio('ephd-buffered', 'ephd-none', 'server_cpu_us_per_op'):.2f}, "
          f"heartbeat p99 {ratio('ephd-buffered', 'ephd-none', 'lat_p99_ms', 'heartbeat'):.2f}")
if "ephd-fsync" in servers and "etcd-3.6" in servers:
    print(f"- fsync / etcd 3.6 on the same disk: put/s {ratio('ephd-fsync', 'etcd-3.6'):.2f}, "
          f"heartbeat/s {ratio('ephd-fsync', 'etcd-3.6', workload='heartbeat'):.2f}")
PY
