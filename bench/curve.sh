#!/usr/bin/env bash
# The cost curve: how a single member's throughput, tail latency, CPU per op
# and memory per object move as it holds more Kubernetes-shaped objects,
# ephd beside stock etcd 3.6 at every size etcd is run at.
#
# For each object count N (SIZES) and server, on a fresh server:
#   1. load: N node Lease objects (the apiserver's create txn, 300 B
#      values) with ephd-bench lease-heartbeat; then the server's resident
#      set per object, against the raw key+value bytes;
#   2. renewals: DURATION of the apiserver's Lease update (CAS txn) over
#      all N objects, with a checking prefix watch: renewals/s, p99, server
#      CPU per renewal;
#   3. for N in LIST_SIZES: a paged list (500 per page, pages pinned to the
#      first page's revision, as the apiserver's) of N more 1 KiB objects
#      under a prefix of their own (ephd-bench range), LISTS times: list p50.
# Servers alternate at every size; etcd's data dir is on tmpfs (/dev/shm).
# Prints a Markdown table of medians, writes the two figures
# (throughput and memory per object against N) as SVG into FIGURES when it
# is set, and keeps the raw JSON lines in a temporary directory it names.
#
# Environment:
#   SIZES="10000 100000 1000000"   object counts (5000000 fits the 8 GiB quota)
#   ETCD_MAX=1000000      largest N etcd is run at (its load takes minutes)
#   LIST_SIZES="100000 1000000"
#   REPEATS=1 DURATION=10s LISTS=3 CLIENTS=100
#   SERVERS="ephd etcd-3.6"
#   FIGURES=<dir>         where to write curve-throughput.svg and curve-memory.svg
#   SPACE_QUOTA_BYTES=8589934592   both servers' --quota-backend-bytes (single_server.sh)
#   EPHD, EPHD_BENCH, EPHD_REFERENCES as in the other scripts
# Stops by itself: every phase is bounded by --max-time.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SIZES=${SIZES:-10000 100000 1000000}
ETCD_MAX=${ETCD_MAX:-1000000}
LIST_SIZES=${LIST_SIZES:-100000 1000000}
REPEATS=${REPEATS:-1}
DURATION=${DURATION:-10s}
LISTS=${LISTS:-3}
CLIENTS=${CLIENTS:-100}
SERVERS=${SERVERS:-ephd etcd-3.6}
FIGURES=${FIGURES:-}
EPHD=${EPHD:-$ROOT/target/release/ephd}
BENCH=${EPHD_BENCH:-$ROOT/target/release/ephd-bench}
REFS=${EPHD_REFERENCES:-$HOME/.cache/ephd/references}/bin
ETCD=$REFS/etcd-3.6

for bin in "$EPHD" "$BENCH"; do
  [[ -x $bin ]] || { echo "curve.sh: missing $bin (cargo build --release --workspace)" >&2; exit 1; }
done
if [[ $SERVERS == *etcd-3.6* && ! -x $ETCD ]]; then
  echo "curve.sh: missing $ETCD (scripts/install-references.sh)" >&2
  exit 1
fi

read -r CLIENT_PORT PEER_PORT <<<"$(python3 "$ROOT/bench/free_ports.py" 2)"
ENDPOINT=127.0.0.1:$CLIENT_PORT
OUT=$(mktemp -d /tmp/ephd-curve.XXXXXX)
DATA=$(mktemp -d /dev/shm/ephd-curve.XXXXXX)
# shellcheck source=bench/single_server.sh
source "$ROOT/bench/single_server.sh"
cleanup() {
  stop_server
  rm -rf "$DATA"
}
trap cleanup EXIT

log() { echo "[curve] $*" >&2; }
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

# Appends the tool's JSON line with what it was, or a failure record.
record() { # phase server n repeat rc json extra-json
  python3 - "$@" >>"$OUT/runs.jsonl" <<'PY'
import json, sys
phase, server, n, repeat, rc, line, extra = sys.argv[1:8]
try:
    d = json.loads(line)
except Exception:
    d = {"failed": True}
if int(rc) not in (0, 3):
    d["failed"] = True
d.update(json.loads(extra or "{}"))
d.update(phase=phase, server=server, objects=int(n), repeat=int(repeat), rc=int(rc))
print(json.dumps(d))
PY
}

one() { # server n repeat
  local server=$1 n=$2 repeat=$3 base rss line rc
  # A server that does not start is a failed run, as in floor.sh, not the end of the script.
  if ! start_server "$server"; then
    record start "$server" "$n" "$repeat" 1 "" ""
    stop_server
    return 0
  fi
  base=$(rss_kb "$SERVER_PID")
  log "$server, $n objects (repeat $repeat): load"
  rc=0
  line=$("$BENCH" lease-heartbeat --endpoints "$ENDPOINT" --nodes "$n" --clients "$CLIENTS" \
    --total 1 --watchers 0 --max-time 20m --json --no-progress | tail -1) || rc=$?
  rss=$(rss_kb "$SERVER_PID")
  record load "$server" "$n" "$repeat" "$rc" "$line" "{\"rss_base_kb\": $base, \"rss_kb\": $rss}"
  log "$server, $n objects: renewals for $DURATION"
  rc=0
  line=$("$BENCH" lease-heartbeat --endpoints "$ENDPOINT" --nodes "$n" --clients "$CLIENTS" \
    --duration "$DURATION" --max-time 20m --server-pid "$SERVER_PID" --json --no-progress | tail -1) || rc=$?
  record renew "$server" "$n" "$repeat" "$rc" "$line" ""
  if [[ " $LIST_SIZES " == *" $n "* ]]; then
    log "$server, $n objects: paged lists of $n more"
    rc=0
    line=$("$BENCH" range --endpoints "$ENDPOINT" --objects "$n" --page-size 500 --clients 1 \
      --total "$LISTS" --max-time 20m --server-pid "$SERVER_PID" --json --no-progress | tail -1) || rc=$?
    record list "$server" "$n" "$repeat" "$rc" "$line" ""
  fi
  stop_server
}

read -r -a servers <<<"$SERVERS"
for repeat in $(seq "$REPEATS"); do
  for n in $SIZES; do
    count=${#servers[@]}
    for i in $(seq 0 $((count - 1))); do
      server=${servers[$(((i + repeat) % count))]}
      if [[ $server == etcd-* && $n -gt $ETCD_MAX ]]; then
        continue
      fi
      one "$server" "$n" "$repeat"
    done
  done
done

python3 "$ROOT/bench/curve_report.py" "$OUT/runs.jsonl" ${FIGURES:+"$FIGURES"}
log "raw runs: $OUT/runs.jsonl"
