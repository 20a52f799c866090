#!/usr/bin/env bash
# Starts ephd's container image (scripts/container-build.sh) with rootful
# podman and checks it with the stock etcdctl, the way an operator would:
#
#   0. whether this machine can run a container at all: `true` in the
#      image, first with podman's defaults, then with the workable
#      alternatives (scripts/container-lib.sh: the hard rlimits the process
#      has, runc instead of crun; --network=host is tried in step 3). If none
#      starts, it prints every attempt's error and the machine's cgroup,
#      capability and rlimit facts, and exits 3 saying containers cannot
#      run here;
#   1. secure by default: the image with nothing mounted refuses to start
#      (exit 2) and names what to mount or set; plaintext on 0.0.0.0
#      without the opt-in is refused too;
#   2. makes a throw-away CA, a server certificate for 127.0.0.1/localhost
#      and a client certificate (openssl), owned by the image's UID 65532;
#   3. runs the image as the manifests do (read-only root filesystem, all
#      capabilities dropped, no privilege escalation) with the certificates
#      mounted at /etc/ephd/tls: on podman's bridge network with the ports
#      published on 127.0.0.1 only, or, where that network cannot be set up,
#      on the host network with ephd told to listen on 127.0.0.1; then
#      waits for `etcdctl endpoint health` (timed: the start time below);
#   4. etcdctl put, get and endpoint status over TLS with the client
#      certificate, a client without a certificate refused, /health on the
#      HTTP port, the image's HEALTHCHECK (`podman healthcheck run`);
#   5. stops it (SIGTERM, graceful exit 0 expected) and removes it.
#
# It removes only the container it started (by the ID podman gave it, also
# on failure or Ctrl-C) and never touches other containers or images.
#
# Usage: scripts/container-smoke.sh          (as root)
# Environment (all optional):
#   EPHD_IMAGE             image to run (default localhost/ephd:dev)
#   EPHD_SMOKE_NETWORK     auto (default: bridge, then host), bridge or host
#   EPHD_SMOKE_PODMAN_OPTS extra `podman run` options, split on spaces
#   EPHD_STORAGE_DRIVER    as for scripts/container-build.sh
#   ETCDCTL                etcdctl binary (default: etcdctl on PATH; 3.4 here)
# Exit codes: 0 all checks passed; 1 a check failed; 3 no container can be
# started on this machine (the evidence is printed).
#
# Recorded run (2026-12-01, this project's 2-core Debian 12 VM under
# Firecracker, podman 4.3.1, etcdctl 3.4.23; README, "Container image"):
# PASS. Containers started with runc and the hard rlimits (crun and podman's
# default rlimits cannot start any here; scripts/container-lib.sh); both
# refusals exit 2 with their directions; ready 0.87-1.34 s after `podman
# run` on the bridge network (0.80 s with EPHD_SMOKE_NETWORK=host); put ->
# OK, get -> the value, endpoint status: 3.6.5, 837 B, leader; no client
# certificate -> "context deadline exceeded"; /health true; HEALTHCHECK
# healthy; SIGTERM -> exit 0 in 0.8-1.2 s; removed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/container-lib.sh
. scripts/container-lib.sh

say() { echo "container-smoke.sh: $*" >&2; }
fail() {
  say "FAIL: $*"
  exit 1
}

image=${EPHD_IMAGE:-localhost/ephd:dev}
network=${EPHD_SMOKE_NETWORK:-auto}
etcdctl_bin=${ETCDCTL:-${EPHD_REFERENCES:-$HOME/.cache/ephd/references}/bin/etcdctl-3.6}
storage=()
if [ -n "${EPHD_STORAGE_DRIVER:-}" ]; then storage=(--storage-driver "$EPHD_STORAGE_DRIVER"); fi
extra=()
if [ -n "${EPHD_SMOKE_PODMAN_OPTS:-}" ]; then read -r -a extra <<<"$EPHD_SMOKE_PODMAN_OPTS"; fi

[ "$(id -u)" = 0 ] || fail "run as root (rootful podman)"
command -v podman >/dev/null || fail "podman missing: run scripts/container-build.sh first"
[ -x "$etcdctl_bin" ] || fail "etcdctl missing (scripts/install-references.sh builds it)"
podman "${storage[@]}" image exists "$image" || fail "no image $image: run scripts/container-build.sh"

work=$(mktemp -d)
cid=""
rt=()
cleanup() {
  if [ -n "$cid" ]; then
    say "removing the container it started (${cid:0:12})"
    podman "${storage[@]}" rm -f -t 5 "$cid" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

podman_run() { podman "${storage[@]}" "${rt[@]}" run "$@"; }

# A loopback TCP port nothing listens on, outside the ephemeral range.
free_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 12000))
    if [ -z "$(ss -Hltn "sport = :$p")" ]; then
      echo "$p"
      return 0
    fi
  done
  fail "no free port"
}

say "$(podman --version); runtime $(podman info --format '{{.Host.OCIRuntime.Name}} {{.Host.OCIRuntime.Version}}' 2>/dev/null | head -n1); storage $(podman "${storage[@]}" info --format '{{.Store.GraphDriverName}}'); cgroups $(podman info --format '{{.Host.CgroupsVersion}}')"
say "image $image: $(podman "${storage[@]}" image inspect --format '{{.Id}} {{.Size}} bytes, binary from {{or (index .Labels "ephd.binary-source") "the builder stage"}}, revision {{or (index .Labels "org.opencontainers.image.revision") "not labelled"}}' "$image")"

# --- 0. can a container start here at all? --------------------------------
if ! container_probe "$image" "$work/probe" "${storage[@]}"; then
  say "CANNOT RUN CONTAINERS HERE: every way to start one failed. Evidence:"
  container_evidence "$work/probe" >&2
  exit 3
fi
for f in "$work"/probe/attempt-*.log; do
  if [ -e "$f" ]; then say "tried first: $(head -n 1 "$f"): $(tail -n +2 "$f" | grep -v '^$' | tail -n 1)"; fi
done
say "containers start with: $(cat "$work/probe/chosen")"
if [ -n "$CONTAINER_RUNTIME" ]; then rt=(--runtime "$CONTAINER_RUNTIME"); fi
run_opts=("${CONTAINER_RUN_OPTS[@]}")

# --- 1. secure by default -------------------------------------------------
say "checking that the image without certificates refuses to start"
set +e
out=$(timeout 60 podman "${storage[@]}" "${rt[@]}" run --rm --network none --no-healthcheck \
  "${run_opts[@]}" "${extra[@]}" "$image" 2>&1)
rc=$?
set -e
[ "$rc" = 2 ] || fail "without certificates: exit $rc (expected 2): $out"
grep -q 'EPHD_CERT_FILE) /etc/ephd/tls/tls.crt does not exist' <<<"$out" || fail "no directions in: $out"
grep -q 'EPHD_ALLOW_INSECURE_PLAINTEXT=true' <<<"$out" || fail "the opt-in is not named in: $out"
say "  refused, exit 2: ${out:0:160}..."
set +e
out=$(timeout 60 podman "${storage[@]}" "${rt[@]}" run --rm --network none --no-healthcheck \
  "${run_opts[@]}" "${extra[@]}" -e EPHD_LISTEN_CLIENT_URLS=http://0.0.0.0:2379 "$image" 2>&1)
rc=$?
set -e
[ "$rc" = 2 ] || fail "plaintext on 0.0.0.0: exit $rc (expected 2): $out"
grep -q 'refusing to serve unauthenticated plaintext gRPC on http://0.0.0.0:2379' <<<"$out" ||
  fail "plaintext on 0.0.0.0 not refused as expected: $out"
say "  plaintext on 0.0.0.0 refused, exit 2: ${out:0:160}..."

# --- 2. certificates ------------------------------------------------------
say "making a throw-away CA, server and client certificates"
(
  cd "$work"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 \
    -subj /CN=ephd-smoke-ca 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >server.ext
  printf 'extendedKeyUsage=clientAuth\n' >client.ext
  for n in server client; do
    openssl req -newkey rsa:2048 -nodes -keyout "$n.key" -out "$n.csr" -subj "/CN=ephd-smoke-$n" 2>/dev/null
    openssl x509 -req -in "$n.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
      -extfile "$n.ext" -out "$n.crt" 2>/dev/null
  done
  mkdir tls
  cp server.crt tls/tls.crt
  cp server.key tls/tls.key
  cp ca.crt tls/ca.crt
  chown -R 65532:65532 tls
  chmod 0500 tls
  chmod 0400 tls/*
)

# --- 3. run it ------------------------------------------------------------
cport=$(free_port)
mport=$(free_port)
[ "$cport" != "$mport" ] || mport=$((cport + 1))
name="ephd-smoke-$$"
# --health-interval=disable: podman 4.3 drives HEALTHCHECK with a systemd
# timer, and there is no systemd here; step 4 runs the check by hand.
common=(-d --name "$name" --read-only --cap-drop=ALL --security-opt=no-new-privileges
  --health-interval=disable -v "$work/tls:/etc/ephd/tls:ro" "${run_opts[@]}" "${extra[@]}")
start_container() { # network mode
  local t0
  t0=$(date +%s.%N)
  if [ "$1" = bridge ]; then
    cid=$(podman_run "${common[@]}" -p "127.0.0.1:$cport:2379" -p "127.0.0.1:$mport:2381" \
      "$image" 2>"$work/run.err") || {
      cid=""
      return 1
    }
  else
    cid=$(podman_run "${common[@]}" --network host \
      -e "EPHD_LISTEN_CLIENT_URLS=https://127.0.0.1:$cport" \
      -e "EPHD_LISTEN_METRICS_URLS=http://127.0.0.1:$mport" \
      "$image" 2>"$work/run.err") || {
      cid=""
      return 1
    }
  fi
  echo "$t0" >"$work/t0"
}
mode=""
for m in bridge host; do
  if [ "$network" != auto ] && [ "$network" != "$m" ]; then continue; fi
  if start_container "$m"; then
    mode=$m
    break
  fi
  say "podman run on the $m network failed: $(cat "$work/run.err")"
  # A failed run may leave a created container under our name: ours only.
  podman "${storage[@]}" rm -f "$name" >/dev/null 2>&1 || true
done
[ -n "$mode" ] || fail "the container did not start on any network"
say "started ${cid:0:12} ($mode network, client 127.0.0.1:$cport, HTTP 127.0.0.1:$mport)"

ctl=("$etcdctl_bin" "--endpoints=https://127.0.0.1:$cport" "--cacert=$work/ca.crt"
  "--cert=$work/client.crt" "--key=$work/client.key" --dial-timeout=2s --command-timeout=5s)
ready=""
for _ in $(seq 300); do
  if "${ctl[@]}" endpoint health >/dev/null 2>&1; then
    ready=$(date +%s.%N)
    break
  fi
  state=$(podman "${storage[@]}" inspect --format '{{.State.Status}}' "$cid")
  [ "$state" = running ] || fail "container $state: $(podman "${storage[@]}" logs "$cid" 2>&1 | tail -n 20)"
  sleep 0.1
done
[ -n "$ready" ] || fail "not healthy within 30 s: $(podman "${storage[@]}" logs "$cid" 2>&1 | tail -n 20)"
startup=$(awk -v a="$(cat "$work/t0")" -v b="$ready" 'BEGIN { printf "%.2f", b - a }')
say "ready: etcdctl endpoint health answered ${startup} s after podman run started"

# --- 4. etcdctl and HTTP --------------------------------------------------
out=$("${ctl[@]}" put smoke/greeting "hello from the container")
echo "$ etcdctl put smoke/greeting 'hello from the container'"
echo "$out"
[ "$out" = OK ] || fail "put answered: $out"
out=$("${ctl[@]}" get smoke/greeting --print-value-only)
echo "$ etcdctl get smoke/greeting --print-value-only"
echo "$out"
[ "$out" = "hello from the container" ] || fail "get answered: $out"
echo "$ etcdctl endpoint status -w table"
"${ctl[@]}" endpoint status -w table
status=$("${ctl[@]}" endpoint status -w json)
grep -q '"version":"3\.' <<<"$status" || fail "endpoint status: $status"
grep -q '"revision":[1-9]' <<<"$status" || fail "endpoint status without a revision: $status"
if "$etcdctl_bin" "--endpoints=https://127.0.0.1:$cport" "--cacert=$work/ca.crt" \
  --dial-timeout=2s --command-timeout=3s get smoke/greeting >"$work/nocert.out" 2>&1; then
  fail "a client without a certificate was served: $(cat "$work/nocert.out")"
fi
say "a client without a certificate is refused: $(tail -n 1 "$work/nocert.out")"
health=$(curl -s --max-time 5 "http://127.0.0.1:$mport/health")
echo "$ curl http://127.0.0.1:$mport/health"
echo "$health"
grep -q '"health":"true"' <<<"$health" || fail "/health: $health"
if podman "${storage[@]}" healthcheck run "$cid" >"$work/hc.out" 2>&1; then
  say "image HEALTHCHECK: healthy"
else
  fail "image HEALTHCHECK: $(cat "$work/hc.out")"
fi
logs=$(podman "${storage[@]}" logs "$cid" 2>&1)
grep -q 'serving etcd v3 gRPC' <<<"$logs" || fail "no serving line in the logs: $logs"
say "container log (colour codes removed):"
sed -e 's/\x1b\[[0-9;]*m//g' -e 's/^/    /' <<<"$logs" >&2

# --- 5. stop and remove ---------------------------------------------------
t0=$(date +%s.%N)
# (podman 4.3 without systemd logs an error about the healthcheck timer it
# cannot remove: noise, kept out of the way unless the stop fails.)
podman "${storage[@]}" stop -t 20 "$cid" >/dev/null 2>"$work/stop.err" ||
  fail "podman stop: $(cat "$work/stop.err")"
stopped=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
code=$(podman "${storage[@]}" inspect --format '{{.State.ExitCode}}' "$cid")
[ "$code" = 0 ] || fail "exit code $code after SIGTERM: $(podman "${storage[@]}" logs "$cid" 2>&1 | tail -n 5)"
podman "${storage[@]}" rm "$cid" >/dev/null 2>"$work/rm.err" || fail "podman rm: $(cat "$work/rm.err")"
cid=""
say "stopped in ${stopped} s (exit 0) and removed"
say "PASS: $image started in ${startup} s ($mode network), put/get/endpoint status over mTLS, insecure defaults refused"
