//! Compaction: moving the compacted revision and dropping the history no
//! reader can ask for any more, in batches so writers are never held up
//! for long.

use super::store::Store;
use crate::error::{Error, Result};
use bytes::Bytes;
use std::ops::Bound;

/// Keys pruned per hold of the range-writer lock.
const BATCH: usize = 1024;

impl Store {
    /// Compacts at `rev` (the apply path's [`Entry::Compact`](super::Entry)):
    /// reads below it fail from the moment this moves the compacted
    /// revision; the change log and every key's history are then pruned.
    /// Returns the current revision.
    pub(super) fn compact_history(&self, rev: i64) -> Result<i64> {
        {
            let _gate = self.compaction_gate().write();
            let current = self.current_revision();
            if rev <= self.compacted_revision() {
                return Err(Error::Compacted);
            }
            if rev > current {
                return Err(Error::FutureRev);
            }
            self.set_compacted(rev);
        }
        self.stats().applied();
        self.log().trim_below(rev);
        self.prune_history(rev);
        Ok(self.current_revision())
    }

    pub(super) fn prune_history(&self, rev: i64) {
        let mut from: Option<Bytes> = None;
        loop {
            let _all = self.range_writers().write();
            let mut seen = 0;
            let mut last = None;
            let mut emptied = Vec::new();
            let lower = match &from {
                Some(k) => Bound::Excluded(k.as_ref()),
                None => Bound::Unbounded,
            };
            self.index().for_range(lower, None, &mut |entry| {
                if seen == BATCH {
                    return false;
                }
                seen += 1;
                let mut versions = entry.versions.write();
                self.stats().prune(&mut versions, rev);
                if versions.is_empty() {
                    emptied.push(entry.key.clone());
                }
                last = Some(entry.key.clone());
                true
            });
            for key in &emptied {
                self.index().remove(key);
            }
            match last {
                Some(k) if seen == BATCH => from = Some(k),
                _ => return,
            }
        }
    }
}
