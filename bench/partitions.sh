#!/usr/bin/env bash
# A long soak of the network partition scenarios (tests/it/partition): three- and five-member
# stock etcd and ephd in network namespaces of their own, the leader cut off, one-way loss,
# flapping links, a five-member split, a follower cut off past the leader's log; each under the
# Kubernetes-like workload with a watch, leases and linearizability clients, checked as in the
# default test command. Here every fault holds SCALE times longer (and a flapping link flaps
# SCALE times as often), and the whole set runs ROUNDS times.
#
# Needs root (it creates network namespaces; the test removes them, and a later run removes what
# a killed run left). Loopback and its own namespaces only; every wait in the tests is bounded.
#
# Environment: ROUNDS (5), SCALE (4), FILTER (partition::scenarios: a test name narrows it),
#   OUT (stdout only; a file to copy the per-scenario lines to).
# Output: each scenario's line per system and round (writes acknowledged, during and after the
#   fault, longest gap between acknowledgements, watch resumes), and a final pass/fail count.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=${ROUNDS:-5}
SCALE=${SCALE:-4}
FILTER=${FILTER:-partition::scenarios}
cd "$ROOT"

cargo build --release --tests >&2
passed=0
failed=0
lines=$(mktemp)
trap 'rm -f "$lines"' EXIT
for round in $(seq 1 "$ROUNDS"); do
  echo "[partitions] round $round of $ROUNDS, scale $SCALE" >&2
  if EPHD_PARTITION_SCALE=$SCALE cargo test --release --test it "$FILTER" -- --test-threads=1 --nocapture \
    2> >(grep -E "^[A-Za-z]+ on (Etcd|Ephd): " | sed "s/^/round $round: /" | tee -a "$lines" >&2); then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
done
echo "rounds passed: $passed, failed: $failed" | tee -a "$lines"
if [ -n "${OUT:-}" ]; then cp "$lines" "$OUT"; fi
[ "$failed" = 0 ]
