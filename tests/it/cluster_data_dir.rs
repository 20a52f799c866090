//! `--data-dir` in cluster mode (`src/cluster/saved.rs`): every member keeps
//! its applied state on disk; a member restarted while the cluster runs
//! catches up from it and ignores its file; after a whole-cluster stop the
//! members refuse to form the cluster anew empty, saying what each holds,
//! and the one started with `--force-new-cluster` resumes the saved state
//! (keys, leases, revisions above the old ones), which members added back
//! get by snapshot.

use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{
    cluster_client::ClusterClient, LeaseGrantRequest, LeaseTimeToLiveRequest, PutRequest,
    RangeRequest,
};

use crate::cluster::{agreed_leader, linearizable_get, put, same_everywhere, SETTLE};
use crate::cluster_members::{add, caught_up, members};
use crate::harness::{free_port, ClusterMember, EphdCluster, Server};
use crate::support::within;

/// Revision continuity on (the default), so the resumed cluster's
/// revisions must be above the old ones; a short save interval so a
/// member killed without warning has a file too.
fn args(dir: &str) -> Vec<String> {
    vec![
        "--heartbeat-interval=50".into(),
        "--election-timeout=500".into(),
        "--snapshot-interval=1s".into(),
        format!("--data-dir={dir}/{{name}}"),
    ]
}

/// The saved-state files in member `i`'s data directory.
fn saved_files(root: &str, i: usize) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(format!("{root}/m{i}")) else {
        return Vec::new();
    };
    dir.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.starts_with("ephd-cluster-") && f.ends_with(".snap"))
        .collect()
}

async fn serializable(m: &ClusterMember, key: &str) -> Option<Vec<u8>> {
    let mut kv = m.kv().await;
    let req = RangeRequest {
        key: key.as_bytes().to_vec().into(),
        serializable: true,
        ..Default::default()
    };
    let r = within("range", kv.range(req)).await.expect("range");
    r.into_inner()
        .kvs
        .into_iter()
        .next()
        .map(|kv| kv.value.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_cluster_resumes_its_saved_state_through_one_forced_member() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let owned = args(&root);
    let flags: Vec<&str> = owned.iter().map(String::as_str).collect();
    let mut cluster = EphdCluster::start(3, &flags);
    let (leader, _) = agreed_leader(&cluster, None).await;
    let lead = cluster.member(leader).unwrap();
    let mut last = 0;
    for i in 0..20 {
        let via = cluster.member(i % 3).unwrap();
        last = put(via, &format!("k{i:02}"), &format!("v{i}")).await;
    }
    let mut lease = lead.lease().await;
    let granted = within(
        "grant",
        lease.lease_grant(LeaseGrantRequest { ttl: 3600, id: 0 }),
    )
    .await
    .expect("grant")
    .into_inner();
    let mut kv = lead.kv().await;
    let leased = within(
        "put",
        kv.put(PutRequest {
            key: b"leased".to_vec().into(),
            value: b"yes".to_vec().into(),
            lease: granted.id,
            ..Default::default()
        }),
    )
    .await
    .expect("leased put")
    .into_inner()
    .header
    .unwrap()
    .revision;
    last = last.max(leased);
    same_everywhere(&cluster, last).await;

    // One member killed while the cluster runs: restarted with its data
    // dir, it catches up from the cluster (under a new ID), not its file.
    let other = (leader + 1) % 3;
    let deadline = Instant::now() + SETTLE;
    while saved_files(&root, other).is_empty() {
        assert!(Instant::now() < deadline, "m{other} never saved its state");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.kill(other);
    put(cluster.member(leader).unwrap(), "while-away", "1").await;
    cluster
        .start_member(&format!("m{other}"), "new", Some(other))
        .unwrap_or_else(|e| panic!("restart beside a running cluster: {e}"));
    let back = cluster.member(other).unwrap();
    let deadline = Instant::now() + SETTLE;
    while serializable(back, "while-away").await.is_none() {
        assert!(
            Instant::now() < deadline,
            "never caught up\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let logs = cluster.logs();
    assert!(logs.contains("its saved state is not used"), "{logs}");
    let (last, _) = linearizable_get(cluster.member(leader).unwrap(), "while-away").await;
    same_everywhere(&cluster, last).await;

    // The whole cluster stops (SIGTERM: each member writes its state).
    for i in 0..3 {
        cluster.terminate(i);
    }
    for i in 0..3 {
        assert!(
            cluster.reap(i, Duration::from_secs(20)),
            "m{i} did not stop cleanly"
        );
        assert!(!saved_files(&root, i).is_empty(), "m{i} saved nothing");
    }

    // Started again as before, a member refuses: forming the cluster anew
    // would drop the saved state. It says what it holds and the way out.
    let refused = cluster
        .start_member("m0", "new", Some(0))
        .expect_err("a member holding saved state must not form an empty cluster");
    for says in [
        "holds a saved state of the cluster",
        &format!("revision {last}"),
        "with --force-new-cluster",
        "--initial-cluster-state existing",
    ] {
        assert!(refused.contains(says), "{says:?} not in: {refused}");
    }

    // m0 forced: a one-member cluster with every key, the lease and its
    // remaining time, and revisions above the old ones.
    cluster
        .start_member_with("m0", "new", Some(0), &["--force-new-cluster"])
        .unwrap_or_else(|e| panic!("forced resume: {e}"));
    let m0 = cluster.member(0).unwrap();
    assert_eq!(members(m0).await.len(), 1);
    for i in 0..20 {
        let (_, kv) = linearizable_get(m0, &format!("k{i:02}")).await;
        assert_eq!(kv.expect("resumed key").value, format!("v{i}").into_bytes());
    }
    let (at, kv) = linearizable_get(m0, "leased").await;
    let kv = kv.expect("leased key");
    assert_eq!(kv.lease, granted.id);
    assert!(at > last, "revision {at} above the old cluster's {last}");
    let mut lease = m0.lease().await;
    let ttl = within(
        "ttl",
        lease.lease_time_to_live(LeaseTimeToLiveRequest {
            id: granted.id,
            keys: true,
        }),
    )
    .await
    .expect("ttl")
    .into_inner();
    assert!(ttl.ttl > 3000 && ttl.ttl <= 3600, "remaining {}", ttl.ttl);
    let after = put(m0, "after", "resumed").await;
    assert!(after > last);

    // A member added back catches up by snapshot (the resumed log starts
    // after the saved index) and holds the same keys.
    let peer = free_port();
    let c = ClusterClient::new(m0.channel().await);
    add(&c, &format!("http://127.0.0.1:{peer}"), false)
        .await
        .unwrap_or_else(|s| panic!("member add: {s:?}"));
    let j = cluster
        .start_joining("m3", peer)
        .unwrap_or_else(|e| panic!("join: {e}"));
    let joined = cluster.member(j).unwrap();
    caught_up(joined, "after", after).await;
    for i in 0..20 {
        assert_eq!(
            serializable(joined, &format!("k{i:02}")).await,
            Some(format!("v{i}").into_bytes())
        );
    }
    assert_eq!(serializable(joined, "leased").await, Some(b"yes".to_vec()));
}
