#!/usr/bin/env bash
# Where a three-member ephd (or one: MEMBERS=1) spends its thread switches under etcd's
# `benchmark put`: per thread name (Raft thread, apply thread, tokio workers), context switches
# and CPU per put, leader and followers apart; with WAKEUPS=1 also who wakes whom (`perf record
# -e sched:sched_wakeup`, needs perf). Used to compare two binaries run alternately
# (BENCHMARKS.md, "The Raft loop run by its inputs"):
#
#   for i in 1 2; do EPHD=/path/old/ephd bench/cluster_switches.sh; EPHD=/path/new/ephd bench/cluster_switches.sh; done
#   RATE=7500 TOTAL=60000 EPHD=... bench/cluster_switches.sh     # at a fixed rate
#
# Environment: EPHD (target/release/ephd), TOTAL (100000), RATE (none: as fast as it goes),
#   MEMBERS (3; 1: one ephd alone, the single-process path), WAKEUPS (0), PROFILE (none; a
#   path: a `perf record` of the members with DWARF call graphs, 4 s, is written there; needs
#   perf), BENCH_DIR
#   ($HOME/.cache/etcd-benchmark; build it with ../shared/bench/build-etcd-benchmark.sh).
# Prints the load tool's latency distribution, then switches and CPU per put per thread name.
# Loopback only, free ports picked at start; it stops only the members it started, and every run
# is bounded (120 s).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
EPHD=${EPHD:-$HERE/../target/release/ephd}
B=${BENCH_DIR:-$HOME/.cache/etcd-benchmark}/bin/benchmark
TOTAL=${TOTAL:-100000}
[ -x "$EPHD" ] || { echo "no ephd binary at $EPHD" >&2; exit 1; }
[ -x "$B" ] || { echo "no etcd benchmark tool at $B" >&2; exit 1; }
OUT=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$OUT"
}
trap cleanup EXIT

# Six free loopback ports below the ephemeral range (free_ports.py).
read -r -a P < <(python3 "$HERE/free_ports.py" 6)
IC="m0=http://127.0.0.1:${P[3]},m1=http://127.0.0.1:${P[4]},m2=http://127.0.0.1:${P[5]}"
EPS=127.0.0.1:${P[0]},127.0.0.1:${P[1]},127.0.0.1:${P[2]}
MEMBERS=${MEMBERS:-3}
if [ "$MEMBERS" = 1 ]; then
  # One member alone (the single-process path), for the same figures.
  IC="m0=http://127.0.0.1:${P[3]}"
  EPS=127.0.0.1:${P[0]}
fi
for i in $(seq 0 $((MEMBERS - 1))); do
  "$EPHD" --name m$i --listen-client-urls http://127.0.0.1:${P[$i]} \
    --advertise-client-urls http://127.0.0.1:${P[$i]} \
    --listen-peer-urls http://127.0.0.1:${P[$((i + 3))]} \
    --initial-advertise-peer-urls http://127.0.0.1:${P[$((i + 3))]} \
    --initial-cluster "$IC" --initial-cluster-token switches$$ --initial-cluster-state new \
    --quota-backend-bytes 8589934592 --log-level warn >"$OUT/m$i.log" 2>&1 &
  pids+=($!)
done
whole=
until_s=$((SECONDS + 30))
while [ $SECONDS -lt $until_s ]; do
  python3 "$HERE/cluster_tool.py" whole "$EPS" 2>/dev/null && whole=1 && break
  sleep 0.3
done
if [ -z "$whole" ]; then
  # A member that could not start (its port taken) would leave two members
  # under load and the figures meaningless: stop, and say why.
  echo "the $MEMBERS members did not all answer within 30 s; their logs:" >&2
  for i in $(seq 0 $((MEMBERS - 1))); do echo "--- m$i" >&2; tail -n 5 "$OUT/m$i.log" >&2; done
  exit 1
fi
# The members may serve before they agree on a leader: ask until they do.
li=
for _ in $(seq 50); do
  read -r li _ < <(python3 "$HERE/cluster_tool.py" leader "$EPS" 2>/dev/null) && break
  li=
  sleep 0.3
done
[ -n "$li" ] || { echo "the members agreed on no leader within 15 s" >&2; exit 1; }
L=${pids[$li]}

snap() { # pid thread-name switches cpu-ticks, one line per thread
  # A thread may end while it is read (tokio's blocking threads do when
  # idle): it is left out rather than ending the script.
  for p in "${pids[@]}"; do
    for t in /proc/$p/task/*; do
      local comm ctx cpu
      comm=$(tr ' ' _ <"$t/comm" 2>/dev/null) || continue
      ctx=$(awk '/ctxt_switches/{s+=$2} END{print s}' "$t/status" 2>/dev/null) || continue
      cpu=$(awk '{print $14+$15}' "$t/stat" 2>/dev/null) || continue
      [ -n "$ctx" ] && [ -n "$cpu" ] && echo "$p $comm $ctx $cpu"
    done
  done
  return 0
}
snap >"$OUT/s0"
timeout 120 "$B" --endpoints "$EPS" --dial-timeout 5s --clients 100 --conns 10 put --total "$TOTAL" \
  --key-size 48 --val-size 1024 --key-space-size 100000 ${RATE:+--rate $RATE} >"$OUT/bench.txt" 2>/dev/null &
BP=$!
if [ -n "${PROFILE:-}" ]; then
  sleep 3
  # DWARF call graphs: the release build keeps no frame pointers, so `-g`
  # would give no user-space callers. 499 Hz keeps the file near 40 MB.
  perf record -F 499 --call-graph dwarf,16384 -p "$(IFS=,; echo "${pids[*]}")" -o "$PROFILE" -- sleep 4 >/dev/null 2>&1
fi
if [ "${WAKEUPS:-0}" = 1 ]; then
  sleep 2
  perf record -a -e sched:sched_wakeup -o "$OUT/wake.data" -- sleep 2 >/dev/null 2>&1
fi
wait $BP
snap >"$OUT/s1"
# The load tool's latency distribution, on one line.
grep -E "in [0-9.]+ secs|Average|Slowest|Fastest" "$OUT/bench.txt" | tr -s " \t" " " | tr "\n" " "
echo
rps=$(awk '/Requests\/sec/{print $2}' "$OUT/bench.txt")
echo "ephd $EPHD, rate ${RATE:-peak}: $rps puts/s, p99 $(awk '/99% in/{print $3}' "$OUT/bench.txt") s"
python3 - "$OUT" "$TOTAL" "$L" <<'PY'
import collections, sys
out, total, leader = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def read(name):
    d = collections.defaultdict(lambda: [0, 0])
    for line in open(f"{out}/{name}"):
        pid, comm, ctx, cpu = line.split()
        d[(pid, comm)][0] += int(ctx); d[(pid, comm)][1] += int(cpu)
    return d
a, b = read("s0"), read("s1")
ctx, cpu = collections.Counter(), collections.Counter()
for k, (c1, u1) in b.items():
    c0, u0 = a.get(k, [0, 0])
    role = "leader" if k[0] == leader else "follower"
    ctx[(role, k[1])] += c1 - c0; cpu[(role, k[1])] += u1 - u0
for k in sorted(ctx):
    n = 1 if k[0] == "leader" else 2
    if ctx[k] or cpu[k]:
        print(f"  {k[0]:8s} {k[1]:16s} switches/put {ctx[k]/total/n:6.3f}  CPU µs/put {cpu[k]*1e4/total/n:6.1f}  (per member)")
print(f"  all members: switches/put {sum(ctx.values())/total:.2f}, server CPU µs/put {sum(cpu.values())*1e4/total:.1f}")
PY
if [ "${WAKEUPS:-0}" = 1 ]; then
  perf script -i "$OUT/wake.data" -F comm,pid,tid,trace 2>/dev/null | python3 -c '
import collections, re, sys
leader, pids, rate = sys.argv[1], sys.argv[2].split(","), float(sys.argv[3])
role = {p: ("leader" if p == leader else "follower") for p in pids}
c = collections.Counter()
for line in sys.stdin:
    m = re.match(r"\s*(\S.*?)\s+(\d+)/(\d+)\s+comm=(\S+) pid=(\d+)", line)
    if m:
        c[(role.get(m.group(2), "other") + ":" + m.group(1), m.group(4))] += 1
print("  wake-ups per put (2 s sample; follower rows sum both followers):")
for (w, e), n in c.most_common(15):
    print(f"    {w:28s} -> {e:18s} {n / (rate * 2):.3f}")
' "$L" "$(IFS=,; echo "${pids[*]}")" "$rps"
fi
