//! Client writes held back until a new member may propose them: until it
//! has applied the cluster's initial revision, and the leader's limits.
//!
//! With `--revision-continuity` (the default) the first leader of a new
//! cluster proposes `Entry::Initialize` (`server/initial.rs`): the store
//! jumps to a wall-clock revision, and everything below reads as
//! compacted. A client write that committed before that entry would keep
//! its key but its revision would read as compacted: an acknowledged write
//! below the initial revision.
//!
//! Every member applies entries with the limits the leader replicated
//! (`Entry::Limits`, `server/limits.rs`), so that members whose flags
//! differ decide every entry alike. Before the first such entry a store
//! has only its own flags: a put on an unknown lease committed then would
//! be adopted by one member and refused by another.
//!
//! So every mutation a member proposes waits here until this member has
//! applied both (or installed a snapshot of a store that had), within the
//! request timeout (`etcdserver: request timed out` otherwise). A proposal
//! made after a committed entry was applied lands after it in the log, so
//! every acknowledged write has a revision above the initial one and is
//! applied everywhere under the same limits.
//!
//! The gate opens once and stays open: a deleted `compact_rev_key` never
//! closes it again. What a member does not wait for (no revision
//! continuity, or no limits replicator running, as in tests of the node
//! alone) counts as applied from the start.

use crate::error::{Error, Result};
use crate::mvcc::{Applied, Entry, RangeRequest, Store, COMPACT_REV_KEY};
use bytes::Bytes;
use std::sync::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

/// What a new member's writes wait for before they are proposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WritesWaitFor {
    /// The initial-revision entry (with revision continuity).
    pub initial_revision: bool,
    /// A replicated Limits entry (when the server's limits replicator
    /// runs).
    pub replicated_limits: bool,
}

/// Whether this member may propose writes yet, and who waits for it.
pub(in crate::cluster) struct InitialGate {
    open: watch::Sender<bool>,
    // Still missing: (the initial revision, the replicated limits).
    missing: Mutex<(bool, bool)>,
}

impl InitialGate {
    /// A gate that holds writes back until what `wait` names is applied.
    pub(in crate::cluster) fn new(wait: WritesWaitFor) -> InitialGate {
        let missing = (wait.initial_revision, wait.replicated_limits);
        InitialGate {
            open: watch::channel(missing == (false, false)).0,
            missing: Mutex::new(missing),
        }
    }

    /// Marks the initial revision (`initial`) or the limits as applied, and
    /// opens the gate once nothing is missing.
    fn arrived(&self, initial: bool, limits: bool) {
        let mut missing = self.missing.lock().unwrap_or_else(|e| e.into_inner());
        missing.0 &= !initial;
        missing.1 &= !limits;
        if *missing == (false, false) {
            self.open();
        }
    }

    /// Lets every waiting and later write through.
    fn open(&self) {
        self.open
            .send_if_modified(|open| !std::mem::replace(open, true));
    }

    /// Whether writes go through.
    pub(in crate::cluster) fn is_open(&self) -> bool {
        *self.open.borrow()
    }

    /// How many writes wait at the gate now (for tests).
    #[cfg(test)]
    pub(in crate::cluster) fn waiting(&self) -> usize {
        self.open.receiver_count()
    }

    /// Notes `result` if it is the initial revision's or the limits',
    /// applied.
    pub(in crate::cluster) fn applied(&self, result: &Result<Applied>) {
        match result {
            Ok(Applied::Initialize { .. }) => self.arrived(true, false),
            Ok(Applied::Limits { .. }) => self.arrived(false, true),
            _ => {}
        }
    }

    /// Notes what the store a snapshot was installed into had: its initial
    /// revision, replicated limits.
    pub(in crate::cluster) fn installed(&self, store: &Store) {
        self.arrived(initialized(store), store.limits_replicated());
    }

    /// Waits until the gate opens if `entry` waits for it ([`holds`]), at
    /// most until `deadline` (`etcdserver: request timed out` then).
    pub(in crate::cluster) async fn pass(&self, entry: &Entry, deadline: Instant) -> Result<()> {
        if self.is_open() || !holds(entry) {
            return Ok(());
        }
        let mut rx = self.open.subscribe();
        // The borrow is dropped inside, so the future stays Send.
        let opened = async move { rx.wait_for(|open| *open).await.is_ok() };
        match tokio::time::timeout_at(deadline, opened).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::Stopped),
            Err(_) => Err(Error::Timeout),
        }
    }
}

/// Whether `entry` waits at the gate: every entry but the initial-revision
/// entry itself and the limits (which write nothing).
pub(in crate::cluster) fn holds(entry: &Entry) -> bool {
    !matches!(entry, Entry::Initialize { .. } | Entry::Limits(_))
}

/// Whether `store` has had its initial revision: it holds
/// `compact_rev_key`, or it has jumped (compacted) above revision 0. Used
/// after installing a snapshot, whose log entries this member never saw.
pub fn initialized(store: &Store) -> bool {
    if store.compacted_revision() > 0 {
        return true;
    }
    store
        .range(&RangeRequest {
            key: Bytes::from_static(COMPACT_REV_KEY.as_bytes()),
            count_only: true,
            ..Default::default()
        })
        .is_ok_and(|r| r.count > 0)
}
