//! `--data-dir` in cluster mode without a Raft log (`--wal none`;
//! `src/cluster/member/saved_state.rs`, `resume.rs`), which is also what a member whose
//! log is not trusted has: every member keeps its applied state on disk; a member restarted while
//! the cluster runs catches up from it and ignores its file; after a
//! whole-cluster stop the members started again resume the saved state by
//! themselves (keys, leases, revisions above the old ones), through the
//! first member, the others rejoining it; or one member started with
//! `--force-new-cluster` resumes its own file, and members added back get
//! it by snapshot.

use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{
    cluster_client::ClusterClient, LeaseGrantRequest, LeaseTimeToLiveRequest, PutRequest,
    RangeRequest,
};

use crate::cluster::members::{add, caught_up, members};
use crate::cluster::{agreed_leader, linearizable_get, put, same_everywhere, SETTLE};
use crate::harness::{free_port, ClusterMember, EphdCluster, Server};
use crate::support::within;

/// Revision continuity on (the default), so the resumed cluster's
/// revisions must be above the old ones; a short save interval so a
/// member killed without warning has a file too; no Raft log (a member
/// with one restarts from it, `cluster_wal.rs`).
fn args(dir: &str) -> Vec<String> {
    vec![
        "--wal=none".into(),
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

/// A three-member cluster with a data dir each, 20 keys written through
/// every member and a key on a 3600 s lease, the same everywhere; with
/// the last revision and the lease ID.
async fn written(root: &str) -> (EphdCluster, i64, i64) {
    let owned = args(root);
    let flags: Vec<&str> = owned.iter().map(String::as_str).collect();
    let cluster = EphdCluster::start(3, &flags);
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
    (cluster, last, granted.id)
}

/// SIGTERM to every member (each writes its state last), all at once.
fn stop_all(cluster: &mut EphdCluster, root: &str) {
    for i in 0..3 {
        cluster.terminate(i);
    }
    for i in 0..3 {
        assert!(
            cluster.reap(i, Duration::from_secs(20)),
            "m{i} did not stop cleanly"
        );
        assert!(!saved_files(root, i).is_empty(), "m{i} saved nothing");
    }
}

/// Waits until the three members are voters again, each published: the
/// others rejoined the resumed seed as learners and promoted themselves.
async fn voters_again(cluster: &EphdCluster) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let list = members(cluster.member(0).unwrap()).await;
        if list.len() == 3 && list.iter().all(|m| !m.is_learner && !m.name.is_empty()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "members never all voters again: {list:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every key `written` wrote, and the lease with its remaining time,
/// through `m`; the revision of a linearizable read, above `last`.
async fn resumed(m: &ClusterMember, last: i64, lease_id: i64) -> i64 {
    for i in 0..20 {
        let (_, kv) = linearizable_get(m, &format!("k{i:02}")).await;
        assert_eq!(kv.expect("resumed key").value, format!("v{i}").into_bytes());
    }
    let (at, kv) = linearizable_get(m, "leased").await;
    assert_eq!(kv.expect("leased key").lease, lease_id);
    assert!(at > last, "revision {at} above the old cluster's {last}");
    let mut lease = m.lease().await;
    let ttl = within(
        "ttl",
        lease.lease_time_to_live(LeaseTimeToLiveRequest {
            id: lease_id,
            keys: true,
        }),
    )
    .await
    .expect("ttl")
    .into_inner();
    assert!(
        ttl.ttl > 3000 && ttl.ttl <= 3600,
        "remaining {} of {} through {}",
        ttl.ttl,
        ttl.granted_ttl,
        m.endpoint()
    );
    at
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_cluster_started_again_resumes_its_saved_state_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let (mut cluster, _, lease_id) = written(&root).await;
    let (leader, _) = agreed_leader(&cluster, None).await;

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

    // The whole cluster stops and is started again as it was.
    stop_all(&mut cluster, &root);
    cluster
        .restart_together(&[0, 1, 2])
        .unwrap_or_else(|e| panic!("whole-cluster restart: {e}"));
    let at = resumed(cluster.member(0).unwrap(), last, lease_id).await;
    assert_eq!(
        serializable(cluster.member(0).unwrap(), "while-away").await,
        Some(b"1".to_vec())
    );
    // Every member is back as a voter (the others rejoined as learners
    // and promoted themselves), holding the same state; writes go on.
    voters_again(&cluster).await;
    let after = put(cluster.member(2).unwrap(), "after", "resumed").await;
    assert!(after > at);
    let kvs = same_everywhere(&cluster, after).await;
    assert_eq!(
        kvs.len(),
        20 + 4,
        "k00..k19, leased, while-away, after, compact_rev_key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_member_forced_resumes_its_own_saved_state_and_members_added_back_get_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let (mut cluster, last, lease_id) = written(&root).await;
    stop_all(&mut cluster, &root);

    // m1 (not the member that resumes by itself) forced: a one-member
    // cluster with every key, the lease and its remaining time, and
    // revisions above the old ones.
    cluster
        .start_member_with("m1", "new", Some(1), &["--force-new-cluster"])
        .unwrap_or_else(|e| panic!("forced resume: {e}"));
    let m1 = cluster.member(1).unwrap();
    assert_eq!(members(m1).await.len(), 1);
    resumed(m1, last, lease_id).await;
    let after = put(m1, "after", "resumed").await;

    // A member added back catches up by snapshot (the resumed log starts
    // after the saved index) and holds the same keys.
    let peer = free_port();
    let c = ClusterClient::new(m1.channel().await);
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

/// The Raft index of the saved state in member `i`'s data directory.
fn saved_index(root: &str, i: usize) -> u64 {
    let files = saved_files(root, i);
    assert_eq!(files.len(), 1, "m{i}: {files:?}");
    let bytes = std::fs::read(format!("{root}/m{i}/{}", files[0])).unwrap();
    ephd::mvcc::snapshot::decode(&bytes).unwrap().raft_index
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_resumes_from_a_newer_file_another_member_holds() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let owned = args(&root);
    let flags: Vec<&str> = owned.iter().map(String::as_str).collect();
    let mut cluster = EphdCluster::start(3, &flags);
    agreed_leader(&cluster, None).await;
    let mut last = 0;
    for i in 0..5 {
        last = put(cluster.member(i % 3).unwrap(), &format!("before{i}"), "old").await;
    }
    same_everywhere(&cluster, last).await;

    // The seed (m0) stops first: its file, written last, holds none of
    // what the two others accept next.
    cluster.terminate(0);
    assert!(cluster.reap(0, Duration::from_secs(20)), "m0 did not stop");
    agreed_leader(&cluster, None).await;
    for i in 0..10 {
        last = put(
            cluster.member(1 + i % 2).unwrap(),
            &format!("after{i}"),
            "new",
        )
        .await;
    }
    same_everywhere(&cluster, last).await;
    for i in [1, 2] {
        cluster.terminate(i);
    }
    for i in [1, 2] {
        assert!(
            cluster.reap(i, Duration::from_secs(20)),
            "m{i} did not stop"
        );
    }
    let seed = saved_index(&root, 0);
    assert!(
        seed < saved_index(&root, 1) && seed < saved_index(&root, 2),
        "the seed's file is the oldest"
    );

    // All three again: the seed takes the newer file and resumes from it.
    cluster
        .restart_together(&[0, 1, 2])
        .unwrap_or_else(|e| panic!("whole-cluster restart: {e}"));
    let m0 = cluster.member(0).unwrap();
    for i in 0..10 {
        let (at, kv) = linearizable_get(m0, &format!("after{i}")).await;
        assert_eq!(
            kv.expect("a key written after the seed stopped").value,
            b"new".to_vec()
        );
        assert!(at > last, "revision {at} above the old cluster's {last}");
    }
    let logs = cluster.logs();
    assert!(
        logs.contains("fetched and checked the newer saved state"),
        "{logs}"
    );
    // The seed's own older file is kept as the previous one.
    let names: Vec<String> = std::fs::read_dir(format!("{root}/m0"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().any(|n| n.ends_with(".snap.prev")), "{names:?}");
    // Every member holds every key (the others rejoined by snapshot) as a
    // voter again, and writes go on above the old revisions.
    voters_again(&cluster).await;
    let after = put(cluster.member(1).unwrap(), "resumed", "yes").await;
    assert!(after > last);
    let kvs = same_everywhere(&cluster, after).await;
    for i in 0..10 {
        let key = format!("after{i}").into_bytes();
        assert!(kvs.iter().any(|kv| kv.key == key), "after{i} missing");
    }
    assert_eq!(
        kvs.len(),
        5 + 10 + 2,
        "before*, after*, resumed, compact_rev_key"
    );
}
