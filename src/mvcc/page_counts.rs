//! What the pages of a paged list still have to count.
//!
//! A Range with a limit answers with the count of every key in its range,
//! so a list read in pages (the apiserver's, 500 keys a page, each page
//! pinned to the first page's revision and starting just after the last
//! key it got) walks the rest of the range on every page: reading n keys
//! costs n²/500 key visits, about a minute for a million keys. But what a
//! revision shows never changes, so the next page's count is known when a
//! page is answered: this page's count less the keys it returned. These
//! are kept for the most recent pages, and a page that starts where one of
//! them left off walks only as far as its limit.
//!
//! Compaction does not change what a revision it keeps shows, and reads
//! below the compacted revision fail before any count is used. Installing
//! a whole new state (a cluster snapshot) forgets every count.

use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::VecDeque;

/// Pages whose successors' counts are kept: more than the paged lists that
/// run at once (one per apiserver and resource being listed).
const KEPT: usize = 64;

/// The count of keys visible at `rev` in `[key, end)`.
struct Remaining {
    key: Bytes,
    end: Bytes,
    rev: i64,
    count: i64,
}

/// The remaining counts of recent pages, newest first.
#[derive(Default)]
pub(crate) struct PageCounts {
    recent: Mutex<VecDeque<Remaining>>,
}

impl PageCounts {
    /// The count of keys visible at `rev` in `[key, end)`, if a recent
    /// page left off at `key`.
    pub(crate) fn get(&self, key: &[u8], end: &[u8], rev: i64) -> Option<i64> {
        self.recent
            .lock()
            .iter()
            .find(|r| r.rev == rev && r.key == key && r.end == end)
            .map(|r| r.count)
    }

    /// Records what a page that read `[_, end)` at `rev`, counted `count`
    /// keys and returned up to `last` (with more to come) leaves for the
    /// page after it.
    pub(crate) fn remember(&self, last: &[u8], end: &Bytes, rev: i64, count: i64) {
        let mut key = Vec::with_capacity(last.len() + 1);
        key.extend_from_slice(last);
        key.push(0);
        let mut recent = self.recent.lock();
        recent.retain(|r| !(r.rev == rev && r.key == key && r.end == end));
        recent.push_front(Remaining {
            key: key.into(),
            end: end.clone(),
            rev,
            count,
        });
        recent.truncate(KEPT);
    }

    /// Forgets every count (the store's whole state was replaced).
    pub(crate) fn clear(&self) {
        self.recent.lock().clear();
    }
}
