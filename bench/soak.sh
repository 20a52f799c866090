#!/usr/bin/env bash
# The fault soak for longer than CI runs it (CI: loadgen/tests/soak.rs,
# about 70 s of debug builds). Builds the release binaries, runs
# `ephd-bench soak` (which starts and owns its own ephd on loopback, with
# its own data directory) for DURATION, keeps its JSON report in
# /tmp/ephd-bench-results/soak-<stamp>.json and prints a summary: faults injected
# per kind, writes acknowledged and lost (and whether within the
# documented windows), peak RSS, watch events checked, panics, violations.
#
# Env: DURATION (10m), ROUND (10s, one fault per round), BUILD (1: cargo
# build --release first), EPHD (the server binary, default the release
# build), OUT (report path). Extra arguments go to `ephd-bench soak`, e.g.
#   DURATION=1h bench/soak.sh --storm 100 --event-rate 300
#   bench/soak.sh --server-arg=--max-request-bytes=3145728
# Exit status: the soak's (0 passed, 3 violations, 1 setup failure).
# Bounded: the soak stops its rounds at DURATION and bounds every call;
# `timeout` kills it at 2 x DURATION + 10 minutes if it hangs anyway.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DURATION=${DURATION:-10m}
ROUND=${ROUND:-10s}
BUILD=${BUILD:-1}
TARGET=${CARGO_TARGET_DIR:-target}
command -v python3 >/dev/null || { echo "soak.sh: python3 is required" >&2; exit 1; }
if [[ $BUILD == 1 ]]; then
  cargo build --release -p ephd -p ephd-bench
fi
BENCH=$TARGET/release/ephd-bench
EPHD=${EPHD:-$TARGET/release/ephd}
mkdir -p /tmp/ephd-bench-results
OUT=${OUT:-/tmp/ephd-bench-results/soak-$(date -u +%Y%m%d-%H%M%S).json}
secs=$(python3 - "$DURATION" <<'PY'
import re, sys
s = sys.argv[1].strip()
try:
    print(int(float(s)))
except ValueError:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"([0-9.]+)(ms|h|m|s)", s)
    if not parts or "".join(a + b for a, b in parts) != s:
        sys.exit(f"soak.sh: cannot read DURATION={s!r} (use 10m, 1h30m, 90s or seconds)")
    print(int(sum(float(a) * units[b] for a, b in parts)))
PY
)
echo "soak.sh: $EPHD for $DURATION (rounds of $ROUND); report in $OUT" >&2
rc=0
timeout --signal=KILL "$((secs * 2 + 600))" \
  "$BENCH" soak --duration "${secs}s" --max-time "${secs}s" --round "$ROUND" \
  --ephd-bin "$EPHD" --json --no-progress "$@" >"$OUT" || rc=$?
python3 - "$OUT" "$rc" <<'PY'
import json, sys
path, rc = sys.argv[1], int(sys.argv[2])
lines = [l for l in open(path) if l.strip().startswith("{")]
if not lines:
    sys.exit(f"soak.sh: no report in {path} (exit status {rc})")
r = json.loads(lines[-1])
acked = r.get("writes_acked", {})
print(f"soak: {r['duration_s']:.0f} s, {r['rounds']} rounds, {r['restarts']} restarts, seed {r['seed']}")
print("faults injected: " + ", ".join(f"{k} {v}" for k, v in sorted(r["faults"].items())))
print(f"writes acknowledged: {sum(acked.values())} ({', '.join(f'{k} {v}' for k, v in acked.items())}); "
      f"unknown outcome {r['writes_unknown_outcome']} (later found applied: {r['writes_unknown_found_applied']})")
print(f"write latency ms: p50 {r['lat_p50_ms']}  p99 {r['lat_p99_ms']}  max {r['lat_max_ms']}")
print(f"lost after SIGKILL: {r['writes_lost_in_crash_window']} acknowledged writes, all within the crash window "
      f"(newest snapshot at most {r['max_crash_window_s']} s old at the kill); "
      f"lost to damaged snapshots: {r['writes_lost_to_damaged_snapshots']} "
      f"({r['damaged_moved_aside']} files moved aside, {r['started_empty']} empty starts)")
print(f"watch: {r['watch_events_checked']} events checked by {r['watchers_created']} watchers, "
      f"{r['watch_state_compares']} prefix compares, {r['watch_compaction_cancels']} compaction cancels, "
      f"{r['burst_deletes_checked']} lease-burst DELETEs")
print(f"list storms: {r['storm_lists_ok']} lists ({r['storm_mib_listed']:.0f} MiB), {r['storm_lists_shed']} shed, "
      f"{r['storm_lists_timed_out']} timed out, {r['storm_lists_expired']} outlived by a compaction "
      f"(continue token expired), slowest {r['storm_list_max_s']} s")
print(f"server: peak RSS {r['peak_rss_mib']:.0f} MiB (budget {r['rss_budget_mib']}), panics {r['server_panics']}, "
      f"ERROR lines {r['server_error_lines']}")
print(f"violations: {r['violations']} {r.get('violation_kinds') or ''}")
for f in r.get("failures", []):
    print(f"  {f}")
PY
exit "$rc"
