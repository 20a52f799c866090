//! Generated protobuf / gRPC code for the etcd v3 API.
//!
//! ephd speaks etcd's v3 gRPC protocol so that unmodified etcd clients
//! (Kubernetes' apiserver via Go clientv3, `etcdctl`, the Rust `etcd-client`
//! crate) can talk to it. The definitions in `proto/` mirror etcd's package,
//! service, message and field names and numbers exactly; this module only
//! exposes the code that `build.rs` generates from them. All `bytes` fields
//! are decoded as [`bytes::Bytes`].

/// MVCC key/value and watch-event types (`mvccpb`).
#[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

/// User / role / permission types (`authpb`).
#[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
pub mod authpb {
    tonic::include_proto!("authpb");
}

/// The main client API: KV, Watch, Lease, Cluster, Maintenance and Auth
/// services (`etcdserverpb`).
#[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}

/// The distributed lock service (`v3lockpb`).
#[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
}

/// The leader election service (`v3electionpb`).
#[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
}

/// ephd's internal messages between cluster members (`ephd.internal`):
/// the Raft log entry and the peer transport. Not part of etcd's wire
/// format; only ephd members speak it.
pub mod ephd {
    /// The `ephd.internal` package (nested so that its references to
    /// `etcdserverpb` resolve to `crate::proto::etcdserverpb`).
    #[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
    pub mod internal {
        tonic::include_proto!("ephd.internal");
    }
}

/// The gRPC message codec of every service and client in [`crate::proto`].
pub mod codec;
pub mod nesting;
