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
//! Not automated, refused with the etcd way spelled out: an ID that was
//! removed (an operator removed it: it must not add itself back), a
//! cluster without a leader (a majority may have lost its state:
//! `force.rs`), or a removal etcd's checks refuse. If the member that
//! serves the rejoin stops between the removal and the addition, the next
//! start finds the ID removed and is refused: add it with MemberAdd then.

use super::membership::Change;
use super::node::Node;
use crate::config::ClusterConfig;
use crate::error::Error;
use crate::proto::ephd::internal::{
    membership_client::MembershipClient, JoinResponse, ProbeResponse, RejoinRequest,
};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tonic::{Request, Status};

use super::members::Boot;

/// Asks the cluster to remove `id` (this member's old ID) and add this
/// member anew as a learner; returns what it starts with, or why not.
/// `answers` are the probe's answers, by peer URL.
pub(super) async fn rejoin(
    config: &ClusterConfig,
    id: u64,
    answers: &[(String, ProbeResponse)],
    client_urls: Vec<String>,
) -> Result<Boot, String> {
    // The leader: MemberAdd needs the serving member connected to every
    // voter, which a follower may not be (followers do not talk to each
    // other). One member only: a second attempt after a partial one would
    // find the old ID removed.
    let leader = answers
        .iter()
        .find_map(|(_, r)| Some(r.leader).filter(|l| *l != 0));
    let Some((url, _)) = answers
        .iter()
        .find(|(_, r)| Some(r.member_id) == leader)
        .or_else(|| answers.first())
    else {
        return Err("no member answers".to_string());
    };
    let mut c = connect(url)
        .await
        .ok_or_else(|| format!("{url}: not reachable"))?;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let r = loop {
        let mut req = Request::new(RejoinRequest {
            token: config.token.clone(),
            member_id: id,
            peer_urls: config.advertise_peer_urls.clone(),
        });
        // A removal and an addition, each within the serving member's
        // request timeout (5 s plus two election timeouts).
        req.set_timeout(2 * (Duration::from_secs(6) + 2 * config.election));
        match c.rejoin(req).await {
            Ok(r) => break r.into_inner(),
            // Refused before anything changed, for a while only: etcd's
            // health rule wants every voter connected for 5 s (a cluster
            // that just formed, or a member that just came back), and
            // another member may be rejoining as the one learner.
            Err(s) if transient(&s) && tokio::time::Instant::now() < deadline => {
                tracing::info!(reason = %s.message(), "rejoin refused for now; asking again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(s) => return Err(format!("{url}: {}", s.message())),
        }
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

/// How long a restarted member asks again while the cluster is not
/// healthy enough to change its membership.
const PATIENCE: Duration = Duration::from_secs(30);

/// A refusal that changed nothing and may pass later.
fn transient(s: &Status) -> bool {
    // One learner at a time: another member rejoining is promoted soon.
    [Error::Unhealthy, Error::NoLeader, Error::TooManyLearners]
        .iter()
        .any(|e| e.message() == s.message())
}

async fn connect(url: &str) -> Option<MembershipClient<tonic::transport::Channel>> {
    let channel = super::peers::connect(url, Duration::from_secs(2))
        .await
        .ok()?;
    Some(MembershipClient::new(channel))
}

/// The serving side: removes member `req.member_id` (which must still be
/// a voter with exactly `req.peer_urls`) and adds those peer URLs as a
/// learner. The caller has checked the token.
pub(super) async fn serve(node: &Node, req: RejoinRequest) -> Result<JoinResponse, Status> {
    let m = node.membership();
    let old = req.member_id;
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
    // What MemberAdd will check after the removal, checked before it, so
    // a refusal changes nothing (a removal without the addition would
    // leave the member to be added by hand).
    let mut after_removal = m.clone();
    after_removal.apply(&Change::Remove(old)).map_err(status)?;
    if after_removal.members().any(|x| x.is_learner) {
        return Err(status(Error::TooManyLearners));
    }
    if !node.connected_fully(&after_removal) {
        return Err(status(Error::Unhealthy));
    }
    node.member_remove(old).await.map_err(status)?;
    let (added, after) = node.member_add(req.peer_urls, true).await.map_err(status)?;
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
pub(super) fn promote_when_caught_up(node: &Arc<Node>) {
    let weak: Weak<Node> = Arc::downgrade(node);
    let id = node.id();
    let pause = node.election_timeout();
    tokio::spawn(async move {
        let mut refusals = 0u64;
        loop {
            tokio::time::sleep(pause / 2).await;
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
