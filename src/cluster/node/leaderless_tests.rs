//! A member that knows no leader yet, on a real one-voter Raft node in
//! process with a 1 s election timeout (its first election comes 1 to 2 s
//! after it starts): writes wait for the leader as in etcd, a write the
//! Raft loop took without a leader is held until there is one, a held
//! write whose request has gone is dropped, never proposed, and a member
//! that stops answers the writes still waiting for a leader at once.

use crate::cluster::log::initial_gate_tests::{put, revision, solo};
use crate::error::Error;
use std::time::Duration;
use tokio::time::Instant;

const HEARTBEAT: Duration = Duration::from_millis(100);
const ELECTION: Duration = Duration::from_millis(1000);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_before_any_leader_waits_for_the_first_and_lands() {
    let (node, _store) = solo(false, HEARTBEAT, ELECTION);
    assert_eq!(node.status().leader(), None, "elected before a tick");
    let applied = node.propose(put("k")).await.expect("applied once elected");
    assert_eq!(revision(applied), 2);
    assert!(node.status().is_leader());
    tokio::task::spawn_blocking(move || node.stop())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_raft_loop_takes_without_a_leader_is_held_until_one_comes() {
    let (node, _store) = solo(false, HEARTBEAT, ELECTION);
    assert_eq!(node.status().leader(), None, "elected before a tick");
    // Straight to the Raft loop, past the wait for a leader.
    let deadline = Instant::now() + 4 * ELECTION;
    let applied = node.propose_by(put("k"), 0, deadline).await;
    assert_eq!(revision(applied.expect("held, then proposed")), 2);
    tokio::task::spawn_blocking(move || node.stop())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_write_whose_request_timed_out_is_never_proposed() {
    let (node, store) = solo(false, HEARTBEAT, ELECTION);
    assert_eq!(node.status().leader(), None, "elected before a tick");
    let soon = Instant::now() + Duration::from_millis(100);
    let gone = node.propose_by(put("gone"), 0, soon).await;
    // As etcd, whose Raft node takes no proposal without a leader: the
    // raw context error, not "request timed out".
    assert_eq!(gone.unwrap_err(), Error::NoLeaderInTime);
    assert!(node.status().held.lock().is_empty(), "forgotten");
    assert_eq!(node.status().leader(), None, "elected within 100 ms");
    // The next write after the election is the first one applied.
    let applied = node.propose(put("k")).await.expect("applied once elected");
    assert_eq!(revision(applied), 2, "the timed-out write was applied");
    assert_eq!(store.current_revision(), 2);
    tokio::task::spawn_blocking(move || node.stop())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_waiting_for_a_leader_answers_server_stopped_when_the_member_stops() {
    // Its first election would come after a minute: none comes here.
    let (node, _store) = solo(false, HEARTBEAT, Duration::from_secs(60));
    let writer = node.clone();
    let write = tokio::spawn(async move { writer.propose(put("k")).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!write.is_finished(), "the write waits for a leader");
    let stopping = node.clone();
    tokio::task::spawn_blocking(move || stopping.stop())
        .await
        .unwrap();
    let answered = tokio::time::timeout(Duration::from_secs(5), write)
        .await
        .expect("answered at once, not after the request timeout")
        .unwrap();
    assert_eq!(answered.unwrap_err(), Error::Stopped);
}
