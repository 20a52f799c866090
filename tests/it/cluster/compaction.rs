//! Auto-compaction in cluster mode: every member samples its revisions,
//! only the leader proposes the compaction, and every member applies it at
//! the same point of the log, so all members end up with the same
//! compacted revision and the same history (HashKV agrees), and old
//! revisions are gone through every member alike.

use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{HashKvRequest, RangeRequest};

use crate::cluster::{agreed_leader, put, same_everywhere, TIMING};
use crate::harness::{EphdCluster, Server};

/// (compact revision, hash) of member `m`'s history up to `rev`.
async fn hash_kv(m: &impl Server, rev: i64) -> (i64, u32) {
    let mut c = m.maintenance().await;
    let r = c
        .hash_kv(HashKvRequest { revision: rev })
        .await
        .expect("hashkv")
        .into_inner();
    (r.compact_revision, r.hash)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_auto_compacts_for_every_member() {
    let mut args: Vec<&str> = TIMING.to_vec();
    args.extend([
        "--auto-compaction-mode=periodic",
        "--auto-compaction-retention=1s",
    ]);
    let cluster = EphdCluster::start(3, &args);
    let (leader, _) = agreed_leader(&cluster, None).await;
    let mut last = 0;
    for i in 0..5 {
        last = put(cluster.member(i % 3).unwrap(), &format!("k{i}"), "v").await;
    }
    same_everywhere(&cluster, last).await;

    // Within a few retention periods, every member reports the same
    // compacted revision above 1, and the same hash of the history kept.
    let deadline = Instant::now() + Duration::from_secs(20);
    let agreed = loop {
        let mut seen = Vec::new();
        for (_, m) in cluster.running() {
            seen.push(hash_kv(m, last).await);
        }
        if seen[0].0 > 1 && seen.iter().all(|s| *s == seen[0]) {
            break seen[0];
        }
        assert!(
            Instant::now() < deadline,
            "members never agreed on a compaction: {seen:?}\n{}",
            cluster.logs()
        );
        // Keep history moving, as a real workload does.
        last = put(cluster.member(leader).unwrap(), "tick", "v").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    // Below the compacted revision every member answers etcd's error.
    for (i, m) in cluster.running() {
        let mut kv = m.kv().await;
        let err = kv
            .range(RangeRequest {
                key: b"k0".to_vec().into(),
                revision: agreed.0 - 1,
                ..Default::default()
            })
            .await
            .expect_err("compacted revision");
        assert_eq!(
            err.message(),
            "etcdserver: mvcc: required revision has been compacted",
            "m{i}"
        );
    }
    // The compaction was the compactor's (no client compacted here).
    let logs = cluster.logs();
    let compactions = logs.matches("auto-compacted").count();
    assert!(compactions >= 1, "{logs}");
}
