# syntax=docker/dockerfile:1
#
# ephd container image.
#
#   docker build -t ephd:dev .
#   docker run --rm -p 2379:2379 -p 2381:2381 ephd:dev
#   etcdctl --endpoints http://127.0.0.1:2379 endpoint status
#   curl -s http://127.0.0.1:2381/health      # {"health":"true"}
#
# Stages: chef (toolchain + cargo-chef) -> planner (dependency recipe) ->
# builder (dependencies cached in their own layer, then ephd) -> runtime
# (debian slim, non-root, no extra packages).
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
FROM debian:${DEBIAN_SUITE}-slim AS runtime

LABEL org.opencontainers.image.title="ephd" \
      org.opencontainers.image.description="In-memory, etcd-v3-compatible store for Kubernetes' ephemeral resources (events, leases)" \
      org.opencontainers.image.licenses="Apache-2.0"

COPY --from=builder /out/ephd /usr/local/bin/ephd
COPY --chmod=0755 deploy/docker/healthcheck.sh /usr/local/bin/ephd-healthcheck

# A data directory owned by the runtime user, for --data-dir (off by default:
# mount a volume there and pass --data-dir=/var/lib/ephd, or set
# EPHD_DATA_DIR=/var/lib/ephd, to keep data across container re-creation).
RUN install -d -o 65532 -g 65532 -m 0700 /var/lib/ephd

# Inside a container a loopback-only listener is unreachable, so the image
# defaults to all interfaces. These are environment defaults rather than CMD
# arguments so that `docker run ephd:dev --log-level=debug` keeps them; a
# command-line flag still overrides its EPHD_* variable.
ENV EPHD_LISTEN_CLIENT_URLS=http://0.0.0.0:2379 \
    EPHD_LISTEN_METRICS_URLS=http://0.0.0.0:2381

# Numeric UID/GID (the distroless "nonroot" ids): no passwd entry needed, and
# Kubernetes' runAsNonRoot can verify it.
USER 65532:65532

# 2379: etcd v3 gRPC (clients, kube-apiserver); 2381: /metrics, /health, /readyz, /livez.
EXPOSE 2379 2381

# Follows EPHD_LISTEN_METRICS_URLS (or EPHD_HEALTHCHECK_ADDR=host:port) if
# you move the metrics listener; Kubernetes ignores HEALTHCHECK and uses the
# manifests' probes instead.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/ephd-healthcheck"]

STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/ephd"]
