//! Paged lists: a page that starts where the page before it left off
//! takes its count from that page instead of walking the rest of the
//! range, and must answer exactly as a walk would, whatever was written,
//! deleted, compacted or installed between the pages.

use super::super::*;
use super::{b, put};
use crate::error::Error;
use bytes::Bytes;

const PAGE: i64 = 50;

fn page(store: &Store, key: &[u8], rev: i64) -> Result<RangeResponse, Error> {
    store.range(&page_request(key, rev))
}

fn page_request(key: &[u8], rev: i64) -> RangeRequest {
    RangeRequest {
        key: Bytes::copy_from_slice(key),
        range_end: b("p0"),
        revision: rev,
        limit: PAGE,
        ..Default::default()
    }
}

/// The same page read inside a read-only txn, which always walks the
/// whole range to count it.
fn walked(store: &Store, key: &[u8], rev: i64) -> RangeResponse {
    walked_request(store, page_request(key, rev))
}

/// `req` read inside a read-only txn (see [`walked`]).
fn walked_request(store: &Store, req: RangeRequest) -> RangeResponse {
    let txn = store
        .txn(TxnRequest {
            compare: vec![],
            success: vec![RequestOp::Range(req)],
            failure: vec![],
        })
        .expect("read-only txn");
    match txn.responses.into_iter().next() {
        Some(ResponseOp::Range(r)) => r,
        other => panic!("not a range response: {other:?}"),
    }
}

fn after(kv: &Kv) -> Vec<u8> {
    let mut next = kv.key.to_vec();
    next.push(0);
    next
}

fn same(a: &RangeResponse, b: &RangeResponse) {
    assert_eq!(a.count, b.count, "count");
    assert_eq!(a.more, b.more, "more");
    assert_eq!(a.revision, b.revision, "header revision");
    let keys = |r: &RangeResponse| r.kvs.iter().map(|kv| kv.key.clone()).collect::<Vec<_>>();
    assert_eq!(keys(a), keys(b), "keys");
}

#[test]
fn pages_pinned_to_a_revision_count_as_a_walk_does_while_the_range_changes() {
    let store = Store::new(StoreConfig::default());
    for i in 0..1_000 {
        put(&store, &format!("p/{i:04}"), "v");
    }
    let first = page(&store, b"p/", 0).unwrap();
    assert_eq!((first.count, first.more), (1_000, true));
    let rev = first.revision;
    let mut key = after(first.kvs.last().unwrap());
    let mut seen = first.kvs.len() as i64;
    let mut n = 0;
    loop {
        // Writes between pages, ahead of the cursor and behind it: new
        // keys, deleted keys and new versions, none visible at `rev`.
        put(&store, &format!("p/{:04}x", 999 - n), "new");
        put(&store, &format!("p/{:04}", n), "again");
        store
            .delete_range(DeleteRequest {
                key: b(&format!("p/{:04}", 990 - n)),
                ..Default::default()
            })
            .unwrap();
        let got = page(&store, &key, rev).unwrap();
        same(&got, &walked(&store, &key, rev));
        assert_eq!(
            got.count,
            1_000 - seen,
            "what is left at the pinned revision"
        );
        seen += got.kvs.len() as i64;
        n += 1;
        if !got.more {
            break;
        }
        key = after(got.kvs.last().unwrap());
    }
    assert_eq!(seen, 1_000);
    assert_eq!(n, 19);
}

#[test]
fn a_compaction_between_pages_keeps_kept_revisions_exact_and_fails_older_ones() {
    let store = Store::new(StoreConfig::default());
    for i in 0..200 {
        put(&store, &format!("p/{i:04}"), "v");
    }
    let first = page(&store, b"p/", 0).unwrap();
    let rev = first.revision;
    for i in 0..100 {
        put(&store, &format!("p/{i:04}"), "w");
    }
    store.compact(rev).unwrap();
    let key = after(first.kvs.last().unwrap());
    let second = page(&store, &key, rev).unwrap();
    same(&second, &walked(&store, &key, rev));
    assert_eq!(second.count, 150);
    let key = after(second.kvs.last().unwrap());
    store.compact(store.current_revision()).unwrap();
    assert_eq!(page(&store, &key, rev).err(), Some(Error::Compacted));
}

#[test]
fn a_page_after_a_new_state_was_installed_counts_the_new_state() {
    let store = Store::new(StoreConfig::default());
    let other = Store::new(StoreConfig::default());
    for i in 0..300 {
        put(&store, &format!("p/{i:04}"), "v");
        // The other store reaches the same revisions with other keys.
        put(&other, &format!("p/{:04}", i * 2), "v");
    }
    let first = page(&store, b"p/", 0).unwrap();
    let rev = first.revision;
    assert_eq!(other.current_revision(), rev);
    store.install_image(other.image());
    let key = after(first.kvs.last().unwrap());
    let second = page(&store, &key, rev).unwrap();
    same(&second, &walked(&store, &key, rev));
    assert_eq!(second.count, 300 - 25, "keys 0050, 0052, ... 0598 are left");
}

#[test]
fn sorted_filtered_and_unlimited_ranges_still_walk_everything() {
    let store = Store::new(StoreConfig::default());
    for i in 0..120 {
        put(&store, &format!("p/{i:04}"), "v");
    }
    let first = page(&store, b"p/", 0).unwrap();
    let key = after(first.kvs.last().unwrap());
    let rev = first.revision;
    for req in [
        RangeRequest {
            sort_order: SortOrder::Descend,
            ..page_request(&key, rev)
        },
        RangeRequest {
            min_mod_revision: rev - 10,
            ..page_request(&key, rev)
        },
        RangeRequest {
            limit: 0,
            ..page_request(&key, rev)
        },
        RangeRequest {
            count_only: true,
            ..page_request(&key, rev)
        },
    ] {
        let got = store.range(&req).unwrap();
        assert_eq!(got.count, 70, "{req:?}");
        // A sorted or filtered page must not stop at its limit either.
        same(&got, &walked_request(&store, req.clone()));
    }
}

#[test]
fn a_page_sorted_by_another_target_leaves_no_count_behind() {
    // Sorted by mod revision with no order, a page holds the first keys in
    // key order sorted another way: its last key is not where the range's
    // next keys start.
    let store = Store::new(StoreConfig::default());
    for i in 0..120 {
        put(&store, &format!("p/{i:04}"), "v");
    }
    put(&store, "p/0000", "again");
    let sorted = store
        .range(&RangeRequest {
            sort_target: SortTarget::Mod,
            ..page_request(b"p/", 0)
        })
        .unwrap();
    let last = sorted.kvs.last().unwrap();
    assert_eq!(last.key, b("p/0050"));
    let key = after(last);
    let got = page(&store, &key, sorted.revision).unwrap();
    same(&got, &walked(&store, &key, sorted.revision));
    assert_eq!(got.count, 69);
}
