//! Catching up a member under load (issue 10, failover): a member restarted
//! without its state while a writer keeps writing through the leader, with
//! a store far larger than the kept log, so it needs a snapshot. It must
//! catch up with one snapshot and the log after it (not chase the leader
//! with snapshot after snapshot, each compacted away before it was used),
//! the leader must keep its term throughout (no election, no refused or
//! timed-out write), it must become a voter again, and every acknowledged
//! write must be on every member at the end.
//!
//! The writes go on until the new member has applied writes made after it
//! started: on the code before this test (the log compacted past each
//! snapshot while it was being encoded, and heartbeats queued behind it),
//! the leader dropped every snapshot it built and the member never caught
//! up while the writer wrote, so this waited until its hang guard.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{PutRequest, RangeRequest};

use crate::cluster::members::members;
use crate::cluster::snapshot::metric;
use crate::cluster::{agreed_leader, status};
use crate::harness::{EphdCluster, Server};

/// A small log (compacted every 50 entries, 10 kept) against a store of
/// tens of MB: encoding and sending its snapshot takes longer than the
/// writer needs to fill the log again.
const ARGS: &[&str] = &[
    "--heartbeat-interval=50",
    "--election-timeout=500",
    "--snapshot-count=50",
    "--experimental-snapshot-catchup-entries=10",
    "--revision-continuity=false",
];
/// History written before the restart: this many puts of [`BIG`] bytes
/// over half as many keys (two versions each).
const PRELOAD: usize = 400;
const BIG: usize = 128 * 1024;
/// Writes the new member must have applied, counted from its start, before
/// the writer stops.
const AFTER_START: usize = 300;
/// Hang guard only (no timing is asserted).
const GUARD: Duration = Duration::from_secs(180);

/// What the writer saw: acknowledged (key, revision) and failures.
#[derive(Default)]
struct Writes {
    acked: Vec<(String, i64)>,
    failed: Vec<String>,
}

/// Puts small unique keys through `kv` until `stop`, a few milliseconds
/// apart, recording every answer.
async fn writer(
    mut kv: ephd::proto::etcdserverpb::kv_client::KvClient<tonic::transport::Channel>,
    stop: Arc<AtomicBool>,
    out: Arc<parking_lot::Mutex<Writes>>,
) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let key = format!("w/{n:08}");
        n += 1;
        let req = PutRequest {
            key: key.clone().into_bytes().into(),
            value: vec![b'v'; 1024].into(),
            ..Default::default()
        };
        match tokio::time::timeout(Duration::from_secs(10), kv.put(req)).await {
            Ok(Ok(r)) => {
                let rev = r.into_inner().header.expect("header").revision;
                out.lock().acked.push((key, rev));
            }
            Ok(Err(s)) => out.lock().failed.push(format!("{key}: {s:?}")),
            Err(_) => out.lock().failed.push(format!("{key}: no answer in 10 s")),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The revision of `key` on `m`'s local store, if it has it.
async fn local_revision(m: &crate::harness::ClusterMember, key: &str) -> Option<i64> {
    let req = RangeRequest {
        key: key.as_bytes().to_vec().into(),
        serializable: true,
        ..Default::default()
    };
    let mut kv = m.kv().await;
    let r = tokio::time::timeout(Duration::from_secs(2), kv.range(req))
        .await
        .ok()?
        .ok()?
        .into_inner();
    r.kvs.first().map(|kv| kv.mod_revision)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_restarted_without_state_catches_up_a_large_store_under_writes_with_one_snapshot()
{
    let mut cluster = EphdCluster::start(3, ARGS);
    let (li, leader_id) = agreed_leader(&cluster, None).await;
    let l = cluster.member(li).unwrap();
    let mut kv = l.kv().await;
    for i in 0..PRELOAD {
        let req = PutRequest {
            key: format!("big/{:04}", i % (PRELOAD / 2)).into_bytes().into(),
            value: vec![b'a' + (i % 26) as u8; BIG].into(),
            ..Default::default()
        };
        crate::support::within("preload put", kv.put(req))
            .await
            .expect("preload put");
    }
    let (_, _, term) = status(l).await.expect("leader status");

    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(parking_lot::Mutex::new(Writes::default()));
    let task = tokio::spawn(writer(kv.clone(), stop.clone(), writes.clone()));

    // A follower dies and comes back without its state, flags unchanged:
    // it rejoins by itself (a learner under a new ID, then promoted).
    let fi = (li + 1) % 3;
    let (old_id, _, _) = status(cluster.member(fi).unwrap()).await.unwrap();
    cluster.kill(fi);
    let started_at = writes.lock().acked.len();
    cluster
        .start_member(&format!("m{fi}"), "new", Some(fi))
        .unwrap_or_else(|e| panic!("m{fi} did not rejoin: {e}"));
    let url = format!("http://127.0.0.1:{}", cluster.peer_port(fi));

    // Until it is a voter and has applied writes made after it started,
    // while the writer goes on; the leader keeps its term all along.
    let deadline = Instant::now() + GUARD;
    loop {
        let l = cluster.member(li).unwrap();
        // (A status that does not answer in time on a busy machine is
        // asked again at the next round.)
        if let Some((_, lead, now_term)) = status(l).await {
            assert_eq!(
                (lead, now_term),
                (leader_id, term),
                "the leader changed during the catch-up\n{}",
                cluster.logs()
            );
        }
        let target = writes.lock().acked.get(started_at + AFTER_START).cloned();
        let applied = match &target {
            Some((key, rev)) => {
                local_revision(cluster.member(fi).unwrap(), key).await == Some(*rev)
            }
            None => false,
        };
        let list = members(l).await;
        let voter = list
            .iter()
            .any(|m| m.peer_ur_ls == [url.clone()] && !m.is_learner && !m.name.is_empty());
        if applied && voter {
            assert!(list.iter().all(|m| m.id != old_id), "{list:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "m{fi} did not catch up under writes within {GUARD:?} (voter: {voter}, \
             snapshots installed: {})\n{}",
            metric(
                cluster.member(fi).unwrap(),
                "ephd_raft_snapshots_installed_total"
            ),
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    task.await.expect("writer");

    let installed = metric(
        cluster.member(fi).unwrap(),
        "ephd_raft_snapshots_installed_total",
    );
    assert_eq!(installed, 1, "snapshots installed by the new member");
    let (_, lead, end_term) = status(cluster.member(li).unwrap()).await.unwrap();
    assert_eq!((lead, end_term), (leader_id, term), "the leader changed");
    let w = std::mem::take(&mut *writes.lock());
    assert!(w.failed.is_empty(), "writes failed: {:?}", w.failed);
    let (last_key, last) = w.acked.last().cloned().expect("acknowledged writes");
    let mut views = Vec::new();
    for (i, m) in cluster.running() {
        let deadline = Instant::now() + GUARD;
        while local_revision(m, &last_key).await != Some(last) {
            assert!(Instant::now() < deadline, "m{i} never applied {last_key}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        views.push((i, keys(m).await));
    }
    for (i, view) in &views[1..] {
        assert!(*view == views[0].1, "m{i} differs from m{}", views[0].0);
    }
    let written = &views[0].1;
    for (key, rev) in &w.acked {
        let found = written.iter().find(|(k, _)| k.as_slice() == key.as_bytes());
        assert_eq!(found.map(|(_, r)| *r), Some(*rev), "{key} (rev {rev})");
    }
}

/// Every key on `m`'s local store with its revision (no values: the
/// preloaded ones are large).
async fn keys(m: &crate::harness::ClusterMember) -> Vec<(Vec<u8>, i64)> {
    let req = RangeRequest {
        key: vec![0].into(),
        range_end: vec![0].into(),
        serializable: true,
        keys_only: true,
        ..Default::default()
    };
    let mut kv = m.kv().await;
    crate::support::within("range", kv.range(req))
        .await
        .expect("range")
        .into_inner()
        .kvs
        .into_iter()
        .map(|kv| (kv.key.to_vec(), kv.mod_revision))
        .collect()
}
