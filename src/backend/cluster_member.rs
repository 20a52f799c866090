//! A member of a Raft cluster: mutations are proposed to the Raft log
//! (`cluster/node/raft_node.rs`) after this member's own checks, linearizable reads
//! wait for the read index, leases are renewed and read at the leader
//! (`cluster/node/lease_forward.rs`), and membership changes are conf changes
//! (`cluster/lifecycle/reconfig.rs`).

use super::{Backend, LeaderLoss, Members, RaftView, RequireLeaderLayer};
use crate::auth::{AuthInfo, AuthOp};
use crate::cluster::{
    node::leadership, node::learner, node::lease_forward, MemberInfo, Membership, Node,
};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::mvcc::{
    AlarmAction, AlarmChange, AlarmMember, Command, Compaction, DeleteRequest, DeleteResponse,
    IdDraws, LeaseGrantResponse, LeaseKeepAliveResponse, LeaseRevoke, LeaseTimeToLiveResponse,
    PutRequest, PutResponse, Space, Store, TxnRequest, TxnResponse,
};
use std::sync::Arc;
use std::time::Duration;
use tonic::metadata::MetadataMap;
use tonic::Status;

/// The backend of a cluster member.
#[derive(Clone)]
pub struct ClusterMember {
    store: Arc<Store>,
    node: Arc<Node>,
}

impl ClusterMember {
    /// The member whose Raft node is `node`, over its `store`.
    pub fn new(store: Arc<Store>, node: Arc<Node>) -> Self {
        ClusterMember { store, node }
    }

    /// Its Raft node.
    pub(super) fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Proposes a client's `command` (by `by` while auth is enabled) once
    /// it passed this member's checks ([`Store::admit`]; a NOSPACE alarm
    /// it raises is proposed, so every member records it). `term` (0: any) is the term the log
    /// entry must have for it to apply (see [`Node::propose_in_term`]).
    async fn propose<C: Command>(
        &self,
        command: C,
        by: Option<AuthInfo>,
        term: u64,
    ) -> Result<C::Answer> {
        let entry = command.into_entry_by(by);
        match self.store.admit(&entry)? {
            Space::Fits => C::answer(self.node.propose_in_term(entry, term).await?),
            Space::Full => Err(Error::NoSpace),
            Space::Raise(alarm) => {
                self.node.propose(alarm).await?;
                Err(Error::NoSpace)
            }
        }
    }
}

fn listed(m: Membership) -> Members {
    m.members().cloned().collect()
}

impl Backend for ClusterMember {
    fn check_range_allowed(&self, serializable: bool) -> std::result::Result<(), Status> {
        learner::check_range(Some(&self.node), serializable)
    }

    async fn read_index(&self) -> Result<()> {
        self.node.read_barrier().await
    }

    async fn put(&self, by: Option<AuthInfo>, req: PutRequest) -> Result<PutResponse> {
        self.propose(req, by, 0).await
    }

    async fn delete_range(
        &self,
        by: Option<AuthInfo>,
        req: DeleteRequest,
    ) -> Result<DeleteResponse> {
        self.propose(req, by, 0).await
    }

    /// Every txn goes through the log, read-only ones too, which makes
    /// them linearizable (at the cost of a round of replication).
    async fn txn(&self, by: Option<AuthInfo>, req: TxnRequest) -> Result<TxnResponse> {
        self.propose(req, by, 0).await
    }

    async fn compact(&self, revision: i64) -> std::result::Result<i64, Status> {
        let compaction = Compaction { revision };
        self.propose(compaction, None, 0)
            .await
            .map_err(crate::grpc_status::status)
    }

    /// This member draws the ID of a grant that left it to the server;
    /// the entry carries it to every member.
    async fn lease_grant(&self, id: i64, ttl: i64) -> Result<LeaseGrantResponse> {
        let mut draws = IdDraws::new(id);
        loop {
            match self.propose(self.store.grant_of(id, ttl), None, 0).await {
                Err(e) if draws.again(&e) => {}
                done => return done,
            }
        }
    }

    /// A revoke by nobody in particular is refused where it applies if a
    /// later term commits it; a user's revoke applies in any term.
    async fn lease_revoke(&self, by: Option<AuthInfo>, id: i64) -> Result<i64> {
        let term = match by {
            None => self.node.status().term(),
            Some(_) => 0,
        };
        self.propose(LeaseRevoke { id }, by, term).await
    }

    /// Only the leader renews, once it has confirmed it leads; a failure
    /// ends the stream, as in etcd.
    async fn lease_keep_alive(
        &self,
        id: i64,
    ) -> std::result::Result<LeaseKeepAliveResponse, Status> {
        lease_forward::keep_alive(&self.node, id).await
    }

    /// The leader's view (forwarded to it).
    async fn lease_time_to_live(
        &self,
        id: i64,
        keys: bool,
    ) -> std::result::Result<LeaseTimeToLiveResponse, Status> {
        lease_forward::time_to_live(&self.node, id, keys).await
    }

    async fn auth(&self, by: Option<AuthInfo>, op: AuthOp) -> Result<i64> {
        self.propose(op, by, 0).await
    }

    /// Listing alarms is local: it changes nothing.
    async fn alarm(&self, change: AlarmChange) -> Result<Vec<AlarmMember>> {
        if change.action == AlarmAction::Get {
            return self.store.apply_command(change, None);
        }
        self.propose(change, None, 0).await
    }

    fn has_leader(&self) -> bool {
        self.node.status().leader().is_some()
    }

    fn leader_loss(&self, metadata: &MetadataMap) -> LeaderLoss {
        leadership::leader_lost(Some(&self.node), metadata)
    }

    fn interceptor(&self) -> RequireLeaderLayer {
        RequireLeaderLayer(Some(self.node.clone()))
    }

    fn raft_view(&self) -> RaftView {
        let s = self.node.status();
        RaftView {
            leader: s.leader().unwrap_or(0),
            term: s.term(),
            committed_index: s.committed(),
            applied_index: s.applied(),
            is_learner: self.node.is_learner(),
        }
    }

    async fn move_leader(
        &self,
        target: u64,
        waits: Option<Duration>,
    ) -> std::result::Result<(), Status> {
        leadership::move_leader(&self.node, target, waits).await
    }

    fn members(&self) -> Members {
        listed(self.node.membership())
    }

    async fn member_add(
        &self,
        peer_urls: Vec<String>,
        is_learner: bool,
    ) -> Result<(MemberInfo, Members)> {
        crate::cluster::check_urls(&peer_urls)?;
        let (member, after) = self.node.member_add(peer_urls, is_learner).await?;
        Ok((member, listed(after)))
    }

    async fn member_remove(&self, id: u64) -> Result<Members> {
        self.node.member_remove(id).await.map(listed)
    }

    async fn member_update(&self, id: u64, peer_urls: Vec<String>) -> Result<Members> {
        self.node.member_update(id, peer_urls).await.map(listed)
    }

    async fn member_promote(&self, id: u64) -> Result<Members> {
        self.node.member_promote(id).await.map(listed)
    }

    /// The role as the Raft state and the applied membership say now, and
    /// the Raft log's bounds and peer figures after the rest.
    fn metrics_text(&self, metrics: &Metrics) -> String {
        let raft = self.node.status();
        metrics.set_role(
            raft.leader().is_some(),
            raft.is_leader(),
            self.node.is_learner(),
            raft.leader_changes(),
        );
        let mut text = metrics.render(&self.store);
        text.push_str(&raft.log().render());
        text.push_str(&self.node.peer_metrics().render());
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::log::initial_gate_tests::solo;
    use bytes::Bytes;

    fn put(key: &'static str) -> PutRequest {
        PutRequest {
            key: Bytes::from_static(key.as_bytes()),
            value: Bytes::from_static(b"v"),
            ..Default::default()
        }
    }

    /// A malformed request is refused by the member it reached, with
    /// etcd's error, and never reaches the Raft log.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_malformed_request_is_refused_before_it_is_proposed() {
        let (node, store) = solo(false, Duration::from_millis(10), Duration::from_millis(50));
        let member = ClusterMember::new(store, node.clone());
        member.put(None, put("a")).await.expect("a valid put");
        let committed = node.status().committed();
        let empty = member.put(None, put("")).await.unwrap_err();
        assert_eq!(empty, Error::EmptyKey);
        let twice = TxnRequest {
            compare: Vec::new(),
            success: vec![
                crate::mvcc::RequestOp::Put(put("k")),
                crate::mvcc::RequestOp::Put(put("k")),
            ],
            failure: Vec::new(),
        };
        assert_eq!(
            member.txn(None, twice).await.unwrap_err(),
            Error::DuplicateKey
        );
        assert_eq!(
            node.status().committed(),
            committed,
            "nothing was proposed for the refused requests"
        );
        node.stop();
    }
}
