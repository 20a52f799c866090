//! Cluster mode, against real processes: several ephd members on loopback
//! (and, where a case compares, a three-member stock etcd). This module
//! holds what the cluster tests share; each file below is one subject.

pub(crate) mod catchup_load;
pub(crate) mod compaction;
pub(crate) mod data_dir;
pub(crate) mod follower_writes;
pub(crate) mod force;
pub(crate) mod framed;
pub(crate) mod held;
pub(crate) mod initial;
pub(crate) mod leader;
pub(crate) mod leaderless;
pub(crate) mod learner;
pub(crate) mod limits;
pub(crate) mod members;
pub(crate) mod move_leader;
pub(crate) mod peer_metrics;
pub(crate) mod quota;
pub(crate) mod rejoin;
pub(crate) mod removal;
pub(crate) mod replaced;
pub(crate) mod replication;
pub(crate) mod sections;
pub(crate) mod snapshot;
pub(crate) mod snapshot_chunks;
pub(crate) mod timeouts;
pub(crate) mod tls;
pub(crate) mod wal;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{PutRequest, RangeRequest, RangeResponse, StatusRequest};
use ephd::proto::mvccpb::KeyValue;

use crate::harness::{ClusterMember, EphdCluster, Server};
use crate::support::within;

/// Faster than etcd's defaults (100 ms, 1 s) so elections take less test
/// time; still the 1:5 ratio etcd requires at least. Revisions start at 1
/// as in etcd, so these tests see only their own keys (the initial
/// revision and `compact_rev_key` are tested in `cluster_snapshot.rs`).
pub(crate) const TIMING: &[&str] = &[
    "--heartbeat-interval=50",
    "--election-timeout=500",
    "--revision-continuity=false",
];

/// How long a leader election or the spread of a write may take at most.
pub(crate) const SETTLE: Duration = Duration::from_secs(15);

/// (member ID, leader ID, raft term) as member `m` reports them in Status.
pub(crate) async fn status(m: &ClusterMember) -> Option<(u64, u64, u64)> {
    let mut client = m.maintenance().await;
    let s = tokio::time::timeout(Duration::from_secs(2), client.status(StatusRequest {}))
        .await
        .ok()?
        .ok()?
        .into_inner();
    Some((s.header?.member_id, s.leader, s.raft_term))
}

/// Waits until every running member reports the same leader, which is one
/// of them (and not `not`); returns the leader's index and its member ID.
pub(crate) async fn agreed_leader(cluster: &EphdCluster, not: Option<u64>) -> (usize, u64) {
    let deadline = Instant::now() + SETTLE;
    let mut last = Vec::new();
    while Instant::now() < deadline {
        last.clear();
        for (i, m) in cluster.running() {
            last.push((i, status(m).await));
        }
        let leaders: BTreeSet<u64> = last.iter().map(|(_, s)| s.map_or(0, |s| s.1)).collect();
        if let (1, Some(&leader)) = (leaders.len(), leaders.iter().next()) {
            let at = last
                .iter()
                .find(|(_, s)| s.is_some_and(|s| s.0 == leader))
                .map(|(i, _)| *i);
            if let Some(i) = at.filter(|_| Some(leader) != not && leader != 0) {
                return (i, leader);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "no agreed leader within {SETTLE:?}: {last:?}\n{}",
        cluster.logs()
    );
}

/// Puts `key` through `m`, retrying while the member answers that it has
/// no leader yet (a fresh leader is not known to every member at once);
/// returns the revision of the put.
pub(crate) async fn put(m: &ClusterMember, key: &str, value: &str) -> i64 {
    let mut kv = m.kv().await;
    let deadline = Instant::now() + SETTLE;
    loop {
        let req = PutRequest {
            key: key.as_bytes().to_vec().into(),
            value: value.as_bytes().to_vec().into(),
            ..Default::default()
        };
        match within("put", kv.put(req)).await {
            Ok(r) => return r.into_inner().header.expect("header").revision,
            Err(s) if s.message() == "etcdserver: no leader" && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(s) => panic!("put {key} through {}: {s:?}", m.endpoint()),
        }
    }
}

/// A linearizable read of `key` through `m` (its header revision, and the
/// key if present).
pub(crate) async fn linearizable_get(m: &ClusterMember, key: &str) -> (i64, Option<KeyValue>) {
    let mut kv = m.kv().await;
    let req = RangeRequest {
        key: key.as_bytes().to_vec().into(),
        ..Default::default()
    };
    let resp = within("linearizable range", kv.range(req))
        .await
        .unwrap_or_else(|s| panic!("linearizable get {key} through {}: {s:?}", m.endpoint()))
        .into_inner();
    (
        resp.header.expect("header").revision,
        resp.kvs.into_iter().next(),
    )
}

/// A serializable (local) read of every key on `m`.
async fn all_keys(m: &ClusterMember) -> RangeResponse {
    let mut kv = m.kv().await;
    let req = RangeRequest {
        key: vec![0].into(),
        range_end: vec![0].into(),
        serializable: true,
        ..Default::default()
    };
    within("range", kv.range(req))
        .await
        .expect("range")
        .into_inner()
}

/// Waits until every running member has applied revision `rev`, then
/// checks that they all hold the very same keys, values and revisions.
pub(crate) async fn same_everywhere(cluster: &EphdCluster, rev: i64) -> Vec<KeyValue> {
    let deadline = Instant::now() + SETTLE;
    let mut views = Vec::new();
    for (i, m) in cluster.running() {
        let resp = loop {
            let resp = all_keys(m).await;
            let at = resp.header.as_ref().expect("header").revision;
            if at >= rev {
                break resp;
            }
            assert!(
                Instant::now() < deadline,
                "m{i} still at revision {at}, not {rev}\n{}",
                cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        views.push((i, resp.header.expect("header").revision, resp.kvs));
    }
    let (first, first_rev, first_kvs) = &views[0];
    for (i, at, kvs) in &views[1..] {
        assert_eq!(
            (at, kvs),
            (first_rev, first_kvs),
            "m{i} differs from m{first}"
        );
    }
    first_kvs.clone()
}
