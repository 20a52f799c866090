//! The revision-ordered change log.
//!
//! Every committed revision appends its events here, strictly in revision
//! order, so watchers can replay history from any retained revision and
//! follow live changes with one cursor and no per-watcher buffers. Memory is
//! bounded by compaction, exactly like the MVCC history it mirrors: events
//! below the compacted revision are dropped. A watcher that falls behind
//! costs only its cursor; it never slows writers.

use super::types::Event;
use parking_lot::RwLock;
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::watch;

/// All events of one revision, in the order the write applied them.
#[derive(Debug)]
pub struct RevisionEvents {
    /// The revision.
    pub revision: i64,
    /// Its events (at least one).
    pub events: Vec<Event>,
}

/// The log itself; see the module docs.
pub struct EventLog {
    entries: RwLock<VecDeque<Arc<RevisionEvents>>>,
    latest: watch::Sender<i64>,
}

impl EventLog {
    /// An empty log whose latest committed revision is `revision`.
    pub fn new(revision: i64) -> Self {
        EventLog {
            entries: RwLock::new(VecDeque::new()),
            latest: watch::Sender::new(revision),
        }
    }

    /// Appends one committed revision. Called by the store's sequencer, in
    /// revision order only.
    pub(crate) fn append(&self, revision: i64, events: Vec<Event>) {
        self.entries
            .write()
            .push_back(Arc::new(RevisionEvents { revision, events }));
        self.latest.send_replace(revision);
    }

    /// A receiver that wakes whenever a new revision is committed.
    pub fn subscribe(&self) -> watch::Receiver<i64> {
        self.latest.subscribe()
    }

    /// The latest committed revision.
    pub fn latest(&self) -> i64 {
        *self.latest.borrow()
    }

    /// Up to `max_revisions` revisions at or after `from`, in order.
    pub fn read_from(&self, from: i64, max_revisions: usize) -> Vec<Arc<RevisionEvents>> {
        let entries = self.entries.read();
        let start = entries.partition_point(|e| e.revision < from);
        entries
            .range(start..)
            .take(max_revisions)
            .cloned()
            .collect()
    }

    /// Drops every revision below `revision` (called by compaction).
    pub(crate) fn trim_below(&self, revision: i64) {
        let mut entries = self.entries.write();
        let keep_from = entries.partition_point(|e| e.revision < revision);
        entries.drain(..keep_from);
    }

    /// Number of retained revisions (for metrics and tests).
    pub fn len(&self) -> usize {
        self.entries.read().len()
    }

    /// Whether no revision is retained.
    pub fn is_empty(&self) -> bool {
        self.entries.read().is_empty()
    }
}
