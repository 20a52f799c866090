//! Cluster mode, where the leader matters: keep-alives answered by the
//! leader (through a follower too, across a leader kill), lease expiry
//! exactly once and never early, the remaining TTL after a leader change
//! (resumed from the leader's checkpoint, not reset), `hasleader` requests
//! and streams on a member without a leader, and a deposed leader's lease
//! decisions. MoveLeader and the hand-over on SIGTERM are in
//! `cluster_move_leader.rs`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{
    lease_client::LeaseClient, maintenance_client::MaintenanceClient, watch_client::WatchClient,
};
use ephd::proto::etcdserverpb::{
    watch_request::RequestUnion, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseTimeToLiveRequest,
    PutRequest, RangeRequest, StatusRequest, StatusResponse, WatchRequest, WatchResponse,
};
use ephd::proto::mvccpb::event::EventType;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::harness::{connect_channel, ClusterMember, EphdCluster, Server};
use crate::support::{watch_req, within};

/// Election timeout of these clusters (heartbeat a tenth of it).
pub(crate) const ELECTION: Duration = Duration::from_millis(500);
/// Revisions start at 1 (no initial-revision entry landing mid-test; it
/// has its own test in `cluster_snapshot.rs`).
pub(crate) const TIMING: &[&str] = &[
    "--heartbeat-interval=50",
    "--election-timeout=500",
    "--revision-continuity=false",
];
/// ephd's checkpoint interval: five election timeouts.
pub(crate) const CHECKPOINT: Duration = Duration::from_millis(2500);
/// How long an election or the spread of a write may take at most.
pub(crate) const SETTLE: Duration = Duration::from_secs(15);

/// Status of the member at `endpoint`, if it answers within 2 s.
pub(crate) async fn status_at(endpoint: &str) -> Option<StatusResponse> {
    let mut c = MaintenanceClient::new(connect_channel(endpoint).await);
    tokio::time::timeout(Duration::from_secs(2), c.status(StatusRequest {}))
        .await
        .ok()?
        .ok()
        .map(|r| r.into_inner())
}

/// Waits until every endpoint reports the same leader, other than `not`;
/// returns it and the index of its endpoint.
pub(crate) async fn leader_of(endpoints: &[String], not: Option<u64>) -> (usize, u64) {
    let deadline = Instant::now() + SETTLE;
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        seen.clear();
        for e in endpoints {
            seen.push(status_at(e).await);
        }
        let leaders: BTreeSet<u64> = seen
            .iter()
            .map(|s| s.as_ref().map_or(0, |s| s.leader))
            .collect();
        if let (1, Some(&leader)) = (leaders.len(), leaders.iter().next()) {
            let at = seen.iter().position(|s| {
                s.as_ref()
                    .and_then(|s| s.header.as_ref())
                    .is_some_and(|h| h.member_id == leader)
            });
            if let Some(i) = at.filter(|_| leader != 0 && Some(leader) != not) {
                return (i, leader);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no agreed leader within {SETTLE:?}: {seen:?}");
}

pub(crate) fn endpoints(cluster: &EphdCluster) -> Vec<String> {
    cluster
        .running()
        .iter()
        .map(|(_, m)| m.endpoint())
        .collect()
}

/// Grants a lease of `ttl` seconds through `m` (retrying while an election
/// runs) and attaches `key` to it; returns the lease ID.
pub(crate) async fn leased_key(m: &ClusterMember, ttl: i64, key: &str) -> i64 {
    let mut lease = m.lease().await;
    let deadline = Instant::now() + SETTLE;
    let id = loop {
        match within("grant", lease.lease_grant(LeaseGrantRequest { ttl, id: 0 })).await {
            Ok(r) => break r.into_inner().id,
            Err(s) if Instant::now() < deadline && s.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(s) => panic!("grant: {s:?}"),
        }
    };
    let mut kv = m.kv().await;
    within(
        "put",
        kv.put(PutRequest {
            key: key.as_bytes().to_vec().into(),
            value: b"v".to_vec().into(),
            lease: id,
            ..Default::default()
        }),
    )
    .await
    .expect("put with lease");
    id
}

/// A LeaseKeepAlive stream: one request in, one answer out.
struct KeepAlive {
    tx: mpsc::Sender<LeaseKeepAliveRequest>,
    rx: tonic::Streaming<ephd::proto::etcdserverpb::LeaseKeepAliveResponse>,
}

impl KeepAlive {
    async fn open(channel: Channel, require_leader: bool) -> KeepAlive {
        let (tx, rx) = mpsc::channel(4);
        let mut req = tonic::Request::new(ReceiverStream::new(rx));
        if require_leader {
            req.metadata_mut()
                .insert("hasleader", "true".parse().unwrap());
        }
        let rx = within(
            "keep-alive open",
            LeaseClient::new(channel).lease_keep_alive(req),
        )
        .await
        .expect("keep-alive stream")
        .into_inner();
        KeepAlive { tx, rx }
    }

    /// One keep-alive; the TTL answered.
    async fn renew(&mut self, id: i64) -> Result<i64, tonic::Status> {
        // A send fails when the server has already ended the stream: its
        // status, read below, says why (the race the hasleader test meets).
        let _ = self.tx.send(LeaseKeepAliveRequest { id }).await;
        match tokio::time::timeout(Duration::from_secs(12), self.rx.message()).await {
            Ok(Ok(Some(r))) => Ok(r.ttl),
            Ok(Ok(None)) => Err(tonic::Status::cancelled("stream ended")),
            Ok(Err(s)) => Err(s),
            Err(_) => Err(tonic::Status::deadline_exceeded("no keep-alive answer")),
        }
    }
}

/// A Watch stream of `key` from revision 1 on `m`, optionally `hasleader`.
async fn watch_key(
    channel: Channel,
    key: &str,
    require_leader: bool,
) -> (mpsc::Sender<WatchRequest>, tonic::Streaming<WatchResponse>) {
    let (tx, rx) = mpsc::channel(4);
    tx.send(WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(watch_req(
            key.as_bytes(),
            b"",
            1,
        ))),
    })
    .await
    .unwrap();
    let mut req = tonic::Request::new(ReceiverStream::new(rx));
    if require_leader {
        req.metadata_mut()
            .insert("hasleader", "true".parse().unwrap());
    }
    let mut stream = within("watch open", WatchClient::new(channel).watch(req))
        .await
        .expect("watch")
        .into_inner();
    let created = within("created", stream.message()).await.unwrap().unwrap();
    assert!(created.created, "{created:?}");
    (tx, stream)
}

/// TimeToLive of `id` through `m`: (remaining, granted).
pub(crate) async fn ttl_of(m: &ClusterMember, id: i64) -> (i64, i64) {
    let mut c = m.lease().await;
    let r = within(
        "ttl",
        c.lease_time_to_live(LeaseTimeToLiveRequest { id, keys: false }),
    )
    .await
    .unwrap_or_else(|s| panic!("time to live through {}: {s:?}", m.endpoint()))
    .into_inner();
    (r.ttl, r.granted_ttl)
}

/// Keep-alives through a follower reach the leader and keep the lease alive
/// across a leader kill; once they stop, the lease expires exactly once
/// (one DELETE, at the same revision, on every member) and not before its
/// TTL after the last acknowledged keep-alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_through_a_follower_survives_a_leader_kill_and_expiry_happens_once() {
    const TTL: i64 = 4;
    let mut cluster = EphdCluster::start(3, TIMING);
    let (leader, leader_id) = leader_of(&endpoints(&cluster), None).await;
    let follower = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    let f = cluster.member(follower).unwrap();
    let id = leased_key(f, TTL, "kept").await;
    let mut ka = KeepAlive::open(f.channel().await, false).await;
    let mut watches = Vec::new();
    for i in [follower, other] {
        watches.push((
            i,
            watch_key(cluster.member(i).unwrap().channel().await, "kept", false).await,
        ));
    }
    assert_eq!(ka.renew(id).await.expect("keep-alive"), TTL);

    cluster.kill(leader);
    // Keep it alive through the follower for three TTLs across the change.
    let until = Instant::now() + Duration::from_secs(3 * TTL as u64);
    // When the last acknowledged keep-alive was sent: the leader renewed
    // it after that, so its TTL runs at least until then plus the TTL.
    let mut last_ack = Instant::now();
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let sent = Instant::now();
        match ka.renew(id).await {
            Ok(ttl) => {
                assert_eq!(ttl, TTL, "renewed with the full TTL");
                last_ack = sent;
            }
            Err(s) => panic!(
                "keep-alive through a follower during the leader change: {s:?}\n{}",
                cluster.logs()
            ),
        }
    }
    leader_of(&endpoints(&cluster), Some(leader_id)).await;
    for (_, m) in cluster.running() {
        let mut kv = m.kv().await;
        let r = within(
            "get",
            kv.range(RangeRequest {
                key: b"kept".to_vec().into(),
                serializable: true,
                ..Default::default()
            }),
        )
        .await
        .unwrap()
        .into_inner();
        assert_eq!(r.kvs.len(), 1, "the key outlived 3 TTLs: {}", m.endpoint());
    }
    drop(ka);
    // One DELETE on each member, never before TTL after the last ack.
    let mut revisions = BTreeSet::new();
    for (i, (_tx, stream)) in &mut watches {
        let deleted = loop {
            let r = within_long(stream.message())
                .await
                .expect("watch")
                .expect("open");
            if let Some(e) = r
                .events
                .iter()
                .find(|e| e.r#type == EventType::Delete as i32)
            {
                break e.kv.as_ref().unwrap().mod_revision;
            }
        };
        let after = last_ack.elapsed();
        assert!(
            after >= Duration::from_secs(TTL as u64),
            "m{i}: expired {after:?} after the last acknowledged keep-alive (TTL {TTL} s)"
        );
        revisions.insert(deleted);
    }
    assert_eq!(
        revisions.len(),
        1,
        "one expiry, at one revision: {revisions:?}"
    );
    // And no second one: nothing else happens to the key.
    for (i, (_tx, stream)) in &mut watches {
        let more = tokio::time::timeout(Duration::from_secs(2), stream.message()).await;
        assert!(
            more.is_err(),
            "m{i}: a second event after the expiry: {more:?}"
        );
    }
}

async fn within_long<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("within 20 s")
}

/// After the leader is killed, a long lease's remaining TTL resumes from
/// the last checkpoint (every five election timeouts) plus at most the time
/// to elect, on every member: not a reset to the full TTL, never shorter
/// than what it had left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remaining_ttl_after_a_leader_kill_resumes_from_the_checkpoint() {
    const TTL: i64 = 60;
    let mut cluster = EphdCluster::start(3, TIMING);
    let (leader, leader_id) = leader_of(&endpoints(&cluster), None).await;
    let granted = Instant::now();
    let id = leased_key(cluster.member(leader).unwrap(), TTL, "long").await;
    // Two checkpoints and a bit.
    tokio::time::sleep(2 * CHECKPOINT + Duration::from_secs(1)).await;
    cluster.kill(leader);
    leader_of(&endpoints(&cluster), Some(leader_id)).await;
    for (i, m) in cluster.running() {
        let (ttl, granted_ttl) = ttl_of(m, id).await;
        let left = TTL as f64 - granted.elapsed().as_secs_f64();
        // Checkpoint interval, plus an election (up to two timeouts with
        // raft's randomization), plus whole-second truncation.
        let bound = CHECKPOINT + 2 * ELECTION + Duration::from_secs(1);
        assert_eq!(granted_ttl, TTL);
        assert!(
            (ttl as f64) >= left - 1.5,
            "m{i}: {ttl} s left, but {left:.1} s were due: shortened"
        );
        assert!(
            (ttl as f64) <= left + bound.as_secs_f64(),
            "m{i}: {ttl} s left, {left:.1} s were due: more than the checkpoint bound {bound:?}"
        );
        assert!(ttl < TTL - 2, "m{i}: reset to the full TTL ({ttl} s)");
        eprintln!("m{i}: {ttl} s left after the leader change, {left:.1} s due");
    }
}

/// `hasleader: true` on a member whose peers are all stopped: a request
/// fails at once with `etcdserver: no leader` (without the metadata the
/// same serializable read is served), and a watch and a keep-alive stream
/// carrying it are cancelled with that error after three election
/// timeouts, while a watch without it stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hasleader_without_a_leader_fails_requests_and_cancels_streams() {
    let mut cluster = EphdCluster::start(3, TIMING);
    leader_of(&endpoints(&cluster), None).await;
    let alone = cluster.member(0).unwrap();
    let channel = alone.channel().await;
    let id = leased_key(alone, 60, "k").await;
    let (_w1, mut required) = watch_key(channel.clone(), "quiet", true).await;
    let (_w2, mut plain) = watch_key(channel.clone(), "quiet", false).await;
    let mut ka = KeepAlive::open(channel.clone(), true).await;
    ka.renew(id).await.expect("keep-alive with a leader");

    cluster.kill(1);
    cluster.kill(2);
    let killed = Instant::now();
    // No leader: known within an election timeout or two (check quorum).
    let deadline = killed + SETTLE;
    loop {
        let s = status_at(&cluster.member(0).unwrap().endpoint())
            .await
            .expect("status");
        if s.leader == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "still a leader alone: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let leaderless = Instant::now();
    let get = |require: bool| {
        let mut req = tonic::Request::new(RangeRequest {
            key: b"k".to_vec().into(),
            serializable: true,
            ..Default::default()
        });
        if require {
            req.metadata_mut()
                .insert("hasleader", "true".parse().unwrap());
        }
        req
    };
    let mut kv = cluster.member(0).unwrap().kv().await;
    let started = Instant::now();
    let err = within("hasleader get", kv.range(get(true)))
        .await
        .expect_err("no leader");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "not at once: {:?}",
        started.elapsed()
    );
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert_eq!(err.message(), "etcdserver: no leader");
    within("plain get", kv.range(get(false)))
        .await
        .expect("serializable read without hasleader");

    let end = within_long(required.message()).await;
    let cancelled_after = leaderless.elapsed();
    let s = end.expect_err("the hasleader watch ends with an error");
    assert_eq!(
        (s.code(), s.message()),
        (tonic::Code::Unavailable, "etcdserver: no leader")
    );
    assert!(
        cancelled_after >= 2 * ELECTION - Duration::from_millis(100)
            && killed.elapsed() <= 3 * ELECTION + Duration::from_secs(4),
        "cancelled {cancelled_after:?} after losing the leader (three election timeouts: {:?})",
        3 * ELECTION
    );
    let s = ka
        .renew(id)
        .await
        .expect_err("the hasleader keep-alive stream ends");
    assert_eq!(
        (s.code(), s.message()),
        (tonic::Code::Unavailable, "etcdserver: no leader")
    );
    let still = tokio::time::timeout(Duration::from_millis(500), plain.message()).await;
    assert!(
        still.is_err(),
        "the watch without hasleader stays open: {still:?}"
    );
}

/// A leader frozen (SIGSTOP) past a lease's TTL while keep-alives go on
/// through a follower is deposed; when it wakes (SIGCONT) its own timers
/// say the lease expired, but what it decided as leader of an old term
/// never takes effect: the key stays on every member, no DELETE event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_never_revokes_a_lease_kept_alive_elsewhere() {
    const TTL: i64 = 2;
    let cluster = EphdCluster::start(3, TIMING);
    let (leader, leader_id) = leader_of(&endpoints(&cluster), None).await;
    let follower = cluster.member((leader + 1) % 3).unwrap();
    let id = leased_key(follower, TTL, "kept").await;
    let (_w, mut events) = watch_key(follower.channel().await, "kept", false).await;
    let put = within("put event", events.message())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(put.events.len(), 1, "{put:?}");
    let mut ka = KeepAlive::open(follower.channel().await, false).await;
    ka.renew(id).await.expect("keep-alive");

    let pid = cluster.member(leader).unwrap().pid() as i32;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let frozen = Instant::now();
    while frozen.elapsed() < Duration::from_secs(3 * TTL as u64) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        ka.renew(id)
            .await
            .unwrap_or_else(|s| panic!("keep-alive while the leader is frozen: {s:?}"));
    }
    let others: Vec<String> = cluster
        .running()
        .iter()
        .filter(|(i, _)| *i != leader)
        .map(|(_, m)| m.endpoint())
        .collect();
    leader_of(&others, Some(leader_id)).await;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    let woke = Instant::now();
    while woke.elapsed() < Duration::from_secs(2 * TTL as u64) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        ka.renew(id)
            .await
            .expect("keep-alive after the old leader woke");
    }
    let more = tokio::time::timeout(Duration::from_millis(200), events.message()).await;
    assert!(more.is_err(), "an event on the kept key: {more:?}");
    for (i, m) in cluster.running() {
        let mut kv = m.kv().await;
        let r = within(
            "get",
            kv.range(RangeRequest {
                key: b"kept".to_vec().into(),
                serializable: true,
                ..Default::default()
            }),
        )
        .await
        .unwrap()
        .into_inner();
        assert_eq!(r.kvs.len(), 1, "m{i} lost the kept key");
    }
}
