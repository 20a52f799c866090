#!/usr/bin/env bash
# Does ephd give memory back to the system after a burst? Measured on the
# release build, loopback only, every phase bounded.
#
# Two scenarios, each on a fresh server, with the server's resident set
# (VmRSS) sampled every 0.5 s from /proc while it runs:
#   storm    load a ~10 MB prefix (OBJECTS x 1 KiB) and rest 5 s ("before");
#            then load a second one and run a list storm on it: LISTS full
#            Ranges from CLIENTS concurrent clients (ephd-bench range); then
#            IDLE seconds with no requests.
#   compact  PUTS small puts (100-byte values) over KEYS keys, so history
#            holds PUTS/KEYS versions per key; compact at the current
#            revision (every old version goes) and stay idle IDLE seconds;
#            then delete every key, compact again, stay idle again.
# For each it reports the RSS before the burst, the peak (VmHWM), and the
# RSS 10 s, 30 s and 60 s after it, next to the data the store holds, and
# writes the timeline and a summary to OUT (default
# /tmp/ephd-bench-results/memory-return-<stamp>/).
#
#   bench/memory-return.sh                      # build, then both scenarios
#   EPHD=path/to/ephd BUILD=0 bench/memory-return.sh
#   MALLOC_CONF=... bench/memory-return.sh      # try jemalloc options at run
#                                               # time (_RJEM_MALLOC_CONF)
# Environment: EPHD, BENCH (binaries), BUILD (1), OBJECTS (10000), LISTS
# (400), CLIENTS (200), PUTS (1000000), KEYS (10000), IDLE (60), LABEL,
# MALLOC_CONF, OUT, SCENARIOS ("storm compact").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OBJECTS=${OBJECTS:-10000}
LISTS=${LISTS:-400}
CLIENTS=${CLIENTS:-200}
PUTS=${PUTS:-1000000}
KEYS=${KEYS:-10000}
IDLE=${IDLE:-60}
SCENARIOS=${SCENARIOS:-storm compact}
LABEL=${LABEL:-ephd}
OUT=${OUT:-/tmp/ephd-bench-results/memory-return-$(date -u +%Y%m%d-%H%M%S)}
TARGET=${CARGO_TARGET_DIR:-target}
if [[ ${BUILD:-1} == 1 ]]; then
  cargo build --release -p ephd -p ephd-bench >/dev/null
fi
EPHD=${EPHD:-$TARGET/release/ephd}
BENCH=${BENCH:-$TARGET/release/ephd-bench}
mkdir -p "$OUT"
PID=""
SAMPLER=""
stop_all() {
  if [[ -n $PID ]]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  if [[ -n $SAMPLER ]]; then kill "$SAMPLER" 2>/dev/null || true; wait "$SAMPLER" 2>/dev/null || true; fi
  SAMPLER=""
  PID=""
}
trap stop_all EXIT

free_port() { python3 bench/free_ports.py; } # below the ephemeral range
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }
now() { date +%s.%N; }
etcdctl_() { timeout 300 "${ETCDCTL:-${EPHD_REFERENCES:-$HOME/.cache/ephd/references}/bin/etcdctl-3.6}" --endpoints="127.0.0.1:$PORT" --command-timeout=280s "$@"; }
revision() { etcdctl_ endpoint status -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["Status"]["header"]["revision"])'; }
db_size() { etcdctl_ endpoint status -w json | python3 -c 'import json,sys; s=json.load(sys.stdin)[0]["Status"]; print(s["dbSize"], s.get("dbSizeInUse", 0))'; }

# start NAME: a fresh server and a sampler writing "seconds rss_kb hwm_kb".
start() {
  PORT=$(free_port)
  if [[ -n ${MALLOC_CONF:-} ]]; then
    _RJEM_MALLOC_CONF=$MALLOC_CONF "$EPHD" --listen-client-urls "http://127.0.0.1:$PORT" \
      --log-level warn >"$OUT/$1.log" 2>&1 &
  else
    "$EPHD" --listen-client-urls "http://127.0.0.1:$PORT" --log-level warn >"$OUT/$1.log" 2>&1 &
  fi
  PID=$!
  wait_port "$PORT"
  T0=$(now)
  (
    while [[ -r /proc/$PID/status ]]; do
      awk -v t="$(now)" -v t0="$T0" '/^VmRSS/ {r=$2} /^VmHWM/ {h=$2} END {printf "%.1f %d %d\n", t-t0, r, h}' \
        "/proc/$PID/status" 2>/dev/null || true
      sleep 0.5
    done
  ) >"$OUT/$1.rss" &
  SAMPLER=$!
  sleep 1
}
mark() { echo "$(python3 -c "print(round($(now)-$T0,1))") $2" >>"$OUT/$1.marks"; }

if [[ " $SCENARIOS " == *" storm "* ]]; then
  echo "storm: $OBJECTS objects x 1 KiB, $LISTS lists from $CLIENTS clients" >&2
  start storm
  # ephd-bench range preloads a fresh prefix and then lists it, with no
  # pause between the two; so a first run loads one prefix (and lists it
  # once), and "before" is the RSS of a server holding it, at rest.
  timeout 300 "$BENCH" --endpoints "127.0.0.1:$PORT" --json --no-progress --clients 1 \
    --total 1 range --objects "$OBJECTS" >"$OUT/storm.preload.json"
  sleep 5
  mark storm before
  # The storm: another prefix of the same size, then the lists of it (the
  # measured phase, so the lists start elapsed_s before ephd-bench ends).
  # Exit status 3 (some lists failed, e.g. shed by the server) still
  # leaves a report; the memory is what is measured here.
  rc=0
  timeout 900 "$BENCH" --endpoints "127.0.0.1:$PORT" --json --no-progress --clients "$CLIENTS" \
    --total "$LISTS" --timeout 120s range --objects "$OBJECTS" >"$OUT/storm.bench.json" || rc=$?
  if [[ $rc != 0 && $rc != 3 ]]; then
    echo "ephd-bench range failed (exit status $rc)" >&2
    exit 1
  fi
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("storm: %d lists in %s s, %d failed" % (r["ops"], r["elapsed_s"], r["errors"]), file=sys.stderr)' "$OUT/storm.bench.json"
  storm_s=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["elapsed_s"])' "$OUT/storm.bench.json")
  echo "$(python3 -c "print(round($(now)-$T0-$storm_s,1))") burst" >>"$OUT/storm.marks"
  mark storm idle
  sleep "$IDLE"
  mark storm end
  read -r db _ < <(db_size)
  echo "$db" >"$OUT/storm.data"
  stop_all
fi

if [[ " $SCENARIOS " == *" compact "* ]]; then
  echo "compact: $PUTS puts of 100 bytes over $KEYS keys" >&2
  start compact
  mark compact start
  timeout 900 "$BENCH" --endpoints "127.0.0.1:$PORT" --json --no-progress --clients 100 \
    --total "$PUTS" put --key-space "$KEYS" --sequential-keys --val-size 100 >"$OUT/compact.bench.json"
  read -r db_hist db_live < <(db_size)
  mark compact burst
  etcdctl_ compact "$(revision)" >/dev/null
  mark compact idle
  sleep "$IDLE"
  mark compact deleting
  etcdctl_ del --prefix /bench/put/ >/dev/null
  etcdctl_ compact "$(revision)" >/dev/null
  mark compact idle2
  sleep "$IDLE"
  mark compact end
  echo "$db_hist $db_live" >"$OUT/compact.data"
  stop_all
fi

python3 - "$OUT" "$LABEL" "${MALLOC_CONF:-built-in}" <<'PY' | tee "$OUT/summary.md"
import os, sys
out, label, conf = sys.argv[1], sys.argv[2], sys.argv[3]
def load(name):
    rows = [l.split() for l in open(f"{out}/{name}.rss") if len(l.split()) == 3]
    rss = [(float(t), int(r) / 1024, int(h) / 1024) for t, r, h in rows]
    marks = {}
    for l in open(f"{out}/{name}.marks"):
        t, what = l.split()
        marks[what] = float(t)
    return rss, marks
def at(rss, t):
    """RSS (MB) of the last sample at or before t."""
    best = None
    for s in rss:
        if s[0] <= t:
            best = s
    return best[1] if best else float("nan")
def hwm(rss, t):
    return max((s[2] for s in rss if s[0] <= t), default=float("nan"))
def fmt(x):
    return f"{x:,.0f}"
print(f"### {label} (jemalloc options at run time: {conf})\n")
print("| scenario | data held MB | RSS empty MB | RSS before MB | peak RSS MB | +10 s idle | +30 s idle | +60 s idle |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
if os.path.exists(f"{out}/storm.rss"):
    rss, m = load("storm")
    data = int(open(f"{out}/storm.data").read().split()[0]) / 1e6
    before, idle = m["before"], m["idle"]
    print(f"| list storm | {data:.1f} | {fmt(rss[0][1])} | {fmt(at(rss, before))} | {fmt(hwm(rss, idle))} | "
          + " | ".join(fmt(at(rss, idle + d)) for d in (10, 30, 60)) + " |")
if os.path.exists(f"{out}/compact.rss"):
    rss, m = load("compact")
    hist, live = (int(x) / 1e6 for x in open(f"{out}/compact.data").read().split())
    before = m["burst"]
    print(f"| compaction (history {hist:.0f} MB, live {live:.1f} MB) | {live:.1f} | {fmt(rss[0][1])} | {fmt(at(rss, before))} | "
          f"{fmt(hwm(rss, m['idle']))} | " + " | ".join(fmt(at(rss, m["idle"] + d)) for d in (10, 30, 60)) + " |")
    print(f"| delete all + compaction | 0 | {fmt(rss[0][1])} | {fmt(at(rss, m['deleting']))} | {fmt(hwm(rss, m['idle2']))} | "
          + " | ".join(fmt(at(rss, m["idle2"] + d)) for d in (10, 30, 60)) + " |")
print()
print("Data held: Status dbSize (etcd's database measure) after the burst. RSS empty: the")
print("fresh server. RSS before: just before the burst (for the list storm, holding one of its")
print("two prefixes, at rest);")
print("the compaction rows' \"before\" is with all history held. Idle times count")
print("from the end of the burst (the last list's answer, the compaction's answer).")
PY
