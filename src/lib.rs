//! ephd: an in-memory store that speaks etcd's v3 API with etcd's exact
//! semantics, built to take Kubernetes' high-churn resources (Events and
//! coordination Leases) off the cluster's etcd.
//!
//! # Layout
//! ```text
//! api/        gRPC adapters (tonic): validate, convert, map errors. Thin.
//! mvcc/       the store core: revisions, per-key history, Range/Txn/Compact,
//!             and the revision-ordered change log.
//! watch/      watch streams: replay from the log, live delivery, progress.
//! lease/      leases and their expiry; revocation is a store write.
//! error.rs    the one table of etcd errors (code + exact message).
//! config.rs   command-line flags with etcd's names, `EPHD_*` env vars.
//! server.rs   listeners, keepalive, TLS, background tasks, shutdown.
//! proto.rs    etcd's wire format, generated from `proto/`.
//! ```
//! A request flows `api` → `mvcc::Store` (which calls into `lease::Lessor`
//! for attachments) → the change log → `watch` streams. Nothing below `api`
//! knows about gRPC.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
pub mod config;
pub mod error;
pub mod http;
pub mod lease;
pub mod metrics;
pub mod mvcc;
pub mod persist;
pub mod proto;
pub mod server;
pub mod watch;
