//! The Raft thread's side of a leadership transfer (MoveLeader, the
//! hand-over on SIGTERM: `leadership.rs`), and of the election a follower
//! starts at once when its leader is known to be gone.

use raft::eraftpb::{Message, MessageType};
use raft::{RawNode, StateRole};

/// On the Raft thread: starts a leader transfer to `to`, or to the voter
/// whose log matches the leader's furthest when `to` is `None`. Raft
/// ignores it on a follower, and aborts it after an election timeout.
pub(super) fn start<S: raft::Storage>(raw: &mut RawNode<S>, to: Option<u64>) {
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
/// the lower one fail.
pub(super) fn leader_gone<S: raft::Storage>(
    raw: &mut RawNode<S>,
    gone: u64,
    answers: impl Fn(u64) -> bool,
) {
    let r = &raw.raft;
    if r.state != StateRole::Follower || r.leader_id != gone {
        return;
    }
    let me = r.id;
    let lowest = r
        .prs()
        .conf()
        .voters()
        .ids()
        .iter()
        .filter(|id| *id != gone && (*id == me || answers(*id)))
        .min();
    if lowest != Some(me) {
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
