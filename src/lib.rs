//! ephd: an in-memory store that speaks etcd's v3 API with etcd's exact
//! semantics, built to take Kubernetes' high-churn resources (Events and
//! coordination Leases) off the cluster's etcd.
//!
//! # Layout
//! ```text
//! server/     wiring: listeners, services, shutdown; bootstrap and
//!             background tasks (lease expiry, auto-compaction, snapshots).
//! tls/        TLS on the client and peer listeners: certificates and CAs
//!             reloaded while serving, revocation lists, the allowed peer
//!             name, a certificate's fields for logs and auth.
//! api/        gRPC adapters (tonic): convert, call the backend, map errors.
//!             Thin, and the same in both modes.
//! backend/    the seam the services call: one `Backend` interface, served by
//!             a `SingleMember` (the store itself) or a `ClusterMember`
//!             (the Raft log).
//! cluster/    cluster mode: the Raft node, the Raft and apply threads, the
//!             peer transport, leadership and membership (CLUSTER.md).
//! concurrency/ etcd's mutex and election recipes for the Lock and Election
//!             services: KV ops through the backend, waits on the watch hub.
//! wire.rs     etcd's wire requests ⇄ the core's, both ways.
//! http.rs     /health, /livez, /readyz, /version, /metrics.
//! gateway/    HTTP/1.1 on the client port: those endpoints and etcd's JSON
//!             gateway, each call made in process as a gRPC call.
//! watch/      watch streams: replay from the log, live delivery, progress.
//! auth/       users, roles, permissions, tokens (etcd's auth).
//! mvcc/       the store core: revisions, per-key history, Range/Txn/Compact,
//!             leases, the change log, and the one write path (`Store::apply`).
//! lease/      the lease table and its timers; knows nothing of revisions.
//! persist/    the optional snapshot file.
//! error.rs    the one table of etcd errors (code + exact message).
//! config.rs   command-line flags with etcd's names, `EPHD_*` and `ETCD_*`
//!             env vars, etcd's YAML file, `--etcd-compat`.
//! embed.rs    an in-process ephd for test suites (etcd's `embed`).
//! logging.rs  `--logger` (zap's JSON lines or text) and `--log-outputs`.
//! proto.rs    etcd's wire format, generated from `proto/`.
//! ```
//! Dependencies run one way: `server` → `api` → (`concurrency` →)
//! `backend` → `cluster` → `watch` → `mvcc` → `lease` → `error`; `api` and
//! `cluster` both convert requests with `wire.rs`, so a replicated request
//! means what a served one does. A request flows `api` → `backend` →
//! `mvcc::Store::apply` (writes: at once on a single member, through the
//! Raft log on a cluster member) or `mvcc::Store::range` (reads) → the
//! change log → `watch` streams. Nothing below `cluster` knows about gRPC.
//! ARCHITECTURE.md walks a request through.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
pub mod auth;
pub mod backend;
pub mod cluster;
pub mod concurrency;
pub mod config;
pub mod embed;
pub mod entry_bytes;
pub mod error;
pub mod gateway;
pub mod grpc_status;
pub mod http;
pub mod lease;
pub mod logging;
pub mod metrics;
pub mod mvcc;
pub mod persist;
pub mod proto;
pub mod server;
mod tls;
pub mod wal;
pub mod watch;
mod wire;
