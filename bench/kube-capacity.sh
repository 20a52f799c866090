#!/usr/bin/env bash
# End-to-end capacity through a real kube-apiserver: N nodes renewing their
# Lease every INTERVAL and an Event stream of EVENTS_PER_S, driven with
# client-go (tests/go/kube-driver, scenario "load"), on three stores side by
# side in the same run:
#
#   etcd   everything on stock etcd 3.6
#   ephd   etcd 3.6, with Events and Leases on ephd (--etcd-servers-overrides)
#   kine   etcd 3.6, with Events and Leases on kine's memory driver
#
# For each N in NODES and each system (alternating system by system, REPEAT
# rounds) it starts the stores and kube-apiserver 1.35 afresh, creates the
# Leases, then renews for DURATION seconds and prints one line: renewals,
# failures, latency p50/p99/max, the longest gap between acknowledged
# renewals, CPU seconds per 1000 renewals of the apiserver and of the
# override store (the store itself for "etcd"), and the override store's
# resident memory at the end. A system "holds" N when every renewal
# succeeded and p99 stayed under 1 s.
#
# Timescale: INTERVAL defaults to 1 s instead of the kubelet's 10 s, so N
# nodes here load the apiserver like 10 N real ones.
#
# Loopback only, ports of its own, etcd's data dir on /dev/shm, every wait
# bounded; on exit it stops only the processes it started.
#
# Environment: NODES ("250 500 1000 2000"), INTERVAL (1s), EVENTS_PER_S
#   (50), DURATION (20s), REPEAT (2), SYSTEMS ("etcd ephd kine"), BUILD (1:
#   cargo build --release first), EPHD (target/release/ephd).
# Needs the references of scripts/install-references.sh (run here).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NODES=${NODES:-250 500 1000 2000}
INTERVAL=${INTERVAL:-1s}
EVENTS_PER_S=${EVENTS_PER_S:-50}
DURATION=${DURATION:-20s}
REPEAT=${REPEAT:-2}
SYSTEMS=${SYSTEMS:-etcd ephd kine}
BUILD=${BUILD:-1}
TGT=${CARGO_TARGET_DIR:-$ROOT/target}
EPHD=${EPHD:-$TGT/release/ephd}
REFS=${EPHD_REFERENCES:-$HOME/.cache/ephd/references}/bin

log() { printf '[kube-capacity %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

bash "$ROOT/scripts/install-references.sh" >&2
if [[ $BUILD == 1 ]]; then
  log "building the release binary"
  (cd "$ROOT" && timeout 3600 cargo build --release -p ephd) >&2
fi
[[ -x $EPHD ]] || { echo "ephd not found at $EPHD" >&2; exit 1; }

WORK=$(mktemp -d /dev/shm/ephd-kube-capacity.XXXXXX)
PIDS=()
stop_all() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  PIDS=()
}
trap 'stop_all; rm -rf "$WORK"' EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

wait_port() { # port what
  for _ in $(seq 1 200); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "$2 never listened on $1" >&2
  exit 1
}

# CPU seconds (user + system) a process has used so far.
cpu_seconds() {
  awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"
}

rss_mib() { awk '/VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$1/status"; }

openssl genrsa -out "$WORK/sa.key" 2048 2>/dev/null
echo "bench-token,admin,admin,system:masters" >"$WORK/tokens.csv"

# run_one SYSTEM NODES: prints the result line.
run_one() {
  local system=$1 nodes=$2
  local dir="$WORK/$system-$nodes-$RANDOM"
  mkdir -p "$dir"
  local etcd_port peer_port store_port api_port
  etcd_port=$(free_port); peer_port=$(free_port); store_port=$(free_port); api_port=$(free_port)
  "$REFS/etcd-3.6" --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "default=http://127.0.0.1:$peer_port" --log-level error >"$dir/etcd.log" 2>&1 &
  local etcd_pid=$!
  PIDS+=("$etcd_pid")
  wait_port "$etcd_port" etcd
  local store_pid=$etcd_pid overrides=()
  case $system in
    ephd)
      "$EPHD" --listen-client-urls "http://127.0.0.1:$store_port" \
        --advertise-client-urls "http://127.0.0.1:$store_port" --log-level warn >"$dir/store.log" 2>&1 &
      store_pid=$!
      ;;
    kine)
      "$REFS/kine" --endpoint memory:// --listen-address "127.0.0.1:$store_port" \
        --metrics-bind-address 0 >"$dir/store.log" 2>&1 &
      store_pid=$!
      ;;
  esac
  if [[ $system != etcd ]]; then
    PIDS+=("$store_pid")
    wait_port "$store_port" "$system"
    local url="http://127.0.0.1:$store_port"
    overrides=("--etcd-servers-overrides=/events#$url,coordination.k8s.io/leases#$url")
  fi
  "$REFS/kube-apiserver-1.35" --etcd-servers="http://127.0.0.1:$etcd_port" "${overrides[@]}" \
    --secure-port "$api_port" --bind-address 127.0.0.1 --advertise-address 127.0.0.1 \
    --endpoint-reconciler-type=none --cert-dir "$dir/certs" --token-auth-file "$WORK/tokens.csv" \
    --authorization-mode AlwaysAllow --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$WORK/sa.key" --service-account-signing-key-file "$WORK/sa.key" \
    --service-cluster-ip-range 10.0.0.0/24 --max-requests-inflight 4000 \
    --max-mutating-requests-inflight 2000 >"$dir/apiserver.log" 2>&1 &
  local api_pid=$!
  PIDS+=("$api_pid")
  local driver=("$REFS/kube-driver" -server "https://127.0.0.1:$api_port" -token bench-token)
  timeout 120 "${driver[@]}" -scenario ready -timeout 100s >/dev/null
  local api_cpu store_cpu out
  api_cpu=$(cpu_seconds "$api_pid"); store_cpu=$(cpu_seconds "$store_pid")
  out=$(timeout 600 "${driver[@]}" -scenario load -nodes "$nodes" -interval "$INTERVAL" \
    -events-per-s "$EVENTS_PER_S" -duration "$DURATION" | grep '"step":"load"')
  api_cpu=$(awk -v a="$(cpu_seconds "$api_pid")" -v b="$api_cpu" 'BEGIN {print a - b}')
  store_cpu=$(awk -v a="$(cpu_seconds "$store_pid")" -v b="$store_cpu" 'BEGIN {print a - b}')
  local rss
  rss=$(rss_mib "$store_pid")
  stop_all
  OUT="$out" SYSTEM="$system" API_CPU="$api_cpu" STORE_CPU="$store_cpu" RSS="$rss" python3 - <<'EOF'
import json, os
r = json.loads(os.environ["OUT"])
n = max(r["renewals"], 1)
holds = r["failed"] == 0 and r["p99_ms"] < 1000
print(f'{os.environ["SYSTEM"]:5} nodes={r["nodes"]:5} renewals={r["renewals"]:6} failed={r["failed"]:4} '
      f'p50={r["p50_ms"]:7.1f}ms p99={r["p99_ms"]:7.1f}ms max={r["max_ms"]:7.1f}ms '
      f'stall={r["longest_stall_ms"]:7.1f}ms events={r["events"]:5} '
      f'apiserver_cpu_s_per_1k={1000 * float(os.environ["API_CPU"]) / n:6.3f} '
      f'store_cpu_s_per_1k={1000 * float(os.environ["STORE_CPU"]) / n:6.3f} '
      f'store_rss_mib={os.environ["RSS"]:>5} holds={"yes" if holds else "no"}', flush=True)
EOF
}

log "nodes: $NODES; interval $INTERVAL; events/s $EVENTS_PER_S; duration $DURATION; repeat $REPEAT"
for nodes in $NODES; do
  for round in $(seq 1 "$REPEAT"); do
    for system in $SYSTEMS; do
      log "round $round: $system with $nodes nodes"
      run_one "$system" "$nodes"
    done
  done
done
