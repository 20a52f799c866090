//! What the Raft loop is asked to do, and the small types those requests
//! carry: a leaf of cluster mode's modules, so the Raft loop (`raft_loop.rs`)
//! and everything that talks to it (peers, catch-up, membership,
//! leadership) share it without depending on one another.

use bytes::Bytes;
use raft::prelude::{ConfChange, Message};
use std::collections::HashMap;
use tokio::sync::oneshot;

/// What the Raft loop is asked to do.
pub(in crate::cluster) enum Input {
    /// A message from a peer.
    Step(Box<Message>),
    /// A proposal of this member, with its number.
    Propose { proposal: u64, data: Vec<u8> },
    /// A ReadIndex request of this member, with its number.
    ReadIndex { ctx: u64 },
    /// Hand leadership to this member, or to the most caught-up voter
    /// (see `leadership.rs`).
    TransferLeader(Option<u64>),
    /// The leader this member follows restarted (it probed this member
    /// while starting) or its process ended (`sender.rs`): an election may
    /// start at once (`leader_transfer.rs`).
    LeaderGone(u64),
    /// The apply thread's snapshot at `index` is encoded (`catchup.rs`).
    SnapshotBuilt { index: u64, term: u64, data: Bytes },
    /// A snapshot sent to peer `to` was delivered, or failed.
    SnapshotStatus { to: u64, ok: bool },
    /// A membership change of this member, with its number (`reconfig.rs`).
    ProposeConf { proposal: u64, cc: ConfChange },
    /// A committed membership change the apply thread found valid: what
    /// Raft's configuration and the peer connections do for it.
    ApplyConf { cc: ConfChange, peer: PeerChange },
    /// The leader's view of how far each member has replicated (`None` on
    /// a member that is not the leader).
    Progress(oneshot::Sender<Option<Progress>>),
    /// Capture the applied state for `--data-dir` (`saved_state.rs`), on the
    /// apply thread in log order.
    Save(oneshot::Sender<crate::mvcc::snapshot::Snapshot>),
    /// Stop the thread.
    Stop,
}

/// How the set of peers changes with an applied membership change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::cluster) enum PeerChange {
    /// Nothing to do.
    None,
    /// Connect to this peer (again, if its URL changed).
    Upsert {
        /// Member ID.
        id: u64,
        /// For log lines.
        name: String,
        /// Where it is reached.
        url: String,
    },
    /// Stop sending to this peer.
    Remove(u64),
}

impl Input {
    /// The bytes of log entries this input proposes (its own proposal, or
    /// one a follower forwarded): what bounds a round's batched append.
    pub(in crate::cluster) fn proposed_bytes(&self) -> usize {
        match self {
            Input::Propose { data, .. } => data.len(),
            Input::Step(m) if m.get_msg_type() == raft::prelude::MessageType::MsgPropose => {
                m.get_entries().iter().map(|e| e.get_data().len()).sum()
            }
            _ => 0,
        }
    }
}

/// The leader's replication progress: how far each member's log matches.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// The leader's ID.
    pub leader: u64,
    /// Matched log index by member ID.
    pub matched: HashMap<u64, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::prelude::{Entry, MessageType};

    #[test]
    fn own_and_forwarded_proposals_count_their_entries_bytes_and_nothing_else_does() {
        let own = Input::Propose {
            proposal: 1,
            data: vec![0; 300],
        };
        assert_eq!(own.proposed_bytes(), 300);
        let entry = |n: usize| {
            let mut e = Entry::default();
            e.set_data(vec![1; n].into());
            e
        };
        let mut forwarded = Message::default();
        forwarded.set_msg_type(MessageType::MsgPropose);
        forwarded.set_entries(vec![entry(100), entry(28)].into());
        assert_eq!(Input::Step(Box::new(forwarded)).proposed_bytes(), 128);
        // An append carries entries too, but proposes nothing here.
        let mut append = Message::default();
        append.set_msg_type(MessageType::MsgAppend);
        append.set_entries(vec![entry(500)].into());
        assert_eq!(Input::Step(Box::new(append)).proposed_bytes(), 0);
        assert_eq!(Input::ReadIndex { ctx: 3 }.proposed_bytes(), 0);
    }
}
