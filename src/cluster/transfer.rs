//! The Raft thread's side of a leadership transfer (MoveLeader, the
//! hand-over on SIGTERM: `leadership.rs`).

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
