#!/usr/bin/env bash
# Compare ephd with stock etcd 3.6 and 3.7 and with kine on this machine,
# workload by workload.
#
# For every case, runs the servers in turn (the order rotates every repeat,
# so that none always runs first), REPEATS times, each run against a
# freshly started server on loopback: etcd with its default snapshot
# settings and its data dir on tmpfs (/dev/shm), kine on its memory driver,
# ephd on its defaults. Load comes from ephd-bench (target/release/ephd-bench)
# and, for `go-put`, from etcd's own Go benchmark tool 3.6. etcd, kine and the
# benchmark tool come from scripts/install-references.sh. Writes
#   /tmp/ephd-bench-results/<stamp>.jsonl   every run's JSON line (plus case/server/repeat)
#   /tmp/ephd-bench-results/<stamp>.md      medians and ephd/reference ratios
#   /tmp/ephd-bench-results/<stamp>.svg     put throughput vs client count, every server
#
# Environment:
#   QUICK=1           ~1-minute smoke run (1 repeat, short runs, fewer cases)
#   REPEATS=3         runs per server per case
#   TOTAL=100000      ops per put / lease-heartbeat / event-churn run
#   WATCHERS=1000     watchers of the fanout and fanout-rate cases
#   CLIENTS="100 500 2000"   client counts for the put sweep (and the plot)
#   CASES="..."       subset of: put heartbeat churn expiry range range-paged
#                     fanout fanout-rate go-put expiry-storm (default: all but
#                     expiry-storm, whose 100,000 leases take about two minutes
#                     a run: etcd and ephd both revoke 1000 leases a second)
#   SERVERS="etcd-3.6 etcd-3.7 kine ephd"   the servers to compare (ephd last
#                     by convention; ratios are ephd over each of the others)
#   GO_BENCH=1        also run etcd's Go benchmark (0 to skip)
#   BUILD=1           cargo build --release first (0 to use existing binaries)
#   EPHD=path         ephd binary (default target/release/ephd)
#   EPHD_REFERENCES   where scripts/install-references.sh put etcd and kine
#   RUN_TIMEOUT=300   hard bound per run, seconds
#   SUMMARIZE=file.jsonl   only (re)write the .md/.svg from an existing .jsonl
# Exit: 0 ok (even if some runs failed: see the table); 1 setup failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SHARED=${SHARED_DIR:-$ROOT/../shared}
OUT_DIR=${OUT_DIR:-/tmp/ephd-bench-results}
QUICK=${QUICK:-0}
if [[ $QUICK == 1 ]]; then
  REPEATS=${REPEATS:-1}
  CLIENTS=${CLIENTS:-"100 500"}
  CASES=${CASES:-"put heartbeat churn expiry range fanout-rate go-put"}
else
  REPEATS=${REPEATS:-3}
  CLIENTS=${CLIENTS:-"100 500 2000"}
  CASES=${CASES:-"put heartbeat churn expiry range range-paged fanout fanout-rate go-put"}
fi
TOTAL=${TOTAL:-100000}
WATCHERS=${WATCHERS:-1000}
GO_BENCH=${GO_BENCH:-1}
BUILD=${BUILD:-1}
REFS=${EPHD_REFERENCES:-$HOME/.cache/ephd/references}/bin
SERVERS=${SERVERS:-etcd-3.6 etcd-3.7 kine ephd}
EPHD=${EPHD:-$ROOT/target/release/ephd}
BENCH=${EPHD_BENCH:-$ROOT/target/release/ephd-bench}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
STAMP=$(date +%Y%m%d-%H%M%S)

log() { printf '[compare %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# ----------------------------------------------------------------- summary
# Reads the JSONL, writes the Markdown table and the SVG plot. No network,
# no third-party Python modules.
summarize() { # jsonl md svg
  python3 - "$1" "$2" "$3" <<'PY'
import json, statistics, sys, os, html, math

jsonl, md_path, svg_path = sys.argv[1:4]
runs = [json.loads(l) for l in open(jsonl) if l.strip()]
meta = next((r for r in runs if r.get("meta")), {})
runs = [r for r in runs if not r.get("meta")]
servers = meta.get("servers") or sorted({r["server"] for r in runs})
references = [s for s in servers if s != "ephd"]
cases = []
for r in runs:
    if r["case"] not in cases:
        cases.append(r["case"])

def ok(r):
    return not r.get("failed")

def med(case, server, key):
    xs = [r[key] for r in runs if r["case"] == case and r["server"] == server and ok(r)
          and isinstance(r.get(key), (int, float))]
    return statistics.median(xs) if xs else None

def total(case, server, key):
    return sum(r.get(key, 0) or 0 for r in runs if r["case"] == case and r["server"] == server)

def n_runs(case, server):
    return sum(1 for r in runs if r["case"] == case and r["server"] == server and ok(r))

def n_failed(case, server):
    return sum(1 for r in runs if r["case"] == case and r["server"] == server and not ok(r))

def fmt(x, digits=0):
    if x is None:
        return "–"
    if digits == 0:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"

def ratio(a, b, digits=2):
    if a is None or b is None or b == 0:
        return "–"
    return f"{a / b:.{digits}f}×"

out = []
out.append(f"# ephd vs {', '.join(references)} — {meta.get('stamp', '')}\n")
out.append("Figures from `bench/compare.sh`: medians over "
           f"{meta.get('repeats', '?')} run(s) per server, the servers run in turn "
           "with the order rotated each repeat, a fresh server per run.\n")
out.append("| setting | value |\n|---|---|")
for k in ["git", "ephd", "versions", "cpu", "nproc", "quick", "total", "clients",
          "load_before", "load_after"]:
    if k in meta:
        out.append(f"| {k} | {html.escape(str(meta[k]))} |")
out.append("")
out.append("Ratios are ephd over each reference: above 1 is better for throughput, below 1 "
           "is better for latency, CPU and memory. `CPU µs/op` is the server's utime+stime "
           "over the measured phase (watch drain included) divided by successful ops; `RSS` "
           "is the server's peak resident set (VmHWM). `other CPU` is the median share of "
           "all CPUs used by other processes during the runs: above ~10% the figures are "
           "disturbed.\n")

def metric_table(title, key, digits):
    out.append(f"## {title}\n")
    head = ["case"] + servers + [f"ephd/{r}" for r in references]
    out.append("| " + " | ".join(head) + " |")
    out.append("|---|" + "---:|" * (len(head) - 1))
    for c in cases:
        row = [c] + [fmt(med(c, s, key), digits) for s in servers]
        row += [ratio(med(c, "ephd", key), med(c, r, key)) for r in references]
        out.append("| " + " | ".join(row) + " |")
    out.append("")

metric_table("Throughput (ops/s)", "ops_per_s", 0)
metric_table("Latency p99 (ms)", "lat_p99_ms", 2)
metric_table("Server CPU per operation (µs)", "server_cpu_us_per_op", 1)
metric_table("Server peak RSS (MB)", "server_peak_rss_mb", 0)

out.append("## Errors and runs\n")
out.append("Errors are totals over all runs; runs counts the successful ones (failed ones "
           "in brackets); other CPU is the median per server.\n")
out.append("| case | " + " | ".join(f"{s} errors | {s} runs | {s} other CPU" for s in servers) + " |")
out.append("|---|" + "---:|" * (3 * len(servers)))
for c in cases:
    row = [c]
    for s in servers:
        failed_runs = n_failed(c, s)
        row += [str(total(c, s, "errors")),
                f"{n_runs(c, s)}" + (f" ({failed_runs})" if failed_runs else ""),
                fmt(med(c, s, "other_cpu_frac") and 100 * med(c, s, "other_cpu_frac")) + "%"]
    out.append("| " + " | ".join(row) + " |")
out.append("")

out.append("## Latency detail (ms, medians)\n")
out.append("| case | server | p50 | p90 | p99 | p99.9 | max | ops/s min–max |")
out.append("|---|---|---:|---:|---:|---:|---:|---:|")
for c in cases:
    for s in servers:
        xs = [r["ops_per_s"] for r in runs if r["case"] == c and r["server"] == s and ok(r)
              and r.get("ops_per_s") is not None]
        spread = f"{min(xs):,.0f}–{max(xs):,.0f}" if xs else "–"
        out.append(f"| {c} | {s} | {fmt(med(c, s, 'lat_p50_ms'), 2)} | {fmt(med(c, s, 'lat_p90_ms'), 2)} "
                   f"| {fmt(med(c, s, 'lat_p99_ms'), 2)} | {fmt(med(c, s, 'lat_p999_ms'), 2)} "
                   f"| {fmt(med(c, s, 'lat_max_ms'), 2)} | {spread} |")
out.append("")

watch_cases = [c for c in cases if any("watch_events" in r for r in runs if r["case"] == c)]
if watch_cases:
    out.append("## Watch delivery\n")
    out.append("Lost, out-of-order and duplicate counts are totals over all runs and must be 0. "
               "Lag is from the write's response to the event's receipt (0 when the event came first).\n")
    out.append("| case | server | events/s | lag p50 ms | lag p99 ms | lag max ms | events (total) | expected | lost | out-of-order | duplicates | canceled | undrained runs |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in watch_cases:
        for s in servers:
            undrained = sum(1 for r in runs if r["case"] == c and r["server"] == s
                            and "watch_drained" in r and not r["watch_drained"])
            out.append(f"| {c} | {s} | {fmt(med(c, s, 'watch_events_per_s'))} "
                       f"| {fmt(med(c, s, 'watch_lag_p50_ms'), 2)} | {fmt(med(c, s, 'watch_lag_p99_ms'), 2)} "
                       f"| {fmt(med(c, s, 'watch_lag_max_ms'), 2)} | {total(c, s, 'watch_events'):,} "
                       f"| {total(c, s, 'watch_expected'):,} | {total(c, s, 'watch_lost')} "
                       f"| {total(c, s, 'watch_out_of_order')} | {total(c, s, 'watch_duplicates')} "
                       f"| {total(c, s, 'watch_canceled')} | {undrained} |")
    out.append("")

extra_cases = [c for c in cases if any("expiry_wait_s" in r for r in runs if r["case"] == c)]
if extra_cases:
    out.append("## Lease expiry\n")
    out.append("| case | server | expiry wait s (after last write) | keys remaining | DELETE events (total) |")
    out.append("|---|---|---:|---:|---:|")
    for c in extra_cases:
        for s in servers:
            out.append(f"| {c} | {s} | {fmt(med(c, s, 'expiry_wait_s'), 2)} "
                       f"| {total(c, s, 'keys_remaining')} | {total(c, s, 'watch_deletes'):,} |")
    out.append("")

storm_cases = [c for c in cases if any("expiry_span_s" in r for r in runs if r["case"] == c)]
if storm_cases:
    out.append("## Lease expiry storm\n")
    out.append("`lease-expiry`: leases with one key each, their deadlines within about a second, "
               "and a heartbeat put at 200/s through the storm. The heartbeat columns are its "
               "latency before the first expiry and between the first and the last; CPU per "
               "expiry is the server's CPU over the whole storm (heartbeats included) over the "
               "keys expired. Early expiries and keys remaining are totals and must be 0.\n")
    out.append("| case | server | grants s | expiries/s | expiry span s | heartbeat p99 before ms | heartbeat p99 in storm ms | heartbeat max in storm ms | server CPU µs/expiry | early expiries | keys remaining |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in storm_cases:
        for s in servers:
            out.append(f"| {c} | {s} | {fmt(med(c, s, 'grants_s'), 1)} | {fmt(med(c, s, 'expiries_per_s'))} "
                       f"| {fmt(med(c, s, 'expiry_span_s'), 1)} | {fmt(med(c, s, 'heartbeat_before_p99_ms'), 2)} "
                       f"| {fmt(med(c, s, 'heartbeat_storm_p99_ms'), 2)} | {fmt(med(c, s, 'heartbeat_storm_max_ms'), 2)} "
                       f"| {fmt(med(c, s, 'server_cpu_us_per_expiry'))} | {total(c, s, 'early_expiries')} "
                       f"| {total(c, s, 'keys_remaining')} |")
    out.append("")

failed = [r for r in runs if not ok(r)]
if failed:
    out.append("## Failed runs\n")
    for r in failed:
        out.append(f"- {r['case']} / {r['server']} / repeat {r.get('repeat')}: rc={r.get('rc')} "
                   f"{html.escape(str(r.get('error', '')))}")
    out.append("")

# ---- SVG: put throughput vs clients
sweep = []
for r in runs:
    if r.get("tool") == "ephd-bench" and r["case"].startswith("put c=") and ok(r):
        sweep.append(r)
svg_note = ""
if sweep:
    xs = sorted({r["clients"] for r in sweep})
    series = {}
    for s in servers:
        pts = []
        for x in xs:
            vals = [r["ops_per_s"] for r in sweep if r["server"] == s and r["clients"] == x]
            if vals:
                pts.append((x, statistics.median(vals), min(vals), max(vals)))
        series[s] = pts
    W, H, L, R, T, B = 640, 400, 80, 20, 50, 60
    top = max(p[3] for pts in series.values() for p in pts) * 1.1 or 1
    raw = top / 5
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    ymax = step * 5
    def px(i):
        return L + (W - L - R) * (i + 0.5) / len(xs)
    def py(v):
        return T + (H - T - B) * (1 - v / ymax)
    palette = ["#d62728", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"]
    colors = {s: ("#1f77b4" if s == "ephd" else palette[i % len(palette)])
              for i, s in enumerate(servers)}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{W}" height="{H}" fill="white"/>',
             f'<text x="{W/2}" y="22" text-anchor="middle" font-size="15">put throughput vs clients '
             f'(ephd-bench, medians, min–max bars)</text>']
    for k in range(6):
        v = ymax * k / 5
        y = py(v)
        parts.append(f'<line x1="{L}" y1="{y:.1f}" x2="{W-R}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{L-6}" y="{y+4:.1f}" text-anchor="end">{v/1000:g}k</text>')
    parts.append(f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H-B}" stroke="black"/>')
    parts.append(f'<line x1="{L}" y1="{H-B}" x2="{W-R}" y2="{H-B}" stroke="black"/>')
    for i, x in enumerate(xs):
        parts.append(f'<text x="{px(i):.1f}" y="{H-B+18}" text-anchor="middle">{x}</text>')
    parts.append(f'<text x="{(L+W-R)/2}" y="{H-15}" text-anchor="middle">concurrent clients (10 connections)</text>')
    parts.append(f'<text x="18" y="{(T+H-B)/2}" text-anchor="middle" transform="rotate(-90 18 {(T+H-B)/2})">puts/s</text>')
    for j, s in enumerate(servers):
        pts = series.get(s, [])
        c = colors[s]
        coords = " ".join(f"{px(xs.index(p[0])):.1f},{py(p[1]):.1f}" for p in pts)
        if len(pts) > 1:
            parts.append(f'<polyline points="{coords}" fill="none" stroke="{c}" stroke-width="2"/>')
        for p in pts:
            x = px(xs.index(p[0]))
            parts.append(f'<line x1="{x:.1f}" y1="{py(p[2]):.1f}" x2="{x:.1f}" y2="{py(p[3]):.1f}" stroke="{c}"/>')
            parts.append(f'<circle cx="{x:.1f}" cy="{py(p[1]):.1f}" r="4" fill="{c}"/>')
            dy = -7 if s == "ephd" else 16 + 12 * references.index(s)
            parts.append(f'<text x="{x+7:.1f}" y="{py(p[1])+dy:.1f}" fill="{c}">{p[1]/1000:.1f}k</text>')
        parts.append(f'<rect x="{W-R-90}" y="{T+j*18}" width="12" height="12" fill="{c}"/>')
        parts.append(f'<text x="{W-R-72}" y="{T+j*18+10}">{s}</text>')
    parts.append("</svg>")
    with open(svg_path, "w") as f:
        f.write("\n".join(parts) + "\n")
    out.append(f"![put throughput vs clients]({os.path.basename(svg_path)})\n")
with open(md_path, "w") as f:
    f.write("\n".join(out) + "\n")
PY
}

if [[ -n ${SUMMARIZE:-} ]]; then
  base=${SUMMARIZE%.jsonl}
  summarize "$SUMMARIZE" "$base.md" "$base.svg"
  cat "$base.md"
  exit 0
fi

# ------------------------------------------------------------------- setup
command -v python3 >/dev/null || { echo "python3 is required" >&2; exit 1; }
# The binary each server runs.
binary_of() {
  case $1 in
    ephd) echo "$EPHD" ;;
    etcd-3.6 | etcd-3.7 | kine) echo "$REFS/$1" ;;
    *) echo "unknown server $1 (SERVERS takes etcd-3.6, etcd-3.7, kine and ephd)" >&2; return 1 ;;
  esac
}
for s in $SERVERS; do
  binary_of "$s" >/dev/null || exit 1
  if [[ $s != ephd && ! -x $(binary_of "$s") ]]; then
    log "$s not found in $REFS; building the references with scripts/install-references.sh"
    timeout 1800 bash "$ROOT/scripts/install-references.sh" || { echo "cannot build the references" >&2; exit 1; }
  fi
done
[[ " $SERVERS " == *" ephd "* ]] || { echo "SERVERS must include ephd (the ratios are over it)" >&2; exit 1; }
if [[ $BUILD == 1 ]]; then
  log "building release binaries"
  (cd "$ROOT" && timeout 1800 cargo build --release -p ephd -p ephd-bench) >&2
fi
[[ -x $EPHD && -x $BENCH ]] || { echo "missing $EPHD or $BENCH (BUILD=1 builds them)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/ephd-compare.XXXXXX)
DATA=$(mktemp -d /dev/shm/ephd-compare.XXXXXX)
SERVER_PID=""
cleanup() {
  if declare -F stop_server >/dev/null; then stop_server; fi
  rm -rf "$DATA"
  if [[ ${KEEP_LOGS:-0} == 1 ]]; then log "logs kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# One client port per server (so that a run never meets the previous
# server's lingering connections), and the peer port etcd needs.
read -r -a FREE < <(python3 "$ROOT/bench/free_ports.py" $(($(wc -w <<<"$SERVERS") + 1)))
PEER_PORT=${FREE[0]}
CLIENT_PORTS=("${FREE[@]:1}")
declare -A PORT
i=0
for s in $SERVERS; do PORT[$s]=${CLIENT_PORTS[$i]}; i=$((i + 1)); done

GO_BIN=${GO_BIN:-$REFS/benchmark-3.6}
if [[ " $CASES " == *" go-put "* && $GO_BENCH == 1 && ! -x $GO_BIN ]]; then
  log "building etcd's Go benchmark 3.6 (scripts/install-references.sh)"
  if ! timeout 1800 bash "$ROOT/scripts/install-references.sh" >"$WORK/go-build.log" 2>&1; then
    log "could not build etcd's benchmark (see $WORK/go-build.log); skipping go-put"
    GO_BENCH=0
  fi
fi

port_of() { echo "${PORT[$1]}"; }

wait_ready() { # port pid
  local i
  for ((i = 0; i < 150; i++)); do
    kill -0 "$2" 2>/dev/null || return 1
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
      # The port is open; make sure the KV service answers.
      if timeout 3 "$REFS/etcdctl-3.6" --endpoints "127.0.0.1:$1" --dial-timeout 1s \
           --command-timeout 2s get /compare-ready-probe >/dev/null 2>&1 \
         || [[ ! -x $REFS/etcdctl-3.6 ]]; then
        return 0
      fi
    fi
    sleep 0.1
  done
  return 1
}

start_server() { # server tag
  local port binary
  port=$(port_of "$1")
  binary=$(binary_of "$1")
  case $1 in
    etcd-*)
      rm -rf "$DATA/etcd"
      "$binary" --name compare --data-dir "$DATA/etcd" \
        --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
        --listen-peer-urls "http://127.0.0.1:$PEER_PORT" \
        --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
        --initial-cluster "compare=http://127.0.0.1:$PEER_PORT" \
        --quota-backend-bytes 8589934592 \
        --logger zap --log-outputs stderr --log-level warn >"$WORK/$2.log" 2>&1 &
      ;;
    kine)
      "$binary" --endpoint memory:// --listen-address "127.0.0.1:$port" >"$WORK/$2.log" 2>&1 &
      ;;
    ephd)
      "$binary" --listen-client-urls "http://127.0.0.1:$port" --log-level warn >"$WORK/$2.log" 2>&1 &
      ;;
  esac
  SERVER_PID=$!
  if ! wait_ready "$port" "$SERVER_PID"; then
    log "$1 did not become ready on 127.0.0.1:$port (log: $WORK/$2.log)"
    tail -5 "$WORK/$2.log" >&2 || true
    stop_server
    return 1
  fi
}

stop_server() {
  [[ -n $SERVER_PID ]] || return 0
  kill -TERM "$SERVER_PID" 2>/dev/null || true
  local i
  for ((i = 0; i < 100; i++)); do
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
  rm -rf "$DATA/etcd"
}

JSONL=$OUT_DIR/$STAMP.jsonl
mkdir -p "$OUT_DIR"

# Appends one line to the JSONL: the tool's JSON plus case/server/repeat, or
# a failure record.
record() { # case server repeat rc json-or-empty error
  python3 - "$@" >>"$JSONL" <<'PY'
import json, sys
case, server, repeat, rc, line, err = sys.argv[1:7]
try:
    d = json.loads(line)
    if int(rc) not in (0, 3):
        d["failed"] = True
except Exception:
    d = {"failed": True, "error": err[-300:]}
d.update({"case": case, "server": server, "repeat": int(repeat), "rc": int(rc)})
print(json.dumps(d))
PY
}

# ----------------------------------------------------------------- the cases
# Each case: its ephd-bench arguments (after the common ones).
if [[ $QUICK == 1 ]]; then
  D=(--duration 2s)
  case_args() {
    case $1 in
      heartbeat) echo "${D[*]} lease-heartbeat" ;;
      churn) echo "${D[*]} event-churn" ;;
      expiry) echo "--total 3000 event-churn --ttl 3 --wait-expiry" ;;
      expiry-storm) echo "lease-expiry --leases 3000 --ttl 3 --expiry-timeout 30s" ;;
      range) echo "${D[*]} range --objects 5000" ;;
      range-paged) echo "${D[*]} range --objects 5000 --page-size 500" ;;
      fanout) echo "${D[*]} watch-fanout --watchers 200" ;;
      fanout-rate) echo "${D[*]} --clients 10 --rate 200 watch-fanout --watchers 200" ;;
    esac
  }
  put_args() { echo "--clients $1 ${D[*]} put"; }
  GO_TOTAL=${GO_TOTAL:-20000}
else
  case_args() {
    case $1 in
      heartbeat) echo "--total $TOTAL lease-heartbeat" ;;
      churn) echo "--total $TOTAL event-churn" ;;
      expiry) echo "--total 20000 event-churn --ttl 5 --wait-expiry" ;;
      # 100,000 leases whose deadlines fall within a second, a heartbeat
      # put at 200/s through the storm.
      expiry-storm) echo "--clients 100 lease-expiry --leases 100000 --ttl 20 --expiry-timeout 240s" ;;
      range) echo "--total 200 range" ;;
      range-paged) echo "--total 200 range --page-size 500" ;;
      # The client's work here is decoding 1000x the events the server
      # sends: give it both cores' worth of threads (the lean default of one
      # thread is for the unary workloads).
      fanout) echo "--threads 2 --total 2000 watch-fanout --watchers $WATCHERS --streams 10" ;;
      fanout-rate) echo "--threads 2 --duration 10s --clients 10 --rate 100 watch-fanout --watchers $WATCHERS --streams 10" ;;
    esac
  }
  put_args() { echo "--clients $1 --total $TOTAL put"; }
  GO_TOTAL=${GO_TOTAL:-$TOTAL}
fi

run_tool() { # case server repeat args...
  local case=$1 server=$2 repeat=$3; shift 3
  local port line rc=0
  port=$(port_of "$server")
  if ! start_server "$server" "$server-r$repeat-${case// /_}"; then
    record "$case" "$server" "$repeat" 1 "" "server did not start"
    return 0
  fi
  log "$case / $server (repeat $repeat): ephd-bench $*"
  # shellcheck disable=SC2068
  line=$(timeout --kill-after=10 "$RUN_TIMEOUT" "$BENCH" --endpoints "127.0.0.1:$port" --conns 10 \
           --server-pid "$SERVER_PID" --label "$server" --json --no-progress $@ \
           2>>"$WORK/bench-stderr.log") || rc=$?
  stop_server
  record "$case" "$server" "$repeat" "$rc" "$line" "$(tail -c 300 "$WORK/bench-stderr.log" 2>/dev/null)"
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("   ", d["case"], d["server"], "ops/s", d.get("ops_per_s"), "p99", d.get("lat_p99_ms"), "cpu/op", d.get("server_cpu_us_per_op"), "errors", d.get("errors"), "watch lost", d.get("watch_lost", "-"), "failed" if d.get("failed") else "")' "$(tail -1 "$JSONL")" >&2
}

run_go() { # server repeat
  local server=$1 repeat=$2 port out err rc=0
  port=$(port_of "$server")
  if ! start_server "$server" "$server-r$repeat-go"; then
    record "go-put c=100" "$server" "$repeat" 1 "" "server did not start"
    return 0
  fi
  log "go-put c=100 / $server (repeat $repeat): etcd benchmark put --total $GO_TOTAL"
  err=$WORK/go-$server-$repeat.err
  out=$(CLIENTS=100 CONNS=10 TOTAL=$GO_TOTAL SERVER_PID=$SERVER_PID TIMEOUT=$RUN_TIMEOUT BENCH=$GO_BIN \
        bash "$SHARED/bench/run-write-bench.sh" "127.0.0.1:$port" 2>"$err") || rc=$?
  stop_server
  local json
  json=$(python3 - "$out" "$(tail -1 "$err")" "$GO_TOTAL" "$server" <<'PY'
import json, sys
out, err, total, server = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
kv = dict(p.split("=", 1) for p in (out + " " + err).split() if "=" in p)
def f(k):
    try:
        return float(kv[k])
    except Exception:
        return None
d = {"tool": "etcd-benchmark", "workload": "put", "clients": 100, "conns": 10, "label": server,
     "ops_per_s": f("put_qps"), "lat_p50_ms": f("p50_ms"), "lat_p99_ms": f("p99_ms"),
     "lat_p999_ms": f("p999_ms"), "lat_mean_ms": f("avg_ms"), "errors": int(f("errors") or 0),
     "server_peak_rss_mb": f("server_hwm_mb"), "other_cpu_frac": f("other_frac")}
if f("server_cpu_s") is not None and total:
    d["server_cpu_us_per_op"] = round(f("server_cpu_s") * 1e6 / total)
if f("client_cpu_s") is not None and total:
    d["client_cpu_us_per_op"] = round(f("client_cpu_s") * 1e6 / total)
print(json.dumps(d) if d["ops_per_s"] is not None else "")
PY
)
  record "go-put c=100" "$server" "$repeat" "$rc" "$json" "$(tail -c 300 "$err")"
}

# -------------------------------------------------------------------- main
python3 - "$STAMP" "$REPEATS" "$QUICK" "$TOTAL" "$CLIENTS" "$EPHD" "$REFS" "$ROOT" "$SERVERS" >"$JSONL" <<'PY'
import json, sys, subprocess, os
stamp, repeats, quick, total, clients, ephd, refs, root, servers = sys.argv[1:10]
servers = servers.split()
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:
        return ""
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
print(json.dumps({"meta": True, "stamp": stamp, "repeats": int(repeats), "quick": quick == "1",
                  "total": int(total), "clients": clients, "ephd": ephd,
                  "git": sh(f"cd {root} && git rev-parse --short HEAD") + (" (dirty)" if sh(f"cd {root} && git status --porcelain --untracked-files=no") else ""),
                  "servers": servers,
                  "versions": "; ".join(
                      f"{s}: " + (sh(f"{refs}/{s} --version | head -1") if s.startswith("etcd")
                                  else sh(f"/usr/local/go/bin/go version -m {refs}/kine | grep -m1 -w mod | cut -f3,4")
                                  if s == "kine" else sh(f"git -C {root} rev-parse --short HEAD"))
                      for s in servers),
                  "cpu": cpu,
                  "nproc": os.cpu_count(), "load_before": open("/proc/loadavg").read().split()[0]}))
PY
log "results: $JSONL (servers: $SERVERS, repeats $REPEATS, cases: $CASES)"

read -r -a ALL <<<"$SERVERS"
for ((r = 1; r <= REPEATS; r++)); do
  # Rotate the order by one each repeat.
  ORDER=()
  for ((k = 0; k < ${#ALL[@]}; k++)); do ORDER+=("${ALL[$(((k + r - 1) % ${#ALL[@]}))]}"); done
  for c in $CASES; do
    case $c in
      put)
        for n in $CLIENTS; do
          for s in "${ORDER[@]}"; do run_tool "put c=$n" "$s" "$r" $(put_args "$n"); done
        done ;;
      go-put)
        [[ $GO_BENCH == 1 ]] || continue
        for s in "${ORDER[@]}"; do run_go "$s" "$r"; done ;;
      heartbeat|churn|expiry|expiry-storm|range|range-paged|fanout|fanout-rate)
        for s in "${ORDER[@]}"; do run_tool "$c" "$s" "$r" $(case_args "$c"); done ;;
      *) log "unknown case $c (skipped)" ;;
    esac
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
summarize "$JSONL" "$OUT_DIR/$STAMP.md" "$OUT_DIR/$STAMP.svg"
log "wrote $OUT_DIR/$STAMP.md"
cat "$OUT_DIR/$STAMP.md"
