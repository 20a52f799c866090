//! The space quota: what a store at its quota refuses, what it still
//! does, and how it recovers, as etcd's quota and NOSPACE alarm behave;
//! and the memory bound, which refuses the same way.

use super::super::*;
use super::{b, put};
use crate::error::Error;

const MEMBER: u64 = 42;

fn store_with_quota(quota: i64) -> Store {
    Store::new(StoreConfig {
        quota_bytes: Some(quota),
        member_id: MEMBER,
        ..StoreConfig::default()
    })
}

fn try_put(store: &Store, k: &str, v: &str) -> Result<i64, Error> {
    store
        .put(PutRequest {
            key: b(k),
            value: b(v),
            ..Default::default()
        })
        .map(|r| r.revision)
}

fn txn_put(k: &str) -> TxnRequest {
    TxnRequest {
        compare: Vec::new(),
        success: vec![RequestOp::Put(PutRequest {
            key: b(k),
            value: b("v"),
            ..Default::default()
        })],
        failure: Vec::new(),
    }
}

/// Fills a store with 100-byte values until the quota refuses one; returns
/// how many fitted.
fn fill(store: &Store) -> usize {
    let value = "x".repeat(100);
    for i in 0..100_000 {
        match try_put(store, &format!("k{i:05}"), &value) {
            Ok(_) => {}
            Err(Error::NoSpace) => return i,
            Err(e) => panic!("unexpected error {e:?}"),
        }
    }
    panic!("the quota never refused a write");
}

#[test]
fn accounted_memory_follows_versions_and_compaction() {
    let store = Store::new(StoreConfig::default());
    assert_eq!(store.stats().memory_bytes(), 0);
    put(&store, "a", "12345");
    let one = stats::VERSION_OVERHEAD + 6;
    assert_eq!(store.stats().memory_bytes(), one);
    let rev = put(&store, "a", "12345");
    assert_eq!(store.stats().memory_bytes(), 2 * one, "history is counted");
    assert_eq!(store.stats().memory_in_use(), one, "in use: newest only");
    store
        .delete_range(DeleteRequest {
            key: b("a"),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(
        store.stats().memory_bytes(),
        2 * one + stats::VERSION_OVERHEAD,
        "a tombstone costs its version"
    );
    store.compact(rev + 1).unwrap();
    assert_eq!(store.stats().memory_bytes(), 0, "compaction frees it all");
}

#[test]
fn the_write_that_does_not_fit_is_refused_and_raises_nospace() {
    let quota = 20_000;
    let store = store_with_quota(quota);
    let fitted = fill(&store);
    assert!(fitted > 10, "{fitted} writes fitted");
    let used = store.stats().backend_bytes();
    assert!(used < quota, "used {used} of {quota}");
    assert!(
        !store
            .range(&RangeRequest {
                key: b(&format!("k{fitted:05}")),
                ..Default::default()
            })
            .unwrap()
            .kvs
            .iter()
            .any(|_| true),
        "the refused write was not applied"
    );
    assert_eq!(
        store.alarms(),
        vec![AlarmMember {
            member_id: MEMBER,
            alarm: ALARM_NOSPACE
        }]
    );
    // Under the alarm even a tiny write that would fit is refused.
    assert!(matches!(try_put(&store, "z", ""), Err(Error::NoSpace)));
    assert!(matches!(store.txn(txn_put("z")), Err(Error::NoSpace)));
    assert!(matches!(store.lease_grant(7, 60), Err(Error::NoSpace)));
}

#[test]
fn reads_deletes_compaction_and_revokes_still_work_at_the_quota() {
    let store = store_with_quota(20_000);
    store.lease_grant(9, 60).unwrap();
    store
        .put(PutRequest {
            key: b("leased"),
            value: b("v"),
            lease: 9,
            ..Default::default()
        })
        .unwrap();
    let fitted = fill(&store);
    let all = store
        .range(&RangeRequest {
            key: b("k"),
            range_end: b("l"),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(all.kvs.len(), fitted, "reads work");
    let deleted = store
        .delete_range(DeleteRequest {
            key: b("k"),
            range_end: b("l"),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(deleted.deleted as usize, fitted, "deletes work");
    // A txn without puts is a delete too.
    let del_txn = TxnRequest {
        compare: Vec::new(),
        success: vec![RequestOp::Delete(DeleteRequest {
            key: b("leased"),
            ..Default::default()
        })],
        failure: Vec::new(),
    };
    store.txn(del_txn).unwrap();
    store.lease_revoke(9).unwrap();
    store.compact(store.current_revision()).unwrap();
    assert!(
        store.stats().memory_bytes() < 1_000,
        "space freed: {}",
        store.stats().memory_bytes()
    );
    assert!(matches!(try_put(&store, "z", "v"), Err(Error::NoSpace)));
}

#[test]
fn disarming_restores_writes_and_the_quota_raises_again_when_still_full() {
    let store = store_with_quota(20_000);
    fill(&store);
    // Disarmed without freeing space: the next write that does not fit
    // raises it again.
    store
        .alarm(AlarmAction::Deactivate, MEMBER, ALARM_NOSPACE)
        .unwrap();
    assert!(store.alarms().is_empty());
    assert!(matches!(
        try_put(&store, "zz", &"x".repeat(200)),
        Err(Error::NoSpace)
    ));
    assert_eq!(store.alarms().len(), 1);
    // Freed, compacted and disarmed: writes work again.
    store
        .delete_range(DeleteRequest {
            key: b("k"),
            range_end: b("l"),
            ..Default::default()
        })
        .unwrap();
    store.compact(store.current_revision()).unwrap();
    store
        .alarm(AlarmAction::Deactivate, MEMBER, ALARM_NOSPACE)
        .unwrap();
    try_put(&store, "z", "v").expect("writes work after disarm");
    store.txn(txn_put("y")).expect("txn puts too");
}

#[test]
fn a_txn_costs_its_costlier_branch() {
    let req = TxnRequest {
        compare: Vec::new(),
        success: vec![RequestOp::Put(PutRequest {
            key: b("k"),
            value: b("1234"),
            ..Default::default()
        })],
        failure: vec![
            RequestOp::Put(PutRequest {
                key: b("k"),
                value: b("1"),
                ..Default::default()
            }),
            RequestOp::Put(PutRequest {
                key: b("k"),
                value: b("1"),
                ..Default::default()
            }),
        ],
    };
    assert_eq!(
        space_cost(&Entry::Txn(req)),
        2 * (2 + stats::VERSION_OVERHEAD)
    );
}

#[test]
fn the_quota_counts_as_etcd_and_the_memory_bound_counts_memory() {
    // 100-byte values under 27-byte keys: etcd 3.4 admits 40,572 such
    // revisions in 8 MiB (about 207 bytes each).
    let quota = 8 << 20;
    let store = store_with_quota(quota);
    let value = "v".repeat(100);
    let mut fitted = 0;
    while try_put(
        &store,
        &format!("/registry/events/ns/ev-{fitted:08}"),
        &value,
    )
    .is_ok()
    {
        fitted += 1;
    }
    assert!(
        (38_000..=44_000).contains(&fitted),
        "{fitted} revisions of 100 bytes in 8 MiB"
    );
    assert_eq!(
        store.stats().backend_in_use(),
        store.stats().backend_bytes(),
        "no history yet"
    );

    // The memory bound alone: accounted memory, whatever the quota.
    let bounded = Store::new(StoreConfig {
        memory_bound_bytes: Some(20_000),
        member_id: MEMBER,
        ..StoreConfig::default()
    });
    let fitted = fill(&bounded);
    assert!(bounded.stats().memory_bytes() <= 20_000);
    assert!(
        bounded.stats().memory_bytes() + 506 > 20_000,
        "{fitted} fitted"
    );
    assert_eq!(bounded.alarms().len(), 1, "NOSPACE raised");
}
