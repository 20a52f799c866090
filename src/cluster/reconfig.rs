//! Membership changes in a running cluster: the Cluster API's MemberAdd,
//! MemberRemove, MemberUpdate and MemberPromote as Raft conf changes, with
//! etcd 3.4's checks before proposing (strict reconfiguration checks: a
//! change must not break the active quorum), and the members publishing
//! their names and client URLs through the log.
//!
//! How a change travels: the member proposes a `ConfChange` whose context
//! is the [`Change`] (`membership.rs`); once committed, the apply thread
//! applies it to the [`Membership`] in log order (checking it again, as
//! etcd does, since the membership may have changed since it was proposed)
//! and, when valid, hands Raft's part to the Raft thread
//! ([`Input::ApplyConf`]): Raft's configuration and the peer connections.
//! The proposing member answers its client with the membership after the
//! change.

use super::membership::{Change, MemberInfo, Membership};
use super::node::{Input, Node, Waiters};
use super::peers::{display_name, PeerChange, PeerHealth, Peers};
use crate::config::ClusterConfig;
use crate::error::{Error, Result};
use crossbeam_channel::Sender;
use parking_lot::RwLock;
use protobuf::Message as _;
use raft::prelude::ConfChange;
use raft::{RawNode, StateRole};
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How long every voter must have answered without interruption before a
/// reconfiguration is allowed (etcd's `HealthInterval`).
const HEALTH_INTERVAL: Duration = Duration::from_secs(5);
/// How far a learner must have replicated, relative to the leader, to be
/// promoted (etcd's `readyPercent`).
const READY_PERCENT: f64 = 0.9;

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
}

/// The leader's replication progress: how far each member's log matches.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// The leader's ID.
    pub leader: u64,
    /// Matched log index by member ID.
    pub matched: HashMap<u64, u64>,
}

/// Membership's shared state, held by the node and its two threads.
pub(super) struct Members {
    /// The applied membership (changed by the apply thread only).
    pub(super) current: RwLock<Membership>,
    /// The membership the log starts from, which a joining member needs.
    pub(super) initial: Membership,
    /// Proposed changes waiting for their result.
    pub(super) waiters: Waiters<Result<Membership>>,
    /// Since when each peer has answered.
    pub(super) health: Arc<PeerHealth>,
    /// `--initial-cluster-token`.
    pub(super) token: String,
    /// The cluster ID.
    pub(super) cluster_id: u64,
}

impl Members {
    pub(super) fn new(boot: &Boot, config: &ClusterConfig) -> Members {
        Members {
            // The log is applied from its start: a joining member replays
            // every change since the initial cluster (`boot.current` only
            // tells it whom to connect to meanwhile).
            current: RwLock::new(boot.initial.clone()),
            initial: boot.initial.clone(),
            waiters: Waiters::default(),
            health: Arc::new(PeerHealth::default()),
            token: config.token.clone(),
            cluster_id: boot.cluster_id,
        }
    }
}

/// Raft-thread side of membership inputs.
pub(super) fn take(
    raw: &mut RawNode<super::catchup::LogStore>,
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
        | Input::TransferLeader(_)
        | Input::SnapshotBuilt { .. }
        | Input::SnapshotStatus { .. } => {
            unreachable!("handled by the raft loop")
        }
    }
}

/// Apply-thread side: applies a committed conf change entry to the
/// membership, hands Raft's part to the Raft thread, and answers the
/// proposer.
pub(super) fn apply_entry(members: &Members, me: u64, inbox: &Sender<Input>, data: &[u8]) {
    let cc = match ConfChange::parse_from_bytes(data) {
        Ok(cc) => cc,
        Err(e) => {
            tracing::error!(error = %e, "undecodable membership change skipped");
            return;
        }
    };
    let (change, proposer, proposal) = match Change::from_conf_change(&cc) {
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
        Change::Remove(id) if *id == me => tracing::error!(
            member_id = %format_args!("{me:x}"),
            "this member was removed from the cluster: it no longer votes or counts for \
             commits; stop it (a member that lost its state joins again under a new ID: \
             MemberAdd, then start it with --initial-cluster-state existing)"
        ),
        Change::Publish { .. } => {}
        other => tracing::info!(change = ?other, "membership changed"),
    }
}

impl Node {
    /// The applied membership.
    pub fn membership(&self) -> Membership {
        self.members().current.read().clone()
    }

    /// The cluster ID.
    pub fn cluster_id(&self) -> u64 {
        self.members().cluster_id
    }

    /// The leader's replication progress, when this member is the leader.
    pub async fn progress(&self) -> Result<Option<Progress>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(Input::Progress(tx))?;
        rx.await.map_err(|_| Error::Stopped)
    }

    /// Proposes `change` and waits until this member has applied it;
    /// returns the membership after it, or why it was refused.
    pub(super) async fn propose_change(&self, change: Change) -> Result<Membership> {
        if self.status().leader().is_none() {
            return Err(Error::NoLeader);
        }
        let proposal = self.next_number();
        let cc = change.to_conf_change(self.id(), proposal);
        let (rx, _pending) = self.members().waiters.wait(proposal);
        self.send(Input::ProposeConf { proposal, cc })?;
        match tokio::time::timeout(self.request_timeout(), rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Error::Stopped),
            Err(_) => Err(Error::Timeout),
        }
    }

    /// Whether this member has heard from every other voter without
    /// interruption for [`HEALTH_INTERVAL`] (etcd's
    /// `isConnectedFullySince`).
    fn connected_fully(&self, m: &Membership) -> bool {
        self.connected_voters(m) == m.voters().count()
    }

    /// Voters this member is connected to (itself included), as etcd's
    /// `numConnectedSince` counts them.
    fn connected_voters(&self, m: &Membership) -> usize {
        let since = Instant::now().checked_sub(HEALTH_INTERVAL);
        let health = &self.members().health;
        m.voters()
            .filter(|v| {
                v.id == self.id()
                    || health
                        .active_since(v.id)
                        .is_some_and(|t| since.is_some_and(|s| t <= s))
            })
            .count()
    }

    /// MemberAdd: a new voter or learner with `peer_urls`, under a new ID. Returns the new member and the membership after it.
    pub async fn member_add(
        &self,
        peer_urls: Vec<String>,
        is_learner: bool,
    ) -> Result<(MemberInfo, Membership)> {
        check_urls(&peer_urls)?;
        let m = self.membership();
        if !is_learner && !ready_to_add_voter(&m) {
            return Err(Error::MemberNotEnoughStarted);
        }
        if !self.connected_fully(&m) {
            return Err(Error::Unhealthy);
        }
        // etcd's rule: the ID hashes the peer URLs, the cluster and the
        // second (so the same URLs added twice in one second get the same
        // ID, and `member ID already exist`).
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        // One difference: etcd answers `member not found` when that ID was
        // removed (the same URLs removed and added again within a second);
        // ephd takes the next second's ID instead, so a replacement works.
        let token = &self.members().token;
        let mut id = 0;
        for s in secs.. {
            id = crate::config::member_id(&peer_urls, &format!("{token}|{s}"));
            if !m.is_removed(id) {
                break;
            }
        }
        let member = MemberInfo {
            id,
            name: String::new(),
            peer_urls,
            client_urls: Vec::new(),
            is_learner,
        };
        let after = self.propose_change(Change::Add(member.clone())).await?;
        Ok((member, after))
    }

    /// MemberRemove, refused when it would leave too few started voters
    /// or break the active quorum (etcd's `mayRemoveMember`).
    pub async fn member_remove(&self, id: u64) -> Result<Membership> {
        let m = self.membership();
        let learner = m.get(id).is_some_and(|x| x.is_learner);
        if !learner {
            if !ready_to_remove_voter(&m, id) {
                return Err(Error::MemberNotEnoughStarted);
            }
            // A member that is down is not part of the active quorum.
            let down = id != self.id() && self.members().health.active_since(id).is_none();
            let voters = m.voters().count();
            if !down && self.connected_voters(&m) < 2 + voters.saturating_sub(1) / 2 {
                return Err(Error::Unhealthy);
            }
        }
        self.propose_change(Change::Remove(id)).await
    }

    /// MemberUpdate: new peer URLs for member `id`.
    pub async fn member_update(&self, id: u64, peer_urls: Vec<String>) -> Result<Membership> {
        self.propose_change(Change::UpdatePeerUrls { id, peer_urls })
            .await
    }

    /// MemberPromote, decided on the leader (only it knows how far the
    /// learner has replicated): a follower asks the leader over the peer
    /// service.
    pub async fn member_promote(&self, id: u64) -> Result<Membership> {
        match self.progress().await? {
            Some(progress) => self.promote_as_leader(id, &progress).await,
            None => super::join::forward_promote(self, id).await,
        }
    }

    /// MemberPromote on the leader (etcd's `mayPromoteMember`).
    pub(super) async fn promote_as_leader(&self, id: u64, p: &Progress) -> Result<Membership> {
        if let Some(matched) = p.matched.get(&id) {
            let leader = p.matched.get(&p.leader).copied().unwrap_or(0);
            if (*matched as f64) < (leader as f64) * READY_PERCENT {
                return Err(Error::LearnerNotReady);
            }
        }
        if !ready_to_promote(&self.membership()) {
            return Err(Error::MemberNotEnoughStarted);
        }
        self.propose_change(Change::Promote(id)).await
    }
}

/// etcd's `IsReadyToAddVotingMember`: after the add, enough started voters
/// for a quorum (adding a second member to a single one is allowed).
fn ready_to_add_voter(m: &Membership) -> bool {
    let members = m.voters().count() + 1;
    let started = m.voters().filter(|v| v.is_started()).count();
    (started == 1 && members == 2) || started > members / 2
}

/// etcd's `IsReadyToRemoveVotingMember`.
fn ready_to_remove_voter(m: &Membership, id: u64) -> bool {
    let rest: Vec<&MemberInfo> = m.voters().filter(|v| v.id != id).collect();
    let started = rest.iter().filter(|v| v.is_started()).count();
    started > rest.len() / 2
}

/// etcd's `IsReadyToPromoteMember` (the learner counts as started).
fn ready_to_promote(m: &Membership) -> bool {
    let members = m.voters().count() + 1;
    let started = m.voters().filter(|v| v.is_started()).count() + 1;
    started > members / 2
}

/// etcd's URL checks on MemberAdd and MemberUpdate (`types.NewURLs`):
/// at least one, each `scheme://host:port` with an http, https, unix or
/// unixs scheme and no path.
pub fn check_urls(urls: &[String]) -> Result<()> {
    if urls.is_empty() {
        return Err(Error::MemberBadUrls);
    }
    for u in urls {
        let Some((scheme, rest)) = u.trim().split_once("://") else {
            return Err(Error::MemberBadUrls);
        };
        if !matches!(scheme, "http" | "https" | "unix" | "unixs") {
            return Err(Error::MemberBadUrls);
        }
        let Some((host, port)) = rest.rsplit_once(':') else {
            return Err(Error::MemberBadUrls);
        };
        if host.is_empty() || port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Error::MemberBadUrls);
        }
    }
    Ok(())
}

/// Once this member has a leader, publishes its name and client URLs
/// through the log (etcd's `publish`), retrying until the applied
/// membership shows them, so every member lists them.
pub(super) fn publish(node: &Arc<Node>, name: String, client_urls: Vec<String>) {
    let weak: Weak<Node> = Arc::downgrade(node);
    let id = node.id();
    let pause = node.election_timeout();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(pause / 4).await;
            let Some(node) = weak.upgrade() else { return };
            let m = node.membership();
            if m.is_removed(id) {
                return;
            }
            if m.get(id)
                .is_some_and(|me| me.name == name && me.client_urls == client_urls)
            {
                return;
            }
            if node.status().leader().is_none() {
                continue;
            }
            let change = Change::Publish {
                id,
                name: name.clone(),
                client_urls: client_urls.clone(),
            };
            // Raft drops a conf change proposed while another is pending
            // (members publish at once when a cluster forms), and nothing
            // says so: wait a couple of election timeouts, not the whole
            // request timeout, then look again.
            match tokio::time::timeout(2 * pause, node.propose_change(change)).await {
                Ok(Ok(_)) => {}
                Ok(Err(Error::Stopped)) => return,
                Ok(Err(_)) | Err(_) => {
                    let jitter = rand::random_range(0..=pause.as_millis() as u64);
                    tokio::time::sleep(Duration::from_millis(jitter)).await;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_as_etcd_checks_them() {
        let ok = |u: &str| check_urls(&[u.to_string()]).is_ok();
        assert!(ok("http://127.0.0.1:2380"));
        assert!(ok("https://host.example:1"));
        assert!(!ok("bad"));
        assert!(!ok("ftp://a:1"));
        assert!(!ok("http://a"));
        assert!(!ok("http://a:1/path"));
        assert!(check_urls(&[]).is_err());
    }

    #[test]
    fn quorum_rules_are_etcds() {
        let member = |id, started: bool, learner| MemberInfo {
            id,
            name: if started {
                format!("m{id}")
            } else {
                String::new()
            },
            peer_urls: vec![format!("http://m{id}:1")],
            client_urls: Vec::new(),
            is_learner: learner,
        };
        let one = Membership::of([member(1, true, false)]);
        assert!(ready_to_add_voter(&one), "a second member for a single one");
        assert!(!ready_to_remove_voter(&one, 1));
        let three = Membership::of([
            member(1, true, false),
            member(2, true, false),
            member(3, false, false),
        ]);
        // Adding a fourth voter needs three started ones.
        assert!(!ready_to_add_voter(&three));
        let started = Membership::of([
            member(1, true, false),
            member(2, true, false),
            member(3, true, false),
        ]);
        assert!(ready_to_add_voter(&started));
        assert!(ready_to_remove_voter(&three, 3));
        assert!(!ready_to_remove_voter(&three, 1));
        assert!(ready_to_promote(&three));
        let four = Membership::of([
            member(1, true, false),
            member(2, true, false),
            member(3, false, false),
            member(4, false, false),
        ]);
        assert!(!ready_to_add_voter(&four));
    }
}
