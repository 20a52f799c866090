#!/usr/bin/env bash
# A three-member ephd cluster against a three-member stock etcd cluster (MEMBERS=5: five against
# five), side by side on this machine, with etcd's own `benchmark` tool
# (docs/cluster.md; bench/README.md, "bench/cluster.sh").
#
# Cases (CASES, run in this order):
#   put, txn-put  benchmark --endpoints <all three> --clients 100 --conns 10 put|txn-put --total 100000
#                 --key-size 48 --val-size 1024 --key-space-size 100000; a fresh cluster per run, etcd and
#                 ephd alternating (order flipped every repeat), REPEATS runs each. Per run: every
#                 member's CPU seconds (/proc/<pid>/stat) and peak RSS (VmHWM), the leader changes
#                 (raft term before/after, leader before/after), other processes' CPU share.
#   range         benchmark ... range <one key> --consistency l --total <TOTAL>: linearizable reads
#                 spread over all three members (each a ReadIndex round with the leader), the same
#                 alternation as put.
#   rate          the same put with --rate at half the three-member ephd's median put/s of this
#                 invocation (RATE=N overrides), against the three-member ephd, a single-member ephd
#                 and the three-member etcd: p99 at half of peak, cluster against single member.
#   etcd-rate     the reference for that ratio: the same put with --rate at half the three-member
#                 etcd's median put/s (ETCD_RATE=N overrides), against the three-member etcd and a
#                 single-member etcd (data dir on tmpfs too).
#   failover      `ephd-bench failover` (clients with a 1 s timeout that move to the next member on a
#                 failure) at FO_RATE writes/s while the current leader is SIGKILLed KILLS times. etcd's
#                 killed member restarts on its data dir; ephd's (memory only) is replaced the etcd way:
#                 member remove, member add, a new data-less process on the same URLs with
#                 --initial-cluster-state existing; with EPHD_DATA=1 ephd's restarts on its data dir as
#                 etcd's does (from its Raft log, under its own ID). KILLED=2 kills the member after the
#                 leader too, at the same moment (needs EPHD_DATA=1 for ephd): two of five, or two of
#                 three, a majority, so that no write is taken until they are back. Per kill: the
#                 longest gap between acknowledged writes from the kill until the restart began
#                 (KILL_WINDOW s later), and how long after the restart began writes were
#                 acknowledged again.
#
# Loopback only, ports of its own (free ports picked at start), etcd data dirs on tmpfs under
# /dev/shm (removed at the end), every run bounded (RUN_TIMEOUT), the whole script bounded
# (MAX_TIME), and on exit it stops only the processes it started.
#
# Environment: REPEATS (2), CASES ("put txn-put rate failover"), SYSTEMS ("etcd ephd"; a subset runs
#   only those), MEMBERS (3, or 5), KILLED (1, or 2: members killed at once in failover), TOTAL (100000), RATE, ETCD_RATE, KILLS (10), FO_RATE (2000), FO_CLIENTS (50), KILL_WINDOW (5),
#   SETTLE (3), WARMUP (5), RUN_TIMEOUT (300), MAX_TIME (5400), LOAD_MAX (1.0) and LOAD_WAIT (600):
#   wait up to LOAD_WAIT s, checking every 30 s, for the 1-minute load to drop below LOAD_MAX before
#   starting; BUILD (1): cargo build --release first; EPHD, EPHD_BENCH (default
#   $CARGO_TARGET_DIR/release/... else target/release/...), ETCD (etcd 3.6 of scripts/install-references.sh), ETCDCTL (its etcdctl 3.6),
#   EPHD_ARGS and ETCD_ARGS (extra server flags, unquoted), EPHD_DATA=1 (each ephd member of the
#   three-member clusters gets a data dir of its own beside etcd's, so its Raft log is written in
#   the --wal mode EPHD_ARGS gives), EPHD_ENV and ETCD_ENV ("NAME=value ..."
#   set for the three-member clusters' processes only, not the single members: e.g.
#   EPHD_ENV=TOKIO_WORKER_THREADS=1 ETCD_ENV=GOMAXPROCS=1), FO_EPHD_ARGS (extra ephd flags for the
#   failover runs only), EPHD_LOG_LEVEL (warn), OUT_DIR (/tmp/ephd-bench-results/cluster-<date>/<time>),
#   KEEP_LOGS=1 (keep server logs; the failover ones are copied to raw/), SUMMARIZE=<dir>: only
#   rewrite <dir>/summary.md from <dir>/runs.jsonl.
# Output: OUT_DIR/runs.jsonl (a metadata line, then one line per run), OUT_DIR/raw/ (every
#   benchmark report, the failover load reports and kill times), OUT_DIR/summary.md.
# Exit: 0 done (failed runs are marked in the table); 1 setup failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONDONTWRITEBYTECODE=1
TOOL=$ROOT/bench/cluster_tool.py
SUMMARY=$ROOT/bench/cluster_summary.py
if [[ -n ${SUMMARIZE:-} ]]; then
  python3 "$SUMMARY" "$SUMMARIZE/runs.jsonl" >"$SUMMARIZE/summary.md"
  cat "$SUMMARIZE/summary.md"
  exit 0
fi

REPEATS=${REPEATS:-2}
MEMBERS=${MEMBERS:-3}
KILLED=${KILLED:-1}
SYSTEMS=${SYSTEMS:-"etcd ephd"}
CASES=${CASES:-"put txn-put rate failover"}
TOTAL=${TOTAL:-100000}
KILLS=${KILLS:-10}
FO_RATE=${FO_RATE:-2000}
FO_CLIENTS=${FO_CLIENTS:-50}
KILL_WINDOW=${KILL_WINDOW:-5}
SETTLE=${SETTLE:-3}
WARMUP=${WARMUP:-5}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
MAX_TIME=${MAX_TIME:-5400}
LOAD_MAX=${LOAD_MAX:-1.0}
LOAD_WAIT=${LOAD_WAIT:-600}
BUILD=${BUILD:-1}
TGT=${CARGO_TARGET_DIR:-$ROOT/target}
EPHD=${EPHD:-$TGT/release/ephd}
EPHD_BENCH=${EPHD_BENCH:-$TGT/release/ephd-bench}
REFS=${EPHD_REFERENCES:-$HOME/.cache/ephd/references}/bin
ETCD=${ETCD:-$REFS/etcd-3.6}
export ETCDCTL=${ETCDCTL:-$REFS/etcdctl-3.6}
GO_BIN=${GO_BIN:-$REFS/benchmark-3.6}
OUT_DIR=${OUT_DIR:-/tmp/ephd-bench-results/cluster-$(date +%Y%m%d)/$(date +%H%M%S)}
EPHD_LOG_LEVEL=${EPHD_LOG_LEVEL:-warn}
QUOTA=8589934592
END_BY=$((SECONDS + MAX_TIME))

log() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
now_ms() { date +%s%3N; }
time_left() { ((SECONDS < END_BY)); }

# ------------------------------------------------------------------- setup
command -v python3 >/dev/null || { echo "python3 is required" >&2; exit 1; }
command -v "$ETCDCTL" >/dev/null || { echo "etcdctl is required" >&2; exit 1; }
[[ -x $ETCD ]] || { echo "etcd not found at $ETCD (scripts/install-references.sh builds it)" >&2; exit 1; }
if [[ $BUILD == 1 ]]; then
  log "building release binaries"
  (cd "$ROOT" && timeout 3600 cargo build --release -p ephd -p ephd-bench) >&2
fi
[[ $MEMBERS == 3 || $MEMBERS == 5 ]] || { echo "MEMBERS must be 3 or 5" >&2; exit 1; }
[[ $KILLED == 1 || $KILLED == 2 ]] || { echo "KILLED is 1 or 2" >&2; exit 1; }
if [[ $KILLED == 2 && " $SYSTEMS " == *" ephd "* && ${EPHD_DATA:-0} != 1 ]]; then
  echo "KILLED=2 needs EPHD_DATA=1: ephd's killed members restart from their Raft logs, as etcd's from their data dirs" >&2; exit 1
fi
[[ -x $EPHD && -x $EPHD_BENCH ]] || { echo "missing $EPHD or $EPHD_BENCH (BUILD=1 builds them)" >&2; exit 1; }
if [[ ! -x $GO_BIN ]]; then
  log "building etcd's benchmark tool 3.6 (scripts/install-references.sh)"
  timeout 1800 bash "$ROOT/scripts/install-references.sh" >&2 || { echo "cannot build etcd's benchmark" >&2; exit 1; }
fi

WORK=$(mktemp -d /tmp/ephd-cluster-bench.XXXXXX)
DATA=$(mktemp -d /dev/shm/ephd-cluster-bench.XXXXXX)
RAW=$OUT_DIR/raw
JSONL=$OUT_DIR/runs.jsonl
mkdir -p "$RAW"
PIDS=()
LOADPID=""

stop_all() {
  local p i
  for p in "${PIDS[@]}"; do [[ -n $p ]] && kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do
    [[ -n $p ]] || continue
    for ((i = 0; i < 100; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  PIDS=()
  rm -rf "${DATA:?}"/*
}
cleanup() {
  if [[ -n $LOADPID ]]; then kill -TERM "$LOADPID" 2>/dev/null || true; wait "$LOADPID" 2>/dev/null || true; fi
  stop_all
  rm -rf "$DATA"
  if [[ ${KEEP_LOGS:-0} == 1 ]]; then log "logs kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Two free loopback ports per member, below the ephemeral range (bench/free_ports.py).
read -r -a PORTS < <(python3 "$ROOT/bench/free_ports.py" $((2 * MEMBERS)))
CPORT=("${PORTS[@]:0:MEMBERS}")
PPORT=("${PORTS[@]:MEMBERS:MEMBERS}")
ep() { echo "127.0.0.1:${CPORT[$1]}"; }
survivors() { # all endpoints but those of the members given
  local j out=()
  for ((j = 0; j < MEMBERS; j++)); do [[ " $* " == *" $j "* ]] || out+=("$(ep "$j")"); done
  (IFS=,; echo "${out[*]}")
}
EPS=$(survivors)

SYS_TOKEN=""
initial_cluster() { # prefix (e or m)
  local j out=()
  for ((j = 0; j < MEMBERS; j++)); do out+=("$1$j=http://127.0.0.1:${PPORT[$j]}"); done
  (IFS=,; echo "${out[*]}")
}

start_member() { # etcd|ephd index state tag
  local sys=$1 i=$2 state=$3 tag=$4 url="http://127.0.0.1:${CPORT[$2]}" peer="http://127.0.0.1:${PPORT[$2]}"
  if [[ $sys == etcd ]]; then
    env ${ETCD_ENV:-} "$ETCD" --name "e$i" --data-dir "$DATA/e$i" \
      --listen-client-urls "$url" --advertise-client-urls "$url" \
      --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
      --initial-cluster "$(initial_cluster e)" --initial-cluster-token "$SYS_TOKEN" \
      --initial-cluster-state "$state" --quota-backend-bytes "$QUOTA" \
      --logger zap --log-outputs stderr --log-level warn ${ETCD_ARGS:-} >>"$WORK/$tag-e$i.log" 2>&1 &
  else
    local data_dir=()
    [[ ${EPHD_DATA:-0} == 1 ]] && data_dir=(--data-dir "$DATA/$tag-m$i")
    env ${EPHD_ENV:-} "$EPHD" --name "m$i" "${data_dir[@]}" \
      --listen-client-urls "$url" --advertise-client-urls "$url" \
      --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
      --initial-cluster "$(initial_cluster m)" --initial-cluster-token "$SYS_TOKEN" \
      --initial-cluster-state "$state" --quota-backend-bytes "$QUOTA" \
      --log-level "$EPHD_LOG_LEVEL" ${EPHD_ARGS:-} ${RUN_EPHD_ARGS:-} >>"$WORK/$tag-m$i.log" 2>&1 &
  fi
  PIDS[$i]=$!
}

start_single() { # ephd1|etcd1 tag: a single member on the first client (and peer) port
  local url="http://127.0.0.1:${CPORT[0]}" peer="http://127.0.0.1:${PPORT[0]}"
  if [[ $1 == etcd1 ]]; then
    "$ETCD" --name s0 --data-dir "$DATA/s0" --listen-client-urls "$url" --advertise-client-urls "$url" \
      --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" --initial-cluster "s0=$peer" \
      --quota-backend-bytes "$QUOTA" --logger zap --log-outputs stderr --log-level warn ${ETCD_ARGS:-} \
      >>"$WORK/$2-s0.log" 2>&1 &
  else
    "$EPHD" --name s0 --listen-client-urls "$url" --advertise-client-urls "$url" \
      --quota-backend-bytes "$QUOTA" --log-level "$EPHD_LOG_LEVEL" ${EPHD_ARGS:-} >>"$WORK/$2-s0.log" 2>&1 &
  fi
  PIDS=("$!")
  local k
  for ((k = 0; k < 150; k++)); do
    python3 "$TOOL" leader "$(ep 0)" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  log "single-member $1 did not start (log $WORK/$2-s0.log)"; tail -5 "$WORK/$2-s0.log" >&2 || true
  stop_all; return 1
}

wait_whole() { # seconds: every member answers, one agreed leader, the same three started voters everywhere
  local until=$((SECONDS + $1))
  while ((SECONDS < until)); do
    python3 "$TOOL" whole "$EPS" 2>"$WORK/whole.err" && return 0
    sleep 0.3
  done
  log "  not whole after $1 s: $(head -c 1500 "$WORK/whole.err")"
  return 1
}

start_cluster() { # etcd|ephd tag
  SYS_TOKEN="bench-$2-$RANDOM$RANDOM"
  local i
  for ((i = 0; i < MEMBERS; i++)); do start_member "$1" "$i" new "$2"; done
  if ! wait_whole 60; then
    log "$1 cluster did not form (logs $WORK/$2-*.log)"
    tail -3 "$WORK/$2"-*.log >&2 || true
    stop_all; return 1
  fi
}

member_pids() { local p; for p in "${PIDS[@]}"; do [[ -n $p ]] && printf '%s ' "$p"; done; }

print_run() { # the last JSONL line, human-readable
  python3 - "$(tail -1 "$JSONL")" <<'PY' >&2
import json, sys
d = json.loads(sys.argv[1])
if d.get("case") == "failover":
    print(f"    failover {d['system']} r{d['repeat']}: {d.get('kill_count')} kills, longest gap "
          f"{d.get('max_gap_ms')} ms, median {d.get('median_gap_ms')} ms (new leader after "
          f"{d.get('median_election_ms')} ms), per kill "
          f"{[k['gap_ms'] for k in d.get('kills', [])]}, recovery gaps max {d.get('max_recovery_gap_ms')} ms, "
          f"errors {d.get('write_errors')} {'FAILED ' + str(d.get('error', '')) if d.get('failed') else ''}")
else:
    cpu = " / ".join(f"{r} {c}" for r, c in zip(d.get("member_roles", []), d.get("member_cpu_s", [])))
    print(f"    {d['case']} {d['system']} r{d['repeat']}: {d.get('ops_per_s')} ops/s, p99 {d.get('lat_p99_ms')} ms, "
          f"server CPU {d.get('server_cpu_us_per_op')} us/op (s: {cpu}), RSS MB {d.get('member_peak_rss_mb')}, "
          f"leader changes {d.get('leader_changes')}, errors {d.get('errors')}, other CPU {d.get('other_cpu_frac')}, "
          f"load1 {d.get('load1_before')}{' FAILED' if d.get('failed') else ''}")
PY
}

record_failure() { # system case repeat why
  python3 -c 'import json,sys; print(json.dumps({"system": sys.argv[1], "case": sys.argv[2], "repeat": int(sys.argv[3]), "failed": True, "error": sys.argv[4]}))' "$@" >>"$JSONL"
}

# --------------------------------------------------------- benchmark runs
run_bench() { # system(etcd|ephd|ephd1|etcd1) case(put|txn-put|range) repeat [rate]
  local sys=$1 case=$2 rep=$3 rate=${4:-} members=3 eps=$EPS tag rc=0 label
  label=$case${rate:+@$rate}
  tag="$sys-${case}${rate:+-rate$rate}-r$rep"
  time_left || { log "MAX_TIME reached: skipping $tag"; return 0; }
  if [[ $sys == *1 ]]; then
    members=1; eps=$(ep 0)
    start_single "$sys" "$tag" || { record_failure "$sys" "$label" "$rep" "did not start"; return 0; }
  else
    start_cluster "$sys" "$tag" || { record_failure "$sys" "$label" "$rep" "cluster did not form"; return 0; }
  fi
  local out=$RAW/$tag.txt
  local args=("$case" --total "$TOTAL" --key-size 48 --val-size 1024 --key-space-size 100000)
  if [[ $case == range ]]; then
    args=(range /bench/range-key --consistency l --total "$TOTAL")
  fi
  # shellcheck disable=SC2046
  python3 "$TOOL" sample pre "$eps" $(member_pids) >"$WORK/pre.json"
  /usr/bin/time -f '%U %S' -o "$WORK/time.txt" \
    timeout --signal=INT --kill-after=10 "$RUN_TIMEOUT" \
    "$GO_BIN" --endpoints "$eps" --dial-timeout 5s --precise --clients 100 --conns 10 \
    "${args[@]}" ${rate:+--rate "$rate"} \
    >"$out" 2>"$WORK/bench.err" || rc=$?
  # The Go client logs every connection change on stderr; keep it only when the run failed.
  if [[ $rc != 0 ]]; then { echo "--- stderr (rc=$rc)"; tail -50 "$WORK/bench.err"; } >>"$out"; fi
  # shellcheck disable=SC2046
  python3 "$TOOL" sample post "$eps" $(member_pids) >"$WORK/post.json"
  python3 "$TOOL" record "$WORK/pre.json" "$WORK/post.json" "$out" "$WORK/time.txt" \
    system="$sys" case="$label" repeat="$rep" rc="$rc" total="$TOTAL" members="$members" \
    rate="${rate:-0}" raw="\"raw/$tag.txt\"" >>"$JSONL"
  stop_all
  print_run
}

# ---------------------------------------------------------------- failover
retry_ctl() { # seconds ok-pattern etcdctl-args...: retries until success or a reply matching ok-pattern
  local until=$((SECONDS + $1)) ok=$2 out; shift 2
  while ((SECONDS < until)); do
    if out=$(timeout 10 "$ETCDCTL" --dial-timeout 2s --command-timeout 5s "$@" 2>&1); then
      echo "$out"; return 0
    fi
    if [[ -n $ok && $out == *"$ok"* ]]; then echo "$out"; return 0; fi
    log "  etcdctl $*: $out (retrying)"
    sleep 1
  done
  return 1
}

replace_ephd() { # index old-member-id: the etcd way to bring back a member without its state
  local i=$1 hex surv
  hex=$(python3 "$TOOL" hex "$2")
  surv=$(survivors "$i")
  retry_ctl 30 "not found" --endpoints "$surv" member remove "$hex" >/dev/null || return 1
  retry_ctl 30 "already exists" --endpoints "$surv" member add "m$i" \
    --peer-urls "http://127.0.0.1:${PPORT[$i]}" >/dev/null || return 1
  start_member ephd "$i" existing "$TAG"
}

run_failover() { # system repeat
  local sys=$1 rep=$2 k lead i j id kill_ms restart_ms whole_ms elected_ms left note bound killed
  TAG="$sys-failover-r$rep"
  time_left || { log "MAX_TIME reached: skipping $TAG"; return 0; }
  RUN_EPHD_ARGS=${FO_EPHD_ARGS:-}
  start_cluster "$sys" "$TAG" || { RUN_EPHD_ARGS=""; record_failure "$sys" failover "$rep" "cluster did not form"; return 0; }
  local load=$RAW/$TAG-load.json kills=$RAW/$TAG-kills.tsv
  : >"$kills"
  bound=$((WARMUP + KILLS * (KILL_WINDOW + SETTLE + 60) + 30))
  timeout --kill-after=10 "$((bound + 20))" "$EPHD_BENCH" --endpoints "$EPS" --conns 9 \
    --clients "$FO_CLIENTS" --rate "$FO_RATE" --timeout 1s --duration "${bound}s" --max-time "${bound}s" \
    --json --no-progress --label "$sys" failover >"$load" 2>"$WORK/$TAG-load.err" &
  LOADPID=$!
  log "failover / $sys (repeat $rep): $MEMBERS members, $FO_CLIENTS clients at $FO_RATE writes/s, $KILLS kills of $KILLED (the leader first)"
  sleep "$WARMUP"
  for ((k = 1; k <= KILLS; k++)); do
    time_left || { log "MAX_TIME reached: stopping the kills"; break; }
    lead=""
    for ((i = 0; i < 100; i++)); do
      lead=$(python3 "$TOOL" leader "$EPS" 2>/dev/null) && break
      lead=""; sleep 0.2
    done
    [[ -n $lead ]] || { log "  no agreed leader before kill $k: stopping"; break; }
    read -r i id <<<"$lead"
    killed=("$i")
    ((KILLED == 2)) && killed+=("$(((i + 1) % MEMBERS))")
    kill_ms=$(now_ms)
    for j in "${killed[@]}"; do kill -KILL "${PIDS[$j]}"; done
    for j in "${killed[@]}"; do wait "${PIDS[$j]}" 2>/dev/null || true; PIDS[$j]=""; done
    # When the survivors agree on a new leader (polled every 0.25 s, so
    # within about a quarter second); then the rest of the window.
    elected_ms=0
    while (($(now_ms) < kill_ms + KILL_WINDOW * 1000)); do
      if python3 "$TOOL" leader "$(survivors "${killed[@]}")" >/dev/null 2>&1; then elected_ms=$(now_ms); break; fi
      sleep 0.25
    done
    left=$((kill_ms + KILL_WINDOW * 1000 - $(now_ms)))
    ((left <= 0)) || sleep "$(printf '%d.%03d' $((left / 1000)) $((left % 1000)))"
    restart_ms=$(now_ms)
    note=ok
    if [[ $sys == etcd || ${EPHD_DATA:-0} == 1 ]]; then
      for j in "${killed[@]}"; do start_member "$sys" "$j" new "$TAG"; done
    else
      replace_ephd "$i" "$id" || note=replace-failed
    fi
    wait_whole 60 || note="$note,not-whole"
    whole_ms=$(now_ms)
    echo "$kill_ms $restart_ms $whole_ms $elected_ms $sys-$(IFS=+; echo "${killed[*]}") $note" >>"$kills"
    log "  kill $k: member(s) ${killed[*]} (the leader first); new leader after $((elected_ms ? elected_ms - kill_ms : -1)) ms; back in $((whole_ms - restart_ms)) ms ($note)"
    [[ $note == ok ]] || { log "  cluster not whole again: stopping the kills (logs $WORK/$TAG-*.log)"; break; }
    sleep "$SETTLE"
  done
  kill -TERM "$LOADPID" 2>/dev/null || true
  wait "$LOADPID" 2>/dev/null || true
  LOADPID=""
  python3 "$TOOL" failover "$load" "$kills" system="$sys" case=failover repeat="$rep" \
    kill_window_s="$KILL_WINDOW" raw="\"raw/$TAG-load.json\"" \
    server_args="\"$([[ $sys == ephd ]] && echo "${EPHD_ARGS:-} ${FO_EPHD_ARGS:-}" || echo "${ETCD_ARGS:-}")\"" >>"$JSONL"
  RUN_EPHD_ARGS=""
  if [[ ${KEEP_LOGS:-0} == 1 ]]; then cp "$WORK/$TAG"-*.log "$RAW/" 2>/dev/null || true; fi
  stop_all
  print_run
}

# -------------------------------------------------------------------- main
load1() { cut -d' ' -f1 /proc/loadavg; }
waited=0
while python3 -c "import sys; sys.exit(0 if float('$(load1)') >= float('$LOAD_MAX') else 1)" && ((waited < LOAD_WAIT)); do
  log "1-minute load $(load1) >= $LOAD_MAX: waiting (${waited}s of ${LOAD_WAIT}s)"
  sleep 30; waited=$((waited + 30))
done
python3 - "$ROOT" "$EPHD" "$ETCD" "$REPEATS" "$TOTAL" "$CASES" "$KILLS" "$FO_RATE" "$FO_CLIENTS" "$waited" "${EPHD_ENV:-}" "${ETCD_ENV:-}" "$GO_BIN" "$MEMBERS" "$KILLED" "${EPHD_DATA:-0}" >>"$JSONL" <<'PY'
import json, os, subprocess, sys, time
root, ephd, etcd, repeats, total, cases, kills, fo_rate, fo_clients, waited, ephd_env, etcd_env, bench, members, killed, ephd_data = sys.argv[1:17]
def sh(c):
    try:
        return subprocess.run(c, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:
        return ""
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
print(json.dumps({"meta": True, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "repeats": int(repeats),
                  "total": int(total), "cases": cases, "kills": int(kills), "fo_rate": float(fo_rate),
                  "fo_clients": int(fo_clients), "ephd": ephd,
                  "git": sh(f"cd {root} && git rev-parse --short HEAD") + (" (dirty)" if sh(f"cd {root} && git status --porcelain --untracked-files=no") else ""),
                  "etcd_version": sh(f"{etcd} --version | head -1"), "cpu": cpu, "nproc": os.cpu_count(),
                  "benchmark": sh(f"/usr/local/go/bin/go version -m {bench} | grep -m1 -w mod | cut -f3,4"),
                  "load_before": open("/proc/loadavg").read().split()[:3], "load_waited_s": int(waited),
                  "ephd_env": ephd_env, "etcd_env": etcd_env, "members": int(members), "killed": int(killed),
                  "ephd_data": ephd_data == "1"}))
PY
half_peak() { # etcd|ephd: half the three-member cluster's median put/s so far, or nothing
  python3 - "$JSONL" "$1" <<'PY'
import json, statistics, sys
xs = [d["ops_per_s"] for d in map(json.loads, open(sys.argv[1])) if d.get("case") == "put"
      and d.get("system") == sys.argv[2] and not d.get("failed") and d.get("ops_per_s")]
print(int(statistics.median(xs) / 2) if xs else "")
PY
}

log "results in $OUT_DIR (client ports ${CPORT[*]}, peer ports ${PPORT[*]}, load $(load1))"

for c in $CASES; do
  case $c in
    put|txn-put|range)
      for ((r = 1; r <= REPEATS; r++)); do
        if ((r % 2)); then order=(etcd ephd); else order=(ephd etcd); fi
        for s in "${order[@]}"; do
          [[ " $SYSTEMS " == *" $s "* ]] || continue
          log "$c / $s (repeat $r)"; run_bench "$s" "$c" "$r"
        done
      done ;;
    rate)
      rate=${RATE:-$(half_peak ephd)}
      if [[ -z $rate ]]; then log "rate: no ephd put figure to halve (run put first or set RATE)"; continue; fi
      for ((r = 1; r <= REPEATS; r++)); do
        if ((r % 2)); then order=(ephd ephd1 etcd); else order=(etcd ephd1 ephd); fi
        for s in "${order[@]}"; do
          [[ " $SYSTEMS " == *" ${s%1} "* ]] || continue
          log "put at $rate/s / $s (repeat $r)"; run_bench "$s" put "$r" "$rate"
        done
      done ;;
    etcd-rate)
      rate=${ETCD_RATE:-$(half_peak etcd)}
      if [[ -z $rate ]]; then log "etcd-rate: no etcd put figure to halve (run put first or set ETCD_RATE)"; continue; fi
      for ((r = 1; r <= REPEATS; r++)); do
        if ((r % 2)); then order=(etcd etcd1); else order=(etcd1 etcd); fi
        for s in "${order[@]}"; do
          [[ " $SYSTEMS " == *" etcd "* ]] || continue
          log "put at $rate/s / $s (repeat $r)"; run_bench "$s" put "$r" "$rate"
        done
      done ;;
    failover)
      for ((r = 1; r <= REPEATS; r++)); do
        if ((r % 2)); then order=(etcd ephd); else order=(ephd etcd); fi
        for s in "${order[@]}"; do [[ " $SYSTEMS " == *" $s "* ]] && run_failover "$s" "$r"; done
      done ;;
    *) log "unknown case $c (skipped)" ;;
  esac
done

python3 "$SUMMARY" "$JSONL" >"$OUT_DIR/summary.md"
log "wrote $OUT_DIR/summary.md (load now $(load1))"
cat "$OUT_DIR/summary.md"
