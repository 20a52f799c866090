//! A cluster member's Raft log (`--wal`, the default `buffered` with a
//! data dir): members killed with SIGKILL under writes, one, two or all
//! three at once, come back under their own IDs with their votes and
//! entries, and the cluster goes on by itself with every acknowledged
//! write (five members losing two at once too, and a member added just
//! before the crash); a member stopped with
//! SIGTERM comes back under its own ID; a member whose log is gone takes
//! the rejoin path instead.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::cluster_client::ClusterClient;

use crate::cluster::members::{add, caught_up, members};
use crate::cluster::{agreed_leader, put, same_everywhere, SETTLE, TIMING};
use crate::harness::{EphdCluster, Server};

/// Concurrent writers: enough to keep thousands of writes a second in
/// flight on two cores (`EPHD_CLUSTER_WAL_WRITERS` for more).
fn writers() -> usize {
    std::env::var("EPHD_CLUSTER_WAL_WRITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16)
}

/// Writes acknowledged in the window whose rate each kill round reports.
const RATE_WINDOW: usize = 1000;

fn args(root: &str) -> Vec<String> {
    let mut out: Vec<String> = TIMING.iter().map(|s| s.to_string()).collect();
    out.push("--snapshot-interval=1s".into());
    out.push(format!("--data-dir={root}/{{name}}"));
    out
}

fn start(root: &str) -> EphdCluster {
    start_n(3, root)
}

fn start_n(n: usize, root: &str) -> EphdCluster {
    let owned = args(root);
    let flags: Vec<&str> = owned.iter().map(String::as_str).collect();
    EphdCluster::start(n, &flags)
}

/// Writers putting `w/<writer>/<n>` through the members in turn until
/// `stop`; each returns its acknowledged (key, revision).
struct Load {
    /// A client per member (a restarted member serves on a new port).
    clients: Arc<std::sync::RwLock<Vec<etcd_client::Client>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<(String, i64)>>>,
    acked: Arc<std::sync::atomic::AtomicUsize>,
}

impl Load {
    async fn start(cluster: &EphdCluster) -> Load {
        let mut clients = Vec::new();
        for (_, m) in cluster.running() {
            clients.push(m.client().await);
        }
        let clients = Arc::new(std::sync::RwLock::new(clients));
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tasks = (0..writers())
            .map(|w| {
                let clients = clients.clone();
                let (stop, count) = (stop.clone(), acked.clone());
                tokio::spawn(async move {
                    let mut acked = Vec::new();
                    let mut n = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        let mut c = {
                            let clients = clients.read().unwrap();
                            clients[(w + n) % clients.len()].clone()
                        };
                        let key = format!("w/{w:02}/{n:07}");
                        n += 1;
                        let put = c.put(key.as_bytes(), "v", None);
                        match tokio::time::timeout(Duration::from_secs(2), put).await {
                            Ok(Ok(r)) => {
                                acked.push((key, r.header().unwrap().revision()));
                                count.fetch_add(1, Ordering::Relaxed);
                            }
                            _ => tokio::time::sleep(Duration::from_millis(20)).await,
                        }
                    }
                    acked
                })
            })
            .collect();
        Load {
            clients,
            stop,
            tasks,
            acked,
        }
    }

    /// Writes through member `i` as it serves now (after its restart).
    async fn reconnect(&self, cluster: &EphdCluster, i: usize) {
        let client = cluster.member(i).unwrap().client().await;
        self.clients.write().unwrap()[i] = client;
    }

    fn count(&self) -> usize {
        self.acked.load(Ordering::Relaxed)
    }

    /// Waits until `more` writes beyond what is acknowledged now are.
    async fn progress(&self, more: usize, cluster: &EphdCluster) -> Duration {
        let started = Instant::now();
        let target = self.count() + more;
        while self.count() < target {
            assert!(
                started.elapsed() < SETTLE,
                "writes did not resume: {} of {target}\n{}",
                self.count(),
                cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        started.elapsed()
    }

    async fn finish(self) -> Vec<(String, i64)> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for t in self.tasks {
            all.extend(t.await.unwrap());
        }
        all
    }
}

/// Every acknowledged write is there at its revision (a linearizable read
/// of the prefix through the leader), and every member holds the same.
async fn every_write_there(cluster: &EphdCluster, acked: &[(String, i64)]) {
    let (leader, _) = agreed_leader(cluster, None).await;
    let mut kv = cluster.member(leader).unwrap().client().await;
    let all = kv
        .get("w/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .expect("range");
    let stored: HashMap<&[u8], i64> = all
        .kvs()
        .iter()
        .map(|kv| (kv.key(), kv.mod_revision()))
        .collect();
    let lost: Vec<&(String, i64)> = acked
        .iter()
        .filter(|(key, rev)| stored.get(key.as_bytes()) != Some(rev))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged writes lost or changed, first {:?}",
        lost.len(),
        acked.len(),
        &lost[..lost.len().min(5)]
    );
    let newest = acked.iter().map(|(_, r)| *r).max().unwrap_or(0);
    same_everywhere(cluster, newest).await;
}

/// The member IDs and whether any is a learner, as member `via` lists them.
async fn voter_ids(cluster: &EphdCluster, via: usize) -> BTreeSet<u64> {
    let list = members(cluster.member(via).unwrap()).await;
    assert!(list.iter().all(|m| !m.is_learner), "{list:?}");
    list.iter().map(|m| m.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_killed_under_writes_come_back_under_their_ids_with_every_acknowledged_write() {
    let rounds: usize = std::env::var("EPHD_CLUSTER_WAL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let mut cluster = start(&root);
    agreed_leader(&cluster, None).await;
    let ids = voter_ids(&cluster, 0).await;
    let load = Load::start(&cluster).await;
    load.progress(500, &cluster).await;
    let mut resumed = Vec::new();
    let mut rates = Vec::new();
    for round in 0..rounds {
        let (leader, _) = agreed_leader(&cluster, None).await;
        // Odd rounds: the leader alone; even rounds: the leader and a
        // follower, a majority.
        let killed: Vec<usize> = if round % 2 == 1 {
            vec![leader]
        } else {
            vec![leader, (leader + 1) % 3]
        };
        load.progress(200, &cluster).await;
        // The rate the members are killed under.
        let window = load.progress(RATE_WINDOW, &cluster).await;
        rates.push((RATE_WINDOW as f64 / window.as_secs_f64()) as u64);
        for &i in &killed {
            cluster.kill(i);
        }
        let restarted = Instant::now();
        for &i in &killed {
            cluster
                .start_member(&format!("m{i}"), "new", Some(i))
                .unwrap_or_else(|e| panic!("round {round}: m{i} did not start: {e}"));
            load.reconnect(&cluster, i).await;
        }
        load.progress(100, &cluster).await;
        resumed.push((killed.len(), restarted.elapsed()));
        let via = (killed[0] + 2) % 3;
        assert_eq!(
            voter_ids(&cluster, via).await,
            ids,
            "round {round}: the members are not the same"
        );
        let logs = cluster.logs();
        assert!(
            !logs.contains("rejoin"),
            "round {round}: a member rejoined\n{logs}"
        );
    }
    let acked = load.finish().await;
    every_write_there(&cluster, &acked).await;
    rates.sort_unstable();
    eprintln!(
        "{rounds} rounds, {} writes acknowledged; killed under writes/s (sorted): {rates:?}; \
         writes resumed after (members killed, time from their restart): {resumed:?}",
        acked.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_cluster_killed_under_writes_continues_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let mut cluster = start(&root);
    agreed_leader(&cluster, None).await;
    let ids = voter_ids(&cluster, 0).await;
    let load = Load::start(&cluster).await;
    load.progress(2_000, &cluster).await;
    for i in 0..3 {
        cluster.kill(i);
    }
    let acked = load.finish().await;
    let newest = acked.iter().map(|(_, r)| *r).max().unwrap();
    cluster
        .restart_together(&[0, 1, 2])
        .unwrap_or_else(|e| panic!("whole-cluster restart: {e}"));
    every_write_there(&cluster, &acked).await;
    assert_eq!(voter_ids(&cluster, 1).await, ids);
    // The revisions go on from where they stopped: nothing was resumed
    // from an older state, so there is no jump.
    let (leader, _) = agreed_leader(&cluster, None).await;
    let next = put(cluster.member(leader).unwrap(), "after", "1").await;
    assert!(
        next > newest && next < newest + 100,
        "revision {next} after {newest}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_stopped_with_sigterm_returns_under_its_id_and_one_without_its_log_rejoins() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let mut cluster = start(&root);
    let (leader, _) = agreed_leader(&cluster, None).await;
    let ids = voter_ids(&cluster, 0).await;
    let other = (leader + 1) % 3;
    cluster.terminate(other);
    assert!(
        cluster.reap(other, Duration::from_secs(20)),
        "m{other} did not stop cleanly"
    );
    let rev = put(cluster.member(leader).unwrap(), "while-away", "1").await;
    let restarted = Instant::now();
    cluster
        .start_member(&format!("m{other}"), "new", Some(other))
        .unwrap_or_else(|e| panic!("restart after SIGTERM: {e}"));
    let back = cluster.member(other).unwrap();
    // It serves a linearizable write and read through itself: a voter
    // under its own ID again.
    put(back, "through-it", "1").await;
    let serving = restarted.elapsed();
    assert_eq!(voter_ids(&cluster, other).await, ids);
    same_everywhere(&cluster, rev).await;
    eprintln!("after SIGTERM, a voter under its own ID again {serving:?} after its restart");

    // Its log removed (its saved state kept): it must not vote under its
    // old ID again; it rejoins under a new one.
    cluster.kill(other);
    let member_dir = format!("{root}/m{other}");
    for entry in std::fs::read_dir(&member_dir).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("raft-log-")
        {
            std::fs::remove_dir_all(path).unwrap();
        }
    }
    cluster
        .start_member(&format!("m{other}"), "new", Some(other))
        .unwrap_or_else(|e| panic!("restart without its log: {e}"));
    let deadline = Instant::now() + SETTLE;
    loop {
        let list = members(cluster.member(leader).unwrap()).await;
        let now: BTreeSet<u64> = list.iter().map(|m| m.id).collect();
        if list.len() == 3 && list.iter().all(|m| !m.is_learner) && now != ids {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never a voter under a new ID: {list:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rev = put(cluster.member(other).unwrap(), "after-rejoin", "1").await;
    same_everywhere(&cluster, rev).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_members_lose_two_at_once_under_writes_and_take_them_back_under_their_ids() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let mut cluster = start_n(5, &root);
    agreed_leader(&cluster, None).await;
    let ids = voter_ids(&cluster, 0).await;
    assert_eq!(ids.len(), 5);
    let load = Load::start(&cluster).await;
    load.progress(500, &cluster).await;
    for round in 0..2 {
        let (leader, _) = agreed_leader(&cluster, None).await;
        let killed = [leader, (leader + 1 + round) % 5];
        for &i in &killed {
            cluster.kill(i);
        }
        // Three of five keep the majority: writes go on meanwhile.
        load.progress(200, &cluster).await;
        for &i in &killed {
            cluster
                .start_member(&format!("m{i}"), "new", Some(i))
                .unwrap_or_else(|e| panic!("round {round}: m{i} did not start: {e}"));
            load.reconnect(&cluster, i).await;
        }
        load.progress(200, &cluster).await;
        assert_eq!(voter_ids(&cluster, killed[0]).await, ids, "round {round}");
    }
    let acked = load.finish().await;
    every_write_there(&cluster, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_added_just_before_a_crash_comes_back_from_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let mut cluster = start(&root);
    let (leader, _) = agreed_leader(&cluster, None).await;
    let before = put(cluster.member(leader).unwrap(), "before", "1").await;
    let peer = crate::harness::free_port();
    let c = ClusterClient::new(cluster.member(leader).unwrap().channel().await);
    let added = add(&c, &format!("http://127.0.0.1:{peer}"), false)
        .await
        .unwrap_or_else(|s| panic!("member add: {s:?}"));
    let j = cluster
        .start_joining("m3", peer)
        .unwrap_or_else(|e| panic!("join: {e}"));
    caught_up(cluster.member(j).unwrap(), "before", before).await;
    let ids = voter_ids(&cluster, leader).await;
    assert_eq!(ids.len(), 4);
    // The new member and another go down at once, before any periodic
    // save: two of four, so the others cannot write until one is back.
    let other = (leader + 1) % 3;
    cluster.kill(j);
    cluster.kill(other);
    cluster
        .start_member("m3", "existing", Some(j))
        .unwrap_or_else(|e| panic!("the added member did not start again: {e}"));
    cluster
        .start_member(&format!("m{other}"), "new", Some(other))
        .unwrap_or_else(|e| panic!("m{other} did not start again: {e}"));
    let back = cluster.member(j).unwrap();
    let rev = put(back, "after", "1").await;
    assert_eq!(voter_ids(&cluster, j).await, ids);
    assert!(ids.contains(&added.id));
    same_everywhere(&cluster, rev).await;
}
