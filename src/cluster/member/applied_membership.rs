//! Membership's state on this member, below the Raft node: what a member
//! starts with ([`Boot`]), the applied membership and waiting changes
//! ([`Members`]), the Raft thread's part of a change ([`take`]) and the
//! apply thread's ([`apply_entry`]). The Cluster API's side, which needs
//! the node to propose, is `reconfig.rs`.

use crate::cluster::log::input::{Input, PeerChange, Progress};
use crate::cluster::log::queue::Sender;
use crate::cluster::log::waiters::Waiters;
use crate::cluster::replicated::member_list::{Change, MemberInfo, Membership};
use crate::cluster::transport::peers::{display_name, PeerHealth, Peers};
use crate::config::ClusterConfig;
use crate::error::{Error, Result};
use parking_lot::RwLock;
use raft::prelude::ConfChange;
use raft::{RawNode, StateRole};
use std::sync::Arc;

/// What a member starts its Raft node with (`join.rs` finds it).
#[derive(Debug, Clone)]
pub struct Boot {
    /// This member's ID.
    pub id: u64,
    /// The cluster's ID.
    pub cluster_id: u64,
    /// The membership the cluster's log starts from (Raft's configuration
    /// at index 0): the initial cluster.
    pub initial: Membership,
    /// The membership applied now, as far as known at start (whom to
    /// connect to while replaying the log).
    pub current: Membership,
    /// This member's `--name`, which it publishes once it has a leader.
    pub name: String,
    /// Its advertised client URLs, published likewise.
    pub client_urls: Vec<String>,
    /// It rejoined as a learner after a restart without state
    /// (`rejoin.rs`): it promotes itself once caught up.
    pub promote: bool,
    /// The Raft index and term of the saved state (`--data-dir`,
    /// `saved_state.rs`) a member forced into a new cluster resumes from: its
    /// log starts after that index, so a member added later catches up by
    /// snapshot instead of replaying a log without the resumed data.
    pub resume: Option<(u64, u64)>,
    /// A member restarting from its Raft log (`restart.rs`): its hard
    /// state and the entries after the saved state, which its Raft node
    /// starts with.
    pub log: Option<LoggedRaft>,
}

/// What a member's Raft log gives its restart.
#[derive(Debug, Clone, Default)]
pub struct LoggedRaft {
    /// Term, vote and commit index as last written.
    pub hard_state: raft::prelude::HardState,
    /// The entries after the saved state's index, in order.
    pub entries: Vec<raft::prelude::Entry>,
}

impl Boot {
    /// What a member starts with from a running member's answer to a join
    /// or rejoin (its ID, the cluster's, the log's first and the current
    /// membership); `promote` when it starts as a learner to promote.
    pub(in crate::cluster) fn joined(
        r: crate::proto::ephd::internal::JoinResponse,
        name: String,
        client_urls: Vec<String>,
        promote: bool,
    ) -> Boot {
        Boot {
            id: r.member_id,
            cluster_id: r.cluster_id,
            initial: Membership::from_state(r.initial.unwrap_or_default()),
            current: Membership::from_state(r.current.unwrap_or_default()),
            name,
            client_urls,
            promote,
            resume: None,
            log: None,
        }
    }
}

/// Membership's shared state, held by the node and its two threads.
pub(in crate::cluster) struct Members {
    /// The applied membership (changed by the apply thread only).
    pub(in crate::cluster) current: RwLock<Membership>,
    /// The membership the log starts from, which a joining member needs.
    pub(in crate::cluster) initial: Membership,
    /// Proposed changes waiting for their result.
    pub(in crate::cluster) waiters: Waiters<Result<Membership>>,
    /// Since when each peer has answered, and the peer metrics.
    pub(in crate::cluster) health: Arc<PeerHealth>,
    /// `--initial-cluster-token`.
    pub(in crate::cluster) token: String,
    /// The cluster ID.
    pub(in crate::cluster) cluster_id: u64,
    /// Raised once this member knows it was removed (`removal.rs`).
    pub(in crate::cluster) removal: Arc<crate::cluster::replicated::removal::Removal>,
    /// This member joined as a learner (`boot.current` says so): what it
    /// is until the applied membership knows it (`learner.rs`).
    pub(in crate::cluster) joined_as_learner: bool,
}

impl Members {
    pub(in crate::cluster) fn new(boot: &Boot, config: &ClusterConfig) -> Members {
        Members {
            // The log is applied from its start: a joining member replays
            // every change since the initial cluster (`boot.current` only
            // tells it whom to connect to meanwhile).
            current: RwLock::new(boot.initial.clone()),
            initial: boot.initial.clone(),
            waiters: Waiters::default(),
            health: Arc::new(PeerHealth::new(boot.id)),
            token: config.token.clone(),
            cluster_id: boot.cluster_id,
            removal: Arc::default(),
            joined_as_learner: boot.current.get(boot.id).is_some_and(|m| m.is_learner),
        }
    }
}

/// Raft-thread side of membership inputs.
pub(in crate::cluster) fn take(
    raw: &mut RawNode<crate::cluster::log::catchup::LogStore>,
    peers: &mut Peers,
    members: &Members,
    input: Input,
) {
    match input {
        Input::ProposeConf { proposal, cc } => {
            if raw.propose_conf_change(Vec::new(), cc).is_err() {
                members.waiters.finish(proposal, Err(Error::NoLeader));
            }
        }
        Input::ApplyConf { cc, peer } => {
            if cc.get_node_id() != 0 {
                match raw.apply_conf_change(&cc) {
                    Ok(cs) => raw.mut_store().wl().set_conf_state(cs),
                    Err(e) => tracing::error!(error = %e, "raft refused a membership change"),
                }
            }
            peers.change(peer);
        }
        Input::Progress(reply) => {
            let raft = &raw.raft;
            let progress = (raft.state == StateRole::Leader).then(|| Progress {
                leader: raft.id,
                matched: raft.prs().iter().map(|(id, p)| (*id, p.matched)).collect(),
            });
            let _ = reply.send(progress);
        }
        Input::Step(_)
        | Input::Propose { .. }
        | Input::ReadIndex { .. }
        | Input::Stop
        | Input::Save(_)
        | Input::TransferLeader(_)
        | Input::LeaderGone(_)
        | Input::SnapshotBuilt { .. }
        | Input::SnapshotStatus { .. } => {
            unreachable!("handled by the raft loop")
        }
    }
}

/// Apply-thread side: applies a committed conf change entry to the
/// membership, hands Raft's part to the Raft thread, and answers the
/// proposer.
pub(in crate::cluster) fn apply_entry(
    members: &Members,
    me: u64,
    inbox: &Sender<Input>,
    data: &[u8],
) {
    let (change, proposer, proposal) = match Change::from_entry_data(data) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "membership change skipped");
            return;
        }
    };
    let result = {
        let mut current = members.current.write();
        current.apply(&change).map(|()| current.clone())
    };
    match &result {
        Ok(after) => {
            let peer = peer_change(&change, after);
            let raft = change.raft_change();
            if raft.get_node_id() != 0 || peer != PeerChange::None {
                // Blocks only while the Raft thread's inbox is full; fails
                // only when it has stopped.
                let _ = inbox.send(Input::ApplyConf { cc: raft, peer });
            }
            log_applied(&change, me);
        }
        Err(e) => tracing::info!(change = ?change, error = %e, "membership change refused"),
    }
    if proposer == me {
        members.waiters.finish(proposal, result);
    }
    if change == Change::Remove(me) && members.current.read().is_removed(me) {
        members.removal.raise(me, "applied its removal");
    }
}

/// Apply-thread side of a snapshot install: the member list the snapshot
/// carries replaces this member's (the changes it lacks were compacted out
/// of the leader's log), and the peer connections follow it. Raft's own
/// configuration comes with the snapshot's metadata.
pub(in crate::cluster) fn install(
    members: &Members,
    me: u64,
    inbox: &Sender<Input>,
    installed: Membership,
) {
    let before = std::mem::replace(&mut *members.current.write(), installed.clone());
    if installed.is_removed(me) {
        // Its removal was in the part of the log the snapshot replaced.
        members
            .removal
            .raise(me, "installed a snapshot that removed it");
    }
    let gone = before
        .members()
        .filter(|m| installed.get(m.id).is_none())
        .map(|m| PeerChange::Remove(m.id));
    let now = installed.members().map(upsert);
    for peer in gone.chain(now).filter(|p| *p != PeerChange::None) {
        let _ = inbox.send(Input::ApplyConf {
            cc: ConfChange::default(),
            peer,
        });
    }
    if before != installed {
        tracing::info!(
            members = installed.members().count(),
            "member list installed from a raft snapshot"
        );
    }
}

fn peer_change(change: &Change, after: &Membership) -> PeerChange {
    match change {
        Change::Add(m) => upsert(m),
        Change::UpdatePeerUrls { id, .. } => after.get(*id).map_or(PeerChange::None, upsert),
        Change::Remove(id) => PeerChange::Remove(*id),
        Change::Promote(_) | Change::Publish { .. } => PeerChange::None,
    }
}

fn upsert(m: &MemberInfo) -> PeerChange {
    match m.peer_urls.first() {
        Some(url) => PeerChange::Upsert {
            id: m.id,
            name: display_name(m),
            url: url.clone(),
        },
        None => PeerChange::None,
    }
}

fn log_applied(change: &Change, me: u64) {
    match change {
        // Logged when the removal is raised.
        Change::Remove(id) if *id == me => {}
        Change::Publish { .. } => {}
        other => tracing::info!(change = ?other, "membership changed"),
    }
}
