//! The write-ahead log through the real binary: ephd killed with SIGKILL
//! in the middle of a write load comes back with every write it
//! acknowledged, at the revision it acknowledged, and its revisions go on
//! from there; a torn tail is cut and the rest replayed; a clean stop
//! comes back at the same revision.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb as pb;

use super::{arg, plain, Proc};
use crate::harness::{connect_channel, free_port};
use crate::kubernetes::apiserver::b;

/// Rounds of kill and restart; `EPHD_WAL_KILL_ROUNDS=20` for the long run.
fn rounds() -> usize {
    std::env::var("EPHD_WAL_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

async fn kv(endpoint: &str) -> pb::kv_client::KvClient<tonic::transport::Channel> {
    pb::kv_client::KvClient::new(connect_channel(endpoint).await)
}

/// The newest acknowledged write of each key: (value, revision).
type Acked = Arc<Mutex<BTreeMap<String, (u64, i64)>>>;

/// Writers putting `w<writer>/k<n>` with growing values until `stop`,
/// recording each acknowledged put.
fn write_load(endpoint: String, writers: usize, acked: Acked) -> Vec<tokio::task::JoinHandle<()>> {
    (0..writers)
        .map(|w| {
            let (endpoint, acked) = (endpoint.clone(), acked.clone());
            tokio::spawn(async move {
                let mut client = kv(&endpoint).await;
                for seq in 0u64.. {
                    let key = format!("wal/w{w}/k{}", seq % 40);
                    let put = client.put(pb::PutRequest {
                        key: b(&key),
                        value: seq.to_string().into_bytes().into(),
                        ..Default::default()
                    });
                    match tokio::time::timeout(Duration::from_secs(2), put).await {
                        Ok(Ok(resp)) => {
                            let rev = resp.into_inner().header.expect("header").revision;
                            acked.lock().unwrap().insert(key, (seq, rev));
                        }
                        // Killed: the load is over.
                        _ => return,
                    }
                }
            })
        })
        .collect()
}

/// Every key under `wal/` with its value and mod revision.
async fn stored(endpoint: &str) -> BTreeMap<String, (u64, i64)> {
    let resp = kv(endpoint)
        .await
        .range(pb::RangeRequest {
            key: b("wal/"),
            range_end: b("wal0"),
            ..Default::default()
        })
        .await
        .expect("range")
        .into_inner();
    resp.kvs
        .into_iter()
        .map(|kv| {
            let key = String::from_utf8(kv.key.to_vec()).expect("utf-8 key");
            let value: u64 = std::str::from_utf8(&kv.value)
                .expect("utf-8 value")
                .parse()
                .expect("a number");
            (key, (value, kv.mod_revision))
        })
        .collect()
}

async fn put(endpoint: &str, key: &str) -> i64 {
    kv(endpoint)
        .await
        .put(pb::PutRequest {
            key: b(key),
            value: b("0"),
            ..Default::default()
        })
        .await
        .expect("put")
        .into_inner()
        .header
        .expect("header")
        .revision
}

/// Waits (bounded) until `acked` holds `n` writes.
async fn until_acked(acked: &Acked, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while acked.lock().unwrap().values().count() < n {
        assert!(
            Instant::now() < deadline,
            "the load acknowledged too few writes"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_load_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let args = ["--data-dir", &arg(dir.path())];
    // Every acknowledged write of every round: the newest per key.
    let mut expected: BTreeMap<String, (u64, i64)> = BTreeMap::new();
    let mut newest_acked = 0;
    for round in 0..rounds() {
        let mut p = Proc::start(port, &args).await;
        let now = stored(&p.endpoint()).await;
        for (key, (value, rev)) in &expected {
            let (got, got_rev) = now
                .get(key)
                .unwrap_or_else(|| panic!("round {round}: {key} lost"));
            assert!(
                got > value || (got == value && got_rev == rev),
                "round {round}: {key} holds {got}@{got_rev}, {value}@{rev} was acknowledged"
            );
        }
        let first = put(&p.endpoint(), "wal-probe").await;
        assert!(first > newest_acked, "round {round}: revision went back");
        if round > 0 {
            assert!(
                plain(&p.logs()).contains("revisions continue where they stopped"),
                "round {round}: the log was trusted:\n{}",
                plain(&p.logs())
            );
        }
        // The writes of this round start from what the store holds, so a
        // write that landed unacknowledged last round is not expected back.
        expected = now;
        let acked: Acked = Arc::new(Mutex::new(BTreeMap::new()));
        let load_started = Instant::now();
        let load = write_load(p.endpoint(), 8, acked.clone());
        until_acked(&acked, 200).await;
        // Let the load run on a little; then SIGKILL, writes in flight.
        tokio::time::sleep(Duration::from_millis(100 + 70 * round as u64)).await;
        p.child.kill().expect("SIGKILL");
        let _ = p.wait_exit(Duration::from_secs(5)).await;
        for l in load {
            let _ = l.await;
        }
        let acked = acked.lock().unwrap().clone();
        assert!(acked.len() >= 200);
        let newest = acked.values().map(|(_, rev)| *rev).max().unwrap();
        // Revisions acknowledged this round, per second of load: the rate
        // the kill interrupted.
        let first_rev = first;
        eprintln!(
            "round {round}: killed after {} acknowledged writes in {:?} ({:.0}/s)",
            newest - first_rev,
            load_started.elapsed(),
            (newest - first_rev) as f64 / load_started.elapsed().as_secs_f64()
        );
        newest_acked = newest;
        expected.extend(acked);
    }
    let p = Proc::start(port, &args).await;
    let now = stored(&p.endpoint()).await;
    for (key, (value, rev)) in &expected {
        let (got, got_rev) = now.get(key).unwrap_or_else(|| panic!("{key} lost"));
        assert!(
            got > value || (got == value && got_rev == rev),
            "{key} holds {got}@{got_rev}, {value}@{rev} was acknowledged"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_comes_back_at_the_same_revision() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let args = ["--data-dir", &arg(dir.path())];
    let mut p = Proc::start(port, &args).await;
    let last = put(&p.endpoint(), "before").await;
    p.sigterm().await;
    let p = Proc::start(port, &args).await;
    assert_eq!(put(&p.endpoint(), "after").await, last + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_tail_is_cut_and_every_whole_record_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let args = ["--data-dir", &arg(dir.path())];
    let mut p = Proc::start(port, &args).await;
    let mut last = 0;
    for i in 0..20 {
        last = put(&p.endpoint(), &format!("wal/t{i}")).await;
    }
    p.child.kill().expect("SIGKILL");
    let _ = p.wait_exit(Duration::from_secs(5)).await;
    // Half a record more, as a crash in the middle of a write leaves it.
    let wal = dir.path().join("wal");
    let mut segments: Vec<_> = std::fs::read_dir(&wal)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    segments.sort();
    let newest = segments.last().expect("a segment");
    let mut bytes = std::fs::read(newest).unwrap();
    bytes.extend_from_slice(&[40, 0, 0, 0, 1, 2, 3, 4, 1, 9]);
    std::fs::write(newest, &bytes).unwrap();

    let p = Proc::start(port, &args).await;
    let logs = plain(&p.logs());
    assert!(logs.contains("cut a torn tail"), "{logs}");
    assert!(
        logs.contains("revisions continue where they stopped"),
        "{logs}"
    );
    assert_eq!(stored(&p.endpoint()).await.len(), 20);
    assert_eq!(put(&p.endpoint(), "next").await, last + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_newest_snapshot_damaged_the_older_one_and_the_log_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let args = ["--data-dir", &arg(dir.path())];
    let mut last = 0;
    // Two runs stopped cleanly: two snapshot generations.
    for run in 0..2 {
        let mut p = Proc::start(port, &args).await;
        for i in 0..10 {
            last = put(&p.endpoint(), &format!("wal/r{run}-{i}")).await;
        }
        p.sigterm().await;
    }
    let mut generations: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("ephd.snap.") && !n.contains("tmp"))
        })
        .collect();
    generations.sort();
    let newest = generations.last().expect("a snapshot");
    let mut bytes = std::fs::read(newest).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x20;
    std::fs::write(newest, bytes).unwrap();

    let p = Proc::start(port, &args).await;
    let logs = plain(&p.logs());
    assert!(logs.contains("moved aside"), "{logs}");
    assert_eq!(stored(&p.endpoint()).await.len(), 20, "{logs}");
    assert!(
        logs.contains("revisions continue where they stopped"),
        "{logs}"
    );
    assert_eq!(put(&p.endpoint(), "next").await, last + 1);
}

/// The value of an unlabelled series in a `/metrics` body.
fn series(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_reports_its_writes_and_syncs_under_etcds_metric_names() {
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    let metrics_url = format!("http://127.0.0.1:{metrics_port}");
    let p = Proc::start(
        free_port(),
        &[
            "--data-dir",
            &arg(dir.path()),
            "--wal",
            "fsync",
            "--listen-metrics-urls",
            &metrics_url,
        ],
    )
    .await;
    for i in 0..10 {
        put(&p.endpoint(), &format!("wal/m{i}")).await;
    }
    let (_, body) = crate::operations::http_get(metrics_port, "/metrics");
    assert!(
        series(&body, "etcd_disk_wal_write_bytes_total") > 0.0,
        "{body}"
    );
    assert!(
        series(&body, "etcd_disk_wal_fsync_duration_seconds_count") >= 10.0,
        "one sync per acknowledged batch at least: {body}"
    );
}
