//! What a learner serves to clients. A learner receives the log but does
//! not vote and does not count for commits, so etcd 3.4 keeps clients off
//! it: it answers Maintenance.Status and serializable Ranges, and refuses
//! every other client call, unary or stream, of every client service (KV,
//! Watch, Lease, Cluster, Maintenance, Auth, Lock, Election, gRPC health)
//! with `etcdserver: rpc not supported for learner` (Unavailable), before
//! any other check. Checked call by call against a stock etcd 3.4 learner
//! in `tests/it/cluster_learner.rs`.
//!
//! Whether this member is a learner is read from the applied membership
//! at each call, so a promoted learner serves everything from the moment
//! it has applied its promotion. The peer listener is not affected: a
//! learner replicates and answers its peers as any member.

use super::node::Node;
use crate::error::Error;
use tonic::Status;

/// Path prefixes of the client services (gRPC paths only: the HTTP routes
/// of the client port, `/metrics` or the JSON gateway's `/v3/...`, never
/// start with these).
const CLIENT_SERVICES: &[&str] = &[
    "/etcdserverpb.",
    "/v3lockpb.",
    "/v3electionpb.",
    "/grpc.health.v1.Health/",
];

/// The client calls a learner serves whatever they carry (a Range is
/// served only when serializable, which the KV service checks).
const SERVED: &[&str] = &["/etcdserverpb.Maintenance/Status", "/etcdserverpb.KV/Range"];

impl Node {
    /// Whether this member is a learner in the applied membership.
    pub fn is_learner(&self) -> bool {
        self.members()
            .current
            .read()
            .get(self.id())
            .is_some_and(|m| m.is_learner)
    }
}

/// etcd's answer to a call a learner does not serve.
pub fn refusal() -> Status {
    crate::grpc_status::status(Error::NotSupportedForLearner)
}

/// Whether a learner refuses the gRPC call at `path` outright.
pub fn refuses(path: &str) -> bool {
    CLIENT_SERVICES.iter().any(|p| path.starts_with(p)) && !SERVED.contains(&path)
}

/// For a Range: refused on a learner unless it is serializable.
pub fn check_range(node: Option<&Node>, serializable: bool) -> Result<(), Status> {
    match node {
        Some(n) if !serializable && n.is_learner() => Err(refusal()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_learner_serves_status_and_range_only() {
        for served in SERVED {
            assert!(!refuses(served), "{served}");
        }
        for refused in [
            "/etcdserverpb.KV/Put",
            "/etcdserverpb.KV/RangeStream",
            "/etcdserverpb.Watch/Watch",
            "/etcdserverpb.Lease/LeaseKeepAlive",
            "/etcdserverpb.Cluster/MemberList",
            "/etcdserverpb.Maintenance/Snapshot",
            "/etcdserverpb.Auth/Authenticate",
            "/v3lockpb.Lock/Lock",
            "/v3electionpb.Election/Observe",
            "/grpc.health.v1.Health/Check",
        ] {
            assert!(refuses(refused), "{refused}");
        }
        for http in ["/metrics", "/health", "/v3/kv/range", "/readyz"] {
            assert!(!refuses(http), "{http}");
        }
        let s = refusal();
        assert_eq!(s.code(), tonic::Code::Unavailable);
        assert_eq!(s.message(), "etcdserver: rpc not supported for learner");
    }
}
