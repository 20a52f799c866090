//! The space quota in a cluster: a member whose quota a write does not fit
//! raises NOSPACE through the log, so every member records the same alarm
//! and refuses the same writes; one disarm through any member clears it
//! everywhere; and the members' stores stay identical throughout (the same
//! keys, revisions and HashKV), whether every member has the quota or only
//! one. Without that, each member decided inside its own apply, under its
//! own ID: a put refused by the member that answered could be stored on
//! another, and a disarm cleared only one member's alarm.

use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{
    alarm_request::AlarmAction, AlarmMember, AlarmRequest, CompactionRequest, DeleteRangeRequest,
    HashKvRequest, PutRequest,
};

use crate::cluster::{agreed_leader, linearizable_get, put, same_everywhere, SETTLE, TIMING};
use crate::harness::{ClusterMember, EphdCluster, Server};
use crate::support::within;

const NOSPACE: i32 = 1;
const QUOTA: &str = "--quota-backend-bytes=150000";

async fn alarms(m: &ClusterMember) -> Vec<(u64, i32)> {
    let mut c = m.maintenance().await;
    let resp = within(
        "alarm list",
        c.alarm(AlarmRequest {
            action: AlarmAction::Get as i32,
            member_id: 0,
            alarm: 0,
        }),
    )
    .await
    .expect("alarm list")
    .into_inner();
    let mut out: Vec<(u64, i32)> = resp
        .alarms
        .iter()
        .map(|a: &AlarmMember| (a.member_id, a.alarm))
        .collect();
    out.sort();
    out
}

/// Waits until every member lists the same alarms, and returns them.
async fn same_alarms(cluster: &EphdCluster, want_empty: bool) -> Vec<(u64, i32)> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let mut lists = Vec::new();
        for (_, m) in cluster.running() {
            lists.push(alarms(m).await);
        }
        if lists.iter().all(|l| *l == lists[0]) && lists[0].is_empty() == want_empty {
            return lists.swap_remove(0);
        }
        assert!(
            Instant::now() < deadline,
            "alarm lists differ or wrong: {lists:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One put through `m`: Ok(revision), or the gRPC status it was refused with.
async fn try_put(m: &ClusterMember, key: &str, value: &str) -> Result<i64, tonic::Status> {
    let mut kv = m.kv().await;
    within(
        "put",
        kv.put(PutRequest {
            key: key.as_bytes().to_vec().into(),
            value: value.as_bytes().to_vec().into(),
            ..Default::default()
        }),
    )
    .await
    .map(|r| r.into_inner().header.expect("header").revision)
}

fn is_nospace(s: &tonic::Status) -> bool {
    s.code() == tonic::Code::ResourceExhausted
        && s.message() == "etcdserver: mvcc: database space exceeded"
}

/// Puts 1 KiB values through `through` in turn until one is refused with
/// NOSPACE; returns the keys acknowledged and the refused ones (one more
/// refused put through every member once the first was refused).
async fn fill(cluster: &EphdCluster, through: &[usize]) -> (Vec<String>, Vec<String>) {
    let value = "x".repeat(1024);
    let mut acked = Vec::new();
    let mut refused = Vec::new();
    for i in 0..5_000 {
        let m = cluster.member(through[i % through.len()]).unwrap();
        let key = format!("fill/{i:05}");
        match try_put(m, &key, &value).await {
            Ok(_) => acked.push(key),
            Err(s) if is_nospace(&s) => {
                refused.push(key);
                break;
            }
            Err(s) => panic!("put {key}: {s:?}"),
        }
    }
    assert!(!refused.is_empty(), "the quota never refused a put");
    assert!(acked.len() > 20, "only {} puts fitted", acked.len());
    // Once the alarm is applied everywhere, every member refuses.
    same_alarms(cluster, false).await;
    for (i, m) in cluster.running() {
        let key = format!("after/{i}");
        let r = try_put(m, &key, "v").await;
        assert!(
            matches!(&r, Err(s) if is_nospace(s)),
            "m{i} under NOSPACE: {r:?}"
        );
        refused.push(key);
    }
    (acked, refused)
}

/// HashKV of every member at one revision: all equal.
async fn same_hash(cluster: &EphdCluster, rev: i64) {
    let mut hashes = Vec::new();
    for (i, m) in cluster.running() {
        let mut c = m.maintenance().await;
        let r = within("hashkv", c.hash_kv(HashKvRequest { revision: rev }))
            .await
            .unwrap_or_else(|s| panic!("hashkv on m{i}: {s:?}"))
            .into_inner();
        hashes.push((r.hash, r.compact_revision));
    }
    assert!(hashes.iter().all(|h| *h == hashes[0]), "HashKV {hashes:?}");
}

/// Every acknowledged key is there and every refused one absent, through
/// every member's linearizable read.
async fn everywhere(cluster: &EphdCluster, acked: &[String], refused: &[String]) {
    for (i, m) in cluster.running() {
        for key in acked.iter().step_by(7).chain(acked.last()) {
            assert!(
                linearizable_get(m, key).await.1.is_some(),
                "m{i} lost {key}"
            );
        }
        for key in refused {
            assert!(
                linearizable_get(m, key).await.1.is_none(),
                "m{i} stored the refused {key}"
            );
        }
    }
}

/// The scenario: fill through `through`, check, free space, disarm through
/// the follower `disarm_via`, write through every member, check again.
async fn fill_disarm_and_write(cluster: &EphdCluster, through: &[usize], disarm_via: usize) {
    let (acked, refused) = fill(cluster, through).await;
    let raised = same_alarms(cluster, false).await;
    assert!(raised.iter().all(|(_, a)| *a == NOSPACE), "{raised:?}");
    everywhere(cluster, &acked, &refused).await;

    // Free space (delete and compact through the leader), then disarm each
    // raised alarm through a follower.
    let (leader, _) = agreed_leader(cluster, None).await;
    let l = cluster.member(leader).unwrap();
    let mut kv = l.kv().await;
    let del = within(
        "delete",
        kv.delete_range(DeleteRangeRequest {
            key: b"fill/".to_vec().into(),
            range_end: b"fill0".to_vec().into(),
            ..Default::default()
        }),
    )
    .await
    .expect("delete under NOSPACE")
    .into_inner();
    assert_eq!(del.deleted as usize, acked.len());
    let at = del.header.unwrap().revision;
    within(
        "compact",
        kv.compact(CompactionRequest {
            revision: at,
            physical: true,
        }),
    )
    .await
    .expect("compact under NOSPACE");
    let mut c = cluster.member(disarm_via).unwrap().maintenance().await;
    for (member_id, alarm) in raised {
        within(
            "disarm",
            c.alarm(AlarmRequest {
                action: AlarmAction::Deactivate as i32,
                member_id,
                alarm,
            }),
        )
        .await
        .expect("disarm through a follower");
    }
    same_alarms(cluster, true).await;

    // Writes through every member work again, and land everywhere.
    let mut written = Vec::new();
    let mut last = 0;
    for (i, m) in cluster.running() {
        let key = format!("again/{i}");
        last = put(m, &key, "v").await;
        written.push(key);
    }
    same_everywhere(cluster, last).await;
    same_hash(cluster, last).await;
    everywhere(cluster, &written, &refused).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_with_the_quota_agrees_on_alarms_refusals_and_data() {
    let mut args = TIMING.to_vec();
    args.push(QUOTA);
    let cluster = EphdCluster::start(3, &args);
    let (leader, _) = agreed_leader(&cluster, None).await;
    let f1 = (leader + 1) % 3;
    let f2 = (leader + 2) % 3;
    // Writes through all three, so whichever member trips first raises.
    fill_disarm_and_write(&cluster, &[leader, f1, f2], f2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_member_with_the_quota_stops_writes_everywhere_through_the_log() {
    // Only m1 has a quota: its alarm, raised through the log, stops writes
    // through the others too, as in etcd.
    let cluster = EphdCluster::start_each(3, TIMING, "http", &|i, cmd| {
        if i == 1 {
            cmd.arg(QUOTA);
        }
    });
    let (leader, _) = agreed_leader(&cluster, None).await;
    let disarm_via = (0..3).find(|i| *i != leader && *i != 1).unwrap_or(1);
    fill_disarm_and_write(&cluster, &[1], disarm_via).await;
}
