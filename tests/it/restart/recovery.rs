//! Damaged snapshots and `--revision-continuity=false`, through the real
//! binary: a damaged newest generation is moved aside and the older one
//! restored whole; with every generation damaged the default mode starts
//! empty above the old revisions with an ERROR, `--strict-restore` and
//! `--revision-continuity=false` refuse to start and change nothing; the
//! compaction key is guarded when continuity is off. All with snapshots
//! alone (`--wal none`): what the write-ahead log adds is `wal.rs`'s.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb as pb;
use ephd::proto::mvccpb::KeyValue;

use super::{arg, node_key, plain, Proc};
use crate::harness::free_port;
use crate::kubernetes::apiserver::{
    b, Apiserver, Compactor, Tick, COMPACT_REV_KEY, EVENTS, EVENT_LEASE_TTL, LEASES,
};

/// Every file in `dir` with its bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .expect("read data dir")
        .filter(|e| e.as_ref().is_ok_and(|e| e.path().is_file()))
        .map(|e| {
            let e = e.expect("dir entry");
            let bytes = std::fs::read(e.path()).expect("read file");
            (e.file_name().into_string().expect("utf-8 name"), bytes)
        })
        .collect()
}

/// The snapshot generations in `dir` (`ephd.snap.<digits>`), newest first.
fn generations(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = files(dir)
        .into_keys()
        .filter(|n| {
            n.strip_prefix("ephd.snap.")
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|c| c.is_ascii_digit()))
        })
        .map(|n| dir.join(n))
        .collect();
    out.sort();
    out.reverse();
    out
}

/// The files moved aside for `path`, with their bytes.
fn moved_aside(path: &Path) -> Vec<Vec<u8>> {
    let name = path.file_name().unwrap().to_str().unwrap().to_string();
    files(path.parent().unwrap())
        .into_iter()
        .filter(|(n, _)| n.starts_with(&format!("{name}.corrupt-")))
        .map(|(_, bytes)| bytes)
        .collect()
}

async fn all_keys(api: &Apiserver) -> Vec<KeyValue> {
    api.range(pb::RangeRequest {
        key: b("\0"),
        range_end: b("\0"),
        ..Default::default()
    })
    .await
    .expect("range all")
    .kvs
}

/// Starts ephd on `dir`, writes `n` keys named after `tag` (leased events
/// and node leases), stops it with SIGTERM (which writes a snapshot) and
/// returns every key as it was and the last revision.
async fn run_and_stop(dir: &Path, tag: &str, n: usize) -> (Vec<KeyValue>, i64) {
    let mut p = Proc::start(free_port(), &["--data-dir", &arg(dir), "--wal", "none"]).await;
    let api = Apiserver::connect(&p.endpoint()).await;
    let lease = api.grant(EVENT_LEASE_TTL).await;
    for i in 0..n {
        let (key, l) = if i % 2 == 0 {
            (format!("{EVENTS}default/{tag}-{i:04}"), lease)
        } else {
            (format!("{LEASES}kube-node-lease/{tag}-{i:04}"), 0)
        };
        api.create(&key, format!("k8s\x00{tag} {i}").as_bytes(), l)
            .await
            .expect("Txn")
            .expect("new");
    }
    let kvs = all_keys(&api).await;
    let rev = api.current_rv(LEASES).await;
    p.sigterm().await;
    (kvs, rev)
}

/// Two runs, so two generations. Returns the keys of the first (what the
/// older generation holds) and the last revision of the second.
async fn two_generations(dir: &Path) -> (Vec<KeyValue>, i64) {
    let (first, _) = run_and_stop(dir, "first", 40).await;
    let (_, rev) = run_and_stop(dir, "second", 20).await;
    assert_eq!(generations(dir).len(), 2, "{:?}", files(dir).keys());
    (first, rev)
}

/// Waits (bounded) until `p`'s log contains `what`; returns the log.
async fn wait_for_log(p: &Proc, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let logs = plain(&p.logs());
        if logs.contains(what) {
            return logs;
        }
        assert!(Instant::now() < deadline, "no {what:?} in the log:\n{logs}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The log line containing `what`.
fn line<'a>(logs: &'a str, what: &str) -> &'a str {
    logs.lines()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("no {what:?} in the log:\n{logs}"))
}

/// Runs ephd with `args` and expects it to refuse to start (exit status 2)
/// with `reason` in its output.
async fn refused(args: &[&str], reason: &str) -> String {
    let mut p = Proc::spawn(free_port(), args);
    let status = p.wait_exit(Duration::from_secs(10)).await;
    let logs = plain(&p.logs());
    assert_eq!(status.code(), Some(2), "exit status {status}:\n{logs}");
    assert!(logs.contains(reason), "no {reason:?} in:\n{logs}");
    logs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_newest_snapshot_restores_the_older_generation_and_is_kept() {
    let dir = tempfile::tempdir().expect("data dir");
    let d = dir.path();
    let (first, rev) = two_generations(d).await;
    let gens = generations(d);
    let (newest, older) = (gens[0].clone(), gens[1].clone());
    let mut damaged = std::fs::read(&newest).expect("read");
    let mid = damaged.len() / 2;
    damaged[mid] ^= 0x20;
    std::fs::write(&newest, &damaged).expect("write");
    let older_bytes = std::fs::read(&older).expect("read");

    let mut p = Proc::start(free_port(), &["--data-dir", &arg(d), "--wal", "none"]).await;
    let api = Apiserver::connect(&p.endpoint()).await;
    assert_eq!(
        all_keys(&api).await,
        first,
        "the older generation is restored whole, revisions included"
    );
    assert!(
        api.current_rv(LEASES).await > rev,
        "above the damaged one's revisions"
    );
    let logs = plain(&p.logs());
    let error = line(&logs, "newer snapshots are damaged");
    assert!(
        error.contains("ERROR")
            && error.contains("LOST")
            && error.contains(newest.file_name().unwrap().to_str().unwrap()),
        "{error}"
    );
    assert!(
        !newest.exists(),
        "the damaged file left its generation name"
    );
    assert_eq!(
        moved_aside(&newest),
        vec![damaged.clone()],
        "kept, byte for byte"
    );
    assert_eq!(std::fs::read(&older).expect("read"), older_bytes);

    // New snapshots never overwrite either of them.
    api.create(&format!("{EVENTS}default/after"), b"k8s\x00after", 0)
        .await
        .expect("Txn")
        .expect("new");
    p.sigterm().await;
    assert_eq!(moved_aside(&newest), vec![damaged]);
    assert_eq!(std::fs::read(&older).expect("read"), older_bytes);
    let gens = generations(d);
    assert_eq!(gens.len(), 2);
    assert_eq!(gens[1], older);
    let p = Proc::start(free_port(), &["--data-dir", &arg(d), "--wal", "none"]).await;
    let api = Apiserver::connect(&p.endpoint()).await;
    assert_eq!(all_keys(&api).await.len(), first.len() + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_snapshot_damaged_strict_refuses_and_default_starts_empty_above() {
    let dir = tempfile::tempdir().expect("data dir");
    let d = dir.path();
    let (_, rev) = two_generations(d).await;
    let gens = generations(d);
    let newest_name = gens[0].file_name().unwrap().to_str().unwrap().to_string();
    let bytes = std::fs::read(&gens[0]).expect("read");
    std::fs::write(&gens[0], &bytes[..bytes.len() / 2]).expect("truncate");
    std::fs::write(&gens[1], b"EPHDSNAP2\nnot records").expect("garbage");
    let before = files(d);

    for flag in ["--strict-restore", "--revision-continuity=false"] {
        let logs = refused(
            &["--data-dir", &arg(d), "--wal", "none", flag],
            "refusing to start",
        )
        .await;
        assert!(
            logs.contains(&newest_name) && logs.contains("cut short"),
            "{flag}: {logs}"
        );
        assert_eq!(files(d), before, "{flag}: nothing changed");
    }

    let p = Proc::start(free_port(), &["--data-dir", &arg(d), "--wal", "none"]).await;
    let api = Apiserver::connect(&p.endpoint()).await;
    let keys: Vec<_> = all_keys(&api).await.into_iter().map(|kv| kv.key).collect();
    assert_eq!(keys, vec![b(COMPACT_REV_KEY)], "started empty");
    assert!(
        api.current_rv(LEASES).await > rev,
        "above every old revision"
    );
    let logs = plain(&p.logs());
    let error = line(&logs, "no snapshot could be read");
    assert!(error.contains("ERROR") && error.contains("LOST"), "{error}");
    for g in &gens {
        let name = g.file_name().unwrap().to_str().unwrap();
        assert!(!g.exists());
        assert_eq!(moved_aside(g), vec![before[name].clone()], "{name} kept");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuity_off_warns_or_refuses_when_the_compaction_key_is_seen() {
    // No data dir: warned about as soon as kube-apiserver writes the key.
    let p = Proc::start(free_port(), &["--revision-continuity=false"]).await;
    let api = Apiserver::connect(&p.endpoint()).await;
    let mut compactor = Compactor::default();
    assert!(matches!(
        compactor.tick(&api).await,
        Tick::Won { compacted: None }
    ));
    let logs = wait_for_log(&p, "compaction key was written").await;
    let warn = line(&logs, "compaction key was written");
    assert!(warn.contains("WARN") && warn.contains("panics"), "{warn}");
    drop(p);

    // A run with continuity (so with the key) killed before its first
    // snapshot: continuity off would start at 1 without the key: refused.
    let dir = tempfile::tempdir().expect("data dir");
    let d = dir.path();
    let mut a = Proc::start(free_port(), &["--data-dir", &arg(d), "--wal", "none"]).await;
    let api = Apiserver::connect(&a.endpoint()).await;
    api.create(&node_key(1), b"k8s\x00v", 0).await.expect("Txn");
    a.child.kill().expect("SIGKILL");
    a.wait_exit(Duration::from_secs(10)).await;
    assert!(generations(d).is_empty(), "no snapshot written");
    let before = files(d);
    let logs = refused(
        &[
            "--data-dir",
            &arg(d),
            "--wal",
            "none",
            "--revision-continuity=false",
        ],
        "refusing to start",
    )
    .await;
    assert!(
        logs.contains(COMPACT_REV_KEY) && logs.contains("compactor panics"),
        "{logs}"
    );
    assert_eq!(files(d), before);

    // With a snapshot holding the key it starts, at the snapshot's
    // revision, and warns.
    let (kvs, rev) = run_and_stop(d, "kept", 4).await;
    let p = Proc::start(
        free_port(),
        &[
            "--data-dir",
            &arg(d),
            "--wal",
            "none",
            "--revision-continuity=false",
        ],
    )
    .await;
    let api = Apiserver::connect(&p.endpoint()).await;
    assert_eq!(all_keys(&api).await, kvs);
    assert_eq!(api.current_rv(LEASES).await, rev);
    let logs = plain(&p.logs());
    assert!(
        line(&logs, "previous run had revision continuity").contains("WARN"),
        "{logs}"
    );
}
