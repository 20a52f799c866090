//! Who leads, and what depends on it: MoveLeader (raft's leader transfer),
//! handing leadership over on SIGTERM, and the `hasleader` metadata
//! (clientv3's `WithRequireLeader`, which kube-apiserver puts on every
//! watch).
//!
//! * MoveLeader answers as etcd 3.4 does: `etcdserver: not leader` on a
//!   member that is not the leader, `etcdserver: bad leader transferee` for
//!   an ID that is not a voting member, success at once for the current
//!   leader, and `etcdserver: request timed out, leader transfer took too
//!   long` (code Unknown: etcd 3.4's gRPC error table lacks it) when the
//!   target has not taken over in time. etcd waits as long as the client
//!   does (its deadline); ephd does too, and waits the request timeout for
//!   a client that sent none (etcd would wait until the transfer happens,
//!   which for a stopped target is never), at most [`MOVE_LEADER_LIMIT`].
//! * On SIGTERM a leader hands leadership to its most caught-up peer before
//!   it stops serving (etcd picks its longest-connected peer), so the others
//!   need not wait an election timeout to notice it is gone.
//! * A request with `hasleader: true` on a member without a leader fails at
//!   once with `etcdserver: no leader` ([`RequireLeaderLayer`]), unless an
//!   election with votes in sight is under way (the leader's process ended
//!   and a peer campaigns at once): then it waits a round trip or two for
//!   that election's outcome, as an etcd member would still take it while
//!   it believes in the old leader; an open
//!   Watch or LeaseKeepAlive stream with it ends with that error once the
//!   member has been without a leader for three election timeouts
//!   ([`leader_lost`]), so the client moves to another member.
//! * The same layer refuses what a learner does not serve (`learner.rs`),
//!   as etcd's interceptors do, before the `hasleader` check.

use crate::cluster::log::input::Input;
use crate::cluster::log::raft_status::RaftStatus;
use crate::cluster::node::raft_node::Node;
use crate::error::Error;
use futures::future::{BoxFuture, Either};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::oneshot;
use tonic::codegen::http;
use tonic::{Code, Status};

/// The metadata key clientv3's `WithRequireLeader` sets (etcd's
/// `rpctypes.MetadataRequireLeaderKey`), and the value it sets.
pub const REQUIRE_LEADER_KEY: &str = "hasleader";
const REQUIRE_LEADER_VALUE: &[u8] = b"true";

/// Election timeouts without a leader after which a `hasleader` stream is
/// cancelled (etcd's `maxNoLeaderCnt`).
const NO_LEADER_CHECKS: u32 = 3;

/// How often MoveLeader and the SIGTERM hand-over look for the new leader.
const TRANSFER_POLL: Duration = Duration::from_millis(10);

pub(in crate::cluster) use crate::cluster::member::lease_state::not_leader;

/// etcd's answer for a target that is not a voting member.
fn bad_transferee() -> Status {
    Status::new(
        Code::FailedPrecondition,
        "etcdserver: bad leader transferee",
    )
}

/// etcd's answer when the target did not take over in time.
fn transfer_timeout() -> Status {
    Status::new(
        Code::Unknown,
        "etcdserver: request timed out, leader transfer took too long",
    )
}

/// How much earlier than the client's deadline MoveLeader answers.
const DEADLINE_MARGIN: Duration = Duration::from_millis(50);

/// The longest MoveLeader waits for the new leader, whatever deadline the
/// client sent.
pub const MOVE_LEADER_LIMIT: Duration = Duration::from_secs(3600);

/// Maintenance.MoveLeader on a cluster member (see the module docs);
/// `waits` is how long the client waits, if it said.
pub async fn move_leader(node: &Node, target: u64, waits: Option<Duration>) -> Result<(), Status> {
    let status = node.status();
    if !status.is_leader() {
        return Err(not_leader());
    }
    if !node.leases.is_voter(target) {
        return Err(bad_transferee());
    }
    if target == node.id() {
        // etcd waits until the leader is the target: it is already.
        return Ok(());
    }
    node.send(Input::TransferLeader(Some(target)))
        .map_err(crate::grpc_status::status)?;
    // Answered a little before the client's deadline, so that the client
    // gets this answer rather than its own timeout (etcd's Go timers win
    // that race; a poll every TRANSFER_POLL could lose it).
    let waits = waits
        .map(|w| w.saturating_sub(DEADLINE_MARGIN))
        .unwrap_or(node.request_timeout())
        .min(MOVE_LEADER_LIMIT);
    if wait_for_leader(node, |l| l == target, waits).await {
        Ok(())
    } else {
        Err(transfer_timeout())
    }
}

/// Maintenance.MoveLeader on a single member, as a single-member etcd
/// answers it: success for itself, `bad leader transferee` otherwise.
pub fn move_leader_single(me: u64, target: u64) -> Result<(), Status> {
    if target == me {
        Ok(())
    } else {
        Err(bad_transferee())
    }
}

/// On SIGTERM, before the member stops serving: a leader hands leadership
/// to its most caught-up peer and waits (at most two election timeouts:
/// raft gives a transfer up after one) until another member leads. A
/// leader stopping because it was removed from the cluster does the same,
/// and waits only until it no longer leads (at most an election timeout).
pub async fn hand_over(node: &Node) {
    if !node.status().is_leader() {
        return;
    }
    let me = node.id();
    if node.send(Input::TransferLeader(None)).is_err() {
        return;
    }
    let bound = 2 * node.election_timeout();
    if node.is_removed() {
        // The others no longer answer it, nor send it their votes: it
        // steps down at the latest when its quorum check fails, after an
        // election timeout.
        let stepped_down = wait_until(node, |s| !s.is_leader(), node.election_timeout()).await;
        tracing::info!(
            stepped_down,
            "removed leader handed leadership over before stopping"
        );
        return;
    }
    if wait_for_leader(node, |l| l != me, bound).await {
        tracing::info!(
            leader = %format_args!("{:x}", node.status().leader().unwrap_or(0)),
            "leadership handed over before stopping"
        );
    } else {
        tracing::warn!(
            waited_ms = bound.as_millis() as u64,
            "leadership not handed over before stopping; the others elect a leader after an election timeout"
        );
    }
}

/// Waits until the known leader satisfies `done`, at most `bound`.
async fn wait_for_leader(node: &Node, done: impl Fn(u64) -> bool, bound: Duration) -> bool {
    wait_until(node, |s| s.leader().is_some_and(&done), bound).await
}

/// Waits until Raft's state satisfies `done`, at most `bound`.
async fn wait_until(node: &Node, done: impl Fn(&RaftStatus) -> bool, bound: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        if done(node.status()) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(TRANSFER_POLL).await;
    }
}

/// Whether a request carries `hasleader: true`.
pub fn requires_leader(headers: &http::HeaderMap) -> bool {
    headers
        .get(REQUIRE_LEADER_KEY)
        .is_some_and(|v| v.as_bytes() == REQUIRE_LEADER_VALUE)
}

/// For a stream opened with `hasleader: true` on a cluster member: a
/// receiver that completes once the member has had no leader at three
/// checks one election timeout apart (etcd's `monitorLeader`). The
/// checking task ends when the receiver is dropped.
pub fn leader_lost(node: Option<&Arc<Node>>, metadata: &tonic::metadata::MetadataMap) -> Lost {
    let Some(node) = node.filter(|_| requires_leader_md(metadata)) else {
        return Lost(None);
    };
    let (tx, rx) = oneshot::channel();
    let node = node.clone();
    tokio::spawn(monitor(node, tx));
    Lost(Some(rx))
}

fn requires_leader_md(metadata: &tonic::metadata::MetadataMap) -> bool {
    metadata
        .get(REQUIRE_LEADER_KEY)
        .is_some_and(|v| v.as_bytes() == REQUIRE_LEADER_VALUE)
}

async fn monitor(node: Arc<Node>, mut tx: oneshot::Sender<()>) {
    let mut misses = 0;
    let mut tick = tokio::time::interval(node.election_timeout());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = tx.closed() => return,
        }
        if node.status().leader().is_some() {
            misses = 0;
            continue;
        }
        misses += 1;
        if misses >= NO_LEADER_CHECKS {
            let _ = tx.send(());
            return;
        }
    }
}

/// See [`leader_lost`]; never completes for a stream without `hasleader`
/// or outside cluster mode.
pub struct Lost(Option<oneshot::Receiver<()>>);

impl Lost {
    /// Completes when the stream must end with `etcdserver: no leader`.
    /// Call it again only after it returned `false` (never, today).
    pub async fn wait(&mut self) {
        match &mut self.0 {
            Some(rx) => {
                if rx.await.is_err() {
                    // The monitor ended without firing: wait forever.
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    }

    /// The status a cancelled stream ends with.
    pub fn status() -> Status {
        crate::grpc_status::status(Error::NoLeader)
    }
}

/// etcd's unary and stream interceptors on a cluster member: refuses, at
/// once, every client call a learner does not serve while this member is a
/// learner (`learner.rs`; a Range is let through, the KV service refuses
/// it unless serializable), and every call with `hasleader: true` while
/// the member knows no leader. Outside cluster mode (no node) it passes
/// everything through.
#[derive(Clone)]
pub struct RequireLeaderLayer(pub Option<Arc<Node>>);

impl<S> tower::Layer<S> for RequireLeaderLayer {
    type Service = RequireLeader<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequireLeader {
            inner,
            node: self.0.clone(),
        }
    }
}

/// The service [`RequireLeaderLayer`] builds.
#[derive(Clone)]
pub struct RequireLeader<S> {
    inner: S,
    node: Option<Arc<Node>>,
}

impl<S, B> tower::Service<http::Request<B>> for RequireLeader<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Either<S::Future, BoxFuture<'static, Result<Self::Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let Some(node) = &self.node else {
            return Either::Left(self.inner.call(req));
        };
        // etcd's order: a learner's refusal first, then `hasleader`.
        if crate::cluster::node::learner::refuses(req.uri().path()) && node.is_learner() {
            return Either::Right(refuse(crate::cluster::node::learner::refusal()));
        }
        if node.status().leader().is_some() || !requires_leader(req.headers()) {
            return Either::Left(self.inner.call(req));
        }
        let Some(ends_by) = node.status().election_ends_by() else {
            return Either::Right(refuse(Lost::status()));
        };
        // An election under way (a leader's process just ended, and a peer
        // campaigns at once): an etcd member would still believe in the
        // old leader for an election timeout and take the call, so the
        // call waits for the election's outcome rather than failing a
        // client that is only moving off the old leader.
        let node = node.clone();
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        Either::Right(Box::pin(async move {
            let deadline = tokio::time::Instant::from_std(ends_by);
            match node
                .status()
                .wait_for_leader(deadline, Error::NoLeader)
                .await
            {
                Ok(()) => inner.call(req).await,
                Err(_) => Ok(Lost::status().into_http::<tonic::body::Body>()),
            }
        }))
    }
}

/// A refusal answered at once.
fn refuse<E: Send + 'static>(
    status: Status,
) -> BoxFuture<'static, Result<http::Response<tonic::body::Body>, E>> {
    Box::pin(futures::future::ready(Ok(
        status.into_http::<tonic::body::Body>()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hasleader_true_requires_a_leader() {
        let mut h = http::HeaderMap::new();
        assert!(!requires_leader(&h));
        h.insert(REQUIRE_LEADER_KEY, http::HeaderValue::from_static("false"));
        assert!(!requires_leader(&h));
        h.insert(REQUIRE_LEADER_KEY, http::HeaderValue::from_static("true"));
        assert!(requires_leader(&h));
    }

    #[test]
    fn a_single_member_moves_leadership_only_to_itself() {
        assert!(move_leader_single(7, 7).is_ok());
        let s = move_leader_single(7, 8).unwrap_err();
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(s.message(), "etcdserver: bad leader transferee");
    }
}
