#!/usr/bin/env bash
# List storms against a heartbeat: ephd vs stock etcd vs
# the machine's floor.
#
# For every storm size N in LISTS and every repeat, three runs of
# `ephd-bench storm` (STORMS storms of N concurrent full lists of a ~10 MB
# prefix, a small heartbeat write every 5 ms, open-loop):
#   etcd   storm and heartbeats to a fresh stock etcd (data dir on /dev/shm)
#   ephd   storm and heartbeats to a fresh ephd ($EPHD $EPHD_ARGS)
#   floor  storm to one fresh ephd, heartbeats to another: the heartbeat's
#          latency when only the machine's cores are shared with the storm
# The order flips every repeat (etcd,ephd,floor then floor,ephd,etcd), so
# drift in the machine's speed cancels out in the medians.
#
# A guard samples every server it started and kills one whose RSS goes over
# RSS_LIMIT_MB, or any of them when the machine's MemAvailable drops under
# MIN_AVAIL_MB; the run is then recorded as killed (`killed` in the JSONL,
# "killed" in the tables). Servers (and guards) started here are killed on
# exit; nothing else is.
#
# Writes /tmp/ephd-bench-results/storm-<stamp>.jsonl (a metadata line, then one line
# per run: ephd-bench's JSON plus case/server/repeat/rc/killed) and
# storm-<stamp>.md (medians per storm size and server, ready to paste into
# docs/reliability.md, and every run).
#
# Environment:
#   QUICK=1             ~2-minute smoke run: 1 repeat, LISTS=300, short
#                       baseline/pauses, 10 s settle
#   REPEATS=3           runs per server and storm size
#   LISTS="300 1000"    storm sizes (concurrent lists); one run per size
#   STORMS=3            storms per run
#   OBJECTS=10000       objects preloaded (VAL_SIZE=1024 bytes each: ~10 MB)
#   CONNS=10            connections the storm's lists are spread over
#   BASELINE=5s PAUSE=5s SETTLE=60s   quiet baseline, pause between storms,
#                       wait after the last storm before reading RSS again
#   HB_OP=put           heartbeat write: put, or cas (the apiserver's Txn)
#   SERVERS="etcd ephd floor"   which runs to make
#   EPHD=path           ephd binary (default $CARGO_TARGET_DIR or target/,
#                       release); EPHD_ARGS="..." extra ephd flags
#   ETCD=etcd 3.6 of scripts/install-references.sh (built if missing)
#   EPHD_BENCH=path     ephd-bench binary
#   BUILD=1             cargo build --release first (0: use the binaries)
#   RUN_TIMEOUT=900     hard bound per run, seconds (QUICK: 300)
#   RSS_LIMIT_MB=12288 MIN_AVAIL_MB=2048   the memory guard
#   SUMMARIZE=file.jsonl   only (re)write the .md from an existing .jsonl
# Exit: 0 (even if runs failed: see the tables); 1 setup failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT_DIR=${OUT_DIR:-/tmp/ephd-bench-results}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
QUICK=${QUICK:-0}
if [[ $QUICK == 1 ]]; then
  REPEATS=${REPEATS:-1}
  LISTS=${LISTS:-300}
  BASELINE=${BASELINE:-2s}
  PAUSE=${PAUSE:-2s}
  SETTLE=${SETTLE:-10s}
  RUN_TIMEOUT=${RUN_TIMEOUT:-300}
else
  REPEATS=${REPEATS:-3}
  LISTS=${LISTS:-"300 1000"}
  BASELINE=${BASELINE:-5s}
  PAUSE=${PAUSE:-5s}
  SETTLE=${SETTLE:-60s}
  RUN_TIMEOUT=${RUN_TIMEOUT:-900}
fi
STORMS=${STORMS:-3}
OBJECTS=${OBJECTS:-10000}
VAL_SIZE=${VAL_SIZE:-1024}
CONNS=${CONNS:-10}
HB_OP=${HB_OP:-put}
SERVERS=${SERVERS:-"etcd ephd floor"}
BUILD=${BUILD:-1}
REFS=${EPHD_REFERENCES:-$HOME/.cache/ephd/references}/bin
ETCD=${ETCD:-$REFS/etcd-3.6}
EPHD=${EPHD:-$TARGET/release/ephd}
EPHD_ARGS=${EPHD_ARGS:-}
BENCH=${EPHD_BENCH:-$TARGET/release/ephd-bench}
RSS_LIMIT_MB=${RSS_LIMIT_MB:-12288}
MIN_AVAIL_MB=${MIN_AVAIL_MB:-2048}
STAMP=$(date +%Y%m%d-%H%M%S)

log() { printf '[storm %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# ----------------------------------------------------------------- summary
summarize() { # jsonl md
  python3 - "$1" "$2" <<'PY'
import json, statistics, sys

src, md = sys.argv[1], sys.argv[2]
lines = [json.loads(l) for l in open(src) if l.strip()]
meta = next((l for l in lines if l.get("meta")), {})
runs = [l for l in lines if not l.get("meta")]

def med(vals):
    vals = [v for v in vals if isinstance(v, (int, float))]
    return statistics.median(vals) if vals else None

def f(v, nd=1):
    if not isinstance(v, (int, float)):
        return "–"
    return f"{v:,.{nd}f}"

def ok(r):
    return not r.get("failed") and not r.get("killed")

sizes = sorted({r.get("lists") for r in runs if r.get("lists")})
order = ["etcd", "ephd", "floor"]
servers = [s for s in order if any(r["server"] == s for r in runs)]

out = [f"# List storm: ephd vs etcd vs the floor ({meta.get('stamp', '')})", ""]
out.append(f"git {meta.get('git', '?')}, ephd `{meta.get('ephd', '?')}` {meta.get('ephd_args', '')}, "
           f"{meta.get('etcd_version', '')}; {meta.get('cpu', '')} × {meta.get('nproc', '?')}, "
           f"{meta.get('mem_total_gib', '?')} GiB; load {meta.get('load_before', '?')} → {meta.get('load_after', '?')}; "
           f"repeats {meta.get('repeats')}{' (QUICK)' if meta.get('quick') else ''}.")
out.append("")
out.append(f"Each run: {meta.get('storms')} storms of N concurrent full lists of {meta.get('objects')} objects × "
           f"{meta.get('val_size')} B (one Range each, over {meta.get('conns')} connections; a list shed with "
           f"ResourceExhausted/Unavailable is retried up to 3 times), a {meta.get('hb_op')} heartbeat every 5 ms "
           f"(open-loop, latency from its due time) to the same server; *floor*: the storm to a second ephd, "
           f"the heartbeats to a first one. Settle {meta.get('settle')}. Medians over repeats; "
           f"heartbeat figures are over the writes due during the storms; *other CPU* is the share of the "
           f"CPUs other processes used during the storms (for the floor, the heartbeat's ephd is one of them).")
out.append("")
out.append("| storm | server | hb p99 ms (× floor) | hb max ms | hb failures | hb p99 quiet ms | lists/s (× etcd) "
           "| list failures / retries | peak RSS MiB | RSS after settle MiB | other CPU |")
out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
checks = []
for n in sizes:
    by = {s: [r for r in runs if r.get("lists") == n and r["server"] == s] for s in servers}
    def m(s, k, only_ok=True):
        return med([r.get(k) for r in by.get(s, []) if ok(r) or not only_ok])
    floor_p99 = m("floor", "hb_storms_p99_ms")
    etcd_rate = m("etcd", "lists_per_s")
    for s in servers:
        rs = by[s]
        if not rs:
            continue
        killed = sum(1 for r in rs if r.get("killed"))
        failed = sum(1 for r in rs if r.get("failed") and not r.get("killed"))
        note = ""
        if killed:
            note += f" ({killed}/{len(rs)} killed by the memory guard)"
        if failed:
            note += f" ({failed}/{len(rs)} failed)"
        p99 = m(s, "hb_storms_p99_ms")
        rate = m(s, "lists_per_s")
        xfloor = f" ({p99 / floor_p99:.1f}×)" if p99 is not None and floor_p99 and s != "floor" else ""
        xetcd = f" ({rate / etcd_rate:.2f}×)" if rate is not None and etcd_rate and s != "etcd" else ""
        hbf = sum(r.get("hb_storms_failures", 0) for r in rs)
        lf = sum(r.get("list_failures", r.get("errors", 0)) or 0 for r in rs)
        lr = sum(r.get("retries", 0) or 0 for r in rs)
        peak = med([r.get("server_peak_rss_mb") or r.get("rss_max_mb") for r in rs])
        if killed:
            peak_s = f"> {meta.get('rss_limit_mb', '?')} (killed)" if any("RSS" in str(r.get("killed")) for r in rs) else "killed"
        else:
            peak_s = f(peak, 0)
        out.append(f"| {n} × {meta.get('storms')} | {s}{note} | {f(p99, 1)}{xfloor} | {f(m(s, 'hb_storms_max_ms'), 1)} "
                   f"| {hbf} | {f(m(s, 'hb_baseline_p99_ms'), 2)} | {f(rate, 1)}{xetcd} | {lf} / {lr} "
                   f"| {peak_s} | {f(m(s, 'rss_after_settle_mb'), 0)} | {f(m(s, 'other_cpu_frac', False), 2)} |")
        if s == "ephd":
            mx = m(s, "hb_storms_max_ms")
            checks.append((n, [
                ("heartbeat max ≤ 100 ms", mx is not None and mx <= 100 and not killed, f"{f(mx, 1)} ms"),
                ("no heartbeat failure", hbf == 0 and not killed, str(hbf)),
                ("heartbeat p99 ≤ 2× floor", p99 is not None and floor_p99 is not None and p99 <= 2 * floor_p99,
                 f"{f(p99, 1)} vs floor {f(floor_p99, 1)} ms"),
                ("every list within 3 retries", lf == 0 and not killed, f"{lf} failed, {lr} retries"),
                ("lists/s ≥ etcd's", rate is not None and etcd_rate is not None and rate >= etcd_rate,
                 f"{f(rate, 1)} vs {f(etcd_rate, 1)}"),
            ]))
out.append("")
if checks:
    out.append("Targets, ephd (medians; the memory bound is ephd's own setting, compare the RSS columns):")
    out.append("")
    for n, cs in checks:
        out.append(f"- {n} lists: " + "; ".join(f"{'✓' if okk else '✗'} {name} ({v})" for name, okk, v in cs))
    out.append("")

out.append("## Every run")
out.append("")
out.append("| storm | server | repeat | rc | hb quiet p99 | hb storm p50 / p99 / p99.9 / max ms | hb failures storms / all | lists ok / failed / retries "
           "| lists/s per storm | storm s | RSS max per storm MiB | peak RSS | after settle | other CPU | note |")
out.append("|---|---|---:|---:|---:|---|---:|---|---|---|---|---:|---:|---:|---|")
for r in runs:
    det = r.get("storm_detail") or []
    note = r.get("killed") or (r.get("error", "")[:80] if r.get("failed") else "")
    kinds = r.get("error_kinds")
    if kinds:
        note = (note + " " if note else "") + ", ".join(f"{k}: {v}" for k, v in kinds.items())
    out.append(
        f"| {r.get('lists', '?')} | {r['server']} | {r['repeat']} | {r.get('rc')} | {f(r.get('hb_baseline_p99_ms'), 2)} "
        f"| {f(r.get('hb_storms_p50_ms'), 1)} / {f(r.get('hb_storms_p99_ms'), 1)} / {f(r.get('hb_storms_p999_ms'), 1)} / {f(r.get('hb_storms_max_ms'), 1)} "
        f"| {r.get('hb_storms_failures', '–')} / {r.get('hb_failures', '–')} | {r.get('ops', '–')} / {r.get('list_failures', '–')} / {r.get('retries', '–')} "
        f"| {' '.join(f(d.get('lists_per_s'), 1) for d in det) or '–'} | {' '.join(f(d.get('elapsed_s'), 1) for d in det) or '–'} "
        f"| {' '.join(f(d.get('rss_max_mb'), 0) for d in det) or '–'} | {f(r.get('server_peak_rss_mb'), 0)} "
        f"| {f(r.get('rss_after_settle_mb'), 0)} | {f(r.get('other_cpu_frac'), 2)} | {note} |")
out.append("")
with open(md, "w") as fh:
    fh.write("\n".join(out) + "\n")
PY
}

if [[ -n ${SUMMARIZE:-} ]]; then
  summarize "$SUMMARIZE" "${SUMMARIZE%.jsonl}.md"
  cat "${SUMMARIZE%.jsonl}.md"
  exit 0
fi

# ------------------------------------------------------------------- setup
command -v python3 >/dev/null || { echo "python3 is required" >&2; exit 1; }
if [[ " $SERVERS " == *" etcd "* && ! -x $ETCD ]]; then
  log "etcd not found at $ETCD; building the references with scripts/install-references.sh"
  timeout 1800 bash "$ROOT/scripts/install-references.sh" || { echo "cannot build etcd" >&2; exit 1; }
fi
if [[ $BUILD == 1 ]]; then
  log "building release binaries"
  (cd "$ROOT" && timeout 1800 cargo build --release -p ephd -p ephd-bench) >&2
fi
[[ -x $EPHD && -x $BENCH ]] || { echo "missing $EPHD or $BENCH (BUILD=1 builds them)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/ephd-storm.XXXXXX)
DATA=$(mktemp -d /dev/shm/ephd-storm.XXXXXX)
STARTED=() # pids of servers and guards started here
LAST_PID=""
cleanup() {
  local p
  for p in "${STARTED[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${STARTED[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$DATA"
  if [[ ${KEEP_LOGS:-0} == 1 ]]; then log "logs kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# N distinct free ports below the ephemeral range, picked in one call so that
# none of them repeats (a port picked alone is not held until its server binds
# it, so two separate picks could return the same one).
free_ports() { python3 "$ROOT/bench/free_ports.py" "$1"; }

wait_ready() { # port pid
  local i
  for ((i = 0; i < 150; i++)); do
    kill -0 "$2" 2>/dev/null || return 1
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
      if [[ ! -x $REFS/etcdctl-3.6 ]] ||
        timeout 3 "$REFS/etcdctl-3.6" --endpoints "127.0.0.1:$1" --dial-timeout 1s \
          --command-timeout 2s get /storm-ready-probe >/dev/null 2>&1; then
        return 0
      fi
    fi
    sleep 0.1
  done
  return 1
}

# Starts a server in the background (a child of this shell, so it can be
# waited for); sets LAST_PID.
start_server() { # etcd|ephd port log [peer port, etcd's]
  local port=$2
  if [[ $1 == etcd ]]; then
    local peer=$4
    rm -rf "$DATA/etcd"
    "$ETCD" --name storm --data-dir "$DATA/etcd" \
      --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
      --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
      --initial-cluster "storm=http://127.0.0.1:$peer" \
      --quota-backend-bytes 8589934592 \
      --logger zap --log-outputs stderr --log-level warn >"$3" 2>&1 &
  else
    # shellcheck disable=SC2086
    "$EPHD" --listen-client-urls "http://127.0.0.1:$port" --log-level warn $EPHD_ARGS >"$3" 2>&1 &
  fi
  LAST_PID=$!
  STARTED+=("$LAST_PID")
}

# Kills server $1 when its RSS passes RSS_LIMIT_MB or the machine's
# MemAvailable drops under MIN_AVAIL_MB; writes why to $3. Sets LAST_PID.
start_guard() { # pid name marker
  (
    while kill -0 "$1" 2>/dev/null; do
      rss=$(awk '/^VmRSS/ {print int($2 / 1024)}' "/proc/$1/status" 2>/dev/null || echo 0)
      avail=$(awk '/^MemAvailable/ {print int($2 / 1024)}' /proc/meminfo)
      if ((${rss:-0} > RSS_LIMIT_MB || avail < MIN_AVAIL_MB)); then
        echo "$2 killed by the guard at RSS ${rss} MiB (MemAvailable ${avail} MiB; limits ${RSS_LIMIT_MB} / ${MIN_AVAIL_MB})" >>"$3"
        kill -KILL "$1" 2>/dev/null || true
        exit 0
      fi
      sleep 0.2
    done
  ) &
  LAST_PID=$!
  STARTED+=("$LAST_PID")
}

stop_pids() { # pids...
  local p i
  for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "$@"; do
    for ((i = 0; i < 100; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  rm -rf "$DATA/etcd"
}

JSONL=$OUT_DIR/storm-$STAMP.jsonl
mkdir -p "$OUT_DIR"

record() { # lists server repeat rc json-or-empty error killed
  python3 - "$@" >>"$JSONL" <<'PY'
import json, sys
lists, server, repeat, rc, line, err, killed = sys.argv[1:8]
try:
    d = json.loads(line)
    if int(rc) not in (0, 3):
        d["failed"] = True
except Exception:
    d = {"failed": True, "error": err[-300:]}
if killed:
    d["killed"] = killed.strip()
d.update({"case": f"storm {lists}", "lists": int(lists), "server": server, "repeat": int(repeat), "rc": int(rc)})
print(json.dumps(d))
PY
}

run_one() { # lists server repeat
  local n=$1 server=$2 repeat=$3 tag="$2-$1-r$3"
  local storm_port peer_port hb_port storm_pid hb_pid="" marker=$WORK/$tag.killed rc=0 line
  local pids=() guards=() g
  : >"$marker"
  read -r storm_port peer_port hb_port < <(free_ports 3)
  if [[ $server == etcd ]]; then
    start_server etcd "$storm_port" "$WORK/$tag.log" "$peer_port"
  else
    start_server ephd "$storm_port" "$WORK/$tag.log"
  fi
  storm_pid=$LAST_PID
  pids+=("$storm_pid")
  local hb_args=()
  if [[ $server == floor ]]; then
    start_server ephd "$hb_port" "$WORK/$tag-hb.log"
    hb_pid=$LAST_PID
    pids+=("$hb_pid")
    hb_args=(--heartbeat-endpoint "127.0.0.1:$hb_port")
  fi
  local p
  for p in "${pids[@]}"; do
    local port=$storm_port
    [[ $p == "$hb_pid" ]] && port=$hb_port
    if ! wait_ready "$port" "$p"; then
      log "$server did not become ready on 127.0.0.1:$port (log: $WORK/$tag.log)"
      tail -5 "$WORK/$tag.log" >&2 || true
      stop_pids "${pids[@]}"
      record "$n" "$server" "$repeat" 1 "" "server did not start" ""
      return 0
    fi
  done
  for p in "${pids[@]}"; do
    local name=$server
    [[ $p == "$hb_pid" ]] && name="heartbeat ephd"
    start_guard "$p" "$name" "$marker"
    guards+=("$LAST_PID")
  done
  log "storm $n × $STORMS / $server (repeat $repeat)"
  line=$(timeout --kill-after=10 "$RUN_TIMEOUT" "$BENCH" --endpoints "127.0.0.1:$storm_port" --conns "$CONNS" \
    --server-pid "$storm_pid" --label "$server" --json --no-progress --val-size "$VAL_SIZE" \
    --max-time "$((RUN_TIMEOUT - 30))s" \
    storm --objects "$OBJECTS" --storms "$STORMS" --lists "$n" --baseline "$BASELINE" --pause "$PAUSE" \
    --settle "$SETTLE" --heartbeat-op "$HB_OP" "${hb_args[@]}" \
    2>>"$WORK/bench-stderr.log") || rc=$?
  for g in "${guards[@]}"; do kill "$g" 2>/dev/null || true; wait "$g" 2>/dev/null || true; done
  stop_pids "${pids[@]}"
  record "$n" "$server" "$repeat" "$rc" "$line" "$(tail -c 300 "$WORK/bench-stderr.log" 2>/dev/null)" "$(cat "$marker")"
  python3 -c '
import json, sys
d = json.loads(sys.argv[1])
print("   ", d["case"], d["server"], "hb storm p99/max", d.get("hb_storms_p99_ms"), d.get("hb_storms_max_ms"),
      "hb failures", d.get("hb_failures"), "lists/s", d.get("lists_per_s"), "list failures", d.get("list_failures"),
      "retries", d.get("retries"), "peak RSS", d.get("server_peak_rss_mb"), "after settle", d.get("rss_after_settle_mb"),
      d.get("killed", ""), "FAILED" if d.get("failed") else "")' "$(tail -1 "$JSONL")" >&2
}

# -------------------------------------------------------------------- main
python3 - "$STAMP" "$REPEATS" "$QUICK" "$LISTS" "$EPHD" "$EPHD_ARGS" "$ETCD" "$ROOT" "$STORMS" "$OBJECTS" \
  "$VAL_SIZE" "$CONNS" "$HB_OP" "$SETTLE" "$RSS_LIMIT_MB" >"$JSONL" <<'PY'
import json, os, subprocess, sys
(stamp, repeats, quick, lists, ephd, ephd_args, etcd, root, storms, objects, val_size, conns, hb_op,
 settle, rss_limit) = sys.argv[1:16]
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:
        return ""
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
mem = next((int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal")), 0)
print(json.dumps({"meta": True, "stamp": stamp, "repeats": int(repeats), "quick": quick == "1", "lists": lists,
                  "storms": int(storms), "objects": int(objects), "val_size": int(val_size), "conns": int(conns),
                  "hb_op": hb_op, "settle": settle, "rss_limit_mb": int(rss_limit),
                  "ephd": ephd, "ephd_args": ephd_args,
                  "git": sh(f"cd {root} && git rev-parse --short HEAD") + (" (dirty)" if sh(f"cd {root} && git status --porcelain --untracked-files=no") else ""),
                  "etcd_version": sh(f"{etcd} --version | head -1"), "cpu": cpu, "nproc": os.cpu_count(),
                  "mem_total_gib": round(mem / 2**20, 1), "load_before": open("/proc/loadavg").read().split()[0]}))
PY
log "results: $JSONL (repeats $REPEATS, lists $LISTS, servers $SERVERS)"

read -r -a ALL <<<"$SERVERS"
for ((r = 1; r <= REPEATS; r++)); do
  ORDER=("${ALL[@]}")
  if ((r % 2 == 0)); then
    ORDER=()
    for ((i = ${#ALL[@]} - 1; i >= 0; i--)); do ORDER+=("${ALL[i]}"); done
  fi
  for n in $LISTS; do
    for s in "${ORDER[@]}"; do
      case $s in
        etcd | ephd | floor) run_one "$n" "$s" "$r" ;;
        *) log "unknown server $s (skipped)" ;;
      esac
    done
  done
done

python3 - "$JSONL" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
meta = json.loads(lines[0])
meta["load_after"] = open("/proc/loadavg").read().split()[0]
lines[0] = json.dumps(meta)
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
summarize "$JSONL" "$OUT_DIR/storm-$STAMP.md"
log "wrote $OUT_DIR/storm-$STAMP.md"
cat "$OUT_DIR/storm-$STAMP.md"
