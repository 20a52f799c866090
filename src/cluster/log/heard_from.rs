//! The members this member has heard from with Raft state: a member whose
//! raft message (other than a pre-vote, which changes nothing) reached
//! this one has run a Raft node under its ID in this cluster: it may have
//! voted or acknowledged entries. If it starts again without its state it
//! must not vote or acknowledge under that ID again, so a starting member
//! asks (`join.rs`' probe) and the others answer from here too, besides
//! what the log says (it published itself) and what the leader's progress
//! says (it acknowledged entries). This catches a member that crashed
//! before its publish committed while the leader that saw its progress
//! is gone too.

use parking_lot::RwLock;
use raft::prelude::{Message, MessageType};
use std::collections::HashSet;

/// IDs whose raft messages reached this member.
#[derive(Debug, Default)]
pub(in crate::cluster) struct Seen(RwLock<HashSet<u64>>);

impl Seen {
    /// Notes the sender of `m` (a received raft message).
    pub(in crate::cluster) fn record(&self, m: &Message) {
        if matches!(
            m.get_msg_type(),
            MessageType::MsgRequestPreVote | MessageType::MsgRequestPreVoteResponse
        ) {
            return;
        }
        let from = m.get_from();
        if from == 0 || self.0.read().contains(&from) {
            return;
        }
        self.0.write().insert(from);
    }

    /// Whether member `id` has sent this member a raft message with state.
    pub(in crate::cluster) fn contains(&self, id: u64) -> bool {
        self.0.read().contains(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: MessageType, from: u64) -> Message {
        let mut m = Message::default();
        m.set_msg_type(kind);
        m.from = from;
        m
    }

    #[test]
    fn pre_votes_do_not_count_other_messages_do() {
        let seen = Seen::default();
        seen.record(&message(MessageType::MsgRequestPreVote, 2));
        seen.record(&message(MessageType::MsgRequestPreVoteResponse, 3));
        assert!(!seen.contains(2) && !seen.contains(3));
        seen.record(&message(MessageType::MsgRequestVote, 2));
        seen.record(&message(MessageType::MsgAppendResponse, 3));
        seen.record(&message(MessageType::MsgHeartbeatResponse, 0));
        assert!(seen.contains(2) && seen.contains(3) && !seen.contains(0));
    }
}
