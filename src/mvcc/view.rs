//! The read view every reader uses: each key's history read under that
//! key's own lock, at a chosen revision.

use super::history::visible;
use super::index::Index;
use super::range::{range_bound, KvSource};
use super::types::Kv;
use bytes::Bytes;
use std::ops::Bound;

/// Reads the index key by key, each history under its own read lock. What
/// unary ranges, read-only txns and writers holding every key (range
/// writers) read through. It is not a point-in-time copy: callers pick a
/// revision at or below the committed watermark, which no writer changes.
pub(crate) struct LockedRead<'a>(pub(crate) &'a Index);

impl KvSource for LockedRead<'_> {
    fn for_each_visible_while(
        &self,
        key: &Bytes,
        end: &Bytes,
        rev: i64,
        f: &mut dyn FnMut(&Kv) -> bool,
    ) {
        match range_bound(end) {
            None => {
                if let Some(entry) = self.0.get(key) {
                    if let Some(kv) = visible(&entry.versions.read(), rev) {
                        f(kv);
                    }
                }
            }
            Some(upper) => {
                if let Some(end) = &upper {
                    if end.as_ref() <= key.as_ref() {
                        return;
                    }
                }
                let to = upper.as_ref().map(|e| e.as_ref());
                self.0.for_range(
                    Bound::Included(key.as_ref()),
                    to,
                    &mut |entry| match visible(&entry.versions.read(), rev) {
                        Some(kv) => f(kv),
                        None => true,
                    },
                );
            }
        }
    }
}
