//! ephd: an in-memory store that speaks etcd's v3 API with etcd's exact
//! semantics, built to take Kubernetes' high-churn resources (Events and
//! coordination Leases) off the cluster's etcd.
//!
//! # Layout
//! ```text
//! server/     wiring: listeners, TLS, services, shutdown; bootstrap and
//!             background tasks (lease expiry, auto-compaction, snapshots).
//! api/        gRPC adapters (tonic): convert, call the core, map errors. Thin.
//! http.rs     /health, /livez, /readyz, /version, /metrics.
//! watch/      watch streams: replay from the log, live delivery, progress.
//! mvcc/       the store core: revisions, per-key history, Range/Txn/Compact,
//!             leases, the change log, and the one write path (`Store::apply`).
//! lease/      the lease table and its timers; knows nothing of revisions.
//! persist/    the optional snapshot file.
//! error.rs    the one table of etcd errors (code + exact message).
//! config.rs   command-line flags with etcd's names, `EPHD_*` env vars.
//! logging.rs  `--logger` (zap's JSON lines or text) and `--log-outputs`.
//! proto.rs    etcd's wire format, generated from `proto/`.
//! ```
//! Dependencies run one way: `server` → `api` → `watch` → `mvcc` → `lease`
//! → `error`. A request flows `api` → `mvcc::Store::apply` (writes) or
//! `mvcc::Store::range` (reads) → the change log → `watch` streams. Nothing
//! below `api` knows about gRPC. ARCHITECTURE.md walks a request through.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
pub mod config;
pub mod error;
pub mod http;
pub mod lease;
pub mod logging;
pub mod metrics;
pub mod mvcc;
pub mod persist;
pub mod proto;
pub mod server;
pub mod watch;
