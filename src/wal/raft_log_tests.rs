//! A cluster member's Raft log written and read back: entries with their
//! conflicts, hard states, installed snapshots, torn tails, the trust rule
//! and segments removed once covered.

use super::*;
use raft::prelude::{Entry, HardState, SnapshotMetadata};
use std::path::Path;
use std::sync::atomic::Ordering;

const ME: Identity = Identity {
    member_id: 0xa1,
    cluster_id: 0xc1,
};

fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
    Entry {
        index,
        term,
        data: data.to_vec().into(),
        ..Default::default()
    }
}

fn hard_state(term: u64, vote: u64, commit: u64) -> HardState {
    HardState {
        term,
        vote,
        commit,
        ..Default::default()
    }
}

fn started(dir: &Path, mode: WalMode, boot: &str, segment_bytes: u64) -> RaftLog {
    let kept = recover_raft_log(dir, boot).unwrap();
    RaftLog::start(
        RaftLogStart {
            dir: dir.to_path_buf(),
            mode,
            boot_id: boot.into(),
            identity: ME,
            hard_state: kept
                .as_ref()
                .map(|k| k.hard_state.clone())
                .unwrap_or_default(),
            next_position: kept.as_ref().map_or(1, |k| k.next_position),
            kept: kept.map(|k| k.segments).unwrap_or_default(),
        },
        segment_bytes,
    )
    .unwrap()
}

fn indexes(entries: &[Entry]) -> Vec<(u64, u64)> {
    entries.iter().map(|e| (e.index, e.term)).collect()
}

#[test]
fn entries_and_the_newest_hard_state_read_back_with_conflicts_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = started(dir.path(), WalMode::Buffered, "boot-1", 1 << 20);
    log.append(&[entry(1, 1, b"a"), entry(2, 1, b"b"), entry(3, 1, b"c")]);
    log.hard_state(&hard_state(1, 0xa1, 1));
    log.flush();
    // A new leader overwrote index 3 onwards.
    log.append(&[entry(3, 2, b"C"), entry(4, 2, b"d")]);
    log.hard_state(&hard_state(2, 0xb2, 3));
    log.flush();
    drop(log);
    let read = recover_raft_log(dir.path(), "boot-1").unwrap().unwrap();
    assert!(read.trusted, "{:?}", read.notes);
    assert_eq!(read.identity, Some(ME));
    assert_eq!(read.hard_state, hard_state(2, 0xb2, 3));
    assert_eq!(indexes(&read.entries), [(1, 1), (2, 1), (3, 2), (4, 2)]);
    assert_eq!(&read.entries[2].data[..], b"C");
    assert_eq!(indexes(&read.after(2, 1).unwrap()), [(3, 2), (4, 2)]);
    assert_eq!(indexes(&read.after(0, 0).unwrap()).len(), 4);
    // A restart continues the same log.
    let mut log = started(dir.path(), WalMode::Buffered, "boot-1", 1 << 20);
    log.append(&[entry(5, 2, b"e")]);
    log.flush();
    drop(log);
    let read = recover_raft_log(dir.path(), "boot-1").unwrap().unwrap();
    assert!(read.trusted, "{:?}", read.notes);
    assert_eq!(read.entries.last().unwrap().index, 5);
    assert_eq!(read.hard_state, hard_state(2, 0xb2, 3));
}

#[test]
fn an_installed_snapshot_replaces_the_entries_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = started(dir.path(), WalMode::Buffered, "boot-1", 1 << 20);
    log.append(&[entry(1, 1, b"a"), entry(2, 1, b"b")]);
    let meta = SnapshotMetadata {
        index: 10,
        term: 3,
        ..Default::default()
    };
    log.installed(&meta);
    log.append(&[entry(11, 3, b"k")]);
    log.hard_state(&hard_state(3, 0, 11));
    log.flush();
    drop(log);
    let read = recover_raft_log(dir.path(), "boot-1").unwrap().unwrap();
    assert_eq!(read.installed, Some((10, 3)));
    assert_eq!(indexes(&read.entries), [(11, 3)]);
    assert_eq!(indexes(&read.after(10, 3).unwrap()), [(11, 3)]);
    // A saved state older than the snapshot cannot be continued.
    let why = read.after(2, 1).unwrap_err();
    assert!(why.contains("snapshot at index 10"), "{why}");
}

#[test]
fn entries_that_do_not_continue_the_saved_state_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = started(dir.path(), WalMode::Buffered, "boot-1", 1 << 20);
    log.append(&[entry(5, 2, b"e"), entry(6, 2, b"f")]);
    log.hard_state(&hard_state(2, 0, 6));
    log.flush();
    drop(log);
    let read = recover_raft_log(dir.path(), "boot-1").unwrap().unwrap();
    assert!(read.after(2, 1).unwrap_err().contains("start at 5"));
    assert!(read.after(5, 1).unwrap_err().contains("has term 2"));
    assert_eq!(indexes(&read.after(5, 2).unwrap()), [(6, 2)]);
    assert_eq!(indexes(&read.after(4, 2).unwrap()), [(5, 2), (6, 2)]);
}

#[test]
fn a_torn_tail_is_cut_and_what_a_reboot_may_have_lost_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = started(dir.path(), WalMode::Buffered, "boot-1", 1 << 20);
    log.append(&[entry(1, 1, b"a"), entry(2, 1, b"b")]);
    log.flush();
    drop(log);
    let (_, path) = segment::list(dir.path()).unwrap().pop().unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(len - 3).unwrap();
    let read = recover_raft_log(dir.path(), "boot-1").unwrap().unwrap();
    assert!(read.trusted, "{:?}", read.notes);
    assert_eq!(indexes(&read.entries), [(1, 1)]);
    assert!(read.notes.iter().any(|n| n.contains("torn tail")));
    // Another boot: a buffered log may have lost what it acknowledged.
    let read = recover_raft_log(dir.path(), "boot-2").unwrap().unwrap();
    assert!(!read.trusted);
    assert!(
        read.notes.iter().any(|n| n.contains("last boot")),
        "{:?}",
        read.notes
    );
    // Synced on every write, it survives a reboot.
    let synced = tempfile::tempdir().unwrap();
    let mut log = started(synced.path(), WalMode::Fsync, "boot-1", 1 << 20);
    log.append(&[entry(1, 1, b"a")]);
    log.flush();
    drop(log);
    let read = recover_raft_log(synced.path(), "boot-2").unwrap().unwrap();
    assert!(read.trusted, "{:?}", read.notes);
    assert!(recover_raft_log(&synced.path().join("none"), "boot-1")
        .unwrap()
        .is_none());
}

#[test]
fn segments_rotate_and_go_once_a_saved_state_covers_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = started(dir.path(), WalMode::Buffered, "boot-1", 4096);
    let covered = log.covered();
    let value = vec![7u8; 500];
    for i in 1..=40u64 {
        log.append(&[entry(i, 1, &value)]);
        log.hard_state(&hard_state(1, 0xa1, i));
        log.flush();
    }
    let segments = segment::list(dir.path()).unwrap().len();
    assert!(segments > 3, "{segments} segments");
    covered.store(30, Ordering::Release);
    for i in 41..=50u64 {
        log.append(&[entry(i, 1, &value)]);
        log.flush();
    }
    drop(log);
    let left = segment::list(dir.path()).unwrap().len();
    assert!(left < segments, "{left} of {segments} segments left");
    let read = recover_raft_log(dir.path(), "boot-1").unwrap().unwrap();
    assert!(read.trusted, "{:?}", read.notes);
    assert_eq!(read.hard_state.commit, 40);
    assert_eq!(read.entries.last().unwrap().index, 50);
    // What is left continues the covered state.
    assert_eq!(read.after(30, 1).unwrap().first().unwrap().index, 31);
}

#[test]
fn garbage_in_a_log_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = started(dir.path(), WalMode::Buffered, "boot-1", 1 << 20);
    log.append(&[entry(1, 1, b"a")]);
    log.flush();
    drop(log);
    let mut bytes = segment::header(99, WalMode::Buffered, "boot-1");
    segment::frame(&mut bytes, segment::KIND_RAFT_ENTRY, 99, 7, b"\xff\xff\xff");
    std::fs::write(dir.path().join(segment::name(99)), bytes).unwrap();
    let read = recover_raft_log(dir.path(), "boot-1").unwrap().unwrap();
    assert!(!read.trusted);
}
