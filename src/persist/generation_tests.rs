//! Generations on disk: written atomically, pruned to the newest ones,
//! damaged ones moved aside (never overwritten or removed), the legacy file
//! adopted, and the revision state file's own damage detected.

use super::format::MAGIC_V1;
use super::state::{self, RevisionState};
use super::tests::{assemble, kv_record, meta, sample, NOW};
use super::*;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Every file in `dir` with its bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

fn write_gen(dir: &Path, revision: i64) -> PathBuf {
    let (kvs, leases) = sample();
    write(dir, revision, &kvs, &leases, None, NOW, None)
        .unwrap()
        .path
}

fn flip(path: &Path, at: usize) {
    let mut bytes = fs::read(path).unwrap();
    let at = at.min(bytes.len() - 1);
    bytes[at] ^= 0x01;
    fs::write(path, bytes).unwrap();
}

#[test]
fn generation_names_sort_by_revision() {
    assert_eq!(generation_name(42), "ephd.snap.00000000000000000042");
    assert_eq!(parse_generation(&generation_name(i64::MAX)), Some(i64::MAX));
    for other in [
        "ephd.snap",
        "ephd.snap.tmp",
        "ephd.snap.",
        "ephd.snap.00000000000000000042.corrupt-1700000000",
        "ephd.state",
    ] {
        assert_eq!(parse_generation(other), None, "{other}");
    }
}

#[test]
fn only_the_newest_generations_are_kept_and_nothing_else_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::write(d.join("ephd.snap.00000000000000000001.corrupt-5"), b"kept").unwrap();
    fs::write(d.join("notes.txt"), b"kept too").unwrap();
    for rev in [10, 30, 20] {
        write_gen(d, rev);
    }
    let written = write(d, 40, &sample().0, &sample().1, None, NOW, None).unwrap();
    assert_eq!(written.bytes, fs::metadata(&written.path).unwrap().len());
    assert_eq!(written.pruned, vec![d.join(generation_name(20))]);
    let names: Vec<_> = files(d).into_keys().collect();
    assert_eq!(
        names,
        vec![
            "ephd.snap.00000000000000000001.corrupt-5".to_string(),
            generation_name(30),
            generation_name(40),
            "notes.txt".to_string(),
        ],
        "two generations, the moved-aside file and foreign files; no temporary file"
    );
    assert_eq!(KEEP_GENERATIONS, 2);
    let listed: Vec<_> = list(d).unwrap().into_iter().map(|(r, _)| r).collect();
    assert_eq!(listed, vec![40, 30]);
}

#[test]
fn a_damaged_newest_generation_is_moved_aside_and_the_older_one_restored() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let old = write_gen(d, 10);
    let new = write_gen(d, 20);
    flip(&new, 60);
    let before = files(d);

    // Strict: refused, with the reason, and nothing touched.
    match recover(d, true, NOW) {
        Err(RecoverError::Refused(damaged)) => {
            assert_eq!(damaged.path, new);
            assert_eq!(damaged.revision, Some(20));
            assert_eq!(damaged.moved_to, None);
            assert!(damaged.reason.contains("record 2"), "{}", damaged.reason);
        }
        other => panic!("strict recovery of a damaged snapshot: {other:?}"),
    }
    assert_eq!(files(d), before, "strict mode changes nothing");

    let rec = recover(d, false, NOW + 1000).unwrap();
    let (path, restored) = rec.restored.expect("the older generation");
    assert_eq!(path, old);
    assert_eq!(restored.revision, 10);
    assert_eq!(restored.kvs.len(), 3);
    assert_eq!(rec.highest_named, 20);
    assert_eq!(rec.damaged.len(), 1);
    let moved = rec.damaged[0].moved_to.clone().expect("moved aside");
    assert_eq!(
        moved.file_name().unwrap().to_str().unwrap(),
        format!("{}.corrupt-{}", generation_name(20), (NOW + 1000) / 1000)
    );
    assert!(!new.exists());
    assert_eq!(fs::read(&moved).unwrap(), before[&generation_name(20)]);
    assert_eq!(fs::read(&old).unwrap(), before[&generation_name(10)]);

    // Later snapshots never touch the moved-aside file.
    for rev in [30, 40, 50] {
        write_gen(d, rev);
    }
    assert_eq!(fs::read(&moved).unwrap(), before[&generation_name(20)]);
}

#[test]
fn with_every_generation_damaged_nothing_is_restored_and_all_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let old = write_gen(d, 10);
    let new = write_gen(d, 20);
    let len = fs::metadata(&new).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&new)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    flip(&old, 30);
    let before = files(d);
    let rec = recover(d, false, NOW).unwrap();
    assert!(rec.restored.is_none());
    assert_eq!(rec.highest_named, 20);
    let revisions: Vec<_> = rec.damaged.iter().map(|d| d.revision).collect();
    assert_eq!(revisions, vec![Some(20), Some(10)], "newest first");
    assert!(rec.damaged[0].reason.contains("cut short"));
    let after = files(d);
    assert_eq!(after.len(), 2);
    for d in &rec.damaged {
        let name = d.path.file_name().unwrap().to_str().unwrap();
        let moved = d.moved_to.as_ref().unwrap();
        assert_eq!(
            fs::read(moved).unwrap(),
            before[name],
            "{name} kept as it was"
        );
    }
}

#[test]
fn moving_aside_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut moved = Vec::new();
    for i in 0..3 {
        let p = d.join("ephd.snap.00000000000000000007");
        fs::write(&p, format!("copy {i}")).unwrap();
        moved.push(move_aside(&p, NOW).unwrap());
    }
    let contents: Vec<_> = moved.iter().map(|p| fs::read(p).unwrap()).collect();
    assert_eq!(
        contents,
        vec![b"copy 0".to_vec(), b"copy 1".to_vec(), b"copy 2".to_vec()]
    );
}

#[test]
fn the_legacy_snapshot_is_adopted_as_a_generation() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let v1 = assemble(MAGIC_V1, &[meta(9), kv_record("a", 3)], false);
    fs::write(d.join(LEGACY_FILE), &v1).unwrap();
    let rec = recover(d, true, NOW).unwrap();
    let (path, restored) = rec.restored.unwrap();
    assert_eq!(path, d.join(generation_name(9)));
    assert_eq!(restored.kvs.len(), 1);
    assert_eq!(fs::read(&path).unwrap(), v1, "renamed, not rewritten");
    assert!(!d.join(LEGACY_FILE).exists());

    // A legacy file whose header is garbage has no revision: tried first,
    // moved aside; the generation is restored.
    fs::write(d.join(LEGACY_FILE), b"garbage, not a snapshot").unwrap();
    let rec = recover(d, false, NOW).unwrap();
    assert_eq!(rec.restored.unwrap().1.revision, 9);
    assert_eq!(rec.damaged.len(), 1);
    assert_eq!(rec.damaged[0].revision, None);
    assert!(rec.damaged[0].reason.contains("not an ephd snapshot"));
    assert!(!d.join(LEGACY_FILE).exists());
}

#[test]
fn a_read_error_that_is_not_damage_moves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_gen(d, 10);
    // A directory where a generation should be: not damage, an I/O error.
    fs::create_dir(d.join(generation_name(20))).unwrap();
    let before: Vec<_> = fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    match recover(d, false, NOW) {
        Err(RecoverError::Io(msg)) => assert!(msg.contains(&generation_name(20)), "{msg}"),
        other => panic!("{other:?}"),
    }
    let after: Vec<_> = fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(before.len(), after.len());
    assert!(d.join(generation_name(20)).is_dir());
}

#[test]
fn an_empty_or_missing_data_dir_restores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let rec = recover(&dir.path().join("absent"), true, NOW).unwrap();
    assert!(rec.restored.is_none() && rec.damaged.is_empty());
    assert_eq!(rec.highest_named, 0);
    assert_eq!(state::read(dir.path()).unwrap(), None);
}

#[test]
fn the_state_file_round_trips_and_detects_damage() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let s = RevisionState {
        used_up_to: 1_700_000_000_123_456,
        continuity: false,
        compact_rev_key: true,
    };
    state::write(d, &s, NOW).unwrap();
    assert_eq!(state::read(d).unwrap(), Some(s));
    let bytes = fs::read(d.join(STATE_FILE)).unwrap();
    assert!(String::from_utf8_lossy(&bytes).contains("revisions-used-up-to 1700000000123456"));
    let path = d.join(STATE_FILE);
    let mut bad_inputs = Vec::new();
    for cut in 0..bytes.len() - 1 {
        bad_inputs.push(bytes[..cut].to_vec());
    }
    for at in 0..bytes.len() {
        for bit in 0..8 {
            let mut b = bytes.clone();
            b[at] ^= 1 << bit;
            bad_inputs.push(b);
        }
    }
    for bad in bad_inputs {
        fs::write(&path, &bad).unwrap();
        match state::read(d) {
            Err(ReadError::Damaged { .. }) => {}
            // A flip that turns the final newline into other whitespace
            // leaves the same lines; anything accepted must say the same.
            Ok(Some(got)) => assert_eq!(got, s, "{:?}", String::from_utf8_lossy(&bad)),
            other => panic!("{other:?} for {:?}", String::from_utf8_lossy(&bad)),
        }
    }
}
