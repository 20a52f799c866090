//! A single member: every operation on the local store, on the calling
//! task, at the cost of a call. Membership changes and leader transfers
//! get the answers of a single-member etcd that cannot grow while it runs.

use super::{Backend, LeaderLoss, Members, RaftView, RequireLeaderLayer};
use crate::auth::{AuthInfo, AuthOp};
use crate::cluster::MemberInfo;
use crate::error::{Error, Result, INTERNAL_COMPACTION_FAILED};
use crate::metrics::Metrics;
use crate::mvcc::{
    AlarmChange, AlarmMember, Compaction, DeleteRequest, DeleteResponse, LeaseGrantResponse,
    LeaseKeepAliveResponse, LeaseRevoke, LeaseTimeToLiveResponse, PutRequest, PutResponse, Store,
    TxnRequest, TxnResponse,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tonic::metadata::MetadataMap;
use tonic::Status;

/// The backend of a server without other members.
#[derive(Clone)]
pub struct SingleMember {
    store: Arc<Store>,
    me: Arc<MemberInfo>,
    raft_term: u64,
}

impl SingleMember {
    /// The single member `me` over `store`, reporting `raft_term`.
    pub fn new(store: Arc<Store>, me: MemberInfo, raft_term: u64) -> Self {
        SingleMember {
            store,
            me: Arc::new(me),
            raft_term,
        }
    }

    /// etcd's answer to a change of member `id`: the only member can be
    /// neither removed nor promoted, and no other member exists.
    fn change_refused(&self, id: u64, for_self: Error) -> Error {
        if id == self.me.id {
            for_self
        } else {
            Error::MemberNotFound
        }
    }
}

impl Backend for SingleMember {
    fn check_range_allowed(&self, _serializable: bool) -> std::result::Result<(), Status> {
        Ok(())
    }

    async fn read_index(&self) -> Result<()> {
        Ok(())
    }

    async fn put(&self, by: Option<AuthInfo>, req: PutRequest) -> Result<PutResponse> {
        self.store.apply_command_async(req, by).await
    }

    async fn delete_range(
        &self,
        by: Option<AuthInfo>,
        req: DeleteRequest,
    ) -> Result<DeleteResponse> {
        self.store.apply_command_async(req, by).await
    }

    async fn txn(&self, by: Option<AuthInfo>, req: TxnRequest) -> Result<TxnResponse> {
        self.store.apply_command_async(req, by).await
    }

    async fn compact(&self, revision: i64) -> std::result::Result<i64, Status> {
        let store = self.store.clone();
        // Pruning a large history takes a while: keep it off the async workers.
        let compaction = Compaction { revision };
        let task = tokio::task::spawn_blocking(move || store.apply_command(compaction, None));
        task.await
            .map_err(|e| Status::internal(format!("{INTERNAL_COMPACTION_FAILED}: {e}")))?
            .map_err(crate::grpc_status::status)
    }

    async fn lease_grant(&self, id: i64, ttl: i64) -> Result<LeaseGrantResponse> {
        self.store.lease_grant_async(id, ttl).await
    }

    async fn lease_revoke(&self, by: Option<AuthInfo>, id: i64) -> Result<i64> {
        self.store.apply_command_async(LeaseRevoke { id }, by).await
    }

    async fn lease_keep_alive(
        &self,
        id: i64,
    ) -> std::result::Result<LeaseKeepAliveResponse, Status> {
        Ok(self.store.lease_keep_alive(id))
    }

    async fn lease_time_to_live(
        &self,
        id: i64,
        keys: bool,
    ) -> std::result::Result<LeaseTimeToLiveResponse, Status> {
        Ok(self.store.lease_time_to_live(id, keys))
    }

    async fn auth(&self, by: Option<AuthInfo>, op: AuthOp) -> Result<i64> {
        self.store.apply_command_async(op, by).await
    }

    async fn alarm(&self, change: AlarmChange) -> Result<Vec<AlarmMember>> {
        self.store.apply_command(change, None)
    }

    fn has_leader(&self) -> bool {
        true
    }

    fn leader_loss(&self, metadata: &MetadataMap) -> LeaderLoss {
        crate::cluster::node::leadership::leader_lost(None, metadata)
    }

    fn interceptor(&self) -> RequireLeaderLayer {
        RequireLeaderLayer(None)
    }

    fn raft_view(&self) -> RaftView {
        let applied = self.store.stats().applied_index.load(Ordering::Relaxed);
        RaftView {
            leader: self.me.id,
            term: self.raft_term,
            committed_index: applied,
            applied_index: applied,
            is_learner: false,
        }
    }

    async fn move_leader(
        &self,
        target: u64,
        _waits: Option<Duration>,
    ) -> std::result::Result<(), Status> {
        // A single member leads already: only itself is a transferee.
        crate::cluster::node::leadership::move_leader_single(self.me.id, target)
    }

    fn members(&self) -> Members {
        vec![(*self.me).clone()]
    }

    async fn member_add(
        &self,
        peer_urls: Vec<String>,
        _is_learner: bool,
    ) -> Result<(MemberInfo, Members)> {
        crate::cluster::check_urls(&peer_urls)?;
        Err(Error::MembershipUnsupported)
    }

    async fn member_remove(&self, id: u64) -> Result<Members> {
        Err(self.change_refused(id, Error::MemberNotEnoughStarted))
    }

    async fn member_update(&self, id: u64, mut peer_urls: Vec<String>) -> Result<Members> {
        // etcd checks no URLs here (MemberAdd does). Its own URLs, as
        // they are, change nothing.
        let mut own = self.me.peer_urls.clone();
        own.sort();
        peer_urls.sort();
        if id == self.me.id && peer_urls == own {
            return Ok(self.members());
        }
        Err(self.change_refused(id, Error::MembershipUnsupported))
    }

    async fn member_promote(&self, id: u64) -> Result<Members> {
        Err(self.change_refused(id, Error::MemberNotLearner))
    }

    fn metrics_text(&self, metrics: &Metrics) -> String {
        metrics.render(&self.store)
    }
}
