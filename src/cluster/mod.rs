//! Cluster mode: several ephd members act as one etcd cluster, replicated
//! by Raft (tikv's `raft` crate). CLUSTER.md has the design and what is not
//! built yet.
//!
//! * [`Proposer`]: where every mutation goes. A single member applies it to
//!   its store at once, exactly as before cluster mode existed; a cluster
//!   member proposes it to the Raft log and answers with its own result of
//!   applying it once committed.
//! * `node.rs`: a member's Raft node; `raft_loop.rs`: the Raft loop's
//!   rounds, run by the Raft thread and by the threads that bring it
//!   proposals and peer messages; `apply_loop.rs`: committed entries
//!   applied in log order through `Store::apply`, by the apply thread or,
//!   for small batches, by the thread that ran the round.
//! * `peers.rs`, `sender.rs` and `transport.rs`: Raft messages to and
//!   from the other members (two lanes per peer, control and bulk), each
//!   lane a framed connection (`frames.rs`, `frames_serve.rs`) or, with
//!   members that serve none, a stream of a small gRPC service on the
//!   peer listener;
//!   `peer_metrics.rs`: etcd's peer network metrics of those links.
//! * `queue.rs`: the channels into the Raft and apply threads (park at
//!   once, take everything queued in one lock); `waiters.rs`: requests
//!   waiting for their answer, woken per applied batch.
//! * `crate::entry_bytes`: a store entry as the bytes of a log entry.
//! * `catchup.rs` (with `mvcc::snapshot`): the bounded log, and snapshots of the
//!   whole store for followers behind it; `snapshot_send.rs` and
//!   `snapshot_recv.rs`: a snapshot's data sent to a peer in chunks.
//! * `membership.rs`: the members as replicated state, changed by conf
//!   change entries; `reconfig.rs`: the Cluster API's changes and their
//!   checks; `join.rs`: how a member starts (new or joining) and the peer
//!   service that answers starting members; `removal.rs`: a removed
//!   member stops; `rejoin.rs`: a member restarted without state rejoins
//!   under a new ID; `force.rs`: `--force-new-cluster`.
//! * `logger.rs`: raft's log lines into `tracing`.
//! * `leadership.rs`: MoveLeader, the hand-over on SIGTERM, `hasleader`;
//!   `learner.rs`: what a learner refuses to serve.
//! * `lease_forward.rs`: keep-alives answered by the leader, term-checked
//!   revokes, lease checkpoints.
//! * `initial_gate.rs`: writes held back until a new cluster's initial
//!   revision is applied.
//! * `saved.rs` and `saving.rs`: `--data-dir`, the applied state kept on
//!   disk; `restart.rs`: a member restarting from it and its Raft log
//!   (`wal::RaftLog`) under its own ID; `resume.rs`: a whole cluster resuming from it; `newest.rs`
//!   and `saved_transfer.rs`: from the newest file among the waiting
//!   members, fetched in pieces.

mod apply_loop;
#[cfg(test)]
mod apply_loop_tests;
mod authorized;
mod catchup;
mod entry_weight;
mod force;
pub mod frames;
pub mod frames_serve;
mod initial_gate;
#[cfg(test)]
mod initial_gate_tests;
mod input;
mod join;
#[cfg(test)]
mod leaderless_tests;
pub mod leadership;
pub mod learner;
pub mod lease_forward;
mod lease_state;
mod link;
mod logger;
mod members;
pub mod membership;
mod newest;
mod node;
mod peer_dial;
pub mod peer_metrics;
mod peer_settings;
mod peer_stream;
mod peers;
mod queue;
mod raft_loop;
mod reconfig;
mod rejoin;
mod removal;
pub mod restart;
pub mod resume;
pub mod saved;
mod saved_transfer;
mod saving;
mod sections;
mod seen;
mod sender;
mod snapshot_recv;
mod snapshot_send;
mod status;
mod timeouts;
mod transfer;
mod transport;
mod waiters;

pub use catchup::{LogCounters, DEFAULT_CATCHUP_ENTRIES, DEFAULT_SNAPSHOT_COUNT};
pub use force::replay_tail as replay_forced_tail;
pub use initial_gate::{initialized, WritesWaitFor};
pub use input::Progress;
pub use join::{bootstrap, membership_service, MembershipService, NotStarted};
pub use members::Boot;
pub use membership::{MemberInfo, Membership};
pub use node::Node;
pub use peer_dial::PeerDialer;
pub use peer_settings::PeerSettings;
pub use peers::MAX_BATCH_BYTES;
pub use reconfig::{check_urls, start_node};
pub use saving::{save_loop, write as write_saved};
pub use status::RaftStatus;
pub use transport::PeerService;

use crate::auth::{AuthInfo, AuthOp};
use crate::error::{Error, Result};
use crate::mvcc::{
    AlarmAction, AlarmMember, Applied, DeleteRequest, DeleteResponse, Entry, LeaseGrantResponse,
    PutRequest, PutResponse, Space, Store, TxnRequest, TxnResponse,
};
use std::sync::Arc;

/// How often a server-chosen lease ID is re-drawn when another lease took
/// it (the single-member path does the same in `mvcc/leases.rs`).
const ID_ATTEMPTS: usize = 16;

/// Where the gRPC services send mutations. `Local` (the default, and the
/// only kind without `--initial-cluster` naming other members) calls the
/// store directly, on the same path and at the same cost as before
/// cluster mode: one branch on an enum, no allocation, no channel.
#[derive(Clone, Default)]
pub enum Proposer {
    /// A single member: apply to the local store.
    #[default]
    Local,
    /// A cluster member: propose to the Raft log.
    Replicated(Arc<Node>),
}

impl Proposer {
    /// The Raft node, in cluster mode.
    pub fn node(&self) -> Option<&Arc<Node>> {
        match self {
            Proposer::Local => None,
            Proposer::Replicated(n) => Some(n),
        }
    }

    /// A cluster member's space check before proposing `entry`: the NOSPACE
    /// alarm it raises is proposed (every member applies it alike), and
    /// what does not fit is refused. A single member checks in the store
    /// (`mvcc/quota.rs`).
    async fn refuse_over_quota(node: &Node, store: &Store, entry: &Entry) -> Result<()> {
        match store.check_space(entry) {
            Space::Fits => Ok(()),
            Space::Full => Err(Error::NoSpace),
            Space::Raise(alarm) => {
                node.propose(alarm).await?;
                Err(Error::NoSpace)
            }
        }
    }

    /// Proposes `entry` after the space quota check.
    async fn propose_write(node: &Node, store: &Store, entry: Entry) -> Result<Applied> {
        Self::refuse_over_quota(node, store, &entry).await?;
        node.propose(entry).await
    }

    /// Put (see [`Store::put_async`]).
    pub async fn put(&self, store: &Store, req: PutRequest) -> Result<PutResponse> {
        match self {
            Proposer::Local => store.put_async(req).await,
            Proposer::Replicated(n) => {
                match Self::propose_write(n, store, Entry::Put(req)).await? {
                    Applied::Put(p) => Ok(p),
                    other => unreachable!("a put applied as {other:?}"),
                }
            }
        }
    }

    /// DeleteRange (see [`Store::delete_range_async`]).
    pub async fn delete_range(&self, store: &Store, req: DeleteRequest) -> Result<DeleteResponse> {
        match self {
            Proposer::Local => store.delete_range_async(req).await,
            Proposer::Replicated(n) => match n.propose(Entry::Delete(req)).await? {
                Applied::Delete(d) => Ok(d),
                other => unreachable!("a delete applied as {other:?}"),
            },
        }
    }

    /// Txn (see [`Store::txn_async`]). In cluster mode every txn goes
    /// through the log, read-only ones too, which makes them linearizable
    /// (at the cost of a round of replication).
    pub async fn txn(&self, store: &Store, req: TxnRequest) -> Result<TxnResponse> {
        match self {
            Proposer::Local => store.txn_async(req).await,
            Proposer::Replicated(n) => {
                match Self::propose_write(n, store, Entry::Txn(req)).await? {
                    Applied::Txn(t) => Ok(t),
                    other => unreachable!("a txn applied as {other:?}"),
                }
            }
        }
    }

    /// Compaction through the log; the caller runs the local one itself
    /// (off the async workers, see the KV service), so this is for cluster
    /// mode only.
    pub async fn compact_replicated(node: &Node, revision: i64) -> Result<i64> {
        match node.propose(Entry::Compact { revision }).await? {
            Applied::Compact { revision } => Ok(revision),
            other => unreachable!("a compaction applied as {other:?}"),
        }
    }

    /// LeaseGrant (see [`Store::lease_grant`]); `id == 0` lets the
    /// proposing member choose the ID, which the entry then carries.
    pub async fn lease_grant(
        &self,
        store: &Store,
        id: i64,
        ttl: i64,
    ) -> Result<LeaseGrantResponse> {
        let node = match self {
            Proposer::Local => return store.lease_grant_async(id, ttl).await,
            Proposer::Replicated(n) => n,
        };
        let mut attempts = 0;
        loop {
            let chosen = if id == 0 { store.choose_lease_id() } else { id };
            let grant = Entry::LeaseGrant { id: chosen, ttl };
            match Self::propose_write(node, store, grant).await {
                Ok(Applied::LeaseGrant { id, ttl, revision }) => {
                    return Ok(LeaseGrantResponse { revision, id, ttl })
                }
                Ok(other) => unreachable!("a grant applied as {other:?}"),
                Err(Error::LeaseExist) if id == 0 && attempts < ID_ATTEMPTS => attempts += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// LeaseRevoke (see [`Store::lease_revoke_async`]).
    pub async fn lease_revoke(&self, store: &Store, id: i64) -> Result<i64> {
        match self {
            Proposer::Local => store.lease_revoke_async(id).await,
            // Refused when applied if a later term commits it.
            Proposer::Replicated(n) => match n
                .propose_in_term(Entry::LeaseRevoke { id }, n.status().term())
                .await?
            {
                Applied::LeaseRevoke { revision } => Ok(revision),
                other => unreachable!("a revoke applied as {other:?}"),
            },
        }
    }

    /// Applies `entry` on behalf of `by` while auth is enabled: its
    /// permissions are checked where it applies, on every member.
    pub async fn apply_as(&self, store: &Store, by: AuthInfo, entry: Entry) -> Result<Applied> {
        match self {
            Proposer::Local => store.apply_as_async(by, entry).await,
            Proposer::Replicated(n) => {
                let entry = Entry::Authorized {
                    by,
                    entry: Box::new(entry),
                };
                Self::propose_write(n, store, entry).await
            }
        }
    }

    /// An auth change (or a token issued), by `by` when auth is enabled;
    /// returns the header revision.
    pub async fn auth(&self, store: &Store, by: Option<AuthInfo>, op: AuthOp) -> Result<i64> {
        let entry = Entry::Auth(op);
        let applied = match (self, by) {
            (_, Some(by)) => self.apply_as(store, by, entry).await?,
            (Proposer::Local, None) => store.apply_async(entry).await?,
            (Proposer::Replicated(n), None) => n.propose(entry).await?,
        };
        match applied {
            Applied::Auth { revision } => Ok(revision),
            other => unreachable!("an auth change applied as {other:?}"),
        }
    }

    /// Alarm (see [`Store::alarm`]). Listing alarms is local in cluster
    /// mode too: it changes nothing.
    pub async fn alarm(
        &self,
        store: &Store,
        action: AlarmAction,
        member_id: u64,
        alarm: i32,
    ) -> Result<Vec<AlarmMember>> {
        match self {
            Proposer::Replicated(n) if action != AlarmAction::Get => {
                match n
                    .propose(Entry::Alarm {
                        action,
                        member_id,
                        alarm,
                    })
                    .await?
                {
                    Applied::Alarm { alarms } => Ok(alarms),
                    other => unreachable!("an alarm applied as {other:?}"),
                }
            }
            _ => store.alarm(action, member_id, alarm),
        }
    }
}
