#!/usr/bin/env bash
# How long killed members take to be voters again, three-member ephd against three-member stock
# etcd, side by side on this machine.
#
# Each round SIGKILLs the current leader (KILLED=2: and the next member, a majority), waits
# RESTART_DELAY s and starts them again with the same flags: etcd's members on their data dirs (on
# tmpfs); ephd's on theirs too (EPHD_STATE=data, the default: they restart from their Raft logs
# under their own IDs) or without state (EPHD_STATE=memory: one rejoins by itself under a new ID:
# old ID removed, added as a learner, caught up, promoted; a majority cannot come back that way).
# The time measured runs from the restart to the moment every restarted member serves a
# linearizable read (a learner refuses them) and the member list it answers shows it as a
# started voter. Before each kill the cluster
# is left STEADY s (etcd's health interval is 5 s). A light writer puts through the other members
# throughout. The systems alternate round by round, each on a cluster of its own.
#
# Loopback only, ports of its own, etcd data dirs under /dev/shm (removed at the end), every wait
# bounded, and on exit it stops only the processes it started.
#
# Environment: KILLS (20 per system), KILLED (1 or 2 members per kill), EPHD_STATE (data or
#   memory), RESTART_DELAY (0.6), STEADY (6), WAIT_MAX (30 s for the members to come back), BUILD (1: cargo build --release first), EPHD (target/release/ephd),
#   ETCD (etcd 3.6 of scripts/install-references.sh), ETCDCTL (its etcdctl 3.6), OUT (stdout only; a file to copy the table to).
# Output: one line per round (system, round, seconds), then the median and maximum per system.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KILLS=${KILLS:-20}
KILLED=${KILLED:-1}
EPHD_STATE=${EPHD_STATE:-data}
RESTART_DELAY=${RESTART_DELAY:-0.6}
STEADY=${STEADY:-6}
WAIT_MAX=${WAIT_MAX:-30}
BUILD=${BUILD:-1}
TGT=${CARGO_TARGET_DIR:-$ROOT/target}
EPHD=${EPHD:-$TGT/release/ephd}
REFS=${EPHD_REFERENCES:-$HOME/.cache/ephd/references}/bin
ETCD=${ETCD:-$REFS/etcd-3.6}
ETCDCTL=${ETCDCTL:-$REFS/etcdctl-3.6}

log() { printf '[rejoin %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
now_ms() { date +%s%3N; }

command -v "$ETCDCTL" >/dev/null || { echo "etcdctl is required (scripts/install-references.sh)" >&2; exit 1; }
[[ -x $ETCD ]] || { echo "etcd not found at $ETCD (scripts/install-references.sh builds it)" >&2; exit 1; }
if [[ $BUILD == 1 ]]; then
  log "building the release binary"
  (cd "$ROOT" && timeout 3600 cargo build --release -p ephd) >&2
fi
[[ -x $EPHD ]] || { echo "missing $EPHD (BUILD=1 builds it)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/ephd-rejoin-bench.XXXXXX)
DATA=$(mktemp -d /dev/shm/ephd-rejoin-bench.XXXXXX)
declare -A PIDS=()
WRITER=""

stop_system() { # etcd|ephd
  local i p
  for i in 0 1 2; do
    p=${PIDS[$1$i]:-}
    [[ -n $p ]] && kill -KILL "$p" 2>/dev/null || true
    [[ -n $p ]] && wait "$p" 2>/dev/null || true
    PIDS[$1$i]=""
  done
}
cleanup() {
  [[ -n $WRITER ]] && kill "$WRITER" 2>/dev/null || true
  stop_system etcd
  stop_system ephd
  rm -rf "$DATA" "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Twelve free loopback ports: client and peer ports of three members for each system.
read -r -a PORTS < <(python3 "$ROOT/bench/free_ports.py" 12)
cport() { # system index
  local base=0
  [[ $1 == ephd ]] && base=6
  echo "${PORTS[$((base + $2))]}"
}
pport() {
  local base=3
  [[ $1 == ephd ]] && base=9
  echo "${PORTS[$((base + $2))]}"
}
endpoint() { echo "127.0.0.1:$(cport "$1" "$2")"; }
initial() { # system
  local i out=()
  for i in 0 1 2; do out+=("$1$i=http://127.0.0.1:$(pport "$1" "$i")"); done
  (IFS=,; echo "${out[*]}")
}

start_member() { # system index state
  local sys=$1 i=$2 url peer
  url="http://127.0.0.1:$(cport "$sys" "$i")"
  peer="http://127.0.0.1:$(pport "$sys" "$i")"
  if [[ $sys == etcd ]]; then
    "$ETCD" --name "etcd$i" --data-dir "$DATA/etcd$i" --listen-client-urls "$url" \
      --advertise-client-urls "$url" --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
      --initial-cluster "$(initial etcd)" --initial-cluster-token rejoin-etcd \
      --initial-cluster-state "$3" --logger zap --log-outputs stderr --log-level warn \
      >>"$WORK/etcd$i.log" 2>&1 &
  else
    local data_dir=()
    [[ $EPHD_STATE == data ]] && data_dir=(--data-dir "$DATA/ephd$i")
    "$EPHD" --name "ephd$i" "${data_dir[@]}" --listen-client-urls "$url" --advertise-client-urls "$url" \
      --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
      --initial-cluster "$(initial ephd)" --initial-cluster-token rejoin-ephd \
      --initial-cluster-state "$3" --log-level warn >>"$WORK/ephd$i.log" 2>&1 &
  fi
  PIDS[$sys$i]=$!
}

ctl() { timeout 5 "$ETCDCTL" --dial-timeout=1s --command-timeout=2s "$@"; }

leader_of() { # system: the index of its leader
  local i
  for i in 0 1 2; do
    if ctl --endpoints="$(endpoint "$1" "$i")" endpoint status -w json 2>/dev/null |
      python3 -c 'import json,sys; s=json.load(sys.stdin)[0]["Status"]; sys.exit(0 if s.get("leader")==s["header"]["member_id"] else 1)'; then
      echo "$i"
      return 0
    fi
  done
  return 1
}

# Whether member i of the system serves a linearizable read and lists itself as a started voter.
voter_again() { # system index
  local ep
  ep=$(endpoint "$1" "$2")
  ctl --endpoints="$ep" get --consistency=l rejoin-probe >/dev/null 2>&1 || return 1
  ctl --endpoints="$ep" member list -w json 2>/dev/null | python3 -c '
import json, sys
url = sys.argv[1]
ms = json.load(sys.stdin).get("members", [])
me = [m for m in ms if url in m.get("clientURLs", [])]
sys.exit(0 if me and me[0].get("name") and not me[0].get("isLearner") else 1)' "http://$ep"
}

writer() { # a put every 50 ms through any member that answers
  local n=0
  while true; do
    ctl --endpoints="$(endpoint etcd 0),$(endpoint etcd 1),$(endpoint etcd 2)" put "w/$n" v >/dev/null 2>&1 || true
    ctl --endpoints="$(endpoint ephd 0),$(endpoint ephd 1),$(endpoint ephd 2)" put "w/$n" v >/dev/null 2>&1 || true
    n=$((n + 1))
    sleep 0.05
  done
}

for sys in etcd ephd; do
  for i in 0 1 2; do start_member "$sys" "$i" new; done
done
deadline=$((SECONDS + WAIT_MAX))
until leader_of etcd >/dev/null && leader_of ephd >/dev/null; do
  ((SECONDS < deadline)) || { echo "the clusters did not elect leaders" >&2; exit 1; }
  sleep 0.2
done
writer &
WRITER=$!
log "both clusters up; $KILLS kills of $KILLED member(s) each, restart after ${RESTART_DELAY}s (ephd: $EPHD_STATE)"

declare -A TIMES=()
for ((round = 0; round < KILLS; round++)); do
  for sys in etcd ephd; do
    sleep "$STEADY"
    leader=$(leader_of "$sys") || { echo "$sys: no leader before round $round" >&2; exit 1; }
    killed=("$leader")
    ((KILLED < 2)) || killed+=("$(((leader + 1) % 3))")
    for i in "${killed[@]}"; do kill -KILL "${PIDS[$sys$i]}"; done
    for i in "${killed[@]}"; do wait "${PIDS[$sys$i]}" 2>/dev/null || true; done
    sleep "$RESTART_DELAY"
    start=$(now_ms)
    for i in "${killed[@]}"; do
      start_member "$sys" "$i" "$([[ $sys == etcd ]] && echo existing || echo new)"
    done
    for i in "${killed[@]}"; do
      until voter_again "$sys" "$i"; do
        if (($(now_ms) - start > WAIT_MAX * 1000)); then
          echo "$sys: member $i not back within ${WAIT_MAX}s (round $round); logs in $WORK" >&2
          trap - EXIT
          exit 1
        fi
        sleep 0.02
      done
    done
    took=$(($(now_ms) - start))
    TIMES[$sys]="${TIMES[$sys]:-} $took"
    printf '%s\tround %d\t%.3f s\n' "$sys" "$round" "$(echo "$took / 1000" | bc -l)"
  done
done

summary() {
  for sys in etcd ephd; do
    echo "${TIMES[$sys]}" | python3 -c '
import statistics, sys
t = [int(x) / 1000 for x in sys.stdin.read().split()]
print(f"{sys.argv[1]}\tkills {len(t)}\tmedian {statistics.median(t):.2f} s\tmax {max(t):.2f} s\tmin {min(t):.2f} s")' "$sys"
  done
}
summary | tee ${OUT:+"$OUT"}
