//! The Raft thread's side of a leadership transfer (MoveLeader, the
//! hand-over on SIGTERM: `leadership.rs`), and of the election a follower
//! starts at once when its leader is known to be gone.

use raft::eraftpb::{Message, MessageType};
use raft::{RawNode, StateRole};

/// On the Raft thread: starts a leader transfer to `to`, or to the voter
/// whose log matches the leader's furthest when `to` is `None`. Raft
/// ignores it on a follower, and aborts it after an election timeout.
pub(in crate::cluster) fn start<S: raft::Storage>(raw: &mut RawNode<S>, to: Option<u64>) {
    if raw.raft.state != StateRole::Leader {
        return;
    }
    let me = raw.raft.id;
    let target = to.or_else(|| {
        raw.raft
            .prs()
            .iter()
            .filter(|(id, _)| **id != me)
            .max_by_key(|(id, p)| (p.matched, std::cmp::Reverse(**id)))
            .map(|(id, _)| *id)
    });
    if let Some(target) = target {
        tracing::info!(
            from = %format_args!("{me:x}"),
            to = %format_args!("{target:x}"),
            "transferring leadership"
        );
        raw.transfer_leader(target);
    }
}

/// On the Raft thread: the leader `gone` leads no more: it restarted (it
/// probed this member while starting, `join.rs`), or its process ended
/// (its peer port refuses connections or it closed its lane,
/// `sender.rs`), so waiting out the election timeout only delays writes.
/// The surviving voter with the lowest ID campaigns at once, as the target
/// of a leader transfer does: the other voters grant it even though they
/// heard from `gone` within the timeout (and refuse it if its log is
/// behind theirs, which leaves the election to the timeout as before).
/// One survivor only, so that two do not split the vote. A voter that
/// does not answer this member (`answers` false: died with the leader,
/// say) is no survivor; the failed probes to the dead leader repeat this
/// call, so the next voter in line takes over once this member has seen
/// the lower one fail. Without a majority of survivors nobody campaigns
/// early: the vote could not be won, and the election timeout decides as
/// in etcd.
pub(in crate::cluster) fn leader_gone<S: raft::Storage>(
    raw: &mut RawNode<S>,
    gone: u64,
    answers: impl Fn(u64) -> bool,
) {
    let r = &raw.raft;
    if r.state != StateRole::Follower || r.leader_id != gone {
        return;
    }
    let me = r.id;
    let voters = r.prs().conf().voters().ids();
    let survivors: Vec<u64> = voters
        .iter()
        .filter(|id| *id != gone && (*id == me || answers(*id)))
        .collect();
    if survivors.len() <= voters.len() / 2 || survivors.iter().min() != Some(&me) {
        return;
    }
    tracing::info!(
        gone = %format_args!("{gone:x}"),
        "the leader is gone (it restarted, or its process ended): campaigning at once"
    );
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgTimeoutNow);
    m.from = gone;
    m.to = me;
    m.term = r.term;
    if let Err(e) = raw.step(m) {
        tracing::debug!(error = %e, "prompt campaign refused");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::storage::MemStorage;

    /// Member 3 of five, following leader 1 at term 1.
    fn follower_of_1() -> RawNode<MemStorage> {
        let voters = raft::prelude::ConfState::from((vec![1, 2, 3, 4, 5], vec![]));
        let config = raft::Config {
            id: 3,
            ..Default::default()
        };
        let storage = MemStorage::new_with_conf_state(voters);
        let mut raw = RawNode::new(
            &config,
            storage,
            &crate::cluster::log::raft_logger::logger(),
        )
        .unwrap();
        let mut beat = Message::default();
        beat.set_msg_type(MessageType::MsgHeartbeat);
        beat.from = 1;
        beat.to = 3;
        beat.term = 1;
        raw.step(beat).unwrap();
        assert_eq!(
            (raw.raft.leader_id, raw.raft.state),
            (1, StateRole::Follower)
        );
        raw
    }

    #[test]
    fn the_lowest_voter_that_answers_campaigns_when_the_leader_is_gone() {
        let mut raw = follower_of_1();
        leader_gone(&mut raw, 1, |_| true);
        assert_eq!(
            raw.raft.state,
            StateRole::Follower,
            "2 is lower and answers"
        );

        leader_gone(&mut raw, 4, |_| false);
        assert_eq!(raw.raft.state, StateRole::Follower, "4 does not lead");

        leader_gone(&mut raw, 1, |id| id == 5);
        assert_eq!(
            raw.raft.state,
            StateRole::Follower,
            "3 and 5 of five are no majority"
        );

        leader_gone(&mut raw, 1, |id| id != 2);
        assert_eq!(
            raw.raft.state,
            StateRole::Candidate,
            "2 died with the leader"
        );
        assert_eq!(raw.raft.term, 2);
    }
}
