#!/usr/bin/env bash
# A/B of jemalloc background threads on one binary: A = off (the old built-in
# setting), B = on (the new one), set through _RJEM_MALLOC_CONF, which
# overrides the built-in options. Alternating order per round.
#   EPHD=target/release/ephd BENCH=target/release/ephd-bench OUT=ab.jsonl \
#     ROUNDS=5 allocator-ab.sh put --total 100000   (or lease-heartbeat, range)
set -uo pipefail
bin=${EPHD:?ephd binary}
tool=${BENCH:?ephd-bench binary}
out=${OUT:-allocator-ab.jsonl}
port=${PORT:-23795}
wl=$1; shift
for round in $(seq "${ROUNDS:-6}"); do
  order="A B"; (( round % 2 == 0 )) && order="B A"
  for side in $order; do
    conf=background_thread:false; [[ $side == B ]] && conf=background_thread:true
    _RJEM_MALLOC_CONF=$conf "$bin" --listen-client-urls "http://127.0.0.1:$port" --log-level warn >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 100); do "$tool" --endpoints "127.0.0.1:$port" --total 1 put >/dev/null 2>&1 && break; sleep 0.1; done
    timeout 600 "$tool" --endpoints "127.0.0.1:$port" --server-pid "$pid" --json --label "$side" "$wl" "$@" >>"$out"
    kill "$pid"; wait "$pid" 2>/dev/null
  done
done
