//! Three ephd processes on loopback form one cluster. Writes
//! through any member are applied by every member at the same revision,
//! linearizable reads through any member see every acknowledged write, and
//! after the leader is killed the other two elect a new leader and keep
//! accepting writes. Every kind of write through a follower (lease grants
//! with server-chosen IDs, txn, delete, revoke, compaction) leaves every
//! member the same, and a lease expiry decided by the leader is applied
//! everywhere at one revision.

use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{
    compare, request_op, CompactionRequest, Compare, DeleteRangeRequest, LeaseGrantRequest,
    LeaseLeasesRequest, LeaseRevokeRequest, MemberListRequest, PutRequest, RangeRequest, RequestOp,
    TxnRequest,
};

use super::*;
use crate::harness::{ClusterMember, EphdCluster, Server};
use crate::support::within;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_replicate_writes_and_survive_the_loss_of_the_leader() {
    let mut cluster = EphdCluster::start(3, TIMING);

    // Every member sees the same members, with the same IDs.
    let mut lists = Vec::new();
    for (_, m) in cluster.running() {
        let mut c = m.cluster().await;
        let list = within("member list", c.member_list(MemberListRequest::default()))
            .await
            .expect("member list")
            .into_inner();
        let mut ids: Vec<(u64, String)> =
            list.members.into_iter().map(|m| (m.id, m.name)).collect();
        ids.sort();
        lists.push(ids);
    }
    assert_eq!(lists[0].len(), 3, "{lists:?}");
    assert!(lists.iter().all(|l| *l == lists[0]), "{lists:?}");

    let (leader, leader_id) = agreed_leader(&cluster, None).await;

    // A put through each member, the leader and both followers: each gets
    // the next revision, and every member applies it.
    let mut last = 0;
    for i in 0..3 {
        let m = cluster.member(i).unwrap();
        let rev = put(m, &format!("key-{i}"), &format!("value-{i}")).await;
        assert!(rev > last, "revisions go up: {rev} after {last}");
        last = rev;
        // Linearizable: once acknowledged, every member's linearizable read
        // sees it at once (each waits for its read index to be applied).
        for (j, other) in cluster.running() {
            let (at, kv) = linearizable_get(other, &format!("key-{i}")).await;
            assert!(at >= rev, "m{j} answered at revision {at}, before {rev}");
            assert_eq!(kv.map(|kv| kv.mod_revision), Some(rev), "m{j}");
        }
        let kvs = same_everywhere(&cluster, rev).await;
        let kv = kvs
            .iter()
            .find(|kv| kv.key == format!("key-{i}").as_bytes())
            .unwrap_or_else(|| panic!("key-{i} missing: {kvs:?}"));
        assert_eq!(
            (kv.value.as_ref(), kv.mod_revision, kv.version),
            (format!("value-{i}").as_bytes(), rev, 1)
        );
    }
    assert_eq!(same_everywhere(&cluster, last).await.len(), 3);

    // Kill the leader: the other two elect a new one and accept writes
    // through either of them.
    cluster.kill(leader);
    let (new_leader, new_id) = agreed_leader(&cluster, Some(leader_id)).await;
    assert_ne!((new_leader, new_id), (leader, leader_id));
    let survivors: Vec<usize> = cluster.running().iter().map(|(i, _)| *i).collect();
    assert_eq!(survivors.len(), 2);
    for i in survivors {
        let m = cluster.member(i).unwrap();
        let rev = put(m, "after-failover", &format!("through-m{i}")).await;
        assert!(rev > last, "revisions go up: {rev} after {last}");
        last = rev;
        for (j, other) in cluster.running() {
            let (_, kv) = linearizable_get(other, "after-failover").await;
            assert_eq!(kv.map(|kv| kv.mod_revision), Some(rev), "m{j}");
        }
        let kvs = same_everywhere(&cluster, rev).await;
        let kv = kvs
            .iter()
            .find(|kv| kv.key.as_ref() == b"after-failover")
            .expect("after-failover present");
        assert_eq!(
            (kv.value.as_ref(), kv.mod_revision),
            (format!("through-m{i}").as_bytes(), rev)
        );
    }
    // Nothing acknowledged before the failover was lost.
    let kvs = same_everywhere(&cluster, last).await;
    for i in 0..3 {
        assert!(
            kvs.iter().any(|kv| kv.key == format!("key-{i}").as_bytes()),
            "key-{i} lost: {kvs:?}"
        );
    }
}

/// The lease IDs `m` lists, sorted.
async fn leases(m: &ClusterMember) -> Vec<i64> {
    let mut c = m.lease().await;
    let mut ids: Vec<i64> = within("lease list", c.lease_leases(LeaseLeasesRequest {}))
        .await
        .expect("lease leases")
        .into_inner()
        .leases
        .into_iter()
        .map(|l| l.id)
        .collect();
    ids.sort_unstable();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_write_through_a_follower_replicates_and_leases_expire_once() {
    let cluster = EphdCluster::start(3, TIMING);
    let (leader, _) = agreed_leader(&cluster, None).await;
    let follower = cluster.member((leader + 1) % 3).unwrap();
    let leader = cluster.member(leader).unwrap();
    put(follower, "warm-up", "x").await;

    // Lease IDs chosen by the proposing member are the same everywhere.
    let mut lease = follower.lease().await;
    let short = within(
        "grant",
        lease.lease_grant(LeaseGrantRequest { ttl: 2, id: 0 }),
    )
    .await
    .expect("grant through a follower")
    .into_inner()
    .id;
    let mut leader_lease = leader.lease().await;
    let long = within(
        "grant",
        leader_lease.lease_grant(LeaseGrantRequest { ttl: 600, id: 0 }),
    )
    .await
    .expect("grant through the leader")
    .into_inner()
    .id;
    let mut kv = follower.kv().await;
    for (key, id) in [("leased", short), ("long", long)] {
        within(
            "put with lease",
            kv.put(PutRequest {
                key: key.as_bytes().to_vec().into(),
                value: b"v".to_vec().into(),
                lease: id,
                ..Default::default()
            }),
        )
        .await
        .expect("put with lease");
    }
    let mut expected = vec![short, long];
    expected.sort_unstable();
    for (i, m) in cluster.running() {
        assert_eq!(leases(m).await, expected, "m{i}");
    }

    // A txn, a delete and a compaction, all through the follower.
    let txn = within(
        "txn",
        kv.txn(TxnRequest {
            compare: vec![Compare {
                result: compare::CompareResult::Equal as i32,
                target: compare::CompareTarget::Version as i32,
                key: b"leased".to_vec().into(),
                target_union: Some(compare::TargetUnion::Version(1)),
                ..Default::default()
            }],
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: b"txn-key".to_vec().into(),
                    value: b"txn".to_vec().into(),
                    ..Default::default()
                })),
            }],
            failure: vec![],
        }),
    )
    .await
    .expect("txn")
    .into_inner();
    assert!(txn.succeeded);
    within(
        "delete",
        kv.delete_range(DeleteRangeRequest {
            key: b"warm-up".to_vec().into(),
            ..Default::default()
        }),
    )
    .await
    .expect("delete");
    let rev = within(
        "revoke",
        lease.lease_revoke(LeaseRevokeRequest { id: long }),
    )
    .await
    .expect("revoke through a follower")
    .into_inner()
    .header
    .expect("header")
    .revision;
    within(
        "compact",
        kv.compact(CompactionRequest {
            revision: rev - 1,
            physical: false,
        }),
    )
    .await
    .expect("compact through a follower");
    let kvs = same_everywhere(&cluster, rev).await;
    let keys: Vec<&[u8]> = kvs.iter().map(|kv| kv.key.as_ref()).collect();
    assert_eq!(keys, [&b"leased"[..], b"txn-key"]);
    for (i, m) in cluster.running() {
        let mut c = m.kv().await;
        let old = c
            .range(RangeRequest {
                key: b"txn-key".to_vec().into(),
                revision: 1,
                serializable: true,
                ..Default::default()
            })
            .await;
        let status = old.expect_err("compacted everywhere");
        assert_eq!(
            status.message(),
            "etcdserver: mvcc: required revision has been compacted",
            "m{i}"
        );
    }

    // The short lease expires (decided by the leader, applied by all):
    // its key goes at exactly one revision after the last write.
    let deadline = Instant::now() + SETTLE;
    loop {
        let kvs = all_keys(leader).await;
        if !kvs.kvs.iter().any(|kv| kv.key.as_ref() == b"leased") {
            break;
        }
        assert!(Instant::now() < deadline, "lease {short} never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let kvs = same_everywhere(&cluster, rev + 1).await;
    assert_eq!(kvs.len(), 1, "{kvs:?}");
    for (i, m) in cluster.running() {
        assert_eq!(leases(m).await, Vec::<i64>::new(), "m{i}");
        let at = all_keys(m).await.header.expect("header").revision;
        assert_eq!(at, rev + 1, "m{i}: one revoke, once");
    }
}

/// Health as etcd reports it in a cluster: every member healthy and ready
/// with a leader; a member left alone (two of three killed) answers
/// `/health` with `RAFT NO LEADER` (but `?serializable=true` passes, as on
/// etcd), fails `/readyz`'s `linearizable_read`, and stays live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_says_when_a_member_has_no_leader() {
    use crate::operations::http_get;
    let mut cluster = EphdCluster::start(3, TIMING);
    agreed_leader(&cluster, None).await;
    for (i, m) in cluster.running() {
        let (status, body) = http_get(m.metrics_port(), "/health");
        assert!(status.contains("200"), "member {i}: {status} {body}");
        let (status, body) = http_get(m.metrics_port(), "/readyz");
        assert!(status.contains("200"), "member {i}: {status} {body}");
    }
    cluster.kill(1);
    cluster.kill(2);
    let alone = cluster.member(0).expect("member 0 runs").metrics_port();
    let deadline = Instant::now() + SETTLE;
    loop {
        let (status, body) = http_get(alone, "/health");
        if status.contains("503") {
            assert_eq!(
                body.trim(),
                r#"{"health":"false","reason":"RAFT NO LEADER"}"#
            );
            break;
        }
        assert!(Instant::now() < deadline, "still healthy alone: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, _) = http_get(alone, "/health?serializable=true");
    assert!(status.contains("200"), "{status}");
    let (status, body) = http_get(alone, "/readyz");
    assert!(status.contains("503"), "{status} {body}");
    assert!(body.contains("[-]linearizable_read failed"), "{body}");
    let (status, body) = http_get(alone, "/livez");
    assert!(status.contains("200"), "alone but alive: {status} {body}");
}
