#!/usr/bin/env bash
# Instructions ephd executes per request, by RPC kind: a measure of CPU per
# request that a busy or noisy machine does not move, so it compares commit
# to commit where timings cannot. (Stock etcd cannot be measured this way:
# the Go runtime crashes under valgrind. bench/compare.sh has CPU seconds
# per request for both.)
#
# ephd (target/release/ephd) runs under valgrind's callgrind, which counts
# every instruction it executes in all threads, twice per kind: once
# serving N requests, once 3N, each time fresh. (Ir(3N) - Ir(N)) / 2N is
# then the instructions per request with start-up, shutdown and idle time
# cancelled out. Load comes from etcd's own benchmark tool 3.6, one client
# on one connection, so requests arrive one at a time. Counts are exact for
# a run; they move a little between runs with scheduling (batching,
# timers), so each figure is the median of REPEATS.
#
# Environment:
#   N=2000         requests of the smaller run (the larger is 3N)
#   REPEATS=3      runs per server and kind (the median is reported)
#   KINDS="put range range-serializable txn-put lease-keepalive"
#   BUILD=1        cargo build --release first (0: use target/release/ephd)
#   EPHD_REFERENCES   where scripts/install-references.sh put etcdctl and the
#                  benchmark tool (default
#                  ~/.cache/ephd/references/bin)
# Prints a Markdown table; raw counts go to /tmp/ephd-instructions/.
# Stops by itself: every server and client run is bounded (RUN_TIMEOUT=600 s).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
N=${N:-2000}
REPEATS=${REPEATS:-3}
KINDS=${KINDS:-"put range range-serializable txn-put lease-keepalive"}
BUILD=${BUILD:-1}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
REFS=${EPHD_REFERENCES:-$HOME/.cache/ephd/references/bin}
OUT=/tmp/ephd-instructions
mkdir -p "$OUT"

command -v valgrind >/dev/null || { echo "instructions.sh: valgrind is required (apt-get install valgrind)" >&2; exit 1; }
for tool in etcdctl-3.6 benchmark-3.6; do
  [[ -x $REFS/$tool ]] || { echo "instructions.sh: $REFS/$tool missing (run scripts/install-references.sh)" >&2; exit 1; }
done
if [[ $BUILD == 1 ]]; then
  (cd "$ROOT" && cargo build --release --bin ephd)
fi
EPHD=${EPHD:-$ROOT/target/release/ephd}
[[ -x $EPHD ]] || { echo "instructions.sh: $EPHD missing (BUILD=1 builds it)" >&2; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Starts ephd under callgrind on a fresh port; sets PID, PORT, CG_OUT.
start() {
  PORT=$(free_port)
  CG_OUT=$(mktemp "$OUT/callgrind.ephd.XXXXXX")
  local cmd=("$EPHD" --listen-client-urls "http://127.0.0.1:$PORT" --log-level warn)
  timeout "$RUN_TIMEOUT" valgrind --tool=callgrind --callgrind-out-file="$CG_OUT" \
    --dump-instr=no --compress-strings=no "${cmd[@]}" >"$CG_OUT.log" 2>&1 &
  PID=$!
  local deadline=$((SECONDS + 120))
  until "$REFS/etcdctl-3.6" --endpoints="127.0.0.1:$PORT" --command-timeout=2s endpoint health >/dev/null 2>&1; do
    if ((SECONDS > deadline)) || ! kill -0 "$PID" 2>/dev/null; then
      echo "instructions.sh: ephd did not start; log: $CG_OUT.log" >&2
      exit 1
    fi
    sleep 0.5
  done
}

# Stops ephd (SIGTERM, as an operator does) and prints its total
# instruction count.
stop() {
  kill -TERM "$PID" 2>/dev/null || true
  # valgrind passes SIGTERM on; ephd exits, callgrind writes its file.
  wait "$PID" 2>/dev/null || true
  awk '/^(summary|totals):/ {print $2; exit}' "$CG_OUT"
}

# Sends $2 requests of kind $1 to 127.0.0.1:$PORT.
load() {
  local kind=$1 total=$2
  local b=("$REFS/benchmark-3.6" --endpoints="127.0.0.1:$PORT" --clients=1 --conns=1)
  case $kind in
    put) "${b[@]}" put --total="$total" --key-size=8 --val-size=1024 ;;
    range) "$REFS/etcdctl-3.6" --endpoints="127.0.0.1:$PORT" put foo bar >/dev/null
           "${b[@]}" range foo --total="$total" --consistency=l ;;
    range-serializable) "$REFS/etcdctl-3.6" --endpoints="127.0.0.1:$PORT" put foo bar >/dev/null
           "${b[@]}" range foo --total="$total" --consistency=s ;;
    txn-put) "${b[@]}" txn-put --total="$total" --val-size=1024 ;;
    lease-keepalive) "${b[@]}" lease-keepalive --total="$total" ;;
    *) echo "instructions.sh: unknown kind $kind" >&2; exit 1 ;;
  esac >/dev/null 2>&1
}

count() {
  local kind=$1 total=$2
  start
  timeout "$RUN_TIMEOUT" bash -c "$(declare -f load); REFS='$REFS' PORT='$PORT' load '$kind' '$total'" \
    || echo "instructions.sh: $kind load failed" >&2
  stop
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "| RPC | instructions per request (median of $REPEATS) |"
echo "|---|---:|"
for kind in $KINDS; do
  runs=()
  for ((r = 1; r <= REPEATS; r++)); do
    small=$(count "$kind" "$N")
    large=$(count "$kind" $((3 * N)))
    runs+=($(( (large - small) / (2 * N) )))
    echo "$kind run $r: $small / $large instructions -> ${runs[-1]} per request" >&2
  done
  echo "| $kind | $(printf '%s\n' "${runs[@]}" | median) |"
done
