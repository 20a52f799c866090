//! Start-up with an injected wall clock: revisions never go backwards when
//! the clock steps back, damaged snapshots are handled by the recovery
//! rules, and `--revision-continuity=false` is checked against the
//! previous run.

use super::super::revisions::{start_revision, Known, RevisionGuard, Step, RESERVE_AHEAD};
use super::*;
use crate::mvcc::PutRequest;
use clap::Parser;
use std::fs;
use std::path::PathBuf;

/// A wall clock in milliseconds (2023-11-14).
const T: i64 = 1_700_000_000_000;
const HOUR_MS: i64 = 3_600_000;

fn config(dir: &Path, extra: &[&str]) -> Config {
    let mut args = vec!["ephd", "--data-dir", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    Config::parse_from(args)
}

/// `n` puts; returns the store's revision after them.
fn traffic(store: &Store, n: usize) -> i64 {
    for i in 0..n {
        store
            .put(PutRequest {
                key: Bytes::from(format!("/registry/events/e{i:04}")),
                value: Bytes::from_static(b"v"),
                ..Default::default()
            })
            .unwrap();
    }
    store.current_revision()
}

/// What `--snapshot-interval` or SIGTERM writes.
fn snapshot(store: &Store, dir: &Path, now: i64) {
    let (rev, kvs) = store.live_kvs();
    persist::write(
        dir,
        rev,
        &kvs,
        &store.leases_for_snapshot(),
        None,
        now,
        None,
    )
    .unwrap();
}

fn keys(store: &Store) -> Vec<Bytes> {
    let (_, kvs) = store.live_kvs();
    kvs.iter().map(|kv| kv.key.clone()).collect()
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_clock_stepped_back_does_not_move_the_start_backwards() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &[]);
    let a = build_store(&cfg, T, SpaceBounds::default()).unwrap();
    let highest = traffic(&a.store, 100);
    // A crash: no snapshot, only the state file written at start.
    drop(a);
    let stepped = T - HOUR_MS;
    assert!(
        start_revision(true, &Known::default(), stepped) < highest,
        "the clock alone would go backwards"
    );
    let b = build_store(&cfg, stepped, SpaceBounds::default()).unwrap();
    let start_b = b.store.current_revision();
    assert!(
        start_b > highest,
        "start {start_b}, previous run reached {highest}"
    );

    // The same again with the state file lost: the snapshot's revision plus
    // the margin still keeps the start above.
    let highest_b = traffic(&b.store, 10);
    snapshot(&b.store, dir.path(), stepped);
    fs::remove_file(dir.path().join(persist::STATE_FILE)).unwrap();
    let c = build_store(&cfg, stepped - HOUR_MS, SpaceBounds::default()).unwrap();
    assert!(c.store.current_revision() > highest_b);
    assert_eq!(keys(&c.store).len(), 11, "10 events and compact_rev_key");
}

#[test]
fn the_start_revision_is_above_every_source() {
    let none = Known::default();
    assert_eq!(start_revision(true, &none, T), T * 1000);
    assert_eq!(start_revision(true, &none, 0), 10_000_000);
    let state = Known {
        state: Some(T * 1000 + 5),
        ..none
    };
    assert_eq!(start_revision(true, &state, T - HOUR_MS), T * 1000 + 6);
    let named = Known {
        snapshot: Some(7),
        named: T * 1000,
        state: None,
    };
    assert_eq!(start_revision(true, &named, 0), T * 1000 + 10_000_000);
    // Without continuity: etcd's rule, the snapshot's revision or 1.
    assert_eq!(start_revision(false, &named, T), 7);
    assert_eq!(start_revision(false, &none, T), 1);
}

#[test]
fn the_reservation_stays_ahead_of_the_store() {
    let mut g = RevisionGuard {
        dir: Some(PathBuf::from("/nonexistent")),
        state: RevisionState {
            used_up_to: 100 + RESERVE_AHEAD,
            continuity: true,
            compact_rev_key: true,
        },
        dirty: false,
    };
    assert_eq!(g.step(100 + RESERVE_AHEAD / 2, true), Step::default());
    let s = g.step(101 + RESERVE_AHEAD / 2, true);
    assert!(s.write && s.overrun.is_none());
    assert_eq!(g.state.used_up_to, 101 + RESERVE_AHEAD / 2 + RESERVE_AHEAD);
    // Still owed until a write succeeds.
    g.dirty = true;
    assert!(g.step(102 + RESERVE_AHEAD / 2, true).write);
    g.dirty = false;
    // Passing the bound between two checks is reported.
    let bound = g.state.used_up_to;
    let s = g.step(bound + 1, true);
    assert_eq!(s.overrun, Some(bound));
    assert_eq!(g.state.used_up_to, bound + 1 + RESERVE_AHEAD);
}

#[test]
fn compact_rev_key_without_continuity_or_data_dir_is_warned_about() {
    let state = RevisionState {
        used_up_to: 1 + RESERVE_AHEAD,
        continuity: false,
        compact_rev_key: false,
    };
    let mut g = RevisionGuard {
        dir: None,
        state,
        dirty: false,
    };
    assert!(g.needed());
    assert!(!g.step(5, false).warn_compact_key);
    let s = g.step(6, true);
    assert!(s.warn_compact_key && !s.write);
    assert!(!g.needed(), "warned once, nothing left to do");
    // With a data dir the key is recorded instead.
    let mut g = RevisionGuard {
        dir: Some(PathBuf::from("/nonexistent")),
        state,
        dirty: false,
    };
    let s = g.step(6, true);
    assert!(!s.warn_compact_key && s.write && g.state.compact_rev_key);
}

#[test]
fn damaged_snapshots_restore_an_older_one_start_empty_or_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = build_store(&config(d, &[]), T, SpaceBounds::default()).unwrap();
    traffic(&a.store, 5);
    snapshot(&a.store, d, T);
    let highest = traffic(&a.store, 5);
    snapshot(&a.store, d, T);
    let newest = persist::list(d).unwrap()[0].1.clone();
    let mut bytes = fs::read(&newest).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    fs::write(&newest, &bytes).unwrap();
    let before = files(d);

    for strict in [&["--strict-restore"][..], &["--revision-continuity=false"]] {
        let err = build_store(&config(d, strict), T, SpaceBounds::default())
            .err()
            .expect("refused");
        assert!(
            err.contains("refusing to start") && err.contains(newest.to_str().unwrap()),
            "{strict:?}: {err}"
        );
        assert_eq!(files(d), before, "{strict:?}: nothing changed");
    }

    // Default: the older generation (5 events and compact_rev_key).
    let b = build_store(&config(d, &[]), T - HOUR_MS, SpaceBounds::default()).unwrap();
    assert_eq!(keys(&b.store).len(), 6);
    assert!(b.store.current_revision() > highest);
    assert!(!newest.exists(), "moved aside");
    drop(b);

    // Every generation damaged: empty, above every revision ever named.
    for (_, path) in persist::list(d).unwrap() {
        fs::write(&path, b"EPHDSNAP2\n").unwrap();
    }
    let c = build_store(&config(d, &[]), T - 2 * HOUR_MS, SpaceBounds::default()).unwrap();
    assert_eq!(keys(&c.store), vec![Bytes::from_static(b"compact_rev_key")]);
    assert!(c.store.current_revision() > highest);
    let corrupt = fs::read_dir(d)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains(".corrupt-")
        })
        .count();
    assert_eq!(corrupt, 2, "both damaged files kept, moved aside");
}

#[test]
fn a_damaged_state_file_is_moved_aside_or_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = build_store(&config(d, &[]), T, SpaceBounds::default()).unwrap();
    let highest = traffic(&a.store, 3);
    drop(a);
    fs::write(
        d.join(persist::STATE_FILE),
        b"ephd-state 1\nrevisions-used-up",
    )
    .unwrap();
    let err = build_store(&config(d, &["--strict-restore"]), T, SpaceBounds::default())
        .err()
        .unwrap();
    assert!(
        err.contains("state file") && err.contains("damaged"),
        "{err}"
    );
    // The state is lost: only the wall clock (one second later) covers the
    // previous run now.
    let b = build_store(&config(d, &[]), T + 1000, SpaceBounds::default()).unwrap();
    assert!(
        b.store.current_revision() > highest,
        "the clock still covers it"
    );
    assert_eq!(b.store.current_revision(), (T + 1000) * 1000 + 1);
    let aside = fs::read_dir(d)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("ephd.state.corrupt-")
        })
        .count();
    assert_eq!(aside, 1, "the damaged state file is kept aside");
    let state = persist::state::read(d).unwrap().expect("rewritten");
    assert!(state.used_up_to >= b.store.current_revision() + RESERVE_AHEAD);
}

#[test]
fn continuity_off_is_refused_when_the_compaction_key_would_vanish() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A run with continuity (so with compact_rev_key) that crashed before
    // its first snapshot.
    let a = build_store(&config(d, &[]), T, SpaceBounds::default()).unwrap();
    traffic(&a.store, 3);
    drop(a);
    let before = files(d);
    let off = ["--revision-continuity=false"];
    let err = build_store(&config(d, &off), T, SpaceBounds::default())
        .err()
        .expect("refused");
    assert!(
        err.contains("compact_rev_key") && err.contains("compactor panics"),
        "{err}"
    );
    assert_eq!(files(d), before);

    // With a snapshot that holds the key, the start goes ahead (with a
    // warning) at the snapshot's revision, key included.
    let b = build_store(&config(d, &[]), T, SpaceBounds::default()).unwrap();
    let rev = traffic(&b.store, 2);
    snapshot(&b.store, d, T);
    drop(b);
    let c = build_store(&config(d, &off), T, SpaceBounds::default()).unwrap();
    assert_eq!(c.store.current_revision(), rev);
    assert!(has_compact_rev_key(&c.store));
    let state = persist::state::read(d).unwrap().unwrap();
    assert!(!state.continuity && state.compact_rev_key);

    // A continuity=false data dir whose runs never saw the key starts at 1.
    let fresh = tempfile::tempdir().unwrap();
    let e = build_store(&config(fresh.path(), &off), T, SpaceBounds::default()).unwrap();
    assert_eq!(e.store.current_revision(), 1);
    drop(e);
    let e = build_store(&config(fresh.path(), &off), T, SpaceBounds::default()).unwrap();
    assert_eq!(e.store.current_revision(), 1);
}
