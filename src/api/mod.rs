//! gRPC adapters: one per etcd service. Each decodes the wire request into
//! the store core's types, calls the backend (`crate::backend`) or, for a
//! read, the store, and encodes the answer; no etcd semantics live here
//! beyond what is about the wire itself (headers, size limits, streaming),
//! and nothing depends on whether the server is a single or a cluster
//! member.

mod auth;
mod authz;
mod cluster;
mod convert;
mod deadline;
mod election;
mod health;
mod kv;
mod lease;
mod limits;
mod lock;
mod maintenance;
mod overload;
mod range_stream;
mod snapshot;
mod watch;

pub use auth::AuthService;
pub use cluster::ClusterService;
pub use election::ElectionService;
pub use health::Health;
pub use kv::KvService;
pub use lease::LeaseService;
pub use limits::GrpcGoLimits;
pub use lock::LockService;
pub use maintenance::MaintenanceService;
pub use overload::{Overload, PreEncoded, ResponsePermit, SendPreEncoded};
pub use watch::WatchService;

use crate::backend::{MemberInfo, Mode};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::mvcc::Store;
use crate::proto::etcdserverpb::ResponseHeader;
use std::sync::Arc;
use std::time::Duration;

/// Version reported by Maintenance.Status. kube-apiserver enables
/// RequestWatchProgress only for etcd >= 3.5.13, so report a 3.6 release.
pub const ETCD_VERSION: &str = "3.6.5";

/// The storage (data format) version Maintenance.Status reports, as etcd
/// 3.6 reports its own.
pub const STORAGE_VERSION: &str = "3.6.0";

/// Identity and limits shared by every service.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// Member name (`--name`).
    pub name: String,
    /// Stable cluster ID derived from the name and advertised URLs.
    pub cluster_id: u64,
    /// Stable member ID derived likewise.
    pub member_id: u64,
    /// Raft term analogue; constant for a single in-memory member.
    pub raft_term: u64,
    /// Advertised client URLs, as MemberList reports them.
    pub client_urls: Vec<String>,
    /// Advertised peer URLs (informational only for a single member).
    pub peer_urls: Vec<String>,
    /// Largest write request accepted (`--max-request-bytes`).
    pub max_request_bytes: usize,
    /// Interval of periodic watch progress notifications.
    pub progress_notify_interval: Duration,
}

impl ServerInfo {
    /// Identity for a member called `name` advertising `client_urls`.
    pub fn new(name: &str, client_urls: Vec<String>) -> Self {
        let member_id = fnv64(format!("{name}|{}", client_urls.join(",")).as_bytes());
        let cluster_id = fnv64(format!("cluster|{name}|{member_id}").as_bytes());
        ServerInfo {
            name: name.to_string(),
            cluster_id,
            member_id,
            raft_term: 2,
            client_urls,
            peer_urls: vec!["http://localhost:2380".to_string()],
            max_request_bytes: 1_572_864,
            progress_notify_interval: Duration::from_secs(600),
        }
    }

    /// This member as MemberList shows it.
    pub fn member_info(&self) -> MemberInfo {
        MemberInfo {
            id: self.member_id,
            name: self.name.clone(),
            peer_urls: self.peer_urls.clone(),
            client_urls: self.client_urls.clone(),
            is_learner: false,
        }
    }

    /// The header of a top-level response at `revision`.
    pub fn header(&self, revision: i64) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision,
            raft_term: self.raft_term,
        })
    }
}

fn fnv64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// What every service holds.
#[derive(Clone)]
pub struct Shared {
    /// The store core.
    pub store: Arc<Store>,
    /// What serves every operation beyond a local read: the store itself
    /// (single member) or the Raft log (cluster member).
    pub backend: Mode,
    /// Identity and limits.
    pub info: Arc<ServerInfo>,
    /// Counters and gauges.
    pub metrics: Arc<Metrics>,
    /// Limits on large reads (see `overload.rs`).
    pub overload: Arc<Overload>,
    /// Turns true when the server shuts down; long-lived streams end then.
    pub stop: tokio::sync::watch::Receiver<bool>,
}

/// Completes once the server is shutting down.
pub async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    // Drop the borrow guard before returning so callers' futures stay Send.
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

/// The status a stream ends with when the server shuts down
/// ([`Error::StreamShutdown`]).
pub(crate) fn shutting_down() -> tonic::Status {
    status(Error::StreamShutdown)
}

pub use crate::grpc_status::status;

/// etcd rejects writes whose encoded size exceeds `--max-request-bytes`.
pub(crate) fn check_size(info: &ServerInfo, len: usize) -> Result<(), tonic::Status> {
    if len > info.max_request_bytes {
        Err(status(Error::RequestTooLarge))
    } else {
        Ok(())
    }
}
