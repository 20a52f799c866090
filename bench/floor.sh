#!/usr/bin/env bash
# Put latency against the machine's floor: the same client (ephd-bench put,
# 100 clients, 10 connections, 1 KiB values, open-loop --rate) at the same
# rates against grpc-floor (etcd's KV service answering without a store, on
# the same tonic/hyper/h2 stack as ephd), ephd and stock etcd 3.6.
#
# 1. Peaks: ephd and etcd 3.6 at full speed (--rate 0), REPEATS each.
# 2. At half of ephd's median peak: the floor, ephd and etcd 3.6.
# 3. At a quarter of etcd's median peak: the floor, ephd and etcd 3.6.
# Every run has a fresh server; the servers alternate within each step.
# etcd's data dir is on tmpfs (/dev/shm), its most favourable disk.
# Prints one Markdown table of medians (delivered ops/s, p50, p99, p99.9,
# server CPU per op) and the ratios BENCHMARKS.md quotes. Writes nothing
# into the repository; raw JSON lines go to $OUT (printed at the end).
#
# Environment:
#   REPEATS=3        runs per server and step
#   DURATION=5s      length of each run
#   CLIENTS=100 CONNS=10
#   EPHD, EPHD_BENCH, GRPC_FLOOR   binaries (default target/release/...)
#   EPHD_REFERENCES  where scripts/install-references.sh put etcd-3.6
# Stops by itself: every run is bounded by --duration and --max-time.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPEATS=${REPEATS:-3}
DURATION=${DURATION:-5s}
CLIENTS=${CLIENTS:-100}
CONNS=${CONNS:-10}
EPHD=${EPHD:-$ROOT/target/release/ephd}
BENCH=${EPHD_BENCH:-$ROOT/target/release/ephd-bench}
FLOOR=${GRPC_FLOOR:-$ROOT/target/release/grpc-floor}
REFS=${EPHD_REFERENCES:-$HOME/.cache/ephd/references}/bin
ETCD=$REFS/etcd-3.6

for bin in "$EPHD" "$BENCH" "$FLOOR"; do
  [[ -x $bin ]] || { echo "floor.sh: missing $bin (cargo build --release --workspace)" >&2; exit 1; }
done
[[ -x $ETCD ]] || { echo "floor.sh: missing $ETCD (scripts/install-references.sh)" >&2; exit 1; }

read -r CLIENT_PORT PEER_PORT <<<"$(python3 "$ROOT/bench/free_ports.py" 2)"
ENDPOINT=127.0.0.1:$CLIENT_PORT
OUT=$(mktemp -d /tmp/ephd-floor.XXXXXX)
DATA=$(mktemp -d /dev/shm/ephd-floor.XXXXXX)
# shellcheck source=bench/single_server.sh
source "$ROOT/bench/single_server.sh"
cleanup() {
  stop_server
  rm -rf "$DATA"
}
trap cleanup EXIT

log() { echo "[floor] $*" >&2; }

run() { # step server rate repeat
  local line=""
  log "step $1: $2 at rate $3 (repeat $4)"
  if start_server "$2"; then
    line=$("$BENCH" put --endpoints "$ENDPOINT" --clients "$CLIENTS" --conns "$CONNS" \
      --duration "$DURATION" --max-time 60s --rate "$3" --server-pid "$SERVER_PID" \
      --json --no-progress | tail -1) || true
  fi
  stop_server
  # A run without a report is left out of the medians (and said so).
  python3 -c 'import json,sys
try:
    d = json.loads(sys.argv[1])
except ValueError:
    sys.exit(print(f"[floor] {sys.argv[3]} at rate {sys.argv[4]}: no report", file=sys.stderr))
d.update(step=sys.argv[2], server=sys.argv[3], target=float(sys.argv[4]))
print(json.dumps(d))' "$line" "$1" "$2" "$3" >>"$OUT/runs.jsonl"
}

median_rate() { # step server
  python3 - "$OUT/runs.jsonl" "$1" "$2" <<'PY'
import json, statistics, sys
path, step, server = sys.argv[1:]
rates = [d["ops_per_s"] for d in map(json.loads, open(path)) if d["step"] == step and d["server"] == server]
if not rates:
    sys.exit(f"[floor] no {server} run of step {step} reported: nothing to take a rate from")
print(int(statistics.median(rates)))
PY
}

alternate() { # step rate servers...
  local step=$1 rate=$2 repeat i n
  shift 2
  local servers=("$@")
  n=${#servers[@]}
  for repeat in $(seq "$REPEATS"); do
    for i in $(seq 0 $((n - 1))); do
      run "$step" "${servers[$(((i + repeat) % n))]}" "$rate" "$repeat"
    done
  done
}

alternate peak 0 ephd etcd-3.6
EPHD_PEAK=$(median_rate peak ephd)
ETCD_PEAK=$(median_rate peak etcd-3.6)
HALF=$((EPHD_PEAK / 2))
QUARTER=$((ETCD_PEAK / 4))
log "peaks: ephd $EPHD_PEAK/s, etcd-3.6 $ETCD_PEAK/s; rates: $HALF/s and $QUARTER/s"
alternate half "$HALF" floor ephd etcd-3.6
alternate quarter "$QUARTER" floor ephd etcd-3.6

python3 - "$OUT/runs.jsonl" "$CLIENTS" "$CONNS" "$REPEATS" <<'PY'
import json, statistics, sys
path, clients, conns, repeats = sys.argv[1:]
runs = [json.loads(l) for l in open(path)]
med = lambda xs: statistics.median(xs) if xs else float("nan")
def cell(step, server, key):
    return med([r[key] for r in runs if r["step"] == step and r["server"] == server and r.get(key) is not None])
def cpu(step, server):
    xs = [r["server_cpu_s"] / r["ops"] * 1e6 for r in runs
          if r["step"] == step and r["server"] == server and r.get("server_cpu_s") and r["ops"]]
    return med(xs)
print(f"put, 1 KiB values, {clients} clients on {conns} connections; medians of {repeats} runs\n")
print("| step | server | asked ops/s | delivered ops/s | p50 ms | p99 ms | p99.9 ms | server CPU µs/op |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for step, servers in (("peak", ("ephd", "etcd-3.6")), ("half", ("floor", "ephd", "etcd-3.6")), ("quarter", ("floor", "ephd", "etcd-3.6"))):
    for s in servers:
        target = cell(step, s, "target")
        asked = "as fast as it can" if target == 0 else f"{target:,.0f}"
        print(f"| {step} | {s} | {asked} | {cell(step, s, 'ops_per_s'):,.0f} | {cell(step, s, 'lat_p50_ms'):.2f} | "
              f"{cell(step, s, 'lat_p99_ms'):.2f} | {cell(step, s, 'lat_p999_ms'):.2f} | {cpu(step, s):.1f} |")
p99 = lambda step, s: cell(step, s, "lat_p99_ms")
print()
print(f"- half of ephd's peak: ephd p99 / floor p99 = {p99('half', 'ephd') / p99('half', 'floor'):.2f}; "
      f"etcd-3.6 delivered {cell('half', 'etcd-3.6', 'ops_per_s'):,.0f} of {cell('half', 'ephd', 'target'):,.0f} asked")
print(f"- ephd p99 at half its peak / etcd-3.6 p99 at a quarter of its peak = "
      f"{p99('half', 'ephd') / p99('quarter', 'etcd-3.6'):.2f}")
print(f"- a quarter of etcd's peak: ephd p99 / floor p99 = {p99('quarter', 'ephd') / p99('quarter', 'floor'):.2f}, "
      f"etcd-3.6 p99 / floor p99 = {p99('quarter', 'etcd-3.6') / p99('quarter', 'floor'):.2f}")
PY
log "raw runs: $OUT/runs.jsonl"
