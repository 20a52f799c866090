//! The automatic rejoin of a member restarted without its state.
//!
//! ephd keeps no Raft state on disk, so a member that restarts (a node
//! reboot, a crashed process) comes back empty. Under its old ID it must
//! never vote or acknowledge again: the others may count its old votes and
//! acknowledgements, which its empty log no longer backs. etcd's answer is
//! manual (MemberRemove, MemberAdd, start with `--initial-cluster-state
//! existing`); ephd does those steps itself when it is safe to:
//!
//! 1. At start (`--initial-cluster-state new`), the member probes the
//!    others (`join.rs`). When one says this ID has run and the cluster has
//!    a leader, it asks the leader (the member that answers, if the leader
//!    does not) to [`serve`] a `Rejoin`: the old ID is removed
//!    (MemberRemove, with etcd's checks: enough started voters must
//!    remain) and its peer URLs added as a learner under a new ID
//!    (MemberAdd). A learner never votes and never counts for a commit,
//!    so the cluster's quorum is the remaining voters' until it is
//!    promoted.
//! 2. The member starts as that learner, as a member added by MemberAdd
//!    does: it replays the leader's log (or installs a snapshot of the
//!    store when the log was compacted), and publishes itself.
//! 3. [`promote_when_caught_up`]: it asks for its promotion (MemberPromote,
//!    decided by the leader, which refuses until the learner has 90% of
//!    its log) until it is a voter.
//!
//! States that pass by themselves are waited out, for at most
//! [`PATIENCE`] (`join.rs` probes and decides again before each attempt):
//! survivors still electing (or still naming this member's old ID as their
//! leader, when it was the leader and came back within an election
//! timeout), a serving member that timed out or lost its leader, another
//! member rejoining as the one learner. An attempt that timed
//! out may have removed the old ID: the next probe shows it, and then only
//! the addition is asked for (`removed_already`), never a second removal.
//!
//! Not automated, refused with the etcd way spelled out: an ID that was
//! removed by someone else (an operator removed it: it must not add
//! itself back), a cluster whose answering members find no leader for
//! ten election timeouts (a majority may have lost its state:
//! `force.rs`), or a removal etcd's checks refuse. If the member that
//! serves the rejoin stops between the removal and the addition and this
//! process stops too, the next start finds the ID removed and is refused:
//! add it with MemberAdd then.

use crate::cluster::node::raft_node::Node;
use crate::cluster::replicated::member_list::Change;
use crate::config::ClusterConfig;
use crate::error::Error;
use crate::proto::ephd::internal::{
    membership_client::MembershipClient, JoinResponse, ProbeResponse, RejoinRequest,
};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tonic::{Request, Status};

use crate::cluster::member::applied_membership::Boot;

/// Why a rejoin attempt did not finish.
#[derive(Debug)]
pub(in crate::cluster) enum Refused {
    /// A state that passes by itself: the survivors still elect (or still
    /// name this member's old ID as their leader), the serving member timed
    /// out or lost its leader, the cluster is not healthy enough for a
    /// membership change yet. `sent` when a request reached the serving
    /// member, whose removal of the old ID may then have been applied.
    Transient { why: String, sent: bool },
    /// A refusal that stays (the ID was removed by an operator, etcd's
    /// checks refuse the removal).
    Final(String),
}

/// Asks the cluster to remove `id` (this member's old ID) and add this
/// member anew as a learner; returns what it starts with, or why not.
/// `answers` are the probe's answers, by peer URL. With `removed_already`
/// (an earlier attempt of this process reached the serving member and the
/// old ID is gone now, with no member holding these peer URLs), only the
/// addition is asked for.
pub(in crate::cluster) async fn rejoin(
    config: &ClusterConfig,
    id: u64,
    answers: &[(String, ProbeResponse)],
    client_urls: Vec<String>,
    removed_already: bool,
) -> Result<Boot, Refused> {
    // The leader: MemberAdd needs the serving member connected to every
    // voter, which a follower may not be (followers do not talk to each
    // other). Survivors that still name this member's old ID as leader (it
    // was killed and restarted within an election timeout) or name none
    // are electing: ask again once they have one.
    let leader = answers
        .iter()
        .find_map(|(_, r)| Some(r.leader).filter(|l| *l != 0));
    let not_sent = |why: String| Refused::Transient { why, sent: false };
    let url = match leader {
        Some(l) if l == id => {
            return Err(not_sent(
                "the others still name this member's old ID as their leader".into(),
            ))
        }
        None => return Err(not_sent("no member that answers has a leader".into())),
        Some(l) => match answers.iter().find(|(_, r)| r.member_id == l) {
            Some((url, _)) => url,
            None => return Err(not_sent(format!("the leader {l:x} does not answer"))),
        },
    };
    let mut c = connect(config, url)
        .await
        .ok_or_else(|| not_sent(format!("{url}: not reachable")))?;
    let mut req = Request::new(RejoinRequest {
        token: config.token.clone(),
        member_id: id,
        peer_urls: config.advertise_peer_urls.clone(),
        removed_already,
    });
    // A removal and an addition, each within the serving member's request
    // timeout (5 s plus two election timeouts).
    req.set_timeout(2 * (Duration::from_secs(6) + 2 * config.election));
    let r = match c.rejoin(req).await {
        Ok(r) => r.into_inner(),
        Err(s) if transient(&s) => {
            return Err(Refused::Transient {
                why: format!("{url}: {}", s.message()),
                sent: true,
            })
        }
        Err(s) => return Err(Refused::Final(format!("{url}: {}", s.message()))),
    };
    tracing::warn!(
        old_member_id = %format_args!("{id:x}"),
        member_id = %format_args!("{:x}", r.member_id),
        via = %url,
        "this member ran before and restarted without its raft state: its old ID was \
         removed and it rejoins as a learner under a new ID, to be promoted once caught up"
    );
    Ok(Boot::joined(r, config.name.clone(), client_urls, true))
}

/// How long a restarted member keeps asking to rejoin while the cluster is
/// in a state that passes by itself (an election, another member
/// rejoining, a removal refused while too few voters answer).
pub(in crate::cluster) const PATIENCE: Duration = Duration::from_secs(60);

/// A refusal or failure that changed nothing for sure, or whose removal
/// the next attempt checks, and that may pass later.
fn transient(s: &Status) -> bool {
    // One learner at a time: another member rejoining is promoted soon.
    // Timeouts and leader changes: the removal may or may not have been
    // applied, which the next probe shows.
    let refusals = [
        Error::Unhealthy,
        Error::NoLeader,
        Error::NoLeaderInTime,
        Error::TooManyLearners,
        Error::ProposalDropped,
        Error::LeaderChanged,
        Error::Timeout,
        Error::TimeoutDueToLeaderFail,
        Error::TimeoutDueToConnectionLost,
        Error::Stopped,
    ];
    refusals.iter().any(|e| e.message() == s.message())
        || matches!(
            s.code(),
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        )
}

async fn connect(
    config: &ClusterConfig,
    url: &str,
) -> Option<MembershipClient<tonic::transport::Channel>> {
    let channel =
        crate::cluster::transport::peers::connect_at_start(config, url, Duration::from_secs(2))
            .await
            .ok()?;
    Some(MembershipClient::new(channel))
}

/// The serving side: removes member `req.member_id` (which must still be
/// a voter with exactly `req.peer_urls`) and adds those peer URLs as a
/// learner. The caller has checked the token.
pub(in crate::cluster) async fn serve(
    node: &Node,
    req: RejoinRequest,
) -> Result<JoinResponse, Status> {
    let m = node.membership();
    let old = req.member_id;
    if req.removed_already
        && m.get(old).is_none()
        && m.is_removed(old)
        && m.by_peer_urls(&req.peer_urls).is_none()
    {
        // An earlier attempt of the same process removed the old ID and
        // timed out before the addition: add it now.
        return add_learner(node, &m, old, req.peer_urls).await;
    }
    let Some(member) = m.get(old) else {
        return Err(Status::failed_precondition(format!(
            "member {old:x} is not a member of this cluster (removed, or never added): a \
             removed ID does not add itself back; add it with MemberAdd and start it with \
             --initial-cluster-state existing"
        )));
    };
    let (mut have, mut want) = (member.peer_urls.clone(), req.peer_urls.clone());
    have.sort();
    want.sort();
    if have != want {
        return Err(Status::failed_precondition(format!(
            "member {old:x} has peer URLs {}, not {}",
            have.join(","),
            want.join(",")
        )));
    }
    if member.is_learner {
        return Err(Status::failed_precondition(format!(
            "member {old:x} is a learner: it restarts under its own ID"
        )));
    }
    let status = |e: Error| crate::grpc_status::status(e);
    // What the addition will check after the removal, checked before it,
    // so a refusal changes nothing (a removal without the addition would
    // leave the member to be added by hand). Not etcd's health check: the
    // removed member is down, and a learner never counts for the quorum
    // (`Node::add_rejoining_learner`).
    let mut after_removal = m.clone();
    after_removal.apply(&Change::Remove(old)).map_err(status)?;
    if after_removal.members().any(|x| x.is_learner) {
        return Err(status(Error::TooManyLearners));
    }
    node.member_remove(old).await.map_err(status)?;
    add_learner(node, &after_removal, old, req.peer_urls).await
}

/// The addition half of a rejoin: `peer_urls` as a learner.
async fn add_learner(
    node: &Node,
    membership: &crate::cluster::replicated::member_list::Membership,
    old: u64,
    peer_urls: Vec<String>,
) -> Result<JoinResponse, Status> {
    let status = |e: Error| crate::grpc_status::status(e);
    if membership.members().any(|x| x.is_learner) {
        return Err(status(Error::TooManyLearners));
    }
    let (added, after) = node
        .add_rejoining_learner(peer_urls)
        .await
        .map_err(status)?;
    tracing::info!(
        old_member_id = %format_args!("{old:x}"),
        member_id = %format_args!("{:x}", added.id),
        "a member restarted without its state: old ID removed, added again as a learner"
    );
    Ok(JoinResponse {
        cluster_id: node.cluster_id(),
        member_id: added.id,
        initial: Some(node.members().initial.to_state()),
        current: Some(after.to_state()),
    })
}

/// After a rejoin: asks for this member's promotion until it is a voter
/// (the leader, which decides, refuses while the learner is behind), or
/// the leader says it is no member. It asks the leader rather than
/// reading its own applied membership, which a learner that caught up by
/// snapshot may not have whole yet (CLUSTER.md, snapshot sections).
pub(in crate::cluster) fn promote_when_caught_up(node: &Arc<Node>) {
    let weak: Weak<Node> = Arc::downgrade(node);
    let id = node.id();
    let pause = node.election_timeout();
    tokio::spawn(async move {
        let mut refusals = 0u64;
        // Asked soon after the start (a learner that caught up from a
        // small log is ready within a round or two), then less often.
        let mut wait = pause / 20;
        loop {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(pause / 2);
            let Some(node) = weak.upgrade() else { return };
            // Raft drops a conf change proposed while another is pending
            // (this member publishing itself), and nothing says so: ask
            // again after a couple of election timeouts.
            match tokio::time::timeout(2 * pause, node.member_promote(id)).await {
                Ok(Ok(_)) | Ok(Err(Error::MemberNotLearner)) => {
                    tracing::info!(
                        member_id = %format_args!("{id:x}"),
                        "promoted to voter after rejoining"
                    );
                    return;
                }
                Ok(Err(Error::Stopped | Error::MemberNotFound)) => return,
                Ok(Err(e)) => {
                    refusals += 1;
                    if refusals.is_multiple_of(20) {
                        tracing::warn!(error = %e, refusals, "promotion after rejoining refused so far");
                    }
                }
                Err(_) => {}
            }
        }
    });
}
