//! The seam between the gRPC services and the two ways ephd runs, as
//! etcd's `v3rpc` calls its server's `RaftKV` and `Lessor`.
//!
//! The services (`api/`, the concurrency recipes, the HTTP endpoints and
//! the JSON gateway) decode a request, call one [`Backend`] operation and
//! encode its answer. They never learn which mode they serve; they hold a
//! [`Mode`], which is one of:
//!
//! * [`SingleMember`] (`single.rs`): one process, no Raft. A mutation is a
//!   typed command ([`crate::mvcc::Command`]) applied to the store at once
//!   on the calling task, through the one apply path.
//! * [`ClusterMember`] (`cluster_member.rs`): a member of a Raft cluster.
//!   The same command, checked first, is proposed to the Raft log as an
//!   entry; every member applies it through the same apply path once it is
//!   committed, and the proposing member answers with its own result.
//!
//! Reads (Range, watches, Status figures) go to the store directly in both
//! modes; a linearizable one first waits for [`Backend::read_index`].
//! Requests are validated once, before they are applied or proposed
//! ([`crate::mvcc::check_request`]): what a client sent wrong is refused
//! by the member it reached, never replicated.

mod cluster_member;
mod single;

pub use crate::cluster::node::leadership::{Lost as LeaderLoss, RequireLeaderLayer};
pub use crate::cluster::MemberInfo;
pub use cluster_member::ClusterMember;
pub use single::SingleMember;

use crate::auth::{AuthInfo, AuthOp};
use crate::error::Result;
use crate::metrics::Metrics;
use crate::mvcc::{
    AlarmChange, AlarmMember, DeleteRequest, DeleteResponse, LeaseGrantResponse,
    LeaseKeepAliveResponse, LeaseTimeToLiveResponse, PutRequest, PutResponse, TxnRequest,
    TxnResponse,
};
use std::future::Future;
use std::time::Duration;
use tonic::metadata::MetadataMap;
use tonic::Status;

/// What Maintenance.Status reports of Raft: a single member leads itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaftView {
    /// The leader's member ID (0: none known).
    pub leader: u64,
    /// The Raft term.
    pub term: u64,
    /// The committed index.
    pub committed_index: u64,
    /// The applied index.
    pub applied_index: u64,
    /// Whether this member is a learner.
    pub is_learner: bool,
}

/// A membership change's answer: the members afterwards.
pub type Members = Vec<MemberInfo>;

/// Every operation the services need from the server behind them.
pub trait Backend {
    /// Refuses a Range this member may not serve (a learner serves only
    /// serializable ones), before anything else is checked.
    fn check_range_allowed(&self, serializable: bool) -> std::result::Result<(), Status>;

    /// Completes once this member has applied everything committed before
    /// the call (the read index); at once on a single member.
    fn read_index(&self) -> impl Future<Output = Result<()>> + Send;

    /// Put by `by` (auth enabled) or anyone.
    fn put(
        &self,
        by: Option<AuthInfo>,
        req: PutRequest,
    ) -> impl Future<Output = Result<PutResponse>> + Send;

    /// DeleteRange by `by` or anyone.
    fn delete_range(
        &self,
        by: Option<AuthInfo>,
        req: DeleteRequest,
    ) -> impl Future<Output = Result<DeleteResponse>> + Send;

    /// Txn by `by` or anyone.
    fn txn(
        &self,
        by: Option<AuthInfo>,
        req: TxnRequest,
    ) -> impl Future<Output = Result<TxnResponse>> + Send;

    /// Compaction at `revision`; answers the header revision.
    fn compact(
        &self,
        revision: i64,
    ) -> impl Future<Output = std::result::Result<i64, Status>> + Send;

    /// LeaseGrant; `id == 0` lets this mode's lease owner choose the ID.
    fn lease_grant(
        &self,
        id: i64,
        ttl: i64,
    ) -> impl Future<Output = Result<LeaseGrantResponse>> + Send;

    /// LeaseRevoke by `by` or anyone; answers the header revision.
    fn lease_revoke(
        &self,
        by: Option<AuthInfo>,
        id: i64,
    ) -> impl Future<Output = Result<i64>> + Send;

    /// One keep-alive of a LeaseKeepAlive stream (TTL 0: unknown lease).
    fn lease_keep_alive(
        &self,
        id: i64,
    ) -> impl Future<Output = std::result::Result<LeaseKeepAliveResponse, Status>> + Send;

    /// LeaseTimeToLive.
    fn lease_time_to_live(
        &self,
        id: i64,
        keys: bool,
    ) -> impl Future<Output = std::result::Result<LeaseTimeToLiveResponse, Status>> + Send;

    /// An auth change (or a token issued) by `by` or anyone; answers the
    /// header revision.
    fn auth(&self, by: Option<AuthInfo>, op: AuthOp) -> impl Future<Output = Result<i64>> + Send;

    /// Raises, clears or lists alarms; answers the alarms afterwards.
    fn alarm(&self, change: AlarmChange) -> impl Future<Output = Result<Vec<AlarmMember>>> + Send;

    /// Whether this member knows a leader (a single member leads itself).
    fn has_leader(&self) -> bool;

    /// For a stream opened with `metadata`: completes once it must end
    /// with `etcdserver: no leader` (never, unless it asked for a leader
    /// on a cluster member).
    fn leader_loss(&self, metadata: &MetadataMap) -> LeaderLoss;

    /// The interceptor of every client call: a learner's refusals and
    /// `hasleader` (passes everything on a single member).
    fn interceptor(&self) -> RequireLeaderLayer;

    /// Raft's leader, term and indexes, for Maintenance.Status.
    fn raft_view(&self) -> RaftView;

    /// Maintenance.MoveLeader to `target`; `waits` is how long the client
    /// waits, if it said.
    fn move_leader(
        &self,
        target: u64,
        waits: Option<Duration>,
    ) -> impl Future<Output = std::result::Result<(), Status>> + Send;

    /// The members, as MemberList shows them.
    fn members(&self) -> Members;

    /// MemberAdd: the new member and the members afterwards.
    fn member_add(
        &self,
        peer_urls: Vec<String>,
        is_learner: bool,
    ) -> impl Future<Output = Result<(MemberInfo, Members)>> + Send;

    /// MemberRemove.
    fn member_remove(&self, id: u64) -> impl Future<Output = Result<Members>> + Send;

    /// MemberUpdate.
    fn member_update(
        &self,
        id: u64,
        peer_urls: Vec<String>,
    ) -> impl Future<Output = Result<Members>> + Send;

    /// MemberPromote.
    fn member_promote(&self, id: u64) -> impl Future<Output = Result<Members>> + Send;

    /// The `/metrics` page: `metrics` with this member's role and, in a
    /// cluster, its Raft log and peer figures.
    fn metrics_text(&self, metrics: &Metrics) -> String;
}

/// The backend a server runs with: one of the two modes.
#[derive(Clone)]
pub enum Mode {
    /// One process, no Raft.
    Single(SingleMember),
    /// A member of a Raft cluster.
    Cluster(ClusterMember),
}

impl Mode {
    /// The Raft node of a cluster member, for the server that starts and
    /// stops it (never for a service).
    pub(crate) fn cluster_node(&self) -> Option<&std::sync::Arc<crate::cluster::Node>> {
        match self {
            Mode::Single(_) => None,
            Mode::Cluster(c) => Some(c.node()),
        }
    }
}

/// Calls `$call` on whichever backend `$mode` holds.
macro_rules! each {
    ($mode:expr, $b:ident => $call:expr) => {
        match $mode {
            Mode::Single($b) => $call,
            Mode::Cluster($b) => $call,
        }
    };
}

impl Backend for Mode {
    fn check_range_allowed(&self, serializable: bool) -> std::result::Result<(), Status> {
        each!(self, b => b.check_range_allowed(serializable))
    }

    async fn read_index(&self) -> Result<()> {
        each!(self, b => b.read_index().await)
    }

    async fn put(&self, by: Option<AuthInfo>, req: PutRequest) -> Result<PutResponse> {
        each!(self, b => b.put(by, req).await)
    }

    async fn delete_range(
        &self,
        by: Option<AuthInfo>,
        req: DeleteRequest,
    ) -> Result<DeleteResponse> {
        each!(self, b => b.delete_range(by, req).await)
    }

    async fn txn(&self, by: Option<AuthInfo>, req: TxnRequest) -> Result<TxnResponse> {
        each!(self, b => b.txn(by, req).await)
    }

    async fn compact(&self, revision: i64) -> std::result::Result<i64, Status> {
        each!(self, b => b.compact(revision).await)
    }

    async fn lease_grant(&self, id: i64, ttl: i64) -> Result<LeaseGrantResponse> {
        each!(self, b => b.lease_grant(id, ttl).await)
    }

    async fn lease_revoke(&self, by: Option<AuthInfo>, id: i64) -> Result<i64> {
        each!(self, b => b.lease_revoke(by, id).await)
    }

    async fn lease_keep_alive(
        &self,
        id: i64,
    ) -> std::result::Result<LeaseKeepAliveResponse, Status> {
        each!(self, b => b.lease_keep_alive(id).await)
    }

    async fn lease_time_to_live(
        &self,
        id: i64,
        keys: bool,
    ) -> std::result::Result<LeaseTimeToLiveResponse, Status> {
        each!(self, b => b.lease_time_to_live(id, keys).await)
    }

    async fn auth(&self, by: Option<AuthInfo>, op: AuthOp) -> Result<i64> {
        each!(self, b => b.auth(by, op).await)
    }

    async fn alarm(&self, change: AlarmChange) -> Result<Vec<AlarmMember>> {
        each!(self, b => b.alarm(change).await)
    }

    fn has_leader(&self) -> bool {
        each!(self, b => b.has_leader())
    }

    fn leader_loss(&self, metadata: &MetadataMap) -> LeaderLoss {
        each!(self, b => b.leader_loss(metadata))
    }

    fn interceptor(&self) -> RequireLeaderLayer {
        each!(self, b => b.interceptor())
    }

    fn raft_view(&self) -> RaftView {
        each!(self, b => b.raft_view())
    }

    async fn move_leader(
        &self,
        target: u64,
        waits: Option<Duration>,
    ) -> std::result::Result<(), Status> {
        each!(self, b => b.move_leader(target, waits).await)
    }

    fn members(&self) -> Members {
        each!(self, b => b.members())
    }

    async fn member_add(
        &self,
        peer_urls: Vec<String>,
        is_learner: bool,
    ) -> Result<(MemberInfo, Members)> {
        each!(self, b => b.member_add(peer_urls, is_learner).await)
    }

    async fn member_remove(&self, id: u64) -> Result<Members> {
        each!(self, b => b.member_remove(id).await)
    }

    async fn member_update(&self, id: u64, peer_urls: Vec<String>) -> Result<Members> {
        each!(self, b => b.member_update(id, peer_urls).await)
    }

    async fn member_promote(&self, id: u64) -> Result<Members> {
        each!(self, b => b.member_promote(id).await)
    }

    fn metrics_text(&self, metrics: &Metrics) -> String {
        each!(self, b => b.metrics_text(metrics))
    }
}
