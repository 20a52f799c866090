//! In-process tests of the store as a whole: the apply path's determinism,
//! and store-level semantics (compaction, the change log, leases).

mod determinism;
mod image;
mod journal;
mod limits;
mod paged_lists;
mod quota;
mod semantics;

use super::*;
use bytes::Bytes;

pub(super) fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

pub(super) fn put(store: &Store, k: &str, v: &str) -> i64 {
    store
        .put(PutRequest {
            key: b(k),
            value: b(v),
            ..Default::default()
        })
        .expect("put")
        .revision
}
