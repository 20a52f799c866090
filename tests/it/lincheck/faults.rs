//! The fault scenarios: a recorded concurrent history on a three-member
//! cluster must stay linearizable when the leader or a follower is killed
//! (SIGKILL) under load, and when the leader or a follower is paused
//! (SIGSTOP: no peer or client traffic at all, the nearest the process
//! harness comes to cutting a minority off) and later resumed, which is
//! where a deposed leader would answer stale reads.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::StatusRequest;

use super::checker::{check, Event, Op, Ret};
use super::recorder::{run_client, History};
use crate::harness::{EphdCluster, Server};

/// etcd's 1:10 heartbeat to election ratio, ten times faster than its
/// defaults, so an election takes well under a second.
const TIMING: &[&str] = &["--heartbeat-interval=50", "--election-timeout=500"];

/// Clients, two per member at the start.
const CLIENTS: usize = 6;

/// Registers: few enough that clients contend on each.
const KEYS: usize = 6;

/// Load before the fault, and after the fault (or the resume): at least
/// this long and this many answered operations, at most `LOAD_CAP` (a
/// debug build on a loaded 2-core machine answers a few dozen operations
/// a second, a quiet machine hundreds).
const BEFORE: Duration = Duration::from_secs(2);
const AFTER: Duration = Duration::from_secs(3);
const MIN_OPS: usize = 60;
const LOAD_CAP: Duration = Duration::from_secs(12);

/// How long a paused member stays paused: several election timeouts.
const PAUSE: Duration = Duration::from_secs(3);

/// The index of the member every running member names as leader.
async fn leader(cluster: &EphdCluster) -> usize {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut seen = BTreeSet::new();
        let mut ids = Vec::new();
        for (i, m) in cluster.running() {
            let mut c = m.maintenance().await;
            let s = tokio::time::timeout(Duration::from_secs(2), c.status(StatusRequest {})).await;
            match s {
                Ok(Ok(s)) => {
                    let s = s.into_inner();
                    seen.insert(s.leader);
                    ids.push((i, s.header.map_or(0, |h| h.member_id)));
                }
                _ => {
                    seen.insert(0);
                }
            }
        }
        if let (1, Some(&id)) = (seen.len(), seen.iter().next()) {
            if let Some(&(i, _)) = ids.iter().find(|(_, m)| *m == id && id != 0) {
                return i;
            }
        }
        assert!(Instant::now() < deadline, "no agreed leader: {seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What to do to the cluster once the load runs.
#[derive(Clone, Copy, Debug)]
enum Fault {
    KillLeader,
    KillFollower,
    PauseLeader,
    PauseFollower,
}

/// Sends `signal` to member process `pid` (one this test started).
fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a child process of this test; no memory involved.
    let rc = unsafe { libc::kill(pid as libc::pid_t, signal) };
    assert_eq!(rc, 0, "kill({pid}, {signal})");
}

/// Resumes a paused member even when the test fails half-way.
struct Paused(u32);

impl Drop for Paused {
    fn drop(&mut self) {
        // SAFETY: as in `signal`.
        unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGCONT) };
    }
}

/// Lets the load run for `least`, then until `MIN_OPS` operations invoked
/// after `since` have answered, for `LOAD_CAP` at most.
async fn load(history: &History, since: u64, least: Duration) {
    let started = Instant::now();
    tokio::time::sleep(least).await;
    while started.elapsed() < LOAD_CAP {
        let answered = history
            .events()
            .iter()
            .filter(|e| e.call > since && e.returned.is_some())
            .count();
        if answered >= MIN_OPS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A read after the end of `events` that returns the value of an
/// acknowledged put which another acknowledged put, invoked after it
/// returned, overwrote: never linearizable (values are unique).
fn stale_read(events: &[Event]) -> Option<Event> {
    let end = events.iter().filter_map(|e| e.returned).max()?;
    let puts: Vec<&Event> = events
        .iter()
        .filter(|e| e.ret == Ret::Put && e.returned.is_some())
        .collect();
    for old in &puts {
        let newer = puts
            .iter()
            .any(|p| p.key == old.key && p.call > old.returned.unwrap());
        if let (true, Op::Put(v)) = (newer, old.op) {
            return Some(Event {
                client: usize::MAX,
                key: old.key.clone(),
                op: Op::Get,
                ret: Ret::Get(Some(v)),
                call: end + 1,
                returned: Some(end + 2),
            });
        }
    }
    None
}

/// Runs the load with `fault` and checks the history.
async fn scenario(fault: Fault) {
    let mut cluster = EphdCluster::start(3, TIMING);
    let leader_at = leader(&cluster).await;
    let endpoints: Vec<String> = cluster
        .running()
        .iter()
        .map(|(_, m)| m.endpoint())
        .collect();
    let keys: Vec<String> = (0..KEYS).map(|k| format!("lin/k{k}")).collect();
    let history = History::new();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| {
            tokio::spawn(run_client(
                id,
                endpoints.clone(),
                keys.clone(),
                history.clone(),
            ))
        })
        .collect();

    load(&history, 0, BEFORE).await;
    let victim = match fault {
        Fault::KillLeader | Fault::PauseLeader => leader_at,
        Fault::KillFollower | Fault::PauseFollower => (leader_at + 1) % 3,
    };
    let fault_at = history.now();
    match fault {
        Fault::KillLeader | Fault::KillFollower => cluster.kill(victim),
        Fault::PauseLeader | Fault::PauseFollower => {
            let pid = cluster.member(victim).expect("victim runs").pid();
            signal(pid, libc::SIGSTOP);
            let paused = Paused(pid);
            tokio::time::sleep(PAUSE).await;
            drop(paused);
        }
    }
    let healed_at = history.now();
    load(&history, healed_at, AFTER).await;
    history.stop();
    for c in clients {
        c.await.expect("client task");
    }

    let events = history.events();
    let acked_after = |t: u64| {
        events
            .iter()
            .filter(|e| e.call > t && matches!(e.ret, Ret::Put | Ret::Cas(true)))
            .count()
    };
    let unknown = events.iter().filter(|e| e.ret == Ret::Unknown).count();
    let reads = events
        .iter()
        .filter(|e| e.op == Op::Get && e.ret != Ret::Unknown)
        .count();
    // Latency per kind of operation (answered ones): mean and max in ms.
    let latency = |kind: fn(&Op) -> bool| {
        let ms: Vec<u64> = events
            .iter()
            .filter(|e| kind(&e.op))
            .filter_map(|e| Some((e.returned? - e.call) / 1_000_000))
            .collect();
        let mean = ms.iter().sum::<u64>() / (ms.len() as u64).max(1);
        format!(
            "{} answered, mean {mean} ms, max {} ms",
            ms.len(),
            ms.iter().max().unwrap_or(&0)
        )
    };
    eprintln!(
        "{fault:?}: gets {}; puts {}; txns {}",
        latency(|o| *o == Op::Get),
        latency(|o| matches!(o, Op::Put(_))),
        latency(|o| matches!(o, Op::Cas { .. }))
    );
    let started = Instant::now();
    let verdict = check(&events);
    eprintln!(
        "{fault:?} on m{victim}: {} operations ({reads} reads, {unknown} of unknown outcome), \
         {} writes acknowledged after the fault, {} after the heal; checked in {:?}",
        events.len(),
        acked_after(fault_at),
        acked_after(healed_at),
        started.elapsed()
    );
    if let Err(v) = verdict {
        panic!(
            "{fault:?} on m{victim} (fault at {fault_at} ns): {v}\n{}",
            cluster.logs()
        );
    }
    // The checker is not blind to this very history: a read issued after
    // everything returned that sees a value overwritten by a later
    // acknowledged put (a stale read) must be rejected.
    let stale = stale_read(&events).expect("a key with two sequential acknowledged puts");
    let mut tampered = events.clone();
    tampered.push(stale.clone());
    assert!(
        check(&tampered).is_err(),
        "the checker accepted an injected stale read: {stale}"
    );
    // Not vacuous: the cluster served load before and after the fault.
    assert!(acked_after(0) >= 20, "too few writes: {}", acked_after(0));
    assert!(
        acked_after(healed_at) >= 10,
        "no writes acknowledged after the fault: {}",
        acked_after(healed_at)
    );
    assert!(reads >= 20, "too few reads: {reads}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linearizable_when_the_leader_is_killed_under_load() {
    scenario(Fault::KillLeader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linearizable_when_a_follower_is_killed_under_load() {
    scenario(Fault::KillFollower).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linearizable_when_the_leader_is_paused_and_resumes() {
    scenario(Fault::PauseLeader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linearizable_when_a_follower_is_paused_and_resumes() {
    scenario(Fault::PauseFollower).await;
}
