//! A member's cluster-wide lease state, below the Raft node that holds it:
//! the voters, links to the other members for forwarding, and whether this
//! member, as leader, has restarted the lease countdowns in its term. What
//! is done with it (forwarding keep-alives, the leader's rounds) is
//! `lease_forward.rs`. Who the members are, and where they are reached,
//! is read from the applied membership at each call, so a member added
//! later (a replacement that became leader) is reached like the others.

use crate::cluster::member::applied_membership::Members;
use crate::cluster::transport::peer_dial::PeerDialer;
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
pub(in crate::cluster) fn not_leader() -> Status {
    Status::new(Code::FailedPrecondition, "etcdserver: not leader")
}

/// The cluster-wide lease state of a member: who the voters are, links to
/// the other members (for forwarding), and whether this member, as leader,
/// has restarted the lease countdowns in its current term.
pub struct LeaseForward {
    me: u64,
    /// The applied membership (who is a voter, where each member is).
    members: Arc<Members>,
    /// A client per member, with the peer URL it was made for.
    clients: Mutex<HashMap<u64, (String, RaftTransportClient<Channel>)>>,
    /// Peer TLS for those clients, if on.
    dialer: PeerDialer,
    pub(in crate::cluster) store: Arc<Store>,
    /// The term in which this member, as leader, restarted the countdowns
    /// (0: not in any term yet).
    pub(in crate::cluster) promoted_term: AtomicU64,
    /// Held by a checkpoint round from reading the time left until the
    /// checkpoint is applied, and by a keep-alive while it renews: a
    /// checkpoint read before a renewal can then never be applied after
    /// it, which would shorten the renewed lease after a leader change.
    pub(in crate::cluster) checkpointing: tokio::sync::Mutex<()>,
}

impl LeaseForward {
    /// The state of member `me`, whose membership is `members`, with
    /// `store`; it dials the others with `dialer`.
    pub(in crate::cluster) fn new(
        me: u64,
        members: Arc<Members>,
        store: Arc<Store>,
        dialer: PeerDialer,
    ) -> Self {
        LeaseForward {
            me,
            members,
            clients: Mutex::new(HashMap::new()),
            dialer,
            store,
            promoted_term: AtomicU64::new(0),
            checkpointing: tokio::sync::Mutex::new(()),
        }
    }

    /// Whether `id` is a voting member now (learners do not vote).
    pub(in crate::cluster) fn is_voter(&self, id: u64) -> bool {
        self.members
            .current
            .read()
            .get(id)
            .is_some_and(|m| !m.is_learner)
    }

    /// A client of member `id`'s peer service, at its current peer URL
    /// (connected lazily, kept while the URL stays).
    pub(in crate::cluster) fn client(
        &self,
        id: u64,
    ) -> Result<RaftTransportClient<Channel>, Status> {
        if id == self.me {
            return Err(not_leader());
        }
        let url = self
            .members
            .current
            .read()
            .get(id)
            .and_then(|m| m.peer_urls.first().cloned())
            .ok_or_else(|| status(Error::NoLeader))?;
        let mut clients = self.clients.lock();
        if let Some((at, c)) = clients.get(&id) {
            if *at == url {
                return Ok(c.clone());
            }
        }
        let channel = self
            .dialer
            .connect_lazy(&url, Duration::from_secs(1))
            .map_err(Status::unavailable)?;
        let client = RaftTransportClient::new(channel);
        clients.insert(id, (url, client.clone()));
        Ok(client)
    }
}
