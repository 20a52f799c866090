//! Membership changes in a running cluster: the Cluster API's MemberAdd,
//! MemberRemove, MemberUpdate and MemberPromote as Raft conf changes, with
//! etcd 3.4's checks before proposing (strict reconfiguration checks: a
//! change must not break the active quorum), and the members publishing
//! their names and client URLs through the log.
//!
//! How a change travels: the member proposes a `ConfChange` whose context
//! is the [`Change`] (`member_list.rs`); once committed, the apply thread
//! applies it to the [`Membership`] in log order (checking it again, as
//! etcd does, since the membership may have changed since it was proposed)
//! and, when valid, hands Raft's part to the Raft thread
//! ([`Input::ApplyConf`]): Raft's configuration and the peer connections.
//! The proposing member answers its client with the membership after the
//! change.

use crate::cluster::log::input::{Input, Progress};
use crate::cluster::member::applied_membership::Boot;
use crate::cluster::node::raft_node::Node;
use crate::cluster::replicated::member_list::{Change, MemberInfo, Membership};
use crate::config::ClusterConfig;
use crate::error::{Error, Result};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How long every voter must have answered without interruption before a
/// reconfiguration is allowed (etcd's `HealthInterval`).
const HEALTH_INTERVAL: Duration = Duration::from_secs(5);
/// How far a learner must have replicated, relative to the leader, to be
/// promoted (etcd's `readyPercent`).
const READY_PERCENT: f64 = 0.9;

impl Node {
    /// The applied membership.
    pub fn membership(&self) -> Membership {
        self.members().current.read().clone()
    }

    /// The cluster ID.
    pub fn cluster_id(&self) -> u64 {
        self.members().cluster_id
    }

    /// Completes once this member knows it was removed from the cluster
    /// (`removal.rs`); the server then stops, as etcd's does.
    pub async fn removed(&self) {
        self.members().removal.raised().await
    }

    /// Whether this member knows it was removed from the cluster.
    pub fn is_removed(&self) -> bool {
        self.members().removal.is_raised()
    }

    /// The leader's replication progress, when this member is the leader.
    pub async fn progress(&self) -> Result<Option<Progress>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(Input::Progress(tx))?;
        rx.await.map_err(|_| Error::Stopped)
    }

    /// Proposes `change` and waits until this member has applied it;
    /// returns the membership after it, or why it was refused.
    pub(in crate::cluster) async fn propose_change(&self, change: Change) -> Result<Membership> {
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
    pub(in crate::cluster) fn connected_fully(&self, m: &Membership) -> bool {
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
        self.add_member(&m, peer_urls, is_learner).await
    }

    /// The learner a member restarted without its state rejoins as
    /// (`rejoin.rs`): MemberAdd without etcd's health check, which guards
    /// the active quorum, and a learner never counts for it. Waiting for
    /// every voter to have answered for five seconds held a rejoin back
    /// after every election and every other rejoin.
    pub(in crate::cluster) async fn add_rejoining_learner(
        &self,
        peer_urls: Vec<String>,
    ) -> Result<(MemberInfo, Membership)> {
        check_urls(&peer_urls)?;
        let m = self.membership();
        self.add_member(&m, peer_urls, true).await
    }

    /// Proposes the addition of `peer_urls` under a new ID, once checked.
    async fn add_member(
        &self,
        m: &Membership,
        peer_urls: Vec<String>,
        is_learner: bool,
    ) -> Result<(MemberInfo, Membership)> {
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
            None => crate::cluster::lifecycle::join::forward_promote(self, id).await,
        }
    }

    /// MemberPromote on the leader (etcd's `mayPromoteMember`).
    pub(in crate::cluster) async fn promote_as_leader(
        &self,
        id: u64,
        p: &Progress,
    ) -> Result<Membership> {
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

/// Starts this member's Raft node ([`Node::start`]; `wait`: what its
/// writes wait for) and has it publish its name and client URLs
/// through the log once it has a leader (and, after a rejoin, promote
/// itself once caught up).
pub fn start_node(
    config: &ClusterConfig,
    store: Arc<crate::mvcc::Store>,
    boot: Boot,
    wait: crate::cluster::WritesWaitFor,
    disk: Option<crate::cluster::member::restart::Disk>,
    settings: crate::cluster::PeerSettings,
) -> std::result::Result<Arc<Node>, String> {
    let (name, client_urls) = (boot.name.clone(), boot.client_urls.clone());
    let promote = boot.promote;
    let node = Node::start(config, store, boot, wait, disk, settings)?;
    publish(&node, name, client_urls);
    if promote {
        crate::cluster::lifecycle::rejoin::promote_when_caught_up(&node);
    }
    Ok(node)
}

/// Once this member has a leader, publishes its name and client URLs
/// through the log (etcd's `publish`), retrying until the applied
/// membership shows them, so every member lists them.
pub(in crate::cluster) fn publish(node: &Arc<Node>, name: String, client_urls: Vec<String>) {
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
