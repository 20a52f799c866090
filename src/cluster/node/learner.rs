//! What a learner serves to clients. A learner receives the log but does
//! not vote and does not count for commits, so etcd keeps clients off it:
//! it answers Maintenance.Status, Maintenance.Snapshot and serializable
//! Ranges, and refuses every other client call, unary or stream, of every
//! client service (KV, Watch, Lease, Cluster, Maintenance, Auth, Lock,
//! Election, gRPC health) with `etcdserver: rpc not supported for learner`
//! (FailedPrecondition), before any other check. Checked call by call
//! against a stock etcd 3.6 learner in `tests/it/cluster/learner.rs`.
//!
//! Whether this member is a learner is read from the applied membership
//! at each call, so a promoted learner serves everything from the moment
//! it has applied its promotion. A member that joined as a learner is one
//! from its start, while it replays the log up to its own addition. The peer listener is not affected: a
//! learner replicates and answers its peers as any member.

use crate::cluster::node::raft_node::Node;
use crate::cluster::replicated::member_list::Membership;
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
const SERVED: &[&str] = &[
    "/etcdserverpb.Maintenance/Status",
    "/etcdserverpb.Maintenance/Snapshot",
    "/etcdserverpb.KV/Range",
];

impl Node {
    /// Whether this member is a learner in the applied membership.
    pub fn is_learner(&self) -> bool {
        let members = self.members();
        learner_in(
            &members.current.read(),
            self.id(),
            members.joined_as_learner,
        )
    }
}

/// Whether member `me` is a learner by the applied membership `current`.
/// A member that joined as a learner and has not yet applied its own
/// addition (it replays the log from the initial cluster) is one already:
/// it must not serve clients while it catches up.
fn learner_in(current: &Membership, me: u64, joined_as_learner: bool) -> bool {
    match current.get(me) {
        Some(m) => m.is_learner,
        None => joined_as_learner && !current.is_removed(me),
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
    fn a_joining_learner_is_one_before_it_applied_its_addition() {
        use crate::cluster::replicated::member_list::{Change, MemberInfo};
        let voter = |id| MemberInfo {
            id,
            name: format!("m{id}"),
            peer_urls: vec![format!("http://127.0.0.1:{id}")],
            ..Default::default()
        };
        let mut m = Membership::of([voter(1), voter(2), voter(3)]);
        // Replaying the log: not in the membership yet.
        assert!(learner_in(&m, 4, true));
        assert!(!learner_in(&m, 4, false));
        let learner = MemberInfo {
            is_learner: true,
            ..voter(4)
        };
        m.apply(&Change::Add(learner)).unwrap();
        assert!(learner_in(&m, 4, true));
        m.apply(&Change::Promote(4)).unwrap();
        assert!(!learner_in(&m, 4, true), "promoted");
        assert!(!learner_in(&m, 1, false));
        m.apply(&Change::Remove(4)).unwrap();
        assert!(!learner_in(&m, 4, true), "removed");
    }

    #[test]
    fn a_learner_serves_status_snapshot_and_range_only() {
        for served in SERVED {
            assert!(!refuses(served), "{served}");
        }
        for refused in [
            "/etcdserverpb.KV/Put",
            "/etcdserverpb.KV/RangeStream",
            "/etcdserverpb.Watch/Watch",
            "/etcdserverpb.Lease/LeaseKeepAlive",
            "/etcdserverpb.Cluster/MemberList",
            "/etcdserverpb.Maintenance/Defragment",
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
        assert_eq!(s.code(), tonic::Code::FailedPrecondition);
        assert_eq!(s.message(), "etcdserver: rpc not supported for learner");
    }
}
