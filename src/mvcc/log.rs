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
use tokio::sync::watch;

/// One logged event with the revision that produced it. A revision with
/// several events (a txn, a lease revoke) has consecutive entries.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedEvent {
    /// The revision.
    pub revision: i64,
    /// The event.
    pub event: Event,
}

/// What an event weighs for [`EventLog::read_from`]'s byte bound: its key
/// and value, and those of the previous version it carries. A watcher's
/// response holds at most these bytes per event (less without `prev_kv`).
fn event_bytes(e: &Event) -> usize {
    e.kv.key.len()
        + e.kv.value.len()
        + e.prev_kv
            .as_ref()
            .map_or(0, |p| p.key.len() + p.value.len())
}

/// Entries below which [`EventLog::trim_below`] never shrinks the buffer
/// (128 KiB): small buffers are not worth a reallocation.
const SHRINK_ABOVE: usize = 4096;

/// The log itself; see the module docs.
///
/// Events are stored flat (32 bytes each, no allocation of their own) rather
/// than grouped per revision behind an `Arc`: the log holds one entry per
/// write until compaction, so its per-entry cost is per-object memory
/// (about 45 bytes less per write, measured with `bench/memory.sh`), and
/// appending costs no allocation.
pub struct EventLog {
    entries: RwLock<VecDeque<LoggedEvent>>,
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
    /// revision order only; readers learn of it from [`EventLog::publish`].
    pub(crate) fn append(&self, revision: i64, events: Vec<Event>) {
        self.entries.write().extend(
            events
                .into_iter()
                .map(|event| LoggedEvent { revision, event }),
        );
    }

    /// Announces that every revision up to `revision` is appended and
    /// readable: wakes every subscriber.
    pub(crate) fn publish(&self, revision: i64) {
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

    /// The events of the revisions at or after `from`, in order, and whether
    /// more revisions followed them. The read stops before a revision once
    /// `max_revisions` revisions were read, or once their events reached
    /// `max_bytes` of keys and values (previous versions included); a revision is never split, so the
    /// first one always comes whole, however large.
    pub fn read_from(
        &self,
        from: i64,
        max_revisions: usize,
        max_bytes: usize,
    ) -> (Vec<LoggedEvent>, bool) {
        let entries = self.entries.read();
        let start = entries.partition_point(|e| e.revision < from);
        let mut out = Vec::new();
        let mut revisions = 0;
        let mut bytes = 0;
        let mut last = None;
        for e in entries.range(start..) {
            if last != Some(e.revision) {
                if revisions == max_revisions || (revisions > 0 && bytes >= max_bytes) {
                    return (out, true);
                }
                revisions += 1;
                last = Some(e.revision);
            }
            bytes += event_bytes(&e.event);
            out.push(e.clone());
        }
        (out, false)
    }

    /// Replaces every retained event (installing a snapshot image).
    pub(crate) fn replace(&self, events: Vec<LoggedEvent>) {
        *self.entries.write() = events.into();
    }

    /// Drops every revision below `revision` (called by compaction).
    ///
    /// A drained buffer keeps its capacity, so after a burst of writes and
    /// a compaction the burst's whole buffer would stay resident (32 MiB
    /// for a million writes, measured with `bench/memory-return.sh`). When
    /// less than a quarter of it is used, it is shrunk to twice what is
    /// left: the copy moves at most that quarter, and steady writing
    /// between compactions does not reallocate back and forth.
    pub(crate) fn trim_below(&self, revision: i64) {
        let mut entries = self.entries.write();
        let keep_from = entries.partition_point(|e| e.revision < revision);
        entries.drain(..keep_from);
        if entries.capacity() > SHRINK_ABOVE && entries.capacity() / 4 > entries.len() {
            let keep = 2 * entries.len();
            entries.shrink_to(keep);
        }
    }

    /// Room allocated for entries (for tests).
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.entries.read().capacity()
    }

    /// Number of retained events (for metrics and tests).
    pub fn len(&self) -> usize {
        self.entries.read().len()
    }

    /// Whether no event is retained.
    pub fn is_empty(&self) -> bool {
        self.entries.read().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::types::{EventKind, KeyValue};
    use bytes::Bytes;
    use std::sync::Arc;

    fn put(rev: i64) -> Vec<Event> {
        vec![Event {
            kind: EventKind::Put,
            kv: Arc::new(KeyValue {
                key: Bytes::from_static(b"k"),
                create_revision: rev,
                mod_revision: rev,
                version: 1,
                value: Bytes::new(),
                lease: 0,
            }),
            prev_kv: None,
        }]
    }

    #[test]
    fn compaction_gives_back_the_room_a_burst_left() {
        let log = EventLog::new(0);
        for rev in 1..=100_000 {
            log.append(rev, put(rev));
        }
        assert!(log.capacity() >= 100_000);
        // Keeping most of it: no reallocation.
        log.trim_below(50_000);
        assert!(log.capacity() >= 100_000);
        // Keeping a little: shrunk to twice what is left.
        log.trim_below(99_001);
        assert_eq!(log.len(), 1_000);
        assert!(log.capacity() < 4_096, "capacity {}", log.capacity());
        let (events, _) = log.read_from(0, usize::MAX, usize::MAX);
        let revs: Vec<i64> = events.iter().map(|e| e.revision).collect();
        assert_eq!(revs, (99_001..=100_000).collect::<Vec<_>>());
        // Small buffers are left alone.
        log.trim_below(100_000);
        assert!(log.capacity() >= 1_000);
    }
}
