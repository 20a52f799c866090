#!/usr/bin/env bash
# Compares two ephd server builds with one load-tool binary: alternating
# runs of the put and lease-heartbeat workloads, medians of the undisturbed
# runs among ROUNDS (other processes under 10% of the CPUs).
# For checking that a change does not cost throughput ("no regression").
#
#   bench/before-after.sh OLD_EPHD NEW_EPHD EPHD_BENCH [OUT_DIR]
#
# Environment: ROUNDS (3), PUT_TOTAL (100000), HB_TOTAL (50000), PORT (23790).
# Loopback only; each server is started here and stopped by its own PID.
set -euo pipefail
old=${1:?old ephd binary}
new=${2:?new ephd binary}
tool=${3:?ephd-bench binary}
out=${4:-/tmp/ephd-bench-results/before-after-$(date -u +%Y%m%d-%H%M%S)}
rounds=${ROUNDS:-3}
port=${PORT:-23790}
mkdir -p "$out"
server_pid=""
stop_server() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
trap stop_server EXIT
run_case() { # label binary workload args...
  local label=$1 bin=$2 workload=$3
  shift 3
  "$bin" --listen-client-urls "http://127.0.0.1:$port" --name "before-after-$label" \
    --log-level warn >"$out/$label.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 100); do
    if "$tool" --endpoints "127.0.0.1:$port" --total 1 put >/dev/null 2>&1; then break; fi
    sleep 0.1
  done
  "$tool" --endpoints "127.0.0.1:$port" --server-pid "$server_pid" --json --label "$label" \
    "$workload" "$@" >>"$out/results.jsonl"
  stop_server
}
for round in $(seq "$rounds"); do
  for side in old new; do
    bin=$old
    [ "$side" = new ] && bin=$new
    echo "round $round: $side put" >&2
    run_case "$side" "$bin" put --total "${PUT_TOTAL:-100000}"
    echo "round $round: $side lease-heartbeat" >&2
    run_case "$side" "$bin" lease-heartbeat --total "${HB_TOTAL:-50000}"
  done
done
python3 - "$out/results.jsonl" <<'PY'
import json, statistics, sys
# Runs during which other processes used over 10% of the CPUs were
# disturbed (bench/README.md); they are left out of the medians.
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
quiet = [r for r in rows if (r.get("other_cpu_frac") or 0) <= 0.1]
def med(label, workload, field):
    v = [r[field] for r in quiet if r.get("label") == label and r.get("workload") == workload and r.get(field) is not None]
    return (statistics.median(v) if v else float("nan")), len(v)
print("| workload | old ops/s | new ops/s | new/old | old server µs/op | new server µs/op | quiet runs old/new |")
print("|---|---|---|---|---|---|---|")
for w in sorted({r["workload"] for r in rows}):
    (o, no), (n, nn) = med("old", w, "ops_per_s"), med("new", w, "ops_per_s")
    (oc, _), (nc, _) = med("old", w, "server_cpu_us_per_op"), med("new", w, "server_cpu_us_per_op")
    print(f"| {w} | {o:,.0f} | {n:,.0f} | {n/o:.3f} | {oc:.1f} | {nc:.1f} | {no}/{nn} |")
PY
