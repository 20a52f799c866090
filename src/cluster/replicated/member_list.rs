//! Cluster membership as replicated state: which members the cluster has
//! (ID, name, peer and client URLs, learner or voter) and which IDs were
//! removed, so that a removed member can never come back under its old ID
//! (its old votes and acknowledgements must never count again).
//!
//! Membership changes only by applied Raft conf change entries
//! (`ConfChange` with a [`MemberChange`] context), in log order, on every
//! member, so every member holds the same membership at the same log index.
//! Each change is checked against the membership when it is applied
//! ([`Membership::apply`]), with etcd's rules and errors; a change found
//! invalid changes nothing, neither here nor in Raft's configuration.
//!
//! [`Membership::encode`] and [`Membership::decode`] give the bytes a
//! state-machine snapshot carries.

use crate::error::Error;
use crate::proto::ephd::internal::{
    member_change::Change as PbChange, MemberChange, MemberRecord, MembershipState,
};
use crate::proto::etcdserverpb as pb;
use prost::Message as _;
use raft::prelude::{ConfChange, ConfChangeType, ConfState};
use std::collections::{BTreeMap, BTreeSet};

/// Most learners a cluster holds at once: etcd 3.4's limit
/// (`etcdserver: too many learner members in cluster` beyond it).
pub const MAX_LEARNERS: usize = 1;

/// One member.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemberInfo {
    /// Member ID, also its Raft ID (never 0).
    pub id: u64,
    /// Its `--name`; empty for a member added by MemberAdd that has not
    /// started yet (etcd's "unstarted").
    pub name: String,
    /// Where its peers reach it.
    pub peer_urls: Vec<String>,
    /// Where clients reach it; empty until it has started and published
    /// them.
    pub client_urls: Vec<String>,
    /// A learner: receives the log, does not vote or count for commits.
    pub is_learner: bool,
}

impl MemberInfo {
    /// Started as etcd counts it (reconfiguration checks): it has a name.
    pub fn is_started(&self) -> bool {
        !self.name.is_empty()
    }

    /// It has run in this cluster and published its client URLs through
    /// the log: a process with this ID has held Raft state.
    pub fn has_published(&self) -> bool {
        !self.client_urls.is_empty()
    }

    fn record(&self) -> MemberRecord {
        MemberRecord {
            id: self.id,
            name: self.name.clone(),
            peer_urls: self.peer_urls.clone(),
            client_urls: self.client_urls.clone(),
            is_learner: self.is_learner,
        }
    }

    fn from_record(r: MemberRecord) -> MemberInfo {
        MemberInfo {
            id: r.id,
            name: r.name,
            peer_urls: r.peer_urls,
            client_urls: r.client_urls,
            is_learner: r.is_learner,
        }
    }

    /// As the Cluster API reports it.
    pub fn to_pb(&self) -> pb::Member {
        pb::Member {
            id: self.id,
            name: self.name.clone(),
            peer_ur_ls: self.peer_urls.clone(),
            client_ur_ls: self.client_urls.clone(),
            is_learner: self.is_learner,
        }
    }
}

/// A change of membership, as one conf change entry carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// MemberAdd: a new voter or learner (not started: no name yet).
    Add(MemberInfo),
    /// MemberRemove.
    Remove(u64),
    /// MemberPromote: a learner becomes a voter.
    Promote(u64),
    /// MemberUpdate: new peer URLs.
    UpdatePeerUrls {
        /// The member.
        id: u64,
        /// Its new peer URLs.
        peer_urls: Vec<String>,
    },
    /// A started member publishes its name and client URLs, so that every
    /// member lists them.
    Publish {
        /// The member.
        id: u64,
        /// Its `--name`.
        name: String,
        /// Its advertised client URLs.
        client_urls: Vec<String>,
    },
}

impl Change {
    /// The member the change is about.
    pub fn member(&self) -> u64 {
        match self {
            Change::Add(m) => m.id,
            Change::Remove(id) | Change::Promote(id) => *id,
            Change::UpdatePeerUrls { id, .. } | Change::Publish { id, .. } => *id,
        }
    }

    /// The conf change entry proposing this change, by member `proposer`
    /// under its proposal number `proposal`. Changes Raft's configuration
    /// does not see (URLs, names) carry node ID 0, which raft ignores.
    pub fn to_conf_change(&self, proposer: u64, proposal: u64) -> ConfChange {
        let change = match self.clone() {
            Change::Add(m) => PbChange::Add(m.record()),
            Change::Remove(id) => PbChange::Remove(id),
            Change::Promote(id) => PbChange::Promote(id),
            Change::UpdatePeerUrls { id, peer_urls } => PbChange::UpdatePeerUrls(MemberRecord {
                id,
                peer_urls,
                ..Default::default()
            }),
            Change::Publish {
                id,
                name,
                client_urls,
            } => PbChange::Publish(MemberRecord {
                id,
                name,
                client_urls,
                ..Default::default()
            }),
        };
        let context = MemberChange {
            proposer,
            proposal,
            change: Some(change),
        };
        let mut cc = self.raft_change();
        cc.set_context(context.encode_to_vec().into());
        cc
    }

    /// What Raft's configuration does for this change once it is valid.
    pub fn raft_change(&self) -> ConfChange {
        let (kind, node) = match self {
            Change::Add(m) if m.is_learner => (ConfChangeType::AddLearnerNode, m.id),
            Change::Add(m) => (ConfChangeType::AddNode, m.id),
            Change::Promote(id) => (ConfChangeType::AddNode, *id),
            Change::Remove(id) => (ConfChangeType::RemoveNode, *id),
            Change::UpdatePeerUrls { .. } | Change::Publish { .. } => (ConfChangeType::AddNode, 0),
        };
        let mut cc = ConfChange::default();
        cc.set_change_type(kind);
        cc.set_node_id(node);
        cc
    }

    /// The change, proposer and proposal a committed conf change entry's
    /// data holds (see [`Change::from_conf_change`]).
    pub fn from_entry_data(data: &[u8]) -> Result<(Change, u64, u64), String> {
        let cc = <ConfChange as protobuf::Message>::parse_from_bytes(data)
            .map_err(|e| format!("undecodable membership change: {e}"))?;
        Change::from_conf_change(&cc)
    }

    /// The change a conf change entry carries, with its proposer and
    /// proposal number.
    pub fn from_conf_change(cc: &ConfChange) -> Result<(Change, u64, u64), String> {
        let ctx = MemberChange::decode(cc.get_context())
            .map_err(|e| format!("bad member change context: {e}"))?;
        let change = match ctx.change {
            Some(PbChange::Add(r)) => Change::Add(MemberInfo::from_record(r)),
            Some(PbChange::Remove(id)) => Change::Remove(id),
            Some(PbChange::Promote(id)) => Change::Promote(id),
            Some(PbChange::UpdatePeerUrls(r)) => Change::UpdatePeerUrls {
                id: r.id,
                peer_urls: r.peer_urls,
            },
            Some(PbChange::Publish(r)) => Change::Publish {
                id: r.id,
                name: r.name,
                client_urls: r.client_urls,
            },
            None => return Err("member change without a change".to_string()),
        };
        Ok((change, ctx.proposer, ctx.proposal))
    }
}

/// The members of the cluster and the IDs removed from it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Membership {
    members: BTreeMap<u64, MemberInfo>,
    removed: BTreeSet<u64>,
}

impl Membership {
    /// Adds `learner` (a learner with a new ID and free peer URLs) without
    /// MemberAdd's one-learner limit: a whole cluster resuming saved state
    /// (`resume.rs`) brings every other member back as a learner at once,
    /// so that members with empty logs can never outvote the member that
    /// holds the state; each is promoted once caught up.
    pub fn add_resumed_learner(&mut self, learner: MemberInfo) {
        debug_assert!(learner.is_learner && !self.removed.contains(&learner.id));
        self.members.insert(learner.id, learner);
    }

    /// A membership of `members` (the initial cluster), all voters.
    pub fn of(members: impl IntoIterator<Item = MemberInfo>) -> Membership {
        Membership {
            members: members.into_iter().map(|m| (m.id, m)).collect(),
            removed: BTreeSet::new(),
        }
    }

    /// The membership `--initial-cluster` describes: its members, all
    /// voters, none published yet.
    pub fn initial(config: &crate::config::ClusterConfig) -> Membership {
        Membership::of(config.members.iter().map(|m| MemberInfo {
            id: m.id,
            name: m.name.clone(),
            peer_urls: m.peer_urls.clone(),
            client_urls: Vec::new(),
            is_learner: false,
        }))
    }

    /// Every member, by ID.
    pub fn members(&self) -> impl Iterator<Item = &MemberInfo> {
        self.members.values()
    }

    /// Member `id`.
    pub fn get(&self, id: u64) -> Option<&MemberInfo> {
        self.members.get(&id)
    }

    /// Whether `id` was removed (it can never be a member again).
    pub fn is_removed(&self, id: u64) -> bool {
        self.removed.contains(&id)
    }

    /// The member whose peer URLs are exactly `urls` (in any order).
    pub fn by_peer_urls(&self, urls: &[String]) -> Option<&MemberInfo> {
        let mut want = urls.to_vec();
        want.sort();
        self.members.values().find(|m| {
            let mut have = m.peer_urls.clone();
            have.sort();
            have == want
        })
    }

    /// The voters (learners excluded).
    pub fn voters(&self) -> impl Iterator<Item = &MemberInfo> {
        self.members.values().filter(|m| !m.is_learner)
    }

    /// Raft's configuration for this membership.
    pub fn conf_state(&self) -> ConfState {
        let mut cs = ConfState::default();
        cs.set_voters(self.voters().map(|m| m.id).collect());
        cs.set_learners(
            self.members
                .values()
                .filter(|m| m.is_learner)
                .map(|m| m.id)
                .collect(),
        );
        cs
    }

    /// Every member as the Cluster API lists them.
    pub fn to_pb(&self) -> Vec<pb::Member> {
        self.members.values().map(MemberInfo::to_pb).collect()
    }

    /// Whether `change` may be applied, with etcd 3.4's rules
    /// (`ValidateConfigurationChange`) and errors.
    pub fn check(&self, change: &Change) -> Result<(), Error> {
        let id = change.member();
        if self.removed.contains(&id) {
            return Err(Error::MemberNotFound);
        }
        let known = self.members.get(&id);
        match change {
            Change::Add(m) => {
                if known.is_some() {
                    return Err(Error::MemberExist);
                }
                self.urls_free(&m.peer_urls, None)?;
                let learners = self.members.values().filter(|m| m.is_learner).count();
                if m.is_learner && learners + 1 > MAX_LEARNERS {
                    return Err(Error::TooManyLearners);
                }
            }
            Change::Remove(_) | Change::Publish { .. } => {
                known.ok_or(Error::MemberNotFound)?;
            }
            Change::Promote(_) => {
                if !known.ok_or(Error::MemberNotFound)?.is_learner {
                    return Err(Error::MemberNotLearner);
                }
            }
            Change::UpdatePeerUrls { peer_urls, .. } => {
                known.ok_or(Error::MemberNotFound)?;
                self.urls_free(peer_urls, Some(id))?;
            }
        }
        Ok(())
    }

    fn urls_free(&self, urls: &[String], except: Option<u64>) -> Result<(), Error> {
        let taken = self
            .members
            .values()
            .filter(|m| Some(m.id) != except)
            .flat_map(|m| &m.peer_urls)
            .any(|u| urls.contains(u));
        if taken {
            Err(Error::PeerUrlExist)
        } else {
            Ok(())
        }
    }

    /// Applies `change` if [`Membership::check`] allows it; otherwise
    /// changes nothing and returns the error.
    pub fn apply(&mut self, change: &Change) -> Result<(), Error> {
        self.check(change)?;
        match change.clone() {
            Change::Add(m) => {
                self.members.insert(m.id, m);
            }
            Change::Remove(id) => {
                self.members.remove(&id);
                self.removed.insert(id);
            }
            Change::Promote(id) => {
                if let Some(m) = self.members.get_mut(&id) {
                    m.is_learner = false;
                }
            }
            Change::UpdatePeerUrls { id, peer_urls } => {
                if let Some(m) = self.members.get_mut(&id) {
                    m.peer_urls = peer_urls;
                }
            }
            Change::Publish {
                id,
                name,
                client_urls,
            } => {
                if let Some(m) = self.members.get_mut(&id) {
                    m.name = name;
                    m.client_urls = client_urls;
                }
            }
        }
        Ok(())
    }

    /// As the protobuf message peers exchange.
    pub fn to_state(&self) -> MembershipState {
        MembershipState {
            members: self.members.values().map(MemberInfo::record).collect(),
            removed: self.removed.iter().copied().collect(),
        }
    }

    /// From the protobuf message peers exchange.
    pub fn from_state(state: MembershipState) -> Membership {
        Membership {
            members: state
                .members
                .into_iter()
                .map(|r| (r.id, MemberInfo::from_record(r)))
                .collect(),
            removed: state.removed.into_iter().collect(),
        }
    }

    /// The bytes a state-machine snapshot carries.
    pub fn encode(&self) -> Vec<u8> {
        self.to_state().encode_to_vec()
    }

    /// The membership a snapshot's bytes carry.
    pub fn decode(bytes: &[u8]) -> Result<Membership, String> {
        let state = MembershipState::decode(bytes)
            .map_err(|e| format!("bad membership in snapshot: {e}"))?;
        if state.members.iter().any(|m| m.id == 0) {
            return Err("bad membership in snapshot: a member with ID 0".to_string());
        }
        Ok(Membership::from_state(state))
    }
}

#[cfg(test)]
#[path = "member_list_tests.rs"]
mod tests;
