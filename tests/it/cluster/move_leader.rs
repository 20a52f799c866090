//! MoveLeader in cluster mode and on a single member, compared with stock
//! etcd; the hand-over of leadership on SIGTERM; and forced leader changes
//! under hour-long leases, whose remaining TTL must neither reset nor
//! shrink across them.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use ephd::proto::etcdserverpb::{MemberListRequest, MoveLeaderRequest, PutRequest};

use crate::cluster::leader::{
    endpoints, leader_of, leased_key, status_at, ttl_of, CHECKPOINT, ELECTION, SETTLE, TIMING,
};
use crate::etcd_cluster::StockEtcdCluster;
use crate::harness::{connect_channel, EphdCluster, Server};
use crate::support::within;

/// MoveLeader's answer through `endpoint`: Ok(()) or (code, message).
async fn move_leader(endpoint: &str, target: u64) -> Result<(), (tonic::Code, String)> {
    let mut c = MaintenanceClient::new(connect_channel(endpoint).await);
    match within(
        "move leader",
        c.move_leader(MoveLeaderRequest { target_id: target }),
    )
    .await
    {
        Ok(_) => Ok(()),
        Err(s) => Err((s.code(), s.message().to_string())),
    }
}

async fn member_ids(endpoint: &str) -> Vec<u64> {
    let mut c = ephd::proto::etcdserverpb::cluster_client::ClusterClient::new(
        connect_channel(endpoint).await,
    );
    within("member list", c.member_list(MemberListRequest::default()))
        .await
        .expect("member list")
        .into_inner()
        .members
        .into_iter()
        .map(|m| m.id)
        .collect()
}

/// The answers MoveLeader gives on a three-member cluster at `endpoints`,
/// moving leadership to every member in turn; checks that each move
/// happened and that every member then reports the target as leader.
async fn move_leader_answers(endpoints: &[String]) -> Vec<Result<(), (tonic::Code, String)>> {
    let ids = member_ids(&endpoints[0]).await;
    let mut answers = Vec::new();
    let (at, leader) = leader_of(endpoints, None).await;
    let follower = &endpoints[(at + 1) % endpoints.len()];
    answers.push(
        move_leader(
            follower,
            ids.iter().copied().find(|i| *i != leader).unwrap(),
        )
        .await,
    );
    answers.push(move_leader(&endpoints[at], 0x1234_5678).await);
    answers.push(move_leader(&endpoints[at], leader).await);
    for target in ids {
        let (at, _) = leader_of(endpoints, None).await;
        let moved = Instant::now();
        answers.push(move_leader(&endpoints[at], target).await);
        let (_, now) = leader_of(endpoints, None).await;
        assert_eq!(now, target, "leader after MoveLeader");
        assert!(moved.elapsed() < SETTLE);
        for e in endpoints {
            let s = status_at(e).await.expect("status");
            assert_eq!(s.leader, target, "{e}");
            assert!(s.raft_term > 0 && s.raft_index > 0, "{e}: {s:?}");
        }
    }
    answers
}

/// MoveLeader to each member and to the current leader, and its refusals
/// (through a follower; to an ID that is no member), answer exactly as a
/// three-member stock etcd answers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_leader_answers_as_a_stock_etcd_cluster_does() {
    let etcd = StockEtcdCluster::start(3, &[]);
    let etcd_endpoints: Vec<String> = etcd.running().iter().map(|(_, m)| m.endpoint()).collect();
    let expected = move_leader_answers(&etcd_endpoints).await;
    drop(etcd);
    let cluster = EphdCluster::start(3, TIMING);
    let got = move_leader_answers(&endpoints(&cluster)).await;
    assert_eq!(got, expected, "ephd's answers against stock etcd's");
    assert_eq!(
        expected[..3],
        [
            Err((
                tonic::Code::FailedPrecondition,
                "etcdserver: not leader".to_string()
            )),
            Err((
                tonic::Code::FailedPrecondition,
                "etcdserver: bad leader transferee".to_string()
            )),
            Ok(()),
        ]
    );
    // Status reports the raft applied index on every member.
    for (i, m) in cluster.running() {
        let s = status_at(&m.endpoint()).await.unwrap();
        assert!(
            s.raft_applied_index > 0 && s.raft_applied_index <= s.raft_index,
            "m{i}: {s:?}"
        );
    }
}

/// SIGTERM of the leader hands leadership to another member before it
/// exits: the others agree on a new leader well within one election
/// timeout (2 s here), where a killed leader costs at least one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_of_the_leader_hands_leadership_over_without_an_election_gap() {
    let mut cluster =
        EphdCluster::start(3, &["--heartbeat-interval=100", "--election-timeout=2000"]);
    let (leader, leader_id) = leader_of(&endpoints(&cluster), None).await;
    let others: Vec<String> = (0..3)
        .filter(|i| *i != leader)
        .map(|i| cluster.member(i).unwrap().endpoint())
        .collect();
    cluster.terminate(leader);
    let sent = Instant::now();
    let mut handed = None;
    while sent.elapsed() < SETTLE {
        let mut seen = BTreeSet::new();
        for e in &others {
            seen.insert(status_at(e).await.map_or(0, |s| s.leader));
        }
        if seen.len() == 1 && !seen.contains(&0) && !seen.contains(&leader_id) {
            handed = Some(sent.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let handed = handed.unwrap_or_else(|| panic!("no new leader\n{}", cluster.logs()));
    assert!(
        handed < Duration::from_millis(1000),
        "new leader {handed:?} after SIGTERM: an election gap (election timeout 2 s)"
    );
    assert!(
        cluster.reap(leader, Duration::from_secs(10)),
        "clean exit after SIGTERM"
    );
    let (at, _) = leader_of(&others, Some(leader_id)).await;
    let mut kv =
        ephd::proto::etcdserverpb::kv_client::KvClient::new(connect_channel(&others[at]).await);
    within(
        "put",
        kv.put(PutRequest {
            key: b"after".to_vec().into(),
            value: b"v".to_vec().into(),
            ..Default::default()
        }),
    )
    .await
    .expect("writes after the hand-over");
    eprintln!("leadership handed over {handed:?} after SIGTERM");
}

/// A single member answers MoveLeader as a single-member stock etcd:
/// success for itself, `bad leader transferee` for any other ID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_leader_on_a_single_member_answers_as_stock_etcd() {
    let etcd = crate::harness::StockEtcd::start();
    let ephd = crate::support::ephd(&[]);
    let mut answers = Vec::new();
    for endpoint in [etcd.endpoint(), ephd.endpoint()] {
        let me = member_ids(&endpoint).await[0];
        answers.push((
            move_leader(&endpoint, me).await,
            move_leader(&endpoint, me ^ 1).await,
        ));
    }
    assert_eq!(answers[1], answers[0], "ephd against stock etcd");
    assert_eq!(
        answers[0].1,
        Err((
            tonic::Code::FailedPrecondition,
            "etcdserver: bad leader transferee".to_string()
        ))
    );
}

/// A forced leader change every few seconds (MoveLeader to the next member
/// in turn; "every few minutes" in production) under hour-long leases
/// granted through different members: after each change, the remaining
/// TTL read through every member keeps counting down from the grant. It is
/// never reset to the full TTL (etcd resets it at every leader change, so
/// frequent changes would keep such a lease alive forever), never shorter
/// than what is due, and at most the checkpoint interval plus an election
/// longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_leader_changes_under_hour_long_leases_neither_reset_nor_shorten_them() {
    const TTL: i64 = 3600;
    const CHANGES: usize = 4;
    let cluster = EphdCluster::start(3, TIMING);
    let eps = endpoints(&cluster);
    leader_of(&eps, None).await;
    let granted = Instant::now();
    let mut leases = Vec::new();
    for (i, m) in cluster.running() {
        leases.push(leased_key(m, TTL, &format!("hour-{i}")).await);
    }
    let members = member_ids(&eps[0]).await;
    let bound = CHECKPOINT + 2 * ELECTION + Duration::from_secs(1);
    for change in 0..CHANGES {
        // Long enough for the leader to checkpoint at least once even on a
        // loaded machine: the bound holds from the last checkpoint, and
        // changes faster than checkpoints would each resume from the same
        // old one.
        tokio::time::sleep(2 * CHECKPOINT + ELECTION).await;
        let (at, current) = leader_of(&eps, None).await;
        let next = members[(members.iter().position(|m| *m == current).unwrap() + 1) % 3];
        move_leader(&eps[at], next)
            .await
            .unwrap_or_else(|e| panic!("change {change}: MoveLeader to {next:x}: {e:?}"));
        let (_, now) = leader_of(&eps, Some(current)).await;
        assert_eq!(now, next, "change {change}");
        for (i, m) in cluster.running() {
            for id in &leases {
                let (ttl, granted_ttl) = ttl_of(m, *id).await;
                let due = TTL as f64 - granted.elapsed().as_secs_f64();
                assert_eq!(granted_ttl, TTL);
                assert!(
                    ttl as f64 >= due - 1.5,
                    "change {change}, m{i}, lease {id:x}: {ttl} s left, {due:.1} s due: shortened"
                );
                assert!(
                    ttl as f64 <= due + bound.as_secs_f64(),
                    "change {change}, m{i}, lease {id:x}: {ttl} s left, {due:.1} s due: more \
                     than the checkpoint bound {bound:?} (reset?)"
                );
            }
        }
    }
    assert!(
        granted.elapsed() > bound * 2,
        "long enough that a reset would have shown"
    );
    // Every member counted each new leader, as etcd's metric does.
    for (i, m) in cluster.running() {
        let (_, body) = crate::operations::http_get(m.metrics_port(), "/metrics");
        let seen: u64 = body
            .lines()
            .find_map(|l| l.strip_prefix("etcd_server_leader_changes_seen_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("m{i}: no leader changes metric"));
        assert!(seen > CHANGES as u64, "m{i}: {seen} leader changes seen");
    }
}
