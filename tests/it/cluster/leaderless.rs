//! Requests through a member that knows no leader, compared with a
//! three-member stock etcd in the same scenario: the other two members are
//! stopped (SIGSTOP), so the one left has no leader.
//!
//! * While an election may still bring a leader, etcd holds writes and
//!   linearizable reads. Once one of the stopped members resumes and a
//!   leader is elected, the write goes ahead and the read fails with
//!   `etcdserver: leader changed`, as every read in flight at a leader
//!   change does.
//! * When none comes within the request timeout, each call gets etcd's own
//!   answer: `context deadline exceeded` (Unknown) for what is proposed
//!   through Raft, `etcdserver: request timed out` for a linearizable read,
//!   `etcdserver: no leader` for lease calls forwarded to the leader.
//!
//! A leader handing leadership to a member that does not take it (stopped)
//! refuses writes with raft's `raft proposal dropped` until it gives the
//! transfer up, an election timeout later, as etcd's does; MoveLeader waits
//! for the new leader as long as the client does, then answers `leader
//! transfer took too long` with code Unknown.

use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{
    compare, kv_client::KvClient, lease_client::LeaseClient, maintenance_client::MaintenanceClient,
    request_op, CompactionRequest, Compare, DeleteRangeRequest, LeaseGrantRequest,
    LeaseKeepAliveRequest, LeaseRevokeRequest, LeaseTimeToLiveRequest, MoveLeaderRequest,
    PutRequest, RangeRequest, RequestOp, StatusRequest, TxnRequest,
};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::authority::raw_h2::{self, Outcome};
use crate::authority::{field, grpc_fields, grpc_message};
use crate::etcd_cluster::on_stock_etcd_then_ephd;
use crate::support::{patient_channel, signal};

/// The same timing for both (ephd's `--revision-continuity=false` aside).
const TIMING: &[&str] = &["--heartbeat-interval=50", "--election-timeout=500"];

/// etcd's request timeout with `TIMING`: 5 s plus two election timeouts.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(6_000);

const SETTLE: Duration = Duration::from_secs(20);

const MOVE_LEADER: &str = "/etcdserverpb.Maintenance/MoveLeader";

/// The deadline of a MoveLeader call that cannot succeed: past the request
/// timeout, which does not bound MoveLeader in etcd.
const MOVE_DEADLINE: Duration = Duration::from_secs(8);

/// A channel that waits longer than the server's request timeout.
async fn patient(endpoint: &str) -> Channel {
    patient_channel(endpoint, REQUEST_TIMEOUT * 3).await
}

/// The leader `endpoint`'s member knows (0 for none), if it answers.
async fn leader_seen_by(endpoint: &str) -> Option<u64> {
    let mut m = MaintenanceClient::new(patient(endpoint).await);
    let s = m.status(StatusRequest {}).await.ok()?.into_inner();
    Some(s.leader)
}

/// The index of a member that follows the leader every member names.
async fn a_follower(endpoints: &[String]) -> usize {
    agreed(endpoints).await.1
}

/// The index of the leader every member names, of a member that follows
/// it, and every member's ID.
async fn agreed(endpoints: &[String]) -> (usize, usize, Vec<u64>) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let mut seen = Vec::new();
        let mut ids = Vec::new();
        for e in endpoints {
            let mut m = MaintenanceClient::new(patient(e).await);
            let s = m
                .status(StatusRequest {})
                .await
                .ok()
                .map(|s| s.into_inner());
            seen.push(s.as_ref().map(|s| s.leader));
            ids.push(s.map(|s| s.header.unwrap().member_id));
        }
        let agreed = seen[0].filter(|l| *l != 0 && seen.iter().all(|s| *s == seen[0]));
        if let Some(leader) = agreed {
            let at = ids.iter().position(|id| *id == Some(leader)).unwrap();
            let follower = ids.iter().position(|id| *id != Some(leader)).unwrap();
            return (at, follower, ids.into_iter().map(Option::unwrap).collect());
        }
        assert!(Instant::now() < deadline, "no agreed leader: {seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the member at `endpoint` knows no leader.
async fn until_leaderless(endpoint: &str) {
    let deadline = Instant::now() + SETTLE;
    while leader_seen_by(endpoint).await != Some(0) {
        assert!(Instant::now() < deadline, "{endpoint} still has a leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn put_req(key: &str) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec().into(),
        value: b"v".to_vec().into(),
        ..Default::default()
    }
}

fn get_req(key: &str) -> RangeRequest {
    RangeRequest {
        key: key.as_bytes().to_vec().into(),
        ..Default::default()
    }
}

/// A call's answer: "ok", or its code and message.
type Answer = String;

fn answer<T>(r: Result<T, tonic::Status>) -> Answer {
    match r {
        Ok(_) => "ok".to_string(),
        Err(s) => format!("{:?}: {}", s.code(), s.message()),
    }
}

/// Every kind of call, each at once through `endpoint`, with a lease and
/// a revision to use; each call's name, answer and how long it took.
async fn every_call(endpoint: &str, lease: i64, rev: i64) -> Vec<(&'static str, Answer, Duration)> {
    let channel = patient(endpoint).await;
    let started = Instant::now();
    let kv = KvClient::new(channel.clone());
    let leases = LeaseClient::new(channel);
    let mut calls: Vec<(&'static str, tokio::task::JoinHandle<Answer>)> = Vec::new();
    let mut c = kv.clone();
    calls.push((
        "put",
        tokio::spawn(async move { answer(c.put(put_req("p")).await) }),
    ));
    let mut c = kv.clone();
    let txn = TxnRequest {
        compare: vec![Compare {
            key: b"k".to_vec().into(),
            target: compare::CompareTarget::Version as i32,
            result: compare::CompareResult::Greater as i32,
            target_union: Some(compare::TargetUnion::Version(0)),
            ..Default::default()
        }],
        success: vec![RequestOp {
            request: Some(request_op::Request::RequestPut(put_req("t"))),
        }],
        ..Default::default()
    };
    calls.push(("txn", tokio::spawn(async move { answer(c.txn(txn).await) })));
    let mut c = kv.clone();
    let del = DeleteRangeRequest {
        key: b"k".to_vec().into(),
        ..Default::default()
    };
    calls.push((
        "delete",
        tokio::spawn(async move { answer(c.delete_range(del).await) }),
    ));
    let mut c = kv.clone();
    let compact = CompactionRequest {
        revision: rev,
        ..Default::default()
    };
    calls.push((
        "compact",
        tokio::spawn(async move { answer(c.compact(compact).await) }),
    ));
    let mut c = kv.clone();
    calls.push((
        "linearizable range",
        tokio::spawn(async move { answer(c.range(get_req("k")).await) }),
    ));
    let mut c = leases.clone();
    let grant = LeaseGrantRequest { ttl: 60, id: 0 };
    calls.push((
        "lease grant",
        tokio::spawn(async move { answer(c.lease_grant(grant).await) }),
    ));
    let mut c = leases.clone();
    let revoke = LeaseRevokeRequest { id: lease };
    calls.push((
        "lease revoke",
        tokio::spawn(async move { answer(c.lease_revoke(revoke).await) }),
    ));
    let mut c = leases.clone();
    let ttl = LeaseTimeToLiveRequest {
        id: lease,
        keys: false,
    };
    calls.push((
        "lease time-to-live",
        tokio::spawn(async move { answer(c.lease_time_to_live(ttl).await) }),
    ));
    let mut c = leases.clone();
    calls.push((
        "lease keep-alive",
        tokio::spawn(async move {
            let (tx, rx) = mpsc::channel(1);
            tx.send(LeaseKeepAliveRequest { id: lease }).await.unwrap();
            let stream = c.lease_keep_alive(ReceiverStream::new(rx)).await;
            let r = match stream {
                Ok(s) => s.into_inner().message().await,
                Err(e) => Err(e),
            };
            drop(tx);
            match r {
                Ok(Some(_)) => "ok".to_string(),
                Ok(None) => "stream ended".to_string(),
                Err(s) => answer::<()>(Err(s)),
            }
        }),
    ));
    let mut answers = Vec::new();
    for (name, call) in calls {
        let a = call.await.unwrap();
        answers.push((name, a, started.elapsed()));
    }
    answers
}

/// What a scenario saw: the answers with no leader to come, and those of
/// a write and a read sent before a leader came.
#[derive(Debug, PartialEq)]
struct Seen {
    leaderless: Vec<(&'static str, Answer)>,
    during_election: Vec<Answer>,
}

async fn scenario(endpoints: &[String], pids: &[u32]) -> Seen {
    let alone = a_follower(endpoints).await;
    let others: Vec<u32> = (0..pids.len())
        .filter(|i| *i != alone)
        .map(|i| pids[i])
        .collect();
    let endpoint = &endpoints[alone];
    let mut kv = KvClient::new(patient(endpoint).await);
    let rev = kv.put(put_req("k")).await.unwrap().into_inner();
    let rev = rev.header.unwrap().revision;
    let mut leases = LeaseClient::new(patient(endpoint).await);
    let lease = leases
        .lease_grant(LeaseGrantRequest { ttl: 600, id: 0 })
        .await
        .unwrap()
        .into_inner()
        .id;

    // No leader comes: every call waits out the request timeout.
    for pid in &others {
        signal(*pid, libc::SIGSTOP);
    }
    until_leaderless(endpoint).await;
    let answers = every_call(endpoint, lease, rev).await;
    for (name, a, took) in &answers {
        assert!(
            *took >= REQUEST_TIMEOUT - Duration::from_millis(200),
            "{name} answered {a} after {took:?}, before the request timeout"
        );
    }
    let leaderless = answers.into_iter().map(|(n, a, _)| (n, a)).collect();

    // A leader comes while a write and a read wait.
    let mut w = KvClient::new(patient(endpoint).await);
    let write = tokio::spawn(async move { answer(w.put(put_req("w")).await) });
    let mut r = KvClient::new(patient(endpoint).await);
    let read = tokio::spawn(async move { answer(r.range(get_req("k")).await) });
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    signal(others[0], libc::SIGCONT);
    let during_election = vec![write.await.unwrap(), read.await.unwrap()];
    signal(others[1], libc::SIGCONT);
    Seen {
        leaderless,
        during_election,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_a_leader_waits_for_one_and_answers_as_stock_etcd() {
    let (etcd, ephd) =
        on_stock_etcd_then_ephd(TIMING, |e, p| async move { scenario(&e, &p).await }).await;

    // What etcd 3.6 answers, so a change in the reference shows too.
    let deadline = "DeadlineExceeded: context deadline exceeded".to_string();
    let expected = Seen {
        leaderless: vec![
            ("put", deadline.clone()),
            ("txn", deadline.clone()),
            ("delete", deadline.clone()),
            ("compact", deadline.clone()),
            (
                "linearizable range",
                "Unavailable: etcdserver: request timed out".to_string(),
            ),
            ("lease grant", deadline.clone()),
            ("lease revoke", deadline),
            (
                "lease time-to-live",
                "Unavailable: etcdserver: no leader".to_string(),
            ),
            (
                "lease keep-alive",
                "Unavailable: etcdserver: no leader".to_string(),
            ),
        ],
        during_election: vec![
            "ok".to_string(),
            "Unavailable: etcdserver: leader changed".to_string(),
        ],
    };
    assert_eq!(etcd, expected, "stock etcd");
    assert_eq!(ephd, etcd, "ephd against stock etcd");
}

/// A `grpc-message` as text: servers percent-encode what they choose to
/// (tonic also spaces, grpc-go not).
fn percent_decoded(s: &str) -> String {
    let mut out = Vec::new();
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex: String = bytes.by_ref().take(2).map(char::from).collect();
            out.push(u8::from_str_radix(&hex, 16).expect("percent-encoded byte"));
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).expect("UTF-8 message")
}

/// MoveLeader to a stopped follower: puts on the leader while it waits for
/// the transfer, until one is refused (or 3 s pass); the refusal and
/// MoveLeader's answer at the client's deadline.
async fn transfer_to_a_stopped_member(endpoints: &[String], pids: &[u32]) -> (Answer, Answer) {
    let (li, fi, ids) = agreed(endpoints).await;
    let leader = &endpoints[li];
    // A cluster that has taken writes (a fresh ephd member proposes none
    // before the leader's limits are replicated).
    let mut kv = KvClient::new(patient(leader).await);
    assert_eq!(answer(kv.put(put_req("before-transfer")).await), "ok");
    signal(pids[fi], libc::SIGSTOP);
    let addr: std::net::SocketAddr = leader.trim_start_matches("http://").parse().unwrap();
    let target = ids[fi];
    let moving = tokio::task::spawn_blocking(move || {
        // By hand, so that the deadline goes to the server only: tonic's
        // client would also run a timer of its own that races the answer.
        let authority = addr.to_string();
        let mut fields = grpc_fields(MOVE_LEADER, &authority);
        let deadline = format!("{}m", MOVE_DEADLINE.as_millis());
        fields.push(("grpc-timeout", &deadline));
        let body = grpc_message(&MoveLeaderRequest { target_id: target }.encode_to_vec());
        let started = Instant::now();
        (raw_h2::exchange(addr, &fields, &body), started.elapsed())
    });
    let started = Instant::now();
    let refused = loop {
        let a = answer(kv.put(put_req("during-transfer")).await);
        if a != "ok" || started.elapsed() > Duration::from_secs(3) {
            break a;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let (moved, took) = moving.await.unwrap();
    signal(pids[fi], libc::SIGCONT);
    let moved = match moved {
        Outcome::Answered { trailers, .. } => {
            let code = field(&trailers, "grpc-status").unwrap_or("none");
            let code = tonic::Code::from_i32(code.parse().unwrap_or(-1));
            let message = percent_decoded(field(&trailers, "grpc-message").unwrap_or(""));
            format!("{code:?}: {message}")
        }
        other => format!("{other:?}"),
    };
    // etcd waits for the transfer as long as the client does.
    assert!(
        took >= MOVE_DEADLINE - Duration::from_millis(200),
        "MoveLeader answered {moved:?} after {took:?}, before the client's deadline"
    );
    (refused, moved)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_handing_over_to_a_stopped_member_refuses_writes_as_stock_etcd() {
    // A longer election timeout: raft gives the transfer up after one.
    let timing = ["--heartbeat-interval=100", "--election-timeout=1000"];
    let (etcd, ephd) = on_stock_etcd_then_ephd(&timing, |e, p| async move {
        transfer_to_a_stopped_member(&e, &p).await
    })
    .await;

    let expected = (
        "Unknown: raft proposal dropped".to_string(),
        "Unknown: etcdserver: request timed out, leader transfer took too long".to_string(),
    );
    // etcd 3.6 answers the timeout at the client's deadline, racing
    // grpc-go's own deadline, which resets the stream (CANCEL) when it
    // wins; ephd always answers.
    let reset = (expected.0.clone(), "Reset(8)".to_string());
    assert!(etcd == expected || etcd == reset, "stock etcd: {etcd:?}");
    assert_eq!(ephd, expected, "ephd");
}
