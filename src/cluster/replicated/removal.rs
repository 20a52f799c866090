//! A member removed from the cluster stops by itself, as etcd's does: it
//! logs that it was permanently removed and the process ends (exit status
//! 0, as etcd's). A removed member must neither go on serving clients from
//! a store that no longer follows the cluster nor disturb the members that
//! remain.
//!
//! How a member learns it was removed:
//! * It applies the conf change that removes it (a leader always does; a
//!   follower does when it learns of the commit in time).
//! * Or a peer tells it. The peer service refuses every batch from a
//!   member its applied membership lists as removed, with
//!   [`REMOVED`] (etcd's rafthttp answers such a member `410 Gone`), and
//!   steps none of its messages into Raft, so a removed member that missed
//!   its removal (paused, cut off) can never win an election or have its
//!   messages counted. Every batch names its sender, even the empty probes
//!   sent every half second, so the removed member hears it at its next
//!   batch. One message is still taken: a leader's `MsgTimeoutNow`, by
//!   which a removed leader hands leadership to the most caught-up member
//!   before it stops (it only makes that member start an election now, as
//!   its own timer would later), so the others need not wait an election
//!   timeout.
//!
//! Either way the [`Removal`] flag is raised once; the server
//! (`server::run`) waits for it (`Node::removed`) as for a shutdown
//! signal.

use crate::cluster::replicated::member_list::Membership;
use raft::prelude::{Message, MessageType};
use tokio::sync::watch;
use tonic::{Code, Status};

/// What a member is told when it is no longer part of the cluster, and
/// what it logs (etcd's words).
pub const REMOVED: &str = "the member has been permanently removed from the cluster";

/// Raised once this member knows it was removed from the cluster.
#[derive(Debug)]
pub(in crate::cluster) struct Removal(watch::Sender<bool>);

impl Default for Removal {
    fn default() -> Self {
        Removal(watch::channel(false).0)
    }
}

impl Removal {
    /// This member was removed (`how`: how it learned it). Logs once.
    pub(in crate::cluster) fn raise(&self, me: u64, how: &str) {
        if !self.0.send_replace(true) {
            tracing::error!(
                member_id = %format_args!("{me:x}"),
                learned = how,
                "{REMOVED}: this process stops. To run it again, add it as a new member \
                 (MemberAdd, which gives it a new ID) and start it with \
                 --initial-cluster-state existing"
            );
        }
    }

    /// Whether it was raised.
    pub(in crate::cluster) fn is_raised(&self) -> bool {
        *self.0.borrow()
    }

    /// Completes once it is raised.
    pub(in crate::cluster) async fn raised(&self) {
        let mut rx = self.0.subscribe();
        // Fails only when the sender is gone, which outlives every caller.
        let _ = rx.wait_for(|r| *r).await;
    }
}

/// The peer service's answer to a batch from member `from`: refused when
/// the applied membership `current` lists `from` as removed.
pub(in crate::cluster) fn check_sender(current: &Membership, from: u64) -> Result<(), Status> {
    if from != 0 && current.is_removed(from) {
        Err(Status::new(Code::FailedPrecondition, REMOVED))
    } else {
        Ok(())
    }
}

/// Whether a removed member's message is still taken (see the module
/// docs): only a leader's request to start an election now.
pub(in crate::cluster) fn taken_from_removed(m: &Message) -> bool {
    m.get_msg_type() == MessageType::MsgTimeoutNow
}

/// Whether a peer's answer says this member was removed.
pub(in crate::cluster) fn says_removed(s: &Status) -> bool {
    s.code() == Code::FailedPrecondition && s.message() == REMOVED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raised_once_and_recognised() {
        let r = Removal::default();
        assert!(!r.is_raised());
        r.raise(1, "test");
        r.raise(1, "test again");
        assert!(r.is_raised());
        assert!(says_removed(&Status::new(
            Code::FailedPrecondition,
            REMOVED
        )));
        assert!(!says_removed(&Status::unavailable(REMOVED)));
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgTimeoutNow);
        assert!(taken_from_removed(&m));
        m.set_msg_type(MessageType::MsgRequestVote);
        assert!(!taken_from_removed(&m));
    }
}
