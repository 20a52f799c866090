//! A write through a follower is answered as soon as that follower learns
//! its entry is committed, which the leader tells its followers at once
//! (an append carrying the new commit index, as etcd's Raft sends), never
//! only with the next heartbeat. These clusters beat their heartbeats far
//! apart, so a follower that waited for a heartbeat to learn of a commit
//! would take a fifth of a second per write on average: fifty writes one
//! after another would take about ten seconds, and a client's fifty writes
//! among others' just as long. (Leaving commits to the next append or
//! heartbeat was tried to save messages below peak and measured no
//! fewer: BENCHMARKS.md, "Applying where the round ran".)

use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::PutRequest;

use crate::cluster::{agreed_leader, put, same_everywhere};
use crate::harness::{EphdCluster, Server};
use crate::support::within;

/// Heartbeats 400 ms apart; elections five heartbeats (the least etcd
/// allows), so the first leader comes within seconds.
const SLOW_HEARTBEATS: &[&str] = &[
    "--heartbeat-interval=400",
    "--election-timeout=2000",
    "--revision-continuity=false",
];
/// Writes per client.
const WRITES: usize = 50;
/// Clients writing at once in the second half.
const CLIENTS: usize = 8;
/// What fifty writes may take: a fifth of the ~10 s they would take if each
/// waited for a heartbeat, and many times what they take when followers
/// are told at once (milliseconds each).
const BOUND: Duration = Duration::from_secs(4);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_followers_are_answered_without_waiting_for_a_heartbeat() {
    let cluster = EphdCluster::start(3, SLOW_HEARTBEATS);
    let (leader, _) = agreed_leader(&cluster, None).await;
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();

    // One at a time, alternating followers: no later append comes to carry
    // the commit, so the follower learns of it from the leader's message
    // sent at the commit.
    let started = Instant::now();
    let mut last = 0;
    for w in 0..WRITES {
        let m = cluster.member(followers[w % 2]).unwrap();
        let rev = put(m, &format!("one/{w}"), "v").await;
        assert!(rev > last, "revision {rev} after {last}");
        last = rev;
    }
    let alone = started.elapsed();
    assert!(
        alone < BOUND,
        "{WRITES} writes one at a time through followers took {alone:?}"
    );

    // Several clients at once, through both followers and the leader:
    // entries committed while later ones wait for acks, and no client's
    // write is left waiting.
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        // Two clients of eight write through the leader.
        let member = if c < 2 { leader } else { followers[c % 2] };
        let mut kv = cluster.member(member).unwrap().kv().await;
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            for w in 0..WRITES {
                let req = PutRequest {
                    key: format!("many/{c}/{w}").into_bytes().into(),
                    value: b"v".to_vec().into(),
                    ..Default::default()
                };
                within("put", kv.put(req))
                    .await
                    .unwrap_or_else(|s| panic!("put many/{c}/{w} through m{member}: {s:?}"));
            }
            started.elapsed()
        }));
    }
    let mut slowest = Duration::ZERO;
    for t in tasks {
        slowest = slowest.max(t.await.expect("client task"));
    }
    assert!(
        slowest < BOUND,
        "{CLIENTS} clients' {WRITES} writes each took up to {slowest:?} (all: {:?})",
        started.elapsed()
    );

    // Every write is on every member, at the same revisions.
    let kvs = same_everywhere(&cluster, last + (CLIENTS * WRITES) as i64).await;
    assert_eq!(kvs.len(), WRITES + CLIENTS * WRITES);
}
