//! Snapshot images (what a cluster member's Raft snapshot carries): an
//! image encoded, decoded and installed into another store gives a store
//! that answers every read at every retained revision and every watch
//! replay like the original, and goes on applying entries exactly like
//! it. Damaged snapshots are refused whole.

use super::super::snapshot::{self, Sections, Snapshot};
use super::super::*;
use super::b;
use super::determinism::{assert_same_state, leases, log, random_entry};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// Captures `store`, encodes and decodes it; checks nothing was lost on
/// the way and returns the decoded image.
fn round_trip(store: &Store) -> StoreImage {
    let snap = Snapshot {
        raft_index: 42,
        raft_term: 3,
        image: store.image(),
        sections: Sections {
            members: Some(b"members hook".to_vec()),
            auth: None,
        },
    };
    let bytes = snapshot::encode(&snap);
    let back = snapshot::decode(&bytes).expect("an intact snapshot decodes");
    assert_eq!(back, snap, "decode(encode(x)) == x");
    back.image
}

/// Every key at every revision the stores still answer for, and the
/// errors below it, are the same.
fn same_reads(a: &Store, b: &Store) {
    let lo = a.compacted_revision().max(1) - 1;
    for rev in lo..=a.current_revision() + 1 {
        let req = RangeRequest {
            key: super::b("\0"),
            range_end: super::b("\0"),
            revision: rev,
            ..Default::default()
        };
        assert_eq!(a.range(&req), b.range(&req), "range at revision {rev}");
    }
    let (ca, ea, _) = a.read_log(i64::MIN, usize::MAX, usize::MAX);
    let (cb, eb, _) = b.read_log(i64::MIN, usize::MAX, usize::MAX);
    assert_eq!((ca, ea), (cb, eb), "watch replay from the oldest revision");
    assert_eq!(a.stats().memory_bytes(), b.stats().memory_bytes());
    assert_eq!(a.stats().memory_in_use(), b.stats().memory_in_use());
}

#[test]
fn an_installed_image_reads_and_applies_exactly_like_the_original() {
    for seed in 30..33 {
        let mut rng = StdRng::seed_from_u64(seed);
        let a = Store::new(StoreConfig::default());
        for _ in 0..600 {
            let _ = a.apply(random_entry(&mut rng, &a));
        }
        assert!(a.current_revision() > 50, "the history is not trivial");
        let restored = Store::new(StoreConfig::default());
        restored.install_image(round_trip(&a));
        assert_same_state(&a, &restored, 0);
        same_reads(&a, &restored);
        for step in 1..600 {
            let entry = random_entry(&mut rng, &a);
            let ra = a.apply(entry.clone());
            assert_eq!(ra, restored.apply(entry.clone()), "step {step}: {entry:?}");
            assert_same_state(&a, &restored, step);
        }
        assert_eq!(log(&a), log(&restored), "change logs");
        same_reads(&a, &restored);
    }
}

#[test]
fn installing_over_a_store_that_is_behind_keeps_its_watch_cursors_valid() {
    let mut rng = StdRng::seed_from_u64(7);
    let leader = Store::new(StoreConfig::default());
    let follower = Store::new(StoreConfig::default());
    // The follower applies a prefix of the leader's log, then misses the
    // rest (it was cut off) and gets a snapshot instead.
    for _ in 0..200 {
        let e = random_entry(&mut rng, &leader);
        assert_eq!(leader.apply(e.clone()), follower.apply(e));
    }
    let cursor = follower.current_revision() + 1;
    let mut woken = follower.log().subscribe();
    for _ in 0..300 {
        let e = random_entry(&mut rng, &leader);
        if !matches!(e, Entry::Compact { .. }) {
            let _ = leader.apply(e);
        }
    }
    assert!(leader.current_revision() > cursor, "the follower is behind");
    follower.install_image(round_trip(&leader));
    assert!(woken.has_changed().unwrap(), "watchers are woken");
    assert_eq!(*woken.borrow_and_update(), leader.current_revision());
    // A watcher of the follower waiting for `cursor` reads on exactly what
    // a watcher of the leader reads: no gap, no duplicate.
    assert_eq!(
        follower.read_log(cursor, usize::MAX, usize::MAX),
        leader.read_log(cursor, usize::MAX, usize::MAX)
    );
    assert_eq!(leases(&leader), leases(&follower));
    same_reads(&leader, &follower);
}

/// A small store with every kind of state: history, deletions, a lease
/// with a key, a compaction and an alarm.
fn small_store() -> Store {
    let s = Store::new(StoreConfig::default());
    s.apply(Entry::LeaseGrant { id: 7, ttl: 60 }).unwrap();
    for (k, v) in [("a", "1"), ("b", "2"), ("a", "3"), ("c", "4")] {
        s.apply(Entry::Put(PutRequest {
            key: b(k),
            value: b(v),
            lease: if k == "c" { 7 } else { 0 },
            ..Default::default()
        }))
        .unwrap();
    }
    s.apply(Entry::Delete(DeleteRequest {
        key: b("b"),
        ..Default::default()
    }))
    .unwrap();
    s.apply(Entry::Compact { revision: 3 }).unwrap();
    s.apply(Entry::Alarm {
        action: AlarmAction::Activate,
        member_id: 9,
        alarm: ALARM_CORRUPT,
    })
    .unwrap();
    s
}

#[test]
fn every_damaged_byte_or_cut_makes_the_whole_snapshot_an_error() {
    let snap = Snapshot {
        raft_index: 10,
        raft_term: 2,
        image: small_store().image(),
        sections: Sections::default(),
    };
    let bytes = snapshot::encode(&snap);
    assert_eq!(snapshot::decode(&bytes).unwrap(), snap);
    for i in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[i] ^= 0x41;
        assert!(snapshot::decode(&damaged).is_err(), "byte {i} flipped");
        assert!(snapshot::decode(&bytes[..i]).is_err(), "cut at byte {i}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    let err = snapshot::decode(&longer).unwrap_err();
    assert!(err.contains("follow the end record"), "{err}");
}

#[test]
fn snapshots_that_break_the_stores_rules_are_refused() {
    let good = Snapshot {
        raft_index: 10,
        raft_term: 2,
        image: small_store().image(),
        sections: Sections::default(),
    };
    let refused = |what: &str, change: &dyn Fn(&mut StoreImage)| {
        let mut snap = good.clone();
        change(&mut snap.image);
        let err = snapshot::decode(&snapshot::encode(&snap)).expect_err(what);
        assert!(!err.is_empty(), "{what}");
    };
    refused("keys out of order", &|i| i.keys.reverse());
    refused("a version above the revision", &|i| i.revision = 2);
    refused("compacted above current", &|i| i.compacted = i.revision + 1);
    refused("events out of order", &|i| i.events.reverse());
    refused("an event below the compaction", &|i| i.compacted = 5);
    refused("a key without versions", &|i| i.keys[0].1.clear());
}

#[test]
fn the_initial_revision_entry_jumps_once_and_creates_compact_rev_key() {
    let s = Store::new(StoreConfig::default());
    s.apply(Entry::Put(PutRequest {
        key: b("early"),
        value: b("1"),
        ..Default::default()
    }))
    .unwrap();
    let applied = s.apply(Entry::Initialize { revision: 1_000 }).unwrap();
    assert_eq!(applied, Applied::Initialize { revision: 1_001 });
    assert_eq!(s.compacted_revision(), 1_000);
    let at = |rev| RangeRequest {
        key: b("\0"),
        range_end: b("\0"),
        revision: rev,
        ..Default::default()
    };
    assert_eq!(s.range(&at(2)), Err(crate::error::Error::Compacted));
    let now = s.range(&at(0)).unwrap();
    let keys: Vec<_> = now.kvs.iter().map(|kv| kv.key.clone()).collect();
    assert_eq!(
        keys,
        vec![b(COMPACT_REV_KEY), b("early")],
        "earlier keys stay"
    );
    assert_eq!(now.kvs[0].value, b("1000"));
    // A second proposal (another leader's) changes nothing.
    let again = s.apply(Entry::Initialize { revision: 5_000 }).unwrap();
    assert_eq!(again, Applied::Initialize { revision: 1_001 });
    assert_eq!(s.current_revision(), 1_001);
    // Under the entry's rules a store above the revision only gets the key.
    let high = Store::new(StoreConfig {
        initial_revision: 9_000,
        ..Default::default()
    });
    high.apply(Entry::Initialize { revision: 1_000 }).unwrap();
    assert_eq!(high.current_revision(), 9_001);
}

#[test]
fn put_events_name_their_versions_instead_of_repeating_their_values() {
    let s = Store::new(StoreConfig::default());
    let value = vec![b'v'; 10_000];
    for i in 0..40 {
        s.apply(Entry::Put(PutRequest {
            key: b(&format!("k{}", i % 10)),
            value: value.clone().into(),
            ..Default::default()
        }))
        .unwrap();
    }
    let snap = Snapshot {
        raft_index: 1,
        raft_term: 1,
        image: s.image(),
        sections: Sections::default(),
    };
    let bytes = snapshot::encode(&snap);
    // 400 KB of values in the history; the events (each with its previous
    // value) would have added 700 KB more.
    assert!(bytes.len() < 450_000, "{} bytes", bytes.len());
    let back = snapshot::decode(&bytes).unwrap();
    assert_eq!(back, snap);
    // The installed events share the history's versions.
    for e in &back.image.events {
        let (_, versions) = back
            .image
            .keys
            .iter()
            .find(|(k, _)| *k == e.event.kv.key)
            .unwrap();
        let at = |rev: i64| versions.iter().find(|v| v.revision == rev).unwrap();
        let kv = at(e.revision).kv.as_ref().unwrap();
        assert!(std::sync::Arc::ptr_eq(kv, &e.event.kv));
        if let Some(p) = &e.event.prev_kv {
            assert!(std::sync::Arc::ptr_eq(
                at(p.mod_revision).kv.as_ref().unwrap(),
                p
            ));
        }
    }
}

/// The records of `bytes` (after the magic) as (kind, body length).
fn records(bytes: &[u8]) -> Vec<(u8, usize)> {
    let mut out = Vec::new();
    let mut at = 10;
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        out.push((bytes[at + 8], len));
        at += 8 + len;
    }
    out
}

#[test]
fn a_long_history_is_cut_into_records_and_read_back_whole() {
    let s = Store::new(StoreConfig::default());
    for i in 0..60 {
        for key in ["a", "hot", "z"] {
            if key == "hot" || i % 20 == 0 {
                s.apply(Entry::Put(PutRequest {
                    key: b(key),
                    value: vec![b'0' + (i % 10) as u8; 1000].into(),
                    ..Default::default()
                }))
                .unwrap();
            }
        }
        if i == 30 {
            // A tombstone inside the cut history too.
            s.apply(Entry::Delete(DeleteRequest {
                key: b("hot"),
                ..Default::default()
            }))
            .unwrap();
        }
    }
    let snap = Snapshot {
        raft_index: 5,
        raft_term: 1,
        image: s.image(),
        sections: Sections::default(),
    };
    // Whole: one record per key.
    let whole = snapshot::encode(&snap);
    let keys = |bytes: &[u8]| records(bytes).iter().filter(|r| r.0 == 2).count();
    assert_eq!(keys(&whole), 3);
    // Cut at 4 KiB: the hot key's 60 versions of about 1,015 encoded bytes
    // (and a tombstone) take 15 records of 4 versions.
    let cut = snapshot::encode_cut(&snap, 4096);
    assert_eq!(keys(&cut), 2 + 15);
    assert!(records(&cut)
        .iter()
        .filter(|r| r.0 == 2)
        .all(|r| r.1 <= 4096 + 16));
    assert_eq!(snapshot::decode(&cut).unwrap(), snap);
    // A bound below one version: one version per record.
    let each = snapshot::encode_cut(&snap, 1);
    assert_eq!(
        keys(&each),
        snap.image.keys.iter().map(|k| k.1.len()).sum::<usize>()
    );
    assert_eq!(snapshot::decode(&each).unwrap(), snap);
    let restored = Store::new(StoreConfig::default());
    restored.install_image(snapshot::decode(&each).unwrap().image);
    same_reads(&s, &restored);
    // Every cut, every flipped byte: still all or nothing.
    for i in (0..cut.len()).step_by(97) {
        let mut damaged = cut.clone();
        damaged[i] ^= 0x41;
        assert!(snapshot::decode(&damaged).is_err(), "byte {i} flipped");
        assert!(snapshot::decode(&cut[..i]).is_err(), "cut at byte {i}");
    }
}

#[test]
fn a_history_going_on_must_go_on_ascending() {
    let mut snap = Snapshot {
        raft_index: 10,
        raft_term: 2,
        image: small_store().image(),
        sections: Sections::default(),
    };
    // The same key twice in a row, its second part repeating a revision.
    let first = snap.image.keys[0].clone();
    snap.image.keys.insert(1, first);
    let err = snapshot::decode(&snapshot::encode(&snap)).unwrap_err();
    assert!(err.contains("impossible revision"), "{err}");
}

#[test]
fn a_record_length_near_four_gib_is_an_error_not_a_panic() {
    let snap = Snapshot {
        raft_index: 10,
        raft_term: 2,
        image: small_store().image(),
        sections: Sections::default(),
    };
    let bytes = snapshot::encode(&snap);
    for len in [u32::MAX, u32::MAX - 8, 1 << 31] {
        let mut damaged = bytes.clone();
        // The meta record's length.
        damaged[10..14].copy_from_slice(&len.to_le_bytes());
        let err = snapshot::decode(&damaged).unwrap_err();
        assert!(err.contains("incomplete"), "{err}");
    }
}
