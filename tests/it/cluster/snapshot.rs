//! Cluster mode's bounded Raft log and catch-up by snapshot: with a small
//! `--snapshot-count`, a follower that stops answering (paused with
//! SIGSTOP, so its peers' messages to it go unanswered and are dropped)
//! while the others go on writing falls behind the leader's kept log.
//! When it answers again it gets a snapshot of the whole store, installs
//! it, and from then on answers reads at every retained revision and
//! watches from any retained revision exactly like the leader; a watch it
//! served before the pause goes on with no gap and no duplicate. The
//! leader's in-memory log stays within `--snapshot-count` plus the kept
//! entries throughout.

use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::kv_client::KvClient;
use ephd::proto::etcdserverpb::{
    watch_request, CompactionRequest, DeleteRangeRequest, LeaseGrantRequest, LeaseLeasesRequest,
    PutRequest, RangeRequest, RangeResponse, StatusRequest, WatchCreateRequest, WatchRequest,
};
use ephd::proto::mvccpb::Event;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

use crate::harness::{ClusterMember, EphdCluster, Server};
use crate::operations::http_get;
use crate::support::within;

const SNAPSHOT_COUNT: u64 = 100;
const CATCHUP_ENTRIES: u64 = 20;
pub(crate) const ARGS: &[&str] = &[
    "--heartbeat-interval=50",
    "--election-timeout=500",
    "--snapshot-count=100",
    "--experimental-snapshot-catchup-entries=20",
];
pub(crate) const SETTLE: Duration = Duration::from_secs(20);

/// A metric of a member's `/metrics`, as a number.
pub(crate) fn metric(m: &ClusterMember, name: &str) -> u64 {
    let (_, body) = http_get(m.metrics_port(), "/metrics");
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in:\n{body}"))
}

/// (member ID, leader ID, applied index) as `m` reports them.
pub(crate) async fn status(m: &ClusterMember) -> Option<(u64, u64, u64)> {
    let mut c = m.maintenance().await;
    let s = tokio::time::timeout(Duration::from_secs(2), c.status(StatusRequest {}))
        .await
        .ok()?
        .ok()?
        .into_inner();
    Some((s.header?.member_id, s.leader, s.raft_applied_index))
}

/// Puts `key` with a new value on `kv` until the leader's kept log starts
/// past `applied` (a paused follower's), within [`SETTLE`]. The leader
/// keeps the entries of a follower it heard from within the last election
/// timeout (up to a bound far above these tests' writes), so how many
/// writes that takes depends on how fast they go.
pub(crate) async fn write_until_log_passes(
    l: &ClusterMember,
    kv: &mut KvClient<Channel>,
    key: &str,
    applied: u64,
) {
    let deadline = Instant::now() + SETTLE;
    let mut n = 0u64;
    while metric(l, "ephd_raft_log_first_index") <= applied + 1 {
        assert!(
            Instant::now() < deadline,
            "the leader kept its log for the paused follower (at {applied}) through {n} more writes"
        );
        let req = PutRequest {
            key: key.as_bytes().to_vec().into(),
            value: n.to_string().into_bytes().into(),
            ..Default::default()
        };
        within("put", kv.put(req))
            .await
            .expect("put while the follower is paused");
        n += 1;
    }
}

/// The index of the member every member names as leader.
pub(crate) async fn leader(cluster: &EphdCluster) -> usize {
    let deadline = Instant::now() + SETTLE;
    while Instant::now() < deadline {
        let mut seen = Vec::new();
        for (i, m) in cluster.running() {
            seen.push((i, status(m).await));
        }
        let first = seen[0].1.map(|s| s.1);
        if first.is_some_and(|l| l != 0) && seen.iter().all(|(_, s)| s.map(|s| s.1) == first) {
            if let Some((i, _)) = seen.iter().find(|(_, s)| s.map(|s| s.0) == first) {
                return *i;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no agreed leader\n{}", cluster.logs());
}

/// Waits until every member applied the initial revision (it holds
/// `compact_rev_key`, whose value is that revision); returns it.
pub(crate) async fn initialized(cluster: &EphdCluster) -> i64 {
    let deadline = Instant::now() + SETTLE;
    let mut values = Vec::new();
    while Instant::now() < deadline {
        values.clear();
        for (_, m) in cluster.running() {
            let req = RangeRequest {
                key: b"compact_rev_key".to_vec().into(),
                serializable: true,
                ..Default::default()
            };
            let r = within("range", m.kv().await.range(req))
                .await
                .expect("range");
            values.extend(r.into_inner().kvs.into_iter().map(|kv| kv.value));
        }
        if values.len() == cluster.running().len() {
            assert!(values.iter().all(|v| *v == values[0]), "{values:?}");
            return String::from_utf8(values[0].to_vec())
                .unwrap()
                .parse()
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "no initial revision on every member: {values:?}\n{}",
        cluster.logs()
    );
}

pub(crate) fn signal(m: &ClusterMember, sig: i32) {
    // SAFETY: kill(2) on a child process this test started.
    let rc = unsafe { libc::kill(m.pid() as i32, sig) };
    assert_eq!(rc, 0, "signal {sig} to member {}", m.pid());
}

/// Every key on `m` at `revision` (0: current), served locally.
pub(crate) async fn all_at(
    m: &ClusterMember,
    revision: i64,
) -> Result<RangeResponse, tonic::Status> {
    let req = RangeRequest {
        key: vec![0].into(),
        range_end: vec![0].into(),
        revision,
        serializable: true,
        ..Default::default()
    };
    within("range", m.kv().await.range(req))
        .await
        .map(|r| r.into_inner())
}

/// Waits (up to [`SETTLE`]) until follower `f` has applied the current
/// revision of leader `l`; returns that revision.
pub(crate) async fn caught_up(cluster: &EphdCluster, l: &ClusterMember, f: &ClusterMember) -> i64 {
    let current = all_at(l, 0).await.unwrap().header.unwrap().revision;
    let deadline = Instant::now() + SETTLE;
    while all_at(f, 0).await.unwrap().header.unwrap().revision < current {
        assert!(
            Instant::now() < deadline,
            "the follower did not catch up\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    current
}

/// Opens a watch of every key from `start` on `m`, with previous values.
async fn watch_from(
    m: &ClusterMember,
    start: i64,
) -> tonic::Streaming<ephd::proto::etcdserverpb::WatchResponse> {
    let create = WatchRequest {
        request_union: Some(watch_request::RequestUnion::CreateRequest(
            WatchCreateRequest {
                key: vec![0].into(),
                range_end: vec![0].into(),
                start_revision: start,
                prev_kv: true,
                ..Default::default()
            },
        )),
    };
    let requests = tokio_stream::iter([create]).chain(tokio_stream::pending());
    let mut stream = within("watch", m.watch().await.watch(requests))
        .await
        .expect("watch")
        .into_inner();
    let created = within("created", stream.next())
        .await
        .expect("open")
        .expect("ok");
    assert!(created.created && !created.canceled, "{created:?}");
    stream
}

/// Reads events off `stream` until one at `upto` has come.
async fn events_until(
    stream: &mut tonic::Streaming<ephd::proto::etcdserverpb::WatchResponse>,
    upto: i64,
) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::new();
    while out
        .last()
        .and_then(|e| e.kv.as_ref())
        .is_none_or(|kv| kv.mod_revision < upto)
    {
        let resp = within("watch events", stream.next())
            .await
            .expect("stream open")
            .expect("ok");
        assert!(!resp.canceled, "watch cancelled: {resp:?}");
        out.extend(resp.events);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_the_kept_log_catches_up_by_snapshot_with_identical_history() {
    let cluster = EphdCluster::start(3, ARGS);
    let li = leader(&cluster).await;
    let fi = (li + 1) % 3;
    let (l, f) = (cluster.member(li).unwrap(), cluster.member(fi).unwrap());
    let base = initialized(&cluster).await;
    let mut kv = l.kv().await;
    let put = |key: String, value: String, lease: i64| PutRequest {
        key: key.into_bytes().into(),
        value: value.into_bytes().into(),
        lease,
        ..Default::default()
    };

    // Some history before the cut: overwrites, a delete, a lease with a
    // key, a compaction.
    let lease = within(
        "grant",
        l.lease()
            .await
            .lease_grant(LeaseGrantRequest { ttl: 600, id: 0 }),
    )
    .await
    .expect("grant")
    .into_inner()
    .id;
    for i in 0..30 {
        within(
            "put",
            kv.put(put(format!("k{}", i % 10), format!("v{i}"), 0)),
        )
        .await
        .expect("put");
    }
    within("put", kv.put(put("leased".into(), "x".into(), lease)))
        .await
        .expect("put");
    within(
        "delete",
        kv.delete_range(DeleteRangeRequest {
            key: b"k3".to_vec().into(),
            ..Default::default()
        }),
    )
    .await
    .expect("delete");
    within(
        "compact",
        kv.compact(CompactionRequest {
            revision: base + 10,
            physical: true,
        }),
    )
    .await
    .expect("compact");
    let cut = all_at(l, 0).await.unwrap().header.unwrap().revision;
    while all_at(f, 0).await.unwrap().header.unwrap().revision < cut {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let applied_at_cut = status(f).await.expect("status").2;
    // A watch on the follower from before the cut, kept across it.
    let mut kept = watch_from(f, cut + 1).await;

    signal(f, libc::SIGSTOP);
    for i in 0..400 {
        let req = put(
            format!("k{}", i % 17),
            format!("w{i}"),
            if i % 50 == 0 { lease } else { 0 },
        );
        within("put", kv.put(req))
            .await
            .expect("put while the follower is paused");
        if i % 40 == 0 {
            let key = format!("k{}", (i + 5) % 17).into_bytes().into();
            within(
                "delete",
                kv.delete_range(DeleteRangeRequest {
                    key,
                    ..Default::default()
                }),
            )
            .await
            .expect("delete");
        }
    }
    write_until_log_passes(l, &mut kv, "k-more", applied_at_cut).await;
    let first = metric(l, "ephd_raft_log_first_index");
    assert!(
        first > applied_at_cut + 1,
        "the leader compacted past the paused follower (first index {first}, follower at {applied_at_cut})"
    );
    signal(f, libc::SIGCONT);

    let current = caught_up(&cluster, l, f).await;
    assert!(
        metric(f, "ephd_raft_snapshots_installed_total") >= 1,
        "caught up by snapshot"
    );
    assert!(metric(l, "ephd_raft_snapshots_sent_total") >= 1);

    // The same answer at every revision, compacted ones included.
    for rev in base + 9..=current {
        let (a, b) = (all_at(l, rev).await, all_at(f, rev).await);
        match (a, b) {
            (Ok(a), Ok(b)) => assert_eq!(a.kvs, b.kvs, "revision {rev}"),
            (Err(a), Err(b)) => assert_eq!(a.message(), b.message(), "revision {rev}"),
            (a, b) => panic!("revision {rev}: leader {a:?}, follower {b:?}"),
        }
    }
    // Watches from the oldest retained revision replay the same events.
    let from_leader = events_until(&mut watch_from(l, base + 10).await, current).await;
    let from_follower = events_until(&mut watch_from(f, base + 10).await, current).await;
    assert_eq!(from_leader, from_follower, "replayed history");
    // The watch open across the pause and the install: no gap, no duplicate.
    let across = events_until(&mut kept, current).await;
    let expected: Vec<Event> = from_leader
        .into_iter()
        .filter(|e| e.kv.as_ref().unwrap().mod_revision > cut)
        .collect();
    assert_eq!(across, expected, "the watch kept across the install");
    // Leases came along.
    let leases = within(
        "leases",
        f.lease().await.lease_leases(LeaseLeasesRequest {}),
    )
    .await
    .expect("leases")
    .into_inner();
    assert_eq!(
        leases.leases.iter().map(|l| l.id).collect::<Vec<_>>(),
        vec![lease]
    );

    // The leader's log stayed bounded.
    let (first, last) = (
        metric(l, "ephd_raft_log_first_index"),
        metric(l, "ephd_raft_log_last_index"),
    );
    assert!(
        last + 1 - first <= SNAPSHOT_COUNT + CATCHUP_ENTRIES + 10,
        "log [{first}, {last}] is bounded"
    );
    // And the follower goes on from the log.
    let rev = within("put", kv.put(put("after".into(), "1".into(), 0)))
        .await
        .expect("put")
        .into_inner()
        .header
        .unwrap()
        .revision;
    let deadline = Instant::now() + SETTLE;
    loop {
        let r = all_at(f, 0).await.unwrap();
        if r.header.as_ref().unwrap().revision >= rev {
            assert!(r.kvs.iter().any(|kv| kv.key.as_ref() == b"after"));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no replication after the install"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A new cluster starts at the wall-clock revision its first leader chose,
/// like a single member (every member applies it at the same log position
/// and holds `compact_rev_key`); with `--revision-continuity=false` (what
/// `--etcd-compat` sets) it starts at 1 like etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cluster_starts_at_the_initial_revision_its_first_leader_chose() {
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let cluster = EphdCluster::start(3, &ARGS[..2]);
    let base = initialized(&cluster).await;
    assert!(base >= before * 1_000, "{base} is the wall-clock revision");
    for (i, m) in cluster.running() {
        let r = all_at(m, 0).await.unwrap();
        assert_eq!(r.header.unwrap().revision, base + 1, "m{i}");
        let below = all_at(m, base - 1).await.unwrap_err();
        assert!(below.message().contains("compacted"), "m{i}: {below:?}");
    }

    let compat = EphdCluster::start(3, &[ARGS[0], ARGS[1], "--revision-continuity=false"]);
    let li = leader(&compat).await;
    let mut kv = compat.member(li).unwrap().kv().await;
    let req = PutRequest {
        key: b"k".to_vec().into(),
        ..Default::default()
    };
    let rev = within("put", kv.put(req))
        .await
        .expect("put")
        .into_inner()
        .header
        .unwrap()
        .revision;
    assert_eq!(rev, 2, "etcd's first revision");
    let none = all_at(compat.member(li).unwrap(), 0).await.unwrap();
    assert!(none
        .kvs
        .iter()
        .all(|kv| kv.key.as_ref() != b"compact_rev_key"));
}
