//! A range read a chunk at a time at one revision, for KV.RangeStream.
//!
//! A unary Range counts every key of its range whatever its limit; a chunk
//! walks only the keys it returns (and looks at one more, to say where the
//! next chunk starts), so a streamed list of N keys costs O(N) reads in
//! all and holds one chunk's worth of key-values at a time.

use super::history::visible;
use super::range::range_bound;
use super::store::Store;
use super::types::{Kv, RangeRequest};
use super::validate;
use crate::error::Result;
use bytes::Bytes;
use std::ops::Bound;

/// Bytes a key-value is counted as besides its key and value: revisions,
/// version, lease and field tags on the wire.
pub const KV_OVERHEAD: usize = 40;

/// One chunk of a streamed range.
#[derive(Debug, Clone)]
pub struct RangeChunk {
    /// The revision read at: the requested one, or the current one when
    /// the request asked for none.
    pub revision: i64,
    /// The store's current revision when the chunk was read (what a
    /// response header reports).
    pub current: i64,
    /// Keys live at `revision`, in key order.
    pub kvs: Vec<Kv>,
    /// The first live key not returned, when the chunk stopped before the
    /// end of the range: where the next chunk starts.
    pub next: Option<Bytes>,
}

impl Store {
    /// Reads the live keys of `req`'s range at `req.revision` (the current
    /// revision when 0) from `req.key` on, stopping after `max_kvs` keys or
    /// once about `max_bytes` are taken (at least one key). Fails like a
    /// Range: compacted or future revisions, empty keys. `req.limit`, sort
    /// options and filters are not looked at: the caller's to handle.
    pub fn range_chunk(
        &self,
        req: &RangeRequest,
        max_kvs: usize,
        max_bytes: usize,
    ) -> Result<RangeChunk> {
        validate::check_range(req)?;
        let _gate = self.compaction_gate().read();
        let current = self.current_revision();
        let revision = self.check_read_revision(req.revision, current)?;
        let max_kvs = max_kvs.max(1);
        let mut kvs: Vec<Kv> = Vec::new();
        let mut next = None;
        let mut bytes = 0usize;
        match range_bound(&req.range_end) {
            None => {
                if let Some(entry) = self.index().get(&req.key) {
                    if let Some(kv) = visible(&entry.versions.read(), revision) {
                        kvs.push(kv.clone());
                    }
                }
            }
            Some(upper) => {
                if upper.is_some_and(|end| end.as_ref() <= req.key.as_ref()) {
                    return Ok(RangeChunk {
                        revision,
                        current,
                        kvs,
                        next,
                    });
                }
                let to = upper.map(|e| e.as_ref());
                self.index()
                    .for_range(Bound::Included(req.key.as_ref()), to, &mut |entry| {
                        let versions = entry.versions.read();
                        let Some(kv) = visible(&versions, revision) else {
                            return true;
                        };
                        if kvs.len() >= max_kvs || (!kvs.is_empty() && bytes >= max_bytes) {
                            next = Some(kv.key.clone());
                            return false;
                        }
                        let value = if req.keys_only { 0 } else { kv.value.len() };
                        bytes += kv.key.len() + value + KV_OVERHEAD;
                        kvs.push(kv.clone());
                        true
                    });
            }
        }
        Ok(RangeChunk {
            revision,
            current,
            kvs,
            next,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::{PutRequest, StoreConfig};

    fn store_with(keys: &[&str]) -> Store {
        let store = Store::new(StoreConfig::default());
        for k in keys {
            store
                .put(PutRequest {
                    key: Bytes::copy_from_slice(k.as_bytes()),
                    value: Bytes::from_static(b"v"),
                    ..Default::default()
                })
                .unwrap();
        }
        store
    }

    fn req(key: &str, end: &str, revision: i64) -> RangeRequest {
        RangeRequest {
            key: Bytes::copy_from_slice(key.as_bytes()),
            range_end: Bytes::copy_from_slice(end.as_bytes()),
            revision,
            ..Default::default()
        }
    }

    fn keys(c: &RangeChunk) -> Vec<&[u8]> {
        c.kvs.iter().map(|kv| kv.key.as_ref()).collect()
    }

    #[test]
    fn chunks_split_the_range_and_say_where_to_go_on() {
        let store = store_with(&["a", "b", "c", "d", "e"]);
        let first = store.range_chunk(&req("a", "e", 0), 2, usize::MAX).unwrap();
        assert_eq!(keys(&first), [b"a", b"b"]);
        assert_eq!(first.next.as_deref(), Some(&b"c"[..]));
        let rest = store
            .range_chunk(&req("c", "e", first.revision), 10, usize::MAX)
            .unwrap();
        assert_eq!(keys(&rest), [b"c", b"d"]);
        assert_eq!(rest.next, None);
    }

    #[test]
    fn a_chunk_stops_at_its_byte_budget_but_holds_one_key() {
        let store = store_with(&["a", "b", "c"]);
        let one = store.range_chunk(&req("a", "\0", 0), 100, 1).unwrap();
        assert_eq!(keys(&one), [b"a"]);
        assert_eq!(one.next.as_deref(), Some(&b"b"[..]));
    }

    #[test]
    fn a_pinned_revision_hides_later_writes_and_compaction_ends_it() {
        let store = store_with(&["a", "b"]);
        let pinned = store.current_revision();
        store
            .put(PutRequest {
                key: Bytes::from_static(b"c"),
                value: Bytes::from_static(b"v"),
                ..Default::default()
            })
            .unwrap();
        let at = store.range_chunk(&req("a", "\0", pinned), 10, usize::MAX);
        assert_eq!(keys(&at.unwrap()), [b"a", b"b"]);
        store.compact(store.current_revision()).unwrap();
        let gone = store.range_chunk(&req("a", "\0", pinned), 10, usize::MAX);
        assert!(
            matches!(gone, Err(crate::error::Error::Compacted)),
            "{gone:?}"
        );
    }
}
