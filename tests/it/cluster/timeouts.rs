//! A write whose fate a leader failure made unknown gets etcd's answer,
//! compared with a three-member stock etcd in the same scenario: the
//! leader is stopped (SIGSTOP) right before a write reaches a follower,
//! which forwards it to the stopped leader; the others elect a new leader.
//! After the request timeout the client gets Unavailable with etcd's text,
//! chosen by etcd's rule: `etcdserver: request timed out, possibly due to
//! previous leader failure` when the follower that took the write itself
//! became the new leader less than two election timeouts after it, else
//! `etcdserver: request timed out`. Both systems are held to the rule;
//! which side of it a run falls on depends on who won the election and how
//! long it took. The write's fate is
//! unknown (stock etcd sometimes commits it after all); it is applied at
//! most once, the same on every member. A loaded machine can spoil the
//! set-up (an election before the stop, a write that arrives after the
//! follower lost its leader); the scenario is then set up again.

use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use ephd::proto::etcdserverpb::{kv_client::KvClient, PutRequest, RangeRequest, StatusRequest};
use tonic::transport::Channel;

use crate::etcd_cluster::on_stock_etcd_then_ephd;
use crate::support::{patient_channel, signal};

/// The same timing for both (ephd's `--revision-continuity=false` aside):
/// etcd's defaults. The write must reach the follower before it misses the
/// stopped leader (at least one election timeout after the stop), or it
/// would wait for the new leader and commit; a short election timeout made
/// that a race with the test's own scheduling on a loaded machine.
const TIMING: &[&str] = &["--heartbeat-interval=100", "--election-timeout=1000"];

/// `--election-timeout` in `TIMING`.
const ELECTION: Duration = Duration::from_millis(1000);

/// etcd's request timeout with `TIMING`: 5 s plus two election timeouts.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(7_000);

/// How long after the test sends the write the follower may take it: the
/// server's "proposed" time is later than the test's by at most this.
const ARRIVAL: Duration = Duration::from_millis(250);

const LEADER_FAIL: &str = "etcdserver: request timed out, possibly due to previous leader failure";
const TIMED_OUT: &str = "etcdserver: request timed out";

const SETTLE: Duration = Duration::from_secs(20);

/// A channel that waits longer than the server's request timeout (the
/// harness' channels give up after 5 s).
async fn patient(endpoint: &str) -> Channel {
    patient_channel(endpoint, REQUEST_TIMEOUT * 3).await
}

/// The index of the member every member names as leader, and its ID.
async fn leader(endpoints: &[String]) -> (usize, u64) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let mut seen = Vec::new();
        for e in endpoints {
            let mut m = MaintenanceClient::new(patient(e).await);
            seen.push(
                m.status(StatusRequest {})
                    .await
                    .ok()
                    .map(|s| s.into_inner())
                    .map(|s| (s.header.unwrap().member_id, s.leader)),
            );
        }
        let first = seen[0].map(|s| s.1);
        if first.is_some_and(|l| l != 0) && seen.iter().all(|s| s.map(|s| s.1) == first) {
            let at = seen.iter().position(|s| s.map(|s| s.0) == first).unwrap();
            return (at, first.unwrap());
        }
        assert!(Instant::now() < deadline, "no agreed leader: {seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn put_req(key: &str) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec().into(),
        value: b"v".to_vec().into(),
        ..Default::default()
    }
}

/// Puts `key` through `endpoint`, retrying while the cluster settles.
async fn put(endpoint: &str, key: &str) {
    let mut kv = KvClient::new(patient(endpoint).await);
    let deadline = Instant::now() + SETTLE;
    while let Err(e) = kv.put(put_req(key)).await {
        assert!(Instant::now() < deadline, "put {key}: {e:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many times the scenario may be set up again when a loaded machine
/// spoiled it (see [`lose_a_forwarded_write`]).
const ATTEMPTS: usize = 3;

/// Runs the scenario until it is not spoiled; the answer and whether the
/// follower became the leader.
async fn lose_a_forwarded_write(endpoints: &[String], pids: &[u32]) -> (String, bool) {
    for attempt in 1..=ATTEMPTS {
        if let Some(outcome) = attempt_to_lose_a_forwarded_write(endpoints, pids, attempt).await {
            return outcome;
        }
        eprintln!("attempt {attempt} spoiled by the machine's load; setting it up again");
    }
    panic!("the scenario was spoiled {ATTEMPTS} times in a row");
}

/// Runs the scenario once and checks the answer by etcd's rule; `None`
/// when it could not happen as intended, on etcd and ephd alike: the
/// member stopped was no longer the leader (an election on a loaded
/// machine came between; a new leader is then seen at once, where an
/// election after the stop takes at least an election timeout), or the write reached the follower only once it had lost its
/// leader (it then waits for the new leader and commits, as in etcd).
async fn attempt_to_lose_a_forwarded_write(
    endpoints: &[String],
    pids: &[u32],
    attempt: usize,
) -> Option<(String, bool)> {
    let (li, old_leader) = leader(endpoints).await;
    let follower = &endpoints[(li + 1) % endpoints.len()];
    let lost_key = format!("lost-{attempt}");
    let after_key = format!("after-{attempt}");
    put(follower, &format!("before-{attempt}")).await;
    let mut kv = KvClient::new(patient(follower).await);

    signal(pids[li], libc::SIGSTOP);
    let started = Instant::now();
    let key = lost_key.clone();
    let write = tokio::spawn(async move { kv.put(put_req(&key)).await });
    // When the follower became the new leader's follower or the new leader,
    // as its Status says: after `not_before` (a poll sent then did not see
    // it yet) and by `seen` (the poll that saw it had returned). Polls under
    // load can take long, so the bounds, not one instant, decide below.
    let mut status = MaintenanceClient::new(patient(follower).await);
    let mut not_before = Duration::ZERO;
    let (seen, follower_leads) = loop {
        let sent = started.elapsed();
        let s = status.status(StatusRequest {}).await;
        if let Ok(s) = s.map(|s| s.into_inner()) {
            if s.leader != 0 && s.leader != old_leader {
                break (started.elapsed(), s.leader == s.header.unwrap().member_id);
            }
        }
        not_before = sent;
        assert!(started.elapsed() < SETTLE, "no new leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let answer = write.await.unwrap();
    let took = started.elapsed();
    signal(pids[li], libc::SIGCONT);
    if seen < ELECTION / 2 || answer.is_ok() {
        eprintln!("new leader seen after {seen:?}; the write answered {answer:?}");
        return None;
    }
    let e = answer.expect_err("the forwarded write cannot be acknowledged");
    assert!(
        took >= REQUEST_TIMEOUT - Duration::from_millis(100),
        "{took:?}: {e:?}"
    );
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    // etcd's rule: the member that took the write became leader less than
    // two election timeouts after it took it. That span is at most `seen`
    // and more than `not_before - ARRIVAL`; where those bounds straddle the
    // edge either answer is right.
    let edge = 2 * ELECTION;
    let expected: &[&str] = if !follower_leads {
        &[TIMED_OUT]
    } else if seen < edge {
        &[LEADER_FAIL]
    } else if not_before.saturating_sub(ARRIVAL) >= edge {
        &[TIMED_OUT]
    } else {
        &[LEADER_FAIL, TIMED_OUT]
    };
    assert!(
        expected.contains(&e.message()),
        "{e:?} with the new leader seen between {not_before:?} and {seen:?} (the follower \
         leads: {follower_leads})"
    );

    // A new leader serves; once every member has caught up, the write of
    // unknown fate is on none of them or on all of them, applied once (it
    // was proposed once: stock etcd sometimes commits it after all).
    let (_, new_leader) = leader(endpoints).await;
    assert_ne!(new_leader, old_leader);
    put(follower, &after_key).await;
    let mut fates = Vec::new();
    for (i, endpoint) in endpoints.iter().enumerate() {
        let mut c = KvClient::new(patient(endpoint).await);
        let deadline = Instant::now() + SETTLE;
        let get = |key: &str, serializable| RangeRequest {
            key: key.as_bytes().to_vec().into(),
            serializable,
            ..Default::default()
        };
        while !c
            .range(get(&after_key, false))
            .await
            .is_ok_and(|r| r.into_inner().count == 1)
        {
            assert!(Instant::now() < deadline, "member {i} did not catch up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let lost = c.range(get(&lost_key, true)).await.unwrap().into_inner();
        fates.push(lost.kvs);
    }
    assert!(fates.iter().all(|f| *f == fates[0]), "{fates:?}");
    assert!(fates[0].iter().all(|kv| kv.version == 1), "{fates:?}");
    Some((e.message().to_string(), follower_leads))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lost_with_a_failed_leader_times_out_as_in_stock_etcd() {
    let (etcd, ephd) = on_stock_etcd_then_ephd(TIMING, |e, p| async move {
        lose_a_forwarded_write(&e, &p).await
    })
    .await;
    // Each answer was checked by etcd's rule above. Both are one of etcd's
    // two texts, and where the scenario came out alike on both (the member
    // that took the write stayed a follower), the same text.
    for (message, _) in [&etcd, &ephd] {
        assert!(
            [LEADER_FAIL, TIMED_OUT].contains(&message.as_str()),
            "etcd {etcd:?}, ephd {ephd:?}"
        );
    }
    if !etcd.1 && !ephd.1 {
        assert_eq!(etcd.0, ephd.0, "the follower stayed a follower on both");
    }
}
