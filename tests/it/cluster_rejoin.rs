//! The automatic rejoin's edges (`src/cluster/rejoin.rs`; the main path,
//! restarts through rounds of leader kills, is in `cluster_members.rs`): a
//! process started with `--initial-cluster-state new` whose peer URLs
//! belong to a learner not started yet (added by MemberAdd, or by a rejoin
//! it did not finish) starts as that learner and promotes itself; a member
//! an operator removed does not add itself back when its process restarts;
//! a leader killed and restarted within an election timeout (or just after
//! one) waits for the survivors' election and rejoins every time.

use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{Member, MemberAddRequest, MemberRemoveRequest};

use crate::cluster::{agreed_leader, put, status, SETTLE, TIMING};
use crate::cluster_members::{members, settled};
use crate::harness::{EphdCluster, Server};

/// Waits until the member with peer URL `url` is listed through member
/// `via` as a started voter; returns it.
async fn voter(cluster: &EphdCluster, via: usize, url: &str) -> Member {
    let deadline = Instant::now() + SETTLE;
    loop {
        let list = members(cluster.member(via).unwrap()).await;
        if let Some(m) = list
            .iter()
            .find(|m| m.peer_ur_ls == [url] && !m.is_learner && !m.name.is_empty())
        {
            return m.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{url} never became a voter: {list:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_added_learner_started_as_new_promotes_itself_and_a_removed_member_stays_out() {
    let mut cluster = EphdCluster::start(3, TIMING);
    let (leader, _) = agreed_leader(&cluster, None).await;
    let f = (leader + 1) % 3;
    let (f_id, _, _) = status(cluster.member(f).unwrap()).await.unwrap();
    let url = format!("http://127.0.0.1:{}", cluster.peer_port(f));
    let c = cluster.member(leader).unwrap().cluster().await;

    // An operator replaces a member that lost its state, but starts the
    // new process with the old flags (`new`): it starts as the learner
    // the operator added and promotes itself.
    cluster.kill(f);
    settled(|| {
        let mut c = c.clone();
        async move { c.member_remove(MemberRemoveRequest { id: f_id }).await }
    })
    .await
    .expect("remove");
    let learner = settled(|| {
        let mut c = c.clone();
        let req = MemberAddRequest {
            peer_ur_ls: vec![url.clone()],
            is_learner: true,
        };
        async move { c.member_add(req).await }
    })
    .await
    .expect("add a learner")
    .into_inner()
    .member
    .unwrap();
    let rev = put(cluster.member(leader).unwrap(), "k", "v").await;
    cluster
        .start_member(&format!("m{f}"), "new", Some(f))
        .unwrap_or_else(|e| panic!("the added learner did not start: {e}"));
    let promoted = voter(&cluster, leader, &url).await;
    assert_eq!(promoted.id, learner.id);
    let m = cluster.member(f).unwrap();
    assert!(put(m, "through-it", "v").await > rev);

    // An operator removes it for good: its process, restarted, is refused
    // and does not add itself back.
    settled(|| {
        let mut c = c.clone();
        async move {
            c.member_remove(MemberRemoveRequest { id: learner.id })
                .await
        }
    })
    .await
    .expect("remove for good");
    cluster.kill(f);
    let refused = cluster
        .start_member(&format!("m{f}"), "new", Some(f))
        .expect_err("a removed member must not add itself back");
    assert!(
        refused.contains("was removed from the cluster"),
        "{refused}"
    );
    let list = members(cluster.member(leader).unwrap()).await;
    assert_eq!(list.len(), 2, "{list:?}");
}

/// Puts `w/N` through the members in turn until `stop`, each within a
/// second; returns every acknowledged (key, revision).
async fn write_until(
    clients: Vec<etcd_client::Client>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<(String, i64)> {
    let mut acked = Vec::new();
    let mut n = 0usize;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let mut c = clients[n % clients.len()].clone();
        let key = format!("w/{n:06}");
        n += 1;
        if let Ok(Ok(r)) =
            tokio::time::timeout(Duration::from_secs(1), c.put(key.as_bytes(), "v", None)).await
        {
            acked.push((key, r.header().unwrap().revision()));
        } else {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_and_restarted_quickly_rejoins_every_time() {
    // The restarted member comes back while the survivors may still name
    // it as their leader (0.2 s, 0.6 s: within the election timeout), or
    // after they elected (2 s). Every time it must rejoin as a voter, not
    // give up on the election in between.
    const DELAYS_MS: [u64; 3] = [200, 600, 2_000];
    let rounds: usize = std::env::var("EPHD_QUICK_RESTART_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let mut cluster = EphdCluster::start(3, TIMING);
    let mut clients = Vec::new();
    for i in 0..3 {
        clients.push(cluster.member(i).unwrap().client().await);
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = tokio::spawn(write_until(clients, stop.clone()));
    let started = Instant::now();
    let mut back = Vec::new();
    for round in 0..rounds {
        let (leader, leader_id) = agreed_leader(&cluster, None).await;
        let url = format!("http://127.0.0.1:{}", cluster.peer_port(leader));
        cluster.kill(leader);
        let killed = Instant::now();
        // The restart delay is the scenario, not a wait for a condition.
        tokio::time::sleep(Duration::from_millis(DELAYS_MS[round % 3])).await;
        cluster
            .start_member(&format!("m{leader}"), "new", Some(leader))
            .unwrap_or_else(|e| panic!("round {round}: m{leader} did not start: {e}"));
        let via = (leader + 1) % 3;
        let fresh = voter(&cluster, via, &url).await;
        assert_ne!(fresh.id, leader_id, "round {round}: back under its old ID");
        back.push(killed.elapsed());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let acked = writer.await.unwrap();
    assert!(
        acked.len() > rounds,
        "only {} writes acknowledged",
        acked.len()
    );
    // Every acknowledged write is there, at its revision, through a
    // linearizable read of the whole prefix.
    let (leader, _) = agreed_leader(&cluster, None).await;
    let mut kv = cluster.member(leader).unwrap().client().await;
    let all = kv
        .get("w/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .expect("range");
    let stored: std::collections::HashMap<&[u8], i64> = all
        .kvs()
        .iter()
        .map(|kv| (kv.key(), kv.mod_revision()))
        .collect();
    for (key, rev) in &acked {
        assert_eq!(stored.get(key.as_bytes()), Some(rev), "{key}");
    }
    back.sort();
    eprintln!(
        "{rounds} quick leader restarts in {:?}: back as a voter after median {:?}, max {:?}; \
         {} writes acknowledged",
        started.elapsed(),
        back[back.len() / 2],
        back[back.len() - 1],
        acked.len()
    );
}
