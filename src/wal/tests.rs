//! The log on disk under a real store: what concurrent writers wrote
//! replays to the same state; torn tails, damage, rotation and the trust
//! rule.

use super::*;
use crate::mvcc::{PutRequest, Store, StoreConfig};
use bytes::Bytes;
use std::path::Path;
use std::sync::Arc;

fn started(
    dir: &Path,
    mode: WalMode,
    next: u64,
    boot: &str,
    segment_bytes: u64,
) -> (Arc<Store>, Arc<Wal>) {
    let store = Arc::new(Store::new(StoreConfig::default()));
    let weak = Arc::downgrade(&store);
    let wal = Arc::new(
        Wal::start_sized(
            dir,
            mode,
            next,
            boot,
            Box::new(move |rev| {
                if let Some(store) = weak.upgrade() {
                    store.journal_durable(rev);
                }
            }),
            segment_bytes,
        )
        .unwrap(),
    );
    store.attach_journal(wal.clone());
    (store, wal)
}

fn put(store: &Store, key: &str, value: &str, lease: i64) -> i64 {
    store
        .put(PutRequest {
            key: Bytes::from(key.to_string()),
            value: Bytes::from(value.to_string()),
            lease,
            ..Default::default()
        })
        .unwrap()
        .revision
}

fn replayed(recovered: Recovered) -> Store {
    let store = Store::new(StoreConfig::default());
    for (revision, record) in recovered.records {
        store.replay(revision, record).unwrap();
    }
    store
}

#[test]
fn concurrent_writes_replay_from_the_files_to_the_same_state() {
    let dir = tempfile::tempdir().unwrap();
    let (store, wal) = started(dir.path(), WalMode::Buffered, 1, "boot-a", 4096);
    store.lease_grant(9, 600).unwrap();
    let writers: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..300 {
                    let lease = if i % 7 == 0 { 9 } else { 0 };
                    put(&store, &format!("k{}", i % 50), &format!("{t}-{i}"), lease);
                    if i % 40 == 0 {
                        store
                            .delete_range(crate::mvcc::DeleteRequest {
                                key: Bytes::from(format!("k{}", i % 50)),
                                ..Default::default()
                            })
                            .unwrap();
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    store.compact(store.current_revision() - 100).unwrap();
    wal.close();
    assert!(
        segment::list(dir.path()).unwrap().len() > 3,
        "segments rotated"
    );

    let recovered = recover(dir.path(), 0, "boot-a").unwrap();
    assert!(recovered.trusted, "{:?}", recovered.notes);
    assert_eq!(
        recovered.last_position,
        crate::mvcc::Journal::durable(wal.as_ref())
    );
    let fresh = replayed(recovered);
    assert_eq!(fresh.current_revision(), store.current_revision());
    assert_eq!(fresh.hash_kv(0), store.hash_kv(0));
    assert_eq!(
        fresh.lease_time_to_live(9, true).keys,
        store.lease_time_to_live(9, true).keys
    );
}

#[test]
fn records_after_a_position_replay_onto_what_covers_it() {
    let dir = tempfile::tempdir().unwrap();
    let (store, wal) = started(dir.path(), WalMode::Fsync, 1, "boot-a", SEGMENT_BYTES);
    put(&store, "a", "1", 0);
    let cut = store.snapshot_cut();
    put(&store, "a", "2", 0);
    put(&store, "b", "1", 0);
    wal.close();
    let recovered = recover(dir.path(), cut.position.unwrap(), "another boot").unwrap();
    assert!(recovered.trusted, "fsync mode is trusted across boots");
    assert_eq!(recovered.records.len(), 2);
    let fresh = Store::new(StoreConfig {
        initial_revision: cut.revision,
        ..Default::default()
    });
    fresh.load(
        cut.kvs.iter().map(|kv| (**kv).clone()).collect(),
        Vec::new(),
    );
    for (revision, record) in recovered.records {
        fresh.replay(revision, record).unwrap();
    }
    assert_eq!(fresh.live_kvs(), store.live_kvs());
}

#[test]
fn a_torn_tail_is_cut_off_and_the_log_goes_on_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let (store, wal) = started(dir.path(), WalMode::Buffered, 1, "boot-a", SEGMENT_BYTES);
    for i in 0..10 {
        put(&store, "k", &i.to_string(), 0);
    }
    wal.close();
    let (_, path) = segment::list(dir.path()).unwrap().pop().unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(len - 3).unwrap();
    let recovered = recover(dir.path(), 0, "boot-a").unwrap();
    assert!(recovered.trusted, "{:?}", recovered.notes);
    assert_eq!(recovered.records.len(), 9);
    assert!(
        recovered.notes[0].contains("torn tail"),
        "{:?}",
        recovered.notes
    );
    assert!(
        std::fs::metadata(&path).unwrap().len() < len - 3,
        "the file was cut"
    );
    let again = recover(dir.path(), 0, "boot-a").unwrap();
    assert!(again.notes.is_empty(), "cut once: {:?}", again.notes);
}

#[test]
fn a_buffered_log_from_before_a_reboot_is_replayed_but_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let (store, wal) = started(dir.path(), WalMode::Buffered, 1, "boot-a", SEGMENT_BYTES);
    put(&store, "k", "v", 0);
    wal.close();
    let recovered = recover(dir.path(), 0, "boot-b").unwrap();
    assert!(!recovered.trusted);
    assert_eq!(recovered.records.len(), 1);
    assert!(recovered.notes[0].contains("before this machine's last boot"));
}

#[test]
fn damage_before_the_newest_segment_stops_the_replay_there_untrusted() {
    let dir = tempfile::tempdir().unwrap();
    let (store, wal) = started(dir.path(), WalMode::Buffered, 1, "boot-a", 512);
    for i in 0..60 {
        put(
            &store,
            &format!("k{i}"),
            "some value to fill the segments",
            0,
        );
    }
    wal.close();
    let segments = segment::list(dir.path()).unwrap();
    assert!(segments.len() >= 3);
    let (second_first, second) = &segments[1];
    let mut bytes = std::fs::read(second).unwrap();
    let last = bytes.len() - 5;
    bytes[last] ^= 0xff;
    std::fs::write(second, bytes).unwrap();
    let recovered = recover(dir.path(), 0, "boot-a").unwrap();
    assert!(!recovered.trusted);
    assert!(recovered.last_position >= *second_first);
    assert!(recovered.last_position < segments[2].0 - 1);
    assert_eq!(
        recovered.damaged,
        segments[1..]
            .iter()
            .map(|(_, p)| p.clone())
            .collect::<Vec<_>>()
    );
    replayed(recovered);
}

#[test]
fn a_gap_after_the_snapshot_replays_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (store, wal) = started(dir.path(), WalMode::Buffered, 50, "boot-a", SEGMENT_BYTES);
    put(&store, "k", "v", 0);
    wal.close();
    let recovered = recover(dir.path(), 10, "boot-a").unwrap();
    assert!(!recovered.trusted);
    assert!(recovered.records.is_empty());
    assert!(
        recovered.notes[0].contains("missing"),
        "{:?}",
        recovered.notes
    );
}

#[test]
fn no_log_at_all_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let recovered = recover(&dir.path().join("wal"), 3, "boot-a").unwrap();
    assert!(!recovered.trusted);
    assert_eq!(recovered.last_position, 3);
}

#[test]
fn covered_segments_are_dropped_and_the_newest_stays() {
    let dir = tempfile::tempdir().unwrap();
    let (store, wal) = started(dir.path(), WalMode::Buffered, 1, "boot-a", 300);
    for i in 0..40 {
        put(&store, &format!("k{i}"), "a value", 0);
    }
    let segments = segment::list(dir.path()).unwrap();
    assert!(segments.len() > 3);
    let covered = segments[3].0 - 1;
    let removed = drop_covered(dir.path(), covered).unwrap();
    assert_eq!(removed.len(), 3);
    let everything = crate::mvcc::Journal::appended(wal.as_ref());
    drop_covered(dir.path(), everything).unwrap();
    assert_eq!(segment::list(dir.path()).unwrap().len(), 1);
    wal.close();
}
