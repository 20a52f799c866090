//! Maintenance.Snapshot and `--restore-snapshot`: `etcdctl snapshot save`
//! against a running ephd writes an etcd database (see `etcd_snapshot.rs`
//! for etcd's side), a new ephd started from it has the keys, values and
//! leases back with revisions above the saved ones, and a damaged file
//! refuses the start.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{GetOptions, LeaseTimeToLiveOptions, PutOptions};

use crate::cli;
use crate::harness::{connect_client, Ephd, Server};
use crate::support::rev;

/// What a streamed or saved snapshot holds (an etcd database and its
/// SHA-256).
fn decoded(bytes: &[u8]) -> ephd::persist::Restored {
    ephd::persist::etcd_db::read_bytes(bytes.to_vec(), ephd::persist::wall_clock_ms())
        .expect("intact")
}

/// Restarts land this far above the snapshot's revision at least
/// (`server::revisions::RESTORE_MARGIN`).
const RESTORE_MARGIN: i64 = 10_000_000;

fn arg(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_string()
}

/// Runs ephd with `args` until it exits (it must, within 10 s); returns
/// its exit code and everything it printed.
fn run_to_exit(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ephd"))
        .args(["--listen-client-urls", "http://127.0.0.1:0"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ephd");
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("ephd did not exit: {args:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// Puts `n` keys `key/<i>` with values of `size` bytes; returns the last
/// put's revision.
async fn fill(client: &mut etcd_client::Client, n: usize, size: usize) -> i64 {
    let mut last = 0;
    for i in 0..n {
        let value = format!("{i:0>size$}");
        let resp = client
            .put(format!("key/{i:04}"), value, None)
            .await
            .expect("put");
        last = rev(resp.header());
    }
    last
}

/// `etcdctl snapshot save` into `file`; asserts it succeeded.
fn etcdctl_save(server: &Ephd, file: &Path) -> cli::CmdOutput {
    let out = cli::run(
        &server.endpoint(),
        &["snapshot".to_string(), "save".to_string(), arg(file)],
        None,
    );
    assert_eq!(out.code, Some(0), "etcdctl snapshot save: {out:?}");
    assert!(out.stdout.contains("Snapshot saved at"), "{out:?}");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_snapshot_save_then_restore_brings_everything_back_above_its_revisions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("backup.db");
    let source = Ephd::start(&[]);
    let mut client = connect_client(&source.endpoint()).await;
    fill(&mut client, 50, 100).await;
    let lease = client.lease_grant(600, None).await.expect("grant").id();
    let put = client
        .put(
            "leased",
            "with a lease",
            Some(PutOptions::new().with_lease(lease)),
        )
        .await
        .expect("put leased");
    let saved_rev = rev(put.header());
    let before = client
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .expect("get all");

    etcdctl_save(&source, &file);
    let decoded = decoded(&std::fs::read(&file).expect("saved file"));
    assert_eq!(decoded.revision, saved_rev);
    assert_eq!(decoded.kvs.len(), before.kvs().len());

    // Writes after the snapshot are not in it.
    client.put("later", "x", None).await.expect("put later");

    let restored = Ephd::start(&["--restore-snapshot", &arg(&file)]);
    let mut client = connect_client(&restored.endpoint()).await;
    let after = client
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .expect("get all");
    let view = |r: &etcd_client::GetResponse| {
        r.kvs()
            .iter()
            .map(|kv| {
                (
                    kv.key().to_vec(),
                    kv.value().to_vec(),
                    kv.create_revision(),
                    kv.mod_revision(),
                    kv.version(),
                    kv.lease(),
                )
            })
            .filter(|kv| kv.0 != b"compact_rev_key")
            .collect::<Vec<_>>()
    };
    assert_eq!(
        view(&after),
        view(&before),
        "keys, values, revisions, leases"
    );
    assert!(
        rev(after.header()) >= saved_rev + RESTORE_MARGIN,
        "revisions continue above the saved ones: {} vs {saved_rev}",
        rev(after.header())
    );
    let next = client.put("new", "v", None).await.expect("put");
    assert!(rev(next.header()) > rev(after.header()));

    let ttl = client
        .lease_time_to_live(lease, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .expect("lease survives");
    assert_eq!(ttl.granted_ttl(), 600);
    assert!(
        (500..=600).contains(&ttl.ttl()),
        "remaining TTL: {}",
        ttl.ttl()
    );
    assert_eq!(ttl.keys(), [b"leased".to_vec()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_streams_32_kib_messages_counting_down_the_remaining_bytes() {
    let server = Ephd::start(&[]);
    let mut client = connect_client(&server.endpoint()).await;
    let saved_rev = fill(&mut client, 200, 1000).await;
    let mut stream = client.snapshot().await.expect("snapshot");
    let mut blobs: Vec<(u64, Vec<u8>)> = Vec::new();
    while let Some(msg) = stream.message().await.expect("message") {
        blobs.push((msg.remaining_bytes(), msg.blob().to_vec()));
    }
    assert!(blobs.len() > 4, "{} messages", blobs.len());
    // The database, then its SHA-256 in a message of its own, as etcd.
    let (last_remaining, sha) = blobs.pop().expect("the checksum");
    assert_eq!((last_remaining, sha.len()), (0, 32));
    let total: usize = blobs.iter().map(|(_, b)| b.len()).sum();
    let mut sent = 0;
    for (remaining, blob) in &blobs {
        assert!(blob.len() <= 32 * 1024 && !blob.is_empty());
        sent += blob.len();
        assert_eq!(*remaining as usize, total - sent);
    }
    let mut whole: Vec<u8> = blobs.into_iter().flat_map(|(_, b)| b).collect();
    whole.extend_from_slice(&sha);
    let decoded = decoded(&whole);
    assert!(decoded.revision >= saved_rev);
    assert_eq!(
        decoded
            .kvs
            .iter()
            .filter(|kv| kv.key.starts_with(b"key/"))
            .count(),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_or_foreign_snapshot_file_refuses_the_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("good.db");
    let source = Ephd::start(&[]);
    let mut client = connect_client(&source.endpoint()).await;
    fill(&mut client, 20, 100).await;
    etcdctl_save(&source, &good);
    let bytes = std::fs::read(&good).expect("read");

    let cut = dir.path().join("cut.db");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).expect("write");
    let flipped = dir.path().join("flipped.db");
    let mut damaged = bytes.clone();
    let mid = damaged.len() / 2;
    damaged[mid] ^= 0x01;
    std::fs::write(&flipped, &damaged).expect("write");
    let foreign = dir.path().join("etcd.db");
    std::fs::write(&foreign, [0u8; 4096]).expect("write");

    for (file, reason) in [
        (&cut, "cut short"),
        (&flipped, "SHA-256 after the database does not match"),
        (&foreign, "not an ephd snapshot"),
    ] {
        let (code, out) = run_to_exit(&["--restore-snapshot", &arg(file)]);
        assert_eq!(code, Some(2), "{out}");
        assert!(
            out.contains("refusing to start") && out.contains(reason),
            "{reason}: {out}"
        );
    }
    let (code, out) = run_to_exit(&["--restore-snapshot", &arg(&dir.path().join("none.db"))]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("cannot read --restore-snapshot"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_into_a_data_dir_becomes_its_first_generation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("backup.db");
    let data = dir.path().join("data");
    let source = Ephd::start(&[]);
    let mut client = connect_client(&source.endpoint()).await;
    fill(&mut client, 10, 10).await;
    etcdctl_save(&source, &file);

    let first = Ephd::start(&["--data-dir", &arg(&data), "--restore-snapshot", &arg(&file)]);
    let generations: Vec<_> = std::fs::read_dir(&data)
        .expect("data dir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .filter(|n| n.starts_with("ephd.snap.0"))
        .collect();
    assert_eq!(generations.len(), 1, "{generations:?}");
    drop(first);

    // The flag still given: the directory has moved on, so it is refused.
    let (code, out) = run_to_exit(&["--data-dir", &arg(&data), "--restore-snapshot", &arg(&file)]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("already holds a snapshot"), "{out}");

    // Without it, the directory's state comes back.
    let next = Ephd::start(&["--data-dir", &arg(&data)]);
    let mut client = connect_client(&next.endpoint()).await;
    let keys = client
        .get(
            "key/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("count");
    assert_eq!(keys.count(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_compat_restores_at_the_files_revision_and_etcds_tools_take_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("backup.db");
    let source = Ephd::start(&["--etcd-compat"]);
    let mut client = connect_client(&source.endpoint()).await;
    let saved_rev = fill(&mut client, 5, 10).await;
    etcdctl_save(&source, &file);

    let restored = Ephd::start(&["--etcd-compat", "--restore-snapshot", &arg(&file)]);
    let mut client = connect_client(&restored.endpoint()).await;
    let all = client
        .get("key/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("get");
    assert_eq!(all.kvs().len(), 5);
    assert_eq!(rev(all.header()), saved_rev, "as etcdctl snapshot restore");
    let next = client.put("new", "v", None).await.expect("put");
    assert_eq!(rev(next.header()), saved_rev + 1);

    // etcd's tools take the file (etcd_snapshot.rs restores it in etcd).
    let status = std::process::Command::new(crate::references::binary("etcdutl-3.6"))
        .args(["snapshot", "status", &arg(&file)])
        .output()
        .expect("run etcdutl");
    assert!(status.status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_cluster_member_snapshots_its_applied_state_and_streams_ranges() {
    use ephd::proto::etcdserverpb::{kv_client::KvClient, RangeRequest};
    let cluster = crate::harness::EphdCluster::start(
        3,
        &["--heartbeat-interval=50", "--election-timeout=500"],
    );
    let members: Vec<_> = cluster.running().into_iter().map(|(_, m)| m).collect();
    let mut first = connect_client(&members[0].endpoint()).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while first.put("replicated", "v", None).await.is_err() {
        assert!(Instant::now() < deadline, "no leader elected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for m in &members {
        // A linearizable RangeStream on any member sees the write at once.
        let channel = crate::harness::connect_channel(&m.endpoint()).await;
        let mut stream = KvClient::new(channel)
            .range_stream(RangeRequest {
                key: b"replicated".to_vec().into(),
                ..Default::default()
            })
            .await
            .expect("range_stream")
            .into_inner();
        let last = stream.message().await.expect("message").expect("one");
        let got = last.range_response.expect("range_response");
        assert_eq!(got.count, 1, "{}", m.endpoint());
        assert_eq!(got.kvs[0].value.as_ref(), b"v");

        // Its snapshot holds what it has applied (the write, once there).
        let mut client = connect_client(&m.endpoint()).await;
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let mut stream = client.snapshot().await.expect("snapshot");
            let mut bytes = Vec::new();
            while let Some(msg) = stream.message().await.expect("message") {
                bytes.extend_from_slice(msg.blob());
            }
            let snap = decoded(&bytes);
            if snap.kvs.iter().any(|kv| kv.key.as_ref() == b"replicated") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} never applied it",
                m.endpoint()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_go_on_while_a_snapshot_streams_and_stay_out_of_it() {
    let server = Ephd::start(&[]);
    let mut client = connect_client(&server.endpoint()).await;
    let saved_rev = fill(&mut client, 500, 10_000).await;
    let mut stream = client.snapshot().await.expect("snapshot");
    let mut bytes = stream
        .message()
        .await
        .expect("message")
        .expect("first")
        .blob()
        .to_vec();
    // The stream is open and unread: writes are not held up by it.
    let mut writer = connect_client(&server.endpoint()).await;
    for i in 0..20 {
        tokio::time::timeout(
            Duration::from_secs(5),
            writer.put(format!("during/{i}"), "x", None),
        )
        .await
        .expect("a write during the snapshot is not held up")
        .expect("put");
    }
    while let Some(msg) = stream.message().await.expect("message") {
        bytes.extend_from_slice(msg.blob());
    }
    let snap = decoded(&bytes);
    assert_eq!(snap.revision, saved_rev, "the revision it was taken at");
    assert!(
        !snap.kvs.iter().any(|kv| kv.key.starts_with(b"during/")),
        "later writes are not in it"
    );
    assert_eq!(
        snap.kvs
            .iter()
            .filter(|kv| kv.key.starts_with(b"key/"))
            .count(),
        500
    );
}
