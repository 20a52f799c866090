//! Replicated limits (`mvcc/limits.rs`): a store applying `Entry::Limits`
//! decides later entries under them, not under its own settings, and an
//! image carries them to the store it is installed into.

use super::super::snapshot::{self, Sections, Snapshot};
use super::super::*;
use super::b;
use crate::error::Error;

fn txn_of(ops: usize) -> TxnRequest {
    TxnRequest {
        compare: Vec::new(),
        success: (0..ops)
            .map(|i| {
                RequestOp::Put(PutRequest {
                    key: b(&format!("k{i}")),
                    value: b("v"),
                    ..Default::default()
                })
            })
            .collect(),
        failure: Vec::new(),
    }
}

fn put_on_lease(store: &Store, lease: i64) -> crate::error::Result<Applied> {
    store.apply(Entry::Put(PutRequest {
        key: b("leased"),
        value: b("v"),
        lease,
        ..Default::default()
    }))
}

#[test]
fn entries_after_the_limits_are_decided_under_them_not_the_flags() {
    let store = Store::new(StoreConfig::default());
    assert_eq!(store.limits(), store.own_limits());
    assert!(!store.limits_replicated());
    assert!(store.apply(Entry::Txn(txn_of(100))).is_ok());
    assert!(matches!(
        put_on_lease(&store, 77),
        Err(Error::LeaseNotFound)
    ));

    let leader = Limits {
        max_txn_ops: 10,
        quota_bytes: Some(1 << 20),
        adopt_unknown_ttl: Some(60),
    };
    let rev = store.current_revision();
    let applied = store.apply(Entry::Limits(leader)).unwrap();
    assert_eq!(applied, Applied::Limits { revision: rev });
    assert_eq!(store.current_revision(), rev, "limits write nothing");
    assert!(store.limits_replicated() && store.limits() == leader);
    assert!(matches!(
        store.apply(Entry::Txn(txn_of(11))),
        Err(Error::TooManyOps)
    ));
    assert!(store.apply(Entry::Txn(txn_of(10))).is_ok());
    // An unknown lease is adopted now.
    assert!(put_on_lease(&store, 77).is_ok());
    // The quota is never the leader's, nor applied at all: each member
    // checks writes against its own before proposing them (`quota.rs`).
    let big = Entry::Put(PutRequest {
        key: b("big"),
        value: bytes::Bytes::from(vec![b'x'; 1 << 20]),
        ..Default::default()
    });
    assert!(
        matches!(store.check_space(&big), Space::Fits),
        "this member has no quota"
    );
    assert!(store.apply(big).is_ok());
}

#[test]
fn an_image_carries_replicated_limits_and_leaves_own_ones_alone() {
    let leader = Limits {
        max_txn_ops: 5,
        quota_bytes: None,
        adopt_unknown_ttl: Some(3660),
    };
    let from = Store::new(StoreConfig::default());
    // Own limits are not carried: the receiver keeps its own.
    assert_eq!(from.image().limits, None);
    from.apply(Entry::Limits(leader)).unwrap();
    let snap = Snapshot {
        raft_index: 9,
        raft_term: 2,
        image: from.image(),
        sections: Sections::default(),
    };
    let back = snapshot::decode(&snapshot::encode(&snap)).unwrap();
    assert_eq!(back.image.limits, Some(leader));
    let to = Store::new(StoreConfig {
        max_txn_ops: 1000,
        ..StoreConfig::default()
    });
    to.install_image(back.image);
    assert!(to.limits_replicated() && to.limits() == leader);
    assert!(matches!(
        to.apply(Entry::Txn(txn_of(6))),
        Err(Error::TooManyOps)
    ));
    let fresh = Store::new(StoreConfig::default());
    let mut own = fresh.image();
    own.limits = None;
    to.install_image(own);
    assert_eq!(to.limits(), leader, "an image without limits changes none");
}
