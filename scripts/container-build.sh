#!/usr/bin/env bash
# Builds ephd's container image with a daemonless builder from Debian's
# packages (buildah), where no container registry is reachable:
#
#   1. installs buildah, podman and mmdebstrap from Debian's packages when
#      missing (non-interactively, starting no service);
#   2. compiles ephd on this host (`cargo build --release --locked --bin
#      ephd`, under nice) and copies the binary to dist/ephd;
#   3. makes a base root filesystem from Debian's packages with mmdebstrap
#      (variant minbase: essential packages and apt, with the man pages,
#      docs and locales left out as in debian:*-slim), of this host's Debian
#      release, and imports it as a local image (reused on later runs);
#   4. builds the Dockerfile's `runtime-prebuilt` target FROM that image
#      (build ARG RUNTIME_BASE), in the docker image format so that the
#      HEALTHCHECK is kept.
#
# Why the binary is compiled on the host, not in the Dockerfile's builder
# stage: that stage starts FROM rust:*, which cannot be pulled without a
# registry, and Debian's own rustc (1.63 in bookworm) is older than the
# crate's rust-version (1.88), so a toolchain image cannot be made from
# Debian's packages either. The Dockerfile keeps both ways: its default
# target compiles in the builder stage (for machines with a registry), and
# `runtime-prebuilt` copies dist/ephd. The image says which it is: label
# ephd.binary-source=host, plus the commit it was built from
# (org.opencontainers.image.revision, "-dirty" with local changes). The
# binary links to glibc dynamically, so the base must be the host's Debian
# release (or newer): the default suite is read from /etc/os-release, and
# the build runs `ephd --version` inside the image to prove it links.
#
# Usage: scripts/container-build.sh
# Environment (all optional):
#   EPHD_IMAGE           image to build (default localhost/ephd:dev)
#   EPHD_BASE_SUITE      Debian suite of the base (default: this host's)
#   EPHD_BASE_IMAGE      base image name (default localhost/ephd-base:<suite>-minbase)
#   EPHD_REBUILD_BASE=1  make the base again even if it exists
#   EPHD_DEBIAN_MIRROR   default http://deb.debian.org/debian (the security
#                        suite is taken from the same host, /debian-security)
#   EPHD_BINARY          use this ephd binary instead of building one
#   EPHD_BUILD_ISOLATION buildah's --isolation (default: oci, with the
#                        runtime and --ulimit options that start a container
#                        here, see scripts/container-lib.sh; chroot when none
#                        does)
#   EPHD_STORAGE_DRIVER  containers/storage driver for buildah and podman
#                        (default: their own, overlay; vfs where overlay
#                        cannot be mounted)
#   CARGO_TARGET_DIR     as usual
#
# Recorded run (2026-12-01, this project's 2-core Debian 12 VM, kernel
# 6.18 under Firecracker, buildah 1.28.2, podman 4.3.1, runc 1.1.5,
# mmdebstrap 1.3.5; README, "Container image"):
#   - the packages installed non-interactively, no service started;
#   - host release build 11 min 28 s from clean (machine shared), 57 MB
#     binary (line tables kept by the release profile), needs GLIBC_2.34;
#   - mmdebstrap bookworm minbase: 157 s, 126.6 MB tar, imported as
#     localhost/ephd-base:bookworm-minbase (127 MB);
#   - podman's defaults could not start a container (crun: "cgroups in
#     hybrid mode not supported"; "setrlimit RLIMIT_NOFILE: Operation not
#     permitted"), runc with --ulimit nofile=20000:20000 --ulimit
#     nproc=32768:32768 could, and the build's RUN steps used that;
#   - buildah build of runtime-prebuilt: 5 s (the rust:* stages skipped,
#     nothing pulled), `ephd --version` ran in the image: localhost/ephd:dev,
#     184 MB.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/container-lib.sh
. scripts/container-lib.sh

say() { echo "container-build.sh: $*" >&2; }

image=${EPHD_IMAGE:-localhost/ephd:dev}
# shellcheck disable=SC1091
suite=${EPHD_BASE_SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}")}
base=${EPHD_BASE_IMAGE:-localhost/ephd-base:${suite}-minbase}
mirror=${EPHD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
storage=()
if [ -n "${EPHD_STORAGE_DRIVER:-}" ]; then storage=(--storage-driver "$EPHD_STORAGE_DRIVER"); fi

# --- 1. tools -------------------------------------------------------------
if [ "$(id -u)" != 0 ]; then
  say "run as root: mmdebstrap's root mode and rootful buildah/podman"
  exit 1
fi
policy=/usr/sbin/policy-rc.d
created_policy=0
work=""
cleanup() {
  if [ "$created_policy" = 1 ]; then rm -f "$policy"; fi
  if [ -n "$work" ]; then rm -rf "$work"; fi
}
trap cleanup EXIT
missing=()
for tool in buildah podman mmdebstrap runc; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing ${missing[*]} from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  # policy-rc.d exit 101: package scripts install services without
  # starting them (podman ships an API service and a socket).
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    created_policy=1
  fi
  apt-get update -qq
  # crun and runc run the containers (runc where crun cannot: see
  # scripts/container-lib.sh); the CNI plugins (bookworm podman's network
  # backend) give the smoke test a bridge network with published ports.
  apt-get install -y -qq --no-install-recommends \
    buildah podman mmdebstrap crun runc containernetworking-plugins \
    golang-github-containers-common iptables >/dev/null
  cleanup
  created_policy=0
fi
say "$(buildah --version); $(podman --version); mmdebstrap $(mmdebstrap --version | awk '{print $2}')"

# --- 2. the binary --------------------------------------------------------
mkdir -p dist
if [ -n "${EPHD_BINARY:-}" ]; then
  binary=$EPHD_BINARY
else
  say "compiling ephd on the host (cargo build --release --locked --bin ephd)"
  nice -n 19 cargo build --release --locked --bin ephd
  binary=${CARGO_TARGET_DIR:-target}/release/ephd
fi
if ! [ "$binary" -ef dist/ephd ]; then install -m 0755 "$binary" dist/ephd; fi
"$binary" --help | grep -q -- '--listen-client-urls' || {
  say "$binary does not look like ephd"
  exit 1
}
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if ! git diff --quiet HEAD -- . 2>/dev/null; then revision="$revision-dirty"; fi
glibc_needed=$(objdump -T dist/ephd 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -n1 || true)
say "dist/ephd: $(stat -c %s dist/ephd) bytes, needs ${glibc_needed:-an unknown glibc}, commit $revision"

# --- 3. the base image ----------------------------------------------------
if [ "${EPHD_REBUILD_BASE:-0}" != 1 ] && buildah "${storage[@]}" inspect --type image "$base" >/dev/null 2>&1; then
  say "reusing base image $base (EPHD_REBUILD_BASE=1 makes it again)"
else
  work=$(mktemp -d)
  say "making the $suite minbase root filesystem with mmdebstrap from $mirror"
  sources=("deb $mirror $suite main")
  case "$suite" in
    sid | unstable) ;;
    *)
      sources+=("deb $mirror $suite-updates main")
      sources+=("deb ${mirror%/debian}/debian-security $suite-security main")
      ;;
  esac
  start=$(date +%s)
  # As debian:*-slim: no man pages, docs (but copyrights) or translations,
  # and no apt lists left in the image. ($1 in the hook is mmdebstrap's.)
  # shellcheck disable=SC2016
  mmdebstrap --variant=minbase --mode=root --format=tar \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/lintian/*' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/apt/* "$1"/var/log/dpkg.log' \
    "$suite" "$work/rootfs.tar" "${sources[@]}" </dev/null
  say "rootfs: $(stat -c %s "$work/rootfs.tar") bytes of tar in $(($(date +%s) - start)) s"
  podman "${storage[@]}" import \
    --change 'CMD ["/bin/bash"]' \
    --change "LABEL org.opencontainers.image.description=Debian $suite minbase made by mmdebstrap" \
    "$work/rootfs.tar" "$base" >/dev/null
  rm -rf "$work"
fi

# --- 4. the image ---------------------------------------------------------
# The build's RUN steps start containers: find the runtime and options that
# can start one here (scripts/container-lib.sh says why the defaults cannot
# on this project's VMs); with none, buildah's chroot isolation needs no
# OCI runtime at all.
run_opts=()
if [ -n "${EPHD_BUILD_ISOLATION:-}" ]; then
  run_opts=(--isolation "$EPHD_BUILD_ISOLATION")
else
  work=$(mktemp -d)
  if container_probe "$base" "$work/probe" "${storage[@]}"; then
    say "containers start with: $(cat "$work/probe/chosen")"
    if [ -n "$CONTAINER_RUNTIME" ]; then run_opts=(--runtime "$CONTAINER_RUNTIME"); fi
    run_opts+=("${CONTAINER_RUN_OPTS[@]}")
  else
    say "no OCI runtime can start a container here; building with --isolation chroot. Evidence:"
    container_evidence "$work/probe" >&2
    run_opts=(--isolation chroot)
  fi
  for f in "$work"/probe/attempt-*.log; do
    if [ -e "$f" ]; then say "(tried first: $(head -n 1 "$f"): $(tail -n +2 "$f" | grep -v '^$' | tail -n 1))"; fi
  done
  rm -rf "$work"
  work=""
fi
say "building $image (target runtime-prebuilt FROM $base)"
start=$(date +%s)
buildah "${storage[@]}" build "${run_opts[@]}" \
  --format docker \
  --pull=never \
  --skip-unused-stages=true \
  --target runtime-prebuilt \
  --build-arg RUNTIME_BASE="$base" \
  --label ephd.binary-source=host \
  --label org.opencontainers.image.revision="$revision" \
  --label org.opencontainers.image.version="$(dist/ephd --version | awk '{print $2}')" \
  --tag "$image" \
  .
say "built $image in $(($(date +%s) - start)) s"
size=$(podman "${storage[@]}" image inspect --format '{{.Size}}' "$image")
base_size=$(podman "${storage[@]}" image inspect --format '{{.Size}}' "$base")
say "image size: $size bytes ($((size / 1000000)) MB; base $((base_size / 1000000)) MB, binary $(($(stat -c %s dist/ephd) / 1000000)) MB)"
podman "${storage[@]}" images --filter reference="$image" --filter reference="$base"
