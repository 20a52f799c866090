# syntax=docker/dockerfile:1
#
# ephd container image.
#
#   docker build -t ephd:dev .
#
# Secure by default: the image serves gRPC over TLS with client-certificate
# authentication on 0.0.0.0:2379, from the files mounted at /etc/ephd/tls
# (tls.crt, tls.key, and ca.crt, the CA that signs the clients'
# certificates; the layout of a Kubernetes TLS Secret with a ca.crt key),
# readable by UID 65532:
#
#   docker run --rm -p 127.0.0.1:2379:2379 -p 127.0.0.1:2381:2381 \
#     -v "$PWD/certs:/etc/ephd/tls:ro" ephd:dev
#   etcdctl --endpoints https://127.0.0.1:2379 --cacert certs/ca.crt \
#     --cert client.crt --key client.key endpoint status
#   curl -s http://127.0.0.1:2381/health      # {"health":"true",...}
#
# Without those files it refuses to start and says what to mount or set.
# Plaintext on all interfaces must be asked for by name, and is then
# logged as a WARN at every start (a private test network only):
#
#   docker run --rm -p 127.0.0.1:2379:2379 \
#     -e EPHD_LISTEN_CLIENT_URLS=http://0.0.0.0:2379 \
#     -e EPHD_ALLOW_INSECURE_PLAINTEXT=true ephd:dev
#
# Stages: chef (toolchain + cargo-chef) -> planner (dependency recipe) ->
# builder (dependencies cached in their own layer, then ephd) ->
# runtime-base (debian slim, non-root, no extra packages) -> runtime (the
# default target: runtime-base + the binary compiled by builder).
#
# runtime-prebuilt is the other way to finish: runtime-base + a binary
# already compiled on the build host, at dist/ephd in the build context, and
# no toolchain stage at all. scripts/container-build.sh uses it where no
# registry is reachable (so rust:* cannot be pulled), with RUNTIME_BASE set
# to a local image made from Debian's packages by mmdebstrap; the image
# then carries the label ephd.binary-source=host (see that
# script's header for why, and for the glibc rule it checks):
#
#   docker build --target runtime-prebuilt --build-arg RUNTIME_BASE=... .
#
# Both targets were built with buildah 1.28 and run with podman on
# 2026-12-01 (the default one from a local stand-in for rust:1.95-bookworm);
# README, "Container image", has what happened.
#
# The runtime is debian:bookworm-slim rather than distroless/cc: slim has
# bash, which the HEALTHCHECK uses to speak HTTP over /dev/tcp (no curl or
# wget is installed, and no package at all is added to the base). That costs
# ~50 MB over distroless/cc-debian12, for a working `docker ps` health status
# and a shell for `kubectl exec` debugging. If ephd grows a self-probe
# subcommand, switching the runtime to gcr.io/distroless/cc-debian12:nonroot
# (same glibc) is a two-line change: FROM, and HEALTHCHECK CMD ["/usr/local/bin/ephd", ...].

ARG RUST_VERSION=1.95
ARG DEBIAN_SUITE=bookworm
# The runtime's base image. Keep its Debian release the one the binary was
# built on (DEBIAN_SUITE for the builder stage; the host's for
# runtime-prebuilt): the binary needs that glibc or newer.
ARG RUNTIME_BASE=debian:bookworm-slim

# ---------------------------------------------------------------------------
FROM rust:${RUST_VERSION}-${DEBIAN_SUITE} AS chef
ARG CARGO_CHEF_VERSION=0.1.78
RUN cargo install cargo-chef --locked --version "${CARGO_CHEF_VERSION}" \
    && rm -rf "${CARGO_HOME}/registry" "${CARGO_HOME}/git"
WORKDIR /src

# ---------------------------------------------------------------------------
# recipe.json captures Cargo.toml/Cargo.lock and the target layout only, so
# the dependency layer below is rebuilt only when dependencies change.
FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

# ---------------------------------------------------------------------------
FROM chef AS builder
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=planner /src/recipe.json recipe.json
# .cargo/config.toml must be in place before dependencies are built: its
# rustflags (--cfg tokio_unstable) must match the final build, or the cached
# dependencies would be rebuilt, and its [env] compiles jemalloc's built-in
# options (oversize_threshold:0, see src/main.rs) into tikv-jemalloc-sys.
COPY .cargo/ .cargo/
# The patched h2 (third_party/h2/EPHD-PATCH.md) is a dependency, not a
# workspace member, so the recipe does not carry it: its real source must be
# in place for the dependency layer, where [patch.crates-io] points.
COPY third_party/ third_party/
# Dependency caching layer: compiles every dependency (and the vendored
# protoc used by build.rs) against a skeleton of the crate.
RUN cargo chef cook --release --locked --bin ephd --recipe-path recipe.json
COPY . .
# The --help check guards against shipping a skeleton binary.
RUN cargo build --release --locked --bin ephd \
    && ./target/release/ephd --help | grep -q -- '--listen-client-urls' \
    && install -D -m 0755 target/release/ephd /out/ephd

# ---------------------------------------------------------------------------
# Everything of the runtime but the binary, shared by both ways to finish.
FROM ${RUNTIME_BASE} AS runtime-base

LABEL org.opencontainers.image.title="ephd" \
      org.opencontainers.image.description="In-memory, etcd-v3-compatible store for Kubernetes' ephemeral resources (events, leases)" \
      org.opencontainers.image.licenses="Apache-2.0"

COPY --chmod=0755 deploy/docker/healthcheck.sh /usr/local/bin/ephd-healthcheck

# A data directory owned by the runtime user, for --data-dir (off by default:
# mount a volume there and pass --data-dir=/var/lib/ephd, or set
# EPHD_DATA_DIR=/var/lib/ephd, to keep data across container re-creation),
# and the mount point of the TLS files.
RUN install -d -o 65532 -g 65532 -m 0700 /var/lib/ephd \
    && install -d -m 0755 /etc/ephd/tls

# Inside a container a loopback-only listener is unreachable, so the image
# listens on all interfaces, and therefore with TLS and client certificates
# (ephd has no users: whoever reaches a plaintext port owns every key).
# These are environment defaults rather than CMD arguments so that
# `docker run ephd:dev --log-level=debug` keeps them; a command-line flag
# still overrides its EPHD_* variable (use the EPHD_* names, or flags, with
# this image: an ETCD_* variable that disagrees with one of these is
# refused). EPHD_ALLOW_INSECURE_PLAINTEXT=true with an http:// client URL
# serves plaintext instead, with a WARN. The HTTP listener serves only
# /health, /livez, /readyz, /version and /metrics, never keys.
ENV EPHD_LISTEN_CLIENT_URLS=https://0.0.0.0:2379 \
    EPHD_CERT_FILE=/etc/ephd/tls/tls.crt \
    EPHD_KEY_FILE=/etc/ephd/tls/tls.key \
    EPHD_TRUSTED_CA_FILE=/etc/ephd/tls/ca.crt \
    EPHD_CLIENT_CERT_AUTH=true \
    EPHD_LISTEN_METRICS_URLS=http://0.0.0.0:2381

# Numeric UID/GID (the distroless "nonroot" ids): no passwd entry needed, and
# Kubernetes' runAsNonRoot can verify it.
USER 65532:65532

# 2379: etcd v3 gRPC (clients, kube-apiserver); 2381: /metrics, /health, /readyz, /livez.
EXPOSE 2379 2381

# Follows EPHD_LISTEN_METRICS_URLS (or EPHD_HEALTHCHECK_ADDR=host:port) if
# you move the metrics listener; Kubernetes ignores HEALTHCHECK and uses the
# manifests' probes instead. (Kept only in the docker image format: buildah
# and podman need --format docker.)
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/ephd-healthcheck"]

STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/ephd"]

# ---------------------------------------------------------------------------
# A binary compiled on the build host (scripts/container-build.sh puts it at
# dist/ephd). The --version run checks, at build time, that it links against
# this base's glibc.
FROM runtime-base AS runtime-prebuilt
COPY --chmod=0755 dist/ephd /usr/local/bin/ephd
RUN ["/usr/local/bin/ephd", "--version"]

# ---------------------------------------------------------------------------
# The default target: the binary compiled in the builder stage above.
FROM runtime-base AS runtime
COPY --from=builder /out/ephd /usr/local/bin/ephd
