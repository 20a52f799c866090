//! A member's cluster-wide lease state, below the Raft node that holds it:
//! the voters, links to the other members for forwarding, and whether this
//! member, as leader, has restarted the lease countdowns in its term. What
//! is done with it (forwarding keep-alives, the leader's rounds) is
//! `lease_forward.rs`.

use crate::config::ClusterConfig;
use crate::error::Error;
use crate::grpc_status::status;
use crate::mvcc::Store;
use crate::proto::ephd::internal::raft_transport_client::RaftTransportClient;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// etcd's answer on a member that is not the leader.
pub(super) fn not_leader() -> Status {
    Status::new(Code::FailedPrecondition, "etcdserver: not leader")
}

/// The cluster-wide lease state of a member: who the voters are, links to
/// the other members (for forwarding), and whether this member, as leader,
/// has restarted the lease countdowns in its current term.
pub struct LeaseForward {
    me: u64,
    peers: HashMap<u64, String>,
    clients: Mutex<HashMap<u64, RaftTransportClient<Channel>>>,
    pub(super) store: Arc<Store>,
    /// The term in which this member, as leader, restarted the countdowns
    /// (0: not in any term yet).
    pub(super) promoted_term: AtomicU64,
    /// Held by a checkpoint round from reading the time left until the
    /// checkpoint is applied, and by a keep-alive while it renews: a
    /// checkpoint read before a renewal can then never be applied after
    /// it, which would shorten the renewed lease after a leader change.
    pub(super) checkpointing: tokio::sync::Mutex<()>,
}

impl LeaseForward {
    /// The state of a member of `config` with `store`.
    pub(super) fn new(config: &ClusterConfig, store: Arc<Store>) -> Self {
        let me = config.member_id();
        LeaseForward {
            me,
            peers: config
                .members
                .iter()
                .map(|m| (m.id, m.peer_urls[0].clone()))
                .collect(),
            clients: Mutex::new(HashMap::new()),
            store,
            promoted_term: AtomicU64::new(0),
            checkpointing: tokio::sync::Mutex::new(()),
        }
    }

    /// Whether `id` is a voting member.
    pub(super) fn is_voter(&self, id: u64) -> bool {
        self.peers.contains_key(&id)
    }

    /// A client of member `id`'s peer service (connected lazily, kept).
    pub(super) fn client(&self, id: u64) -> Result<RaftTransportClient<Channel>, Status> {
        if id == self.me {
            return Err(not_leader());
        }
        let mut clients = self.clients.lock();
        if let Some(c) = clients.get(&id) {
            return Ok(c.clone());
        }
        let url = self.peers.get(&id).ok_or_else(|| status(Error::NoLeader))?;
        let channel = super::peers::endpoint(url)
            .map_err(|e| Status::unavailable(format!("invalid peer URL {url}: {e}")))?
            .connect_timeout(Duration::from_secs(1))
            .tcp_nodelay(true)
            .connect_lazy();
        let client = RaftTransportClient::new(channel);
        clients.insert(id, client.clone());
        Ok(client)
    }
}
