//! Store-level semantics, in process: compaction and version pruning, the
//! change log around compaction, and the lease rules of the entry point.

use super::super::*;
use super::{b, put};
use crate::error::Error;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn get_at(store: &Store, k: &str, rev: i64) -> Result<Option<Kv>, Error> {
    store
        .range(&RangeRequest {
            key: b(k),
            revision: rev,
            ..Default::default()
        })
        .map(|r| r.kvs.into_iter().next())
}

fn delete(store: &Store, k: &str) -> i64 {
    store
        .delete_range(DeleteRequest {
            key: b(k),
            ..Default::default()
        })
        .expect("delete")
        .revision
}

#[test]
fn compaction_keeps_reads_at_and_above_it_and_prunes_below() {
    let store = Store::new(StoreConfig::default());
    let r2 = put(&store, "k", "one");
    let r3 = put(&store, "k", "two");
    put(&store, "gone", "x");
    let r5 = delete(&store, "gone");
    let r6 = put(&store, "k", "three");
    let before = store.stats().total_bytes.load(Ordering::Relaxed);

    assert_eq!(store.compact(r5), Ok(r6));
    assert_eq!(store.compacted_revision(), r5);
    assert_eq!(get_at(&store, "k", r2), Err(Error::Compacted));
    assert_eq!(get_at(&store, "k", r5).unwrap().unwrap().value, b("two"));
    assert_eq!(get_at(&store, "k", r5).unwrap().unwrap().mod_revision, r3);
    assert_eq!(get_at(&store, "k", 0).unwrap().unwrap().value, b("three"));
    assert_eq!(get_at(&store, "gone", r5), Ok(None));
    assert_eq!(get_at(&store, "k", r6 + 1), Err(Error::FutureRev));
    let after = store.stats().total_bytes.load(Ordering::Relaxed);
    assert_eq!(before - after, 4 + 5, "k=one and gone=x were freed");

    // etcd's errors for compacting again at or below, and into the future.
    assert_eq!(store.compact(r5), Err(Error::Compacted));
    assert_eq!(store.compact(r2), Err(Error::Compacted));
    assert_eq!(store.compact(r6 + 1), Err(Error::FutureRev));
    assert_eq!(store.compact(r6), Ok(r6));
}

#[test]
fn compaction_prunes_across_many_batches() {
    let store = Store::new(StoreConfig::default());
    for i in 0..3_000 {
        put(&store, &format!("k{i:05}"), "a");
    }
    for i in 0..3_000 {
        if i % 3 == 0 {
            delete(&store, &format!("k{i:05}"));
        } else {
            put(&store, &format!("k{i:05}"), "b");
        }
    }
    store.compact(store.current_revision()).unwrap();
    let all = store
        .range(&RangeRequest {
            key: b("k"),
            range_end: b("l"),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(all.count, 2_000);
    assert!(all.kvs.iter().all(|kv| kv.value == b("b")));
    let live = store.stats().live_bytes.load(Ordering::Relaxed);
    let total = store.stats().total_bytes.load(Ordering::Relaxed);
    assert_eq!(live, total, "only the live versions are left");
    assert_eq!(store.stats().live_keys.load(Ordering::Relaxed), 2_000);
}

#[test]
fn the_change_log_around_compaction() {
    let store = Store::new(StoreConfig::default());
    for i in 0..8 {
        put(&store, &format!("k{i}"), "v"); // revisions 2..=9
    }
    // A revision with two events.
    store
        .txn(TxnRequest {
            compare: vec![],
            success: vec![
                RequestOp::Put(PutRequest {
                    key: b("x"),
                    ..Default::default()
                }),
                RequestOp::Put(PutRequest {
                    key: b("y"),
                    ..Default::default()
                }),
            ],
            failure: vec![],
        })
        .unwrap(); // revision 10
    let (compacted, events, limited) = store.read_log(2, 3, usize::MAX);
    assert_eq!(compacted, -1);
    assert_eq!(
        events.iter().map(|e| e.revision).collect::<Vec<_>>(),
        [2, 3, 4]
    );
    assert!(limited);
    let (_, events, limited) = store.read_log(9, 2, usize::MAX);
    assert_eq!(
        events.iter().map(|e| e.revision).collect::<Vec<_>>(),
        [9, 10, 10]
    );
    assert!(!limited, "both events of revision 10 come together");

    store.compact(6).unwrap();
    let (compacted, events, _) = store.read_log(2, 100, usize::MAX);
    assert_eq!(
        compacted, 6,
        "the reader learns it asked below the compaction"
    );
    assert_eq!(events.first().map(|e| e.revision), Some(6));
    let (compacted, events, _) = store.read_log(8, 100, usize::MAX);
    assert_eq!(compacted, 6);
    assert_eq!(events.len(), 4, "8, 9 and the two events of 10");
    let (_, events, limited) = store.read_log(11, 100, usize::MAX);
    assert!(
        events.is_empty() && !limited,
        "nothing after the newest revision"
    );
}

#[test]
fn log_reads_stop_at_a_byte_bound_without_splitting_a_revision() {
    let store = Store::new(StoreConfig::default());
    let put_len = |k: &str, len: usize| {
        store
            .put(PutRequest {
                key: b(k),
                value: bytes::Bytes::from(vec![b'v'; len]),
                ..Default::default()
            })
            .unwrap()
    };
    put_len("a", 100); // r2: 101 bytes
    put_len("b", 100); // r3
    put_len("c", 1000); // r4
    put_len("a", 100); // r5: 202 bytes with its previous version
    let revisions = |from, bytes| {
        let (_, events, limited) = store.read_log(from, 100, bytes);
        let revs: Vec<i64> = events.iter().map(|e| e.revision).collect();
        (revs, limited)
    };
    assert_eq!(
        revisions(2, 150),
        (vec![2, 3], true),
        "stops once 150 reached"
    );
    assert_eq!(revisions(2, 202), (vec![2, 3], true));
    assert_eq!(revisions(2, 203), (vec![2, 3, 4], true));
    assert_eq!(
        revisions(4, 1),
        (vec![4], true),
        "the first revision comes whole, however large"
    );
    assert_eq!(revisions(2, usize::MAX), (vec![2, 3, 4, 5], false));
    assert_eq!(revisions(5, 1), (vec![5], false));
}

#[test]
fn a_bumped_start_reads_as_compacted_below_it() {
    let store = Store::new(StoreConfig {
        initial_revision: 500,
        ..Default::default()
    });
    assert_eq!(store.current_revision(), 500);
    assert_eq!(store.compacted_revision(), 500);
    assert_eq!(get_at(&store, "k", 499), Err(Error::Compacted));
    assert_eq!(put(&store, "k", "v"), 501);
}

#[test]
fn writes_after_stop_are_refused() {
    let store = Store::new(StoreConfig::default());
    let id = store.lease_grant(0, 60).unwrap().id;
    store.stop_writes();
    let err = store
        .put(PutRequest {
            key: b("k"),
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(err, Error::Stopped);
    assert_eq!(store.lease_grant(0, 60), Err(Error::Stopped));
    assert_eq!(store.lease_revoke(id), Err(Error::Stopped));
    assert_eq!(store.lease_count(), 1, "a refused revoke keeps the lease");
    assert!(
        get_at(&store, "k", 0).unwrap().is_none(),
        "reads still work"
    );
}

// ------------------------------------------------------------------ leases

fn put_with_lease(store: &Store, k: &str, lease: i64) -> Result<PutResponse, Error> {
    store.put(PutRequest {
        key: b(k),
        value: b("v"),
        lease,
        ..Default::default()
    })
}

#[test]
fn lease_answers_for_unknown_leases_follow_etcd() {
    let store = Store::new(StoreConfig::default());
    let ttl = store.lease_time_to_live(42, true);
    assert_eq!((ttl.id, ttl.ttl, ttl.granted_ttl), (42, -1, 0));
    let ka = store.lease_keep_alive(42);
    assert_eq!((ka.id, ka.ttl), (42, 0));
    assert_eq!(store.lease_revoke(42), Err(Error::LeaseNotFound));
    assert_eq!(put_with_lease(&store, "k", 42), Err(Error::LeaseNotFound));
    assert_eq!(
        store.lease_grant(0, 9_000_000_001),
        Err(Error::LeaseTtlTooLarge)
    );
}

#[test]
fn a_grant_chooses_an_id_and_applies_the_minimum_ttl() {
    let store = Store::new(StoreConfig::default());
    let g = store.lease_grant(0, 1).unwrap();
    assert!(g.id > 0);
    assert_eq!(g.ttl, 2, "etcd's minimum TTL");
    assert_eq!(store.lease_grant(g.id, 10), Err(Error::LeaseExist));
    let chosen = store.lease_grant(77, 30).unwrap();
    assert_eq!((chosen.id, chosen.ttl), (77, 30));
    let mut ids = store.lease_leases().ids;
    ids.sort();
    let mut want = vec![g.id, 77];
    want.sort();
    assert_eq!(ids, want);
    let ttl = store.lease_time_to_live(77, false);
    assert_eq!(ttl.granted_ttl, 30);
    assert!((29..=30).contains(&ttl.ttl), "armed at grant: {}", ttl.ttl);
}

#[test]
fn revoke_deletes_attached_keys_at_one_revision() {
    let store = Store::new(StoreConfig::default());
    let id = store.lease_grant(0, 60).unwrap().id;
    put_with_lease(&store, "b", id).unwrap();
    put_with_lease(&store, "a", id).unwrap();
    put_with_lease(&store, "moved", id).unwrap();
    put(&store, "moved", "no lease now"); // detaches it
    let ttl = store.lease_time_to_live(id, true);
    assert_eq!(ttl.keys, vec![b("a"), b("b")]);
    let before = store.current_revision();
    let rev = store.lease_revoke(id).unwrap();
    assert_eq!(rev, before + 1, "one revision for every key");
    let (_, events, _) = store.read_log(rev, 10, usize::MAX);
    let deleted: Vec<_> = events
        .iter()
        .map(|e| (e.revision, e.event.kind, e.event.kv.key.clone()))
        .collect();
    assert_eq!(
        deleted,
        vec![
            (rev, EventKind::Delete, b("a")),
            (rev, EventKind::Delete, b("b"))
        ],
        "in key order"
    );
    assert!(get_at(&store, "moved", 0).unwrap().is_some());
    // A lease with no keys left: revoking changes no revision.
    let empty = store.lease_grant(0, 60).unwrap().id;
    assert_eq!(store.lease_revoke(empty), Ok(rev));
}

#[test]
fn expiry_is_decided_by_the_clock_and_applied_as_a_revoke() {
    let store = Store::new(StoreConfig::default());
    let short = store.lease_grant(0, 5).unwrap().id;
    let long = store.lease_grant(0, 500).unwrap().id;
    put_with_lease(&store, "short", short).unwrap();
    assert!(store.revoke_expired(Instant::now(), 10).is_empty());
    let later = Instant::now() + Duration::from_secs(6);
    let expired = store.revoke_expired(later, 10);
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].0, short);
    assert_eq!(expired[0].1, Ok(store.current_revision()));
    assert!(get_at(&store, "short", 0).unwrap().is_none());
    assert_eq!(store.lease_leases().ids, vec![long]);
}

#[test]
fn adopted_leases_expire_like_granted_ones() {
    let store = Store::new(StoreConfig {
        lessor: crate::lease::LessorConfig {
            adopt_unknown_ttl: Some(30),
            ..Default::default()
        },
        ..Default::default()
    });
    put_with_lease(&store, "event", 4242).unwrap();
    let ttl = store.lease_time_to_live(4242, true);
    assert_eq!((ttl.granted_ttl, ttl.keys.len()), (30, 1));
    let later = Instant::now() + Duration::from_secs(31);
    assert_eq!(store.revoke_expired(later, 10).len(), 1);
    assert!(get_at(&store, "event", 0).unwrap().is_none());
}

/// etcd reads a keep-alive's header revision before refreshing: a lease
/// revoked at revision N never shows a successful keep-alive at N or after.
#[test]
fn a_successful_keep_alive_never_reports_the_revoke_revision() {
    for _ in 0..50 {
        let store = Arc::new(Store::new(StoreConfig::default()));
        let id = store.lease_grant(0, 60).unwrap().id;
        put_with_lease(&store, "k", id).unwrap();
        let keeper = {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                loop {
                    let ka = store.lease_keep_alive(id);
                    seen.push((ka.revision, ka.ttl));
                    if ka.ttl == 0 {
                        return seen;
                    }
                }
            })
        };
        std::thread::sleep(Duration::from_micros(200));
        let revoked_at = store.lease_revoke(id).unwrap();
        let seen = keeper.join().unwrap();
        for (rev, ttl) in seen {
            if ttl > 0 {
                assert!(rev < revoked_at, "alive at {rev}, revoked at {revoked_at}");
            }
        }
    }
}
