//! Leases in cluster mode: only the leader's clock counts.
//!
//! * Keep-alives reach the leader: a follower forwards each one over the
//!   peer transport (`RaftTransport/LeaseKeepAlive`); the leader renews the
//!   lease only after a ReadIndex round has confirmed with a quorum that it
//!   still leads, and answers then. LeaseTimeToLive is forwarded the same
//!   way, so every member answers from the leader's view.
//! * Revokes (by request or by expiry) and checkpoints carry the term they
//!   were proposed in; the apply thread refuses one whose log entry has
//!   another term (`etcdserver: leader changed`), on every member alike, so
//!   a deposed leader's expiry decision never takes effect.
//! * A checkpoint round and a renewal never overlap (a checkpoint read
//!   before a renewal and applied after it would shorten the lease).
//! * Checkpoints: every [`checkpoint_interval`] (five election timeouts) the
//!   leader proposes the time left of every lease whose TTL is longer than
//!   that interval. A member that becomes leader first catches up with the
//!   log (a ReadIndex round), then restarts every lease's countdown from its
//!   last checkpoint, or from its full TTL when it has none (shorter leases,
//!   or none taken yet). Until then it renews nothing and expires nothing.
//!   A keep-alive of a lease with a checkpoint replicates a reset (full TTL)
//!   before it is acknowledged, so no leader change can shorten a lease
//!   below its TTL after the last acknowledged keep-alive. After a leader
//!   change a lease has at most the checkpoint interval plus the time to
//!   elect (about one election timeout) more than it had left.

use crate::cluster::member::lease_state::not_leader;
use crate::cluster::node::raft_node::Node;
use crate::error::Error;
use crate::grpc_status::status;
use crate::mvcc::{Entry, LeaseKeepAliveResponse, LeaseTimeToLiveResponse};
use crate::proto::ephd::internal::raft_transport_client::RaftTransportClient;
use crate::proto::etcdserverpb as pb;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::{Code, Status};

/// How long a forwarding member waits before asking again when the leader
/// is not known or not ready (an election, a promotion under way).
const RETRY: Duration = Duration::from_millis(50);
/// Leases in one checkpoint entry at most.
const CHECKPOINTS_PER_ENTRY: usize = 10_000;
/// Leases revoked per expiry round at most (see the expiry task).
const REVOKES_PER_ROUND: usize = 100;

/// How often the leader checkpoints the time left of leases longer than
/// this: five election timeouts (5 s with etcd's default 1 s). etcd's 5
/// minutes would let a leader change add up to 5 minutes to a lease; this
/// bounds the gain to six election timeouts, at the cost of one small log
/// entry every five election timeouts (about 20 bytes per long lease).
pub fn checkpoint_interval(election: Duration) -> Duration {
    5 * election
}

/// How long one forwarded call may take before the member looks for the
/// leader again: the leader may wait up to an election timeout for its
/// lease restart and another for a ReadIndex round, plus a round trip.
fn attempt_limit(election: Duration) -> Duration {
    (3 * election).max(Duration::from_secs(1))
}

/// Whether an answer from the leader (or the way to it) may change if the
/// member asks again shortly: a leader change, or a leader not ready.
fn retryable(s: &Status) -> bool {
    match s.code() {
        Code::Unavailable => s.message() != "etcdserver: server stopped",
        Code::FailedPrecondition => s.message() == "etcdserver: not leader",
        Code::Unknown | Code::Cancelled | Code::DeadlineExceeded => true,
        _ => false,
    }
}

/// Asks the leader, wherever it is, until it answers or the request
/// timeout passes: `local` when this member leads, `remote` with a client
/// of the leader's peer service otherwise.
async fn at_leader<T, L, LF, R, RF>(node: &Node, local: L, remote: R) -> Result<T, Status>
where
    L: Fn() -> LF,
    LF: std::future::Future<Output = Result<T, Status>>,
    R: Fn(RaftTransportClient<Channel>) -> RF,
    RF: std::future::Future<Output = Result<T, Status>>,
{
    let deadline = tokio::time::Instant::now() + node.request_timeout();
    loop {
        let result = match node.status().leader() {
            None => Err(status(Error::NoLeader)),
            Some(l) if l == node.id() => local().await,
            Some(l) => match node.leases.client(l) {
                Ok(client) => {
                    // A leader that hangs (frozen, cut off) is likely
                    // replaced meanwhile: ask again, maybe elsewhere.
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    let attempt = left.min(attempt_limit(node.election_timeout()));
                    match tokio::time::timeout(attempt, remote(client)).await {
                        Ok(r) => r,
                        Err(_) => Err(status(Error::Timeout)),
                    }
                }
                Err(e) => Err(e),
            },
        };
        match result {
            Err(s) if retryable(&s) && tokio::time::Instant::now() + RETRY < deadline => {
                tokio::time::sleep(RETRY).await;
            }
            Err(s) if s.code() == Code::FailedPrecondition => {
                // The leader moved while we asked, and kept moving.
                return Err(status(Error::Timeout));
            }
            other => return other,
        }
    }
}

/// LeaseKeepAlive on a cluster member: renewed by the leader after it has
/// confirmed its leadership (see the module docs). TTL 0 when the lease
/// is unknown or expired, as in etcd.
pub async fn keep_alive(node: &Node, id: i64) -> Result<LeaseKeepAliveResponse, Status> {
    at_leader(
        node,
        || keep_alive_as_leader(node, id),
        |mut c| async move {
            let r = c
                .lease_keep_alive(pb::LeaseKeepAliveRequest { id })
                .await?
                .into_inner();
            Ok(LeaseKeepAliveResponse {
                revision: r.header.map_or(0, |h| h.revision),
                id: r.id,
                ttl: r.ttl,
            })
        },
    )
    .await
}

/// LeaseTimeToLive on a cluster member: the leader's view of the lease.
pub async fn time_to_live(
    node: &Node,
    id: i64,
    keys: bool,
) -> Result<LeaseTimeToLiveResponse, Status> {
    at_leader(
        node,
        || async move {
            leading_term(node).await?;
            Ok(node.leases.store.lease_time_to_live(id, keys))
        },
        |mut c| async move {
            let r = c
                .lease_time_to_live(pb::LeaseTimeToLiveRequest { id, keys })
                .await?
                .into_inner();
            Ok(LeaseTimeToLiveResponse {
                revision: r.header.map_or(0, |h| h.revision),
                id: r.id,
                ttl: r.ttl,
                granted_ttl: r.granted_ttl,
                keys: r.keys,
            })
        },
    )
    .await
}

/// The peer service's LeaseKeepAlive: only the leader answers.
pub(in crate::cluster) async fn serve_keep_alive(
    node: &Node,
    id: i64,
) -> Result<pb::LeaseKeepAliveResponse, Status> {
    let r = keep_alive_as_leader(node, id).await?;
    Ok(pb::LeaseKeepAliveResponse {
        header: Some(pb::ResponseHeader {
            revision: r.revision,
            member_id: node.id(),
            ..Default::default()
        }),
        id: r.id,
        ttl: r.ttl,
    })
}

/// The peer service's LeaseTimeToLive: only the leader answers.
pub(in crate::cluster) async fn serve_time_to_live(
    node: &Node,
    req: pb::LeaseTimeToLiveRequest,
) -> Result<pb::LeaseTimeToLiveResponse, Status> {
    leading_term(node).await?;
    let l = node.leases.store.lease_time_to_live(req.id, req.keys);
    Ok(pb::LeaseTimeToLiveResponse {
        header: Some(pb::ResponseHeader {
            revision: l.revision,
            member_id: node.id(),
            ..Default::default()
        }),
        id: l.id,
        ttl: l.ttl,
        granted_ttl: l.granted_ttl,
        keys: l.keys,
    })
}

/// Renews lease `id` on the leader: after the countdowns of this term were
/// restarted, and after a quorum confirmed this member still leads (and it
/// applied everything committed before). A lease with a checkpoint has
/// its reset replicated before the answer.
async fn keep_alive_as_leader(node: &Node, id: i64) -> Result<LeaseKeepAliveResponse, Status> {
    let term = leading_term(node).await?;
    node.read_barrier().await.map_err(status)?;
    let s = node.status();
    if !s.is_leader() || s.term() != term {
        return Err(not_leader());
    }
    let store = &node.leases.store;
    let _no_checkpoint_in_flight = node.leases.checkpointing.lock().await;
    if store.lease_checkpointed(id) {
        // Replicated first, so the renewal below is as late as possible:
        // its TTL counts from just before the answer.
        let reset = Entry::LeaseCheckpoint {
            checkpoints: vec![(id, -1)],
        };
        node.propose_in_term(reset, term).await.map_err(status)?;
    }
    let s = node.status();
    if !s.is_leader() || s.term() != term {
        return Err(not_leader());
    }
    Ok(store.lease_keep_alive(id))
}

/// The current term, once this member leads in it and has restarted the
/// lease countdowns; `etcdserver: not leader` otherwise (the caller asks
/// again), after waiting up to an election timeout for the restart.
async fn leading_term(node: &Node) -> Result<u64, Status> {
    let deadline = tokio::time::Instant::now() + node.election_timeout();
    loop {
        let s = node.status();
        if !s.is_leader() {
            return Err(not_leader());
        }
        let term = s.term();
        if node.leases.promoted_term.load(Ordering::Acquire) == term {
            return Ok(term);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(not_leader());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What the leader's lease task remembers between rounds.
#[derive(Default)]
pub struct LeaderRounds {
    last_checkpoint: Option<Instant>,
}

/// One round of the lease task on a cluster member (every 100 ms): on the
/// leader, restart the countdowns once per term, checkpoint every
/// [`checkpoint_interval`], and propose a revoke for every expired lease,
/// each carrying the term. Followers do nothing.
pub async fn leader_round(
    expired: &prometheus::IntCounter,
    node: &Node,
    rounds: &mut LeaderRounds,
) {
    let s = node.status();
    if !s.is_leader() {
        return;
    }
    let term = s.term();
    let store = &node.leases.store;
    if node.leases.promoted_term.load(Ordering::Acquire) != term {
        // Catch up with everything committed in earlier terms (the last
        // checkpoints among it) before restarting the countdowns.
        if node.read_barrier().await.is_err() {
            return;
        }
        let s = node.status();
        if !s.is_leader() || s.term() != term {
            return;
        }
        store.lease_promote(Instant::now());
        node.leases.promoted_term.store(term, Ordering::Release);
        rounds.last_checkpoint = Some(Instant::now());
        tracing::info!(
            term,
            leases = store.lease_count(),
            "leading: lease countdowns restart from the last checkpoint"
        );
        return;
    }
    let interval = checkpoint_interval(node.election_timeout());
    if rounds
        .last_checkpoint
        .is_none_or(|at| at.elapsed() >= interval)
    {
        rounds.last_checkpoint = Some(Instant::now());
        let _renewals_wait = node.leases.checkpointing.lock().await;
        let all = store.lease_remaining_for_checkpoint(Instant::now(), interval);
        for chunk in all.chunks(CHECKPOINTS_PER_ENTRY) {
            let entry = Entry::LeaseCheckpoint {
                checkpoints: chunk.to_vec(),
            };
            if let Err(e) = node.propose_in_term(entry, term).await {
                tracing::debug!(error = %e, "lease checkpoint not committed");
                break;
            }
        }
    }
    for id in store.expired_leases(Instant::now(), REVOKES_PER_ROUND) {
        match node.propose_in_term(Entry::LeaseRevoke { id }, term).await {
            Ok(_) => {
                expired.inc();
                tracing::debug!(lease = id, "lease expired");
            }
            // Revoked by a client meanwhile: nothing to do.
            Err(e @ Error::LeaseNotFound) => {
                tracing::debug!(lease = id, error = %e, "expired lease already gone")
            }
            // Not committed (leadership lost, or slow), or refused as a
            // deposed leader's: its deadline was handed out, so give it a
            // fresh one, to be tried again then (by whichever member
            // leads). A lease may outlive its TTL, never fall short of it.
            Err(e) => {
                store.lease_keep_alive(id);
                tracing::debug!(lease = id, error = %e, "expired lease not revoked yet");
            }
        }
    }
}
