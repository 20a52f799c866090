# shellcheck shell=bash
# CONTAINER_RUNTIME and CONTAINER_RUN_OPTS are set here for the scripts
# that source this file.
# shellcheck disable=SC2034
# Shared by scripts/container-build.sh and scripts/container-smoke.sh:
# finds a way to start a container on this machine.
#
# Why this is needed on this project's machines (Firecracker VMs; found
# 2026-12-01 with podman 4.3.1, crun 1.8.1, runc 1.1.5):
#   - crun refuses to start any container: "cgroups in hybrid mode not
#     supported, drop all controllers from cgroupv2". The VM mounts the
#     cgroup v1 controllers and a cgroup2 hierarchy (/sys/fs/cgroup/unified)
#     whose cgroup.controllers still lists hugetlb; crun gives up on that
#     layout even with --cgroups=disabled / --cgroup-manager=disabled.
#     runc handles it (v1 controllers).
#   - podman's defaults ask for RLIMIT_NOFILE 1048576 and RLIMIT_NPROC
#     4194304, above this machine's hard limits (20000 open files; the
#     runtime runs with 32768 processes), and root here lacks
#     CAP_SYS_RESOURCE (CapEff 0x1fffeffffff: bit 24 cleared), so raising
#     them fails ("setrlimit RLIMIT_NOFILE: Operation not permitted", runc
#     "error setting rlimit type 7"). Asking for the hard limits the
#     process already has works.
# So: podman's defaults first (a normal machine needs nothing), then the
# same with the current hard limits, then runc with them. The first that
# starts /bin/true in the image wins; each failure is kept as evidence.

# The current hard limits as --ulimit options: open files, and processes
# capped at the kernel's pid_max (the limit podman starts the runtime with
# here when it is lower than the shell's).
container_ulimits() {
  local nofile nproc pid_max
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  pid_max=$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo "$nproc")
  if [ "$nproc" = unlimited ] || { [ "$pid_max" != unlimited ] && [ "$pid_max" -lt "$nproc" ]; }; then
    nproc=$pid_max
  fi
  if [ "$nofile" = unlimited ]; then nofile=1048576; fi
  echo "--ulimit nofile=$nofile:$nofile --ulimit nproc=$nproc:$nproc"
}

# container_probe IMAGE EVIDENCE_DIR [podman global options...]
# Sets CONTAINER_RUNTIME (empty: podman's default, else a runtime name) and
# CONTAINER_RUN_OPTS (an array of `podman run`/`buildah build` options) to
# the first combination that starts /bin/true in IMAGE. Returns 1 when none
# does, with each attempt's output in EVIDENCE_DIR/attempt-N.log.
container_probe() {
  local image=$1 evidence=$2
  shift 2
  local ulimits candidates=() i=0 runtime opts out
  ulimits=$(container_ulimits)
  candidates+=("|")
  candidates+=("|$ulimits")
  if command -v runc >/dev/null 2>&1; then candidates+=("runc|$ulimits"); fi
  mkdir -p "$evidence"
  for c in "${candidates[@]}"; do
    i=$((i + 1))
    runtime=${c%%|*}
    opts=${c#*|}
    local rt=()
    if [ -n "$runtime" ]; then rt=(--runtime "$runtime"); fi
    read -r -a CONTAINER_RUN_OPTS <<<"$opts"
    if out=$(timeout 120 podman "$@" "${rt[@]}" run --rm --network none --entrypoint /bin/true "${CONTAINER_RUN_OPTS[@]}" "$image" 2>&1); then
      CONTAINER_RUNTIME=$runtime
      echo "podman ${rt[*]:+${rt[*]} }run ${opts:-(defaults)}" >"$evidence/chosen"
      return 0
    fi
    printf 'podman %srun %s\n%s\n' "${rt[*]:+${rt[*]} }" "${opts:-(defaults)}" "$out" >"$evidence/attempt-$i.log"
  done
  CONTAINER_RUNTIME=""
  CONTAINER_RUN_OPTS=()
  return 1
}

# Prints what makes containers fail here, after the attempts' errors.
container_evidence() {
  local evidence=$1 f
  for f in "$evidence"/attempt-*.log; do
    [ -e "$f" ] || continue
    echo "--- $(basename "$f"): $(head -n 1 "$f")"
    tail -n +2 "$f" | tail -n 5
  done
  echo "--- kernel $(uname -r); $(grep -c cgroup /proc/mounts) cgroup mounts; cgroup2 controllers: $(cat /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null || cat /sys/fs/cgroup/cgroup.controllers 2>/dev/null)"
  echo "--- $(grep CapEff /proc/self/status); hard limits: nofile $(ulimit -Hn), nproc $(ulimit -Hu); pid_max $(cat /proc/sys/kernel/pid_max)"
  echo "--- runtimes: crun $(crun --version 2>/dev/null | head -n 1 | awk '{print $3}'), runc $(runc --version 2>/dev/null | head -n 1 | awk '{print $3}')"
}
