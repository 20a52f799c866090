//! Client writes held back until the new cluster's initial revision.
//!
//! With `--revision-continuity` (the default) the first leader of a new
//! cluster proposes `Entry::Initialize` (`server/initial.rs`): the store
//! jumps to a wall-clock revision, and everything below reads as
//! compacted. A client write that committed before that entry would keep
//! its key but its revision would read as compacted: an acknowledged write
//! below the initial revision. So every mutation a member proposes waits
//! here until this member has applied the initial-revision entry (or
//! installed a snapshot of a store that had), within the request timeout
//! (`etcdserver: request timed out` otherwise). A proposal made after a
//! committed entry was applied lands after it in the log, so every
//! acknowledged write has a revision above the initial one.
//!
//! The gate opens once and stays open: a deleted `compact_rev_key` never
//! closes it again. Without revision continuity (`--etcd-compat`) it is
//! open from the start.

use crate::error::{Error, Result};
use crate::mvcc::{Applied, Entry, RangeRequest, Store, COMPACT_REV_KEY};
use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

/// Whether this member has applied the initial revision, and who waits for
/// it.
pub(super) struct InitialGate {
    open: watch::Sender<bool>,
}

impl InitialGate {
    /// A gate that holds writes back (`hold`) or lets them through.
    pub(super) fn new(hold: bool) -> InitialGate {
        InitialGate {
            open: watch::channel(!hold).0,
        }
    }

    /// Lets every waiting and later write through (the apply thread calls
    /// it once the initial revision is applied).
    pub(super) fn open(&self) {
        self.open
            .send_if_modified(|open| !std::mem::replace(open, true));
    }

    /// Whether writes go through.
    pub(super) fn is_open(&self) -> bool {
        *self.open.borrow()
    }

    /// How many writes wait at the gate now (for tests).
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.open.receiver_count()
    }

    /// Opens the gate if `result` is the initial revision's, applied.
    pub(super) fn applied(&self, result: &Result<Applied>) {
        if matches!(result, Ok(Applied::Initialize { .. })) {
            self.open();
        }
    }

    /// Opens the gate if the store a snapshot was installed into had its
    /// initial revision.
    pub(super) fn installed(&self, store: &Store) {
        if initialized(store) {
            self.open();
        }
    }

    /// Waits until the gate opens if `entry` waits for it ([`holds`]), at
    /// most until `deadline` (`etcdserver: request timed out` then).
    pub(super) async fn pass(&self, entry: &Entry, deadline: Instant) -> Result<()> {
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

/// Whether `entry` waits for the initial revision: every entry but the
/// initial-revision entry itself and the limits (which write nothing).
pub(super) fn holds(entry: &Entry) -> bool {
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
