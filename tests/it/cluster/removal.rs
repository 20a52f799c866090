//! A member removed from the cluster stops by itself, as a stock etcd 3.4
//! member does, side by side: the same scenario runs on a four-member
//! stock etcd and a four-member ephd. A running follower that is removed
//! exits (status 0) with a log line saying it was permanently removed; a
//! follower paused (SIGSTOP) while it is removed exits as soon as it runs
//! again and contacts the others, without disturbing them; a running leader
//! removed through a follower exits likewise, and the member left elects
//! itself and keeps serving writes.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{PutRequest, StatusRequest};

use crate::cluster::learner::ETCD_TIMING;
use crate::cluster::members::{add, members, remove};
use crate::cluster::{agreed_leader, SETTLE, TIMING};
use crate::etcd_cluster::{EtcdMember, StockEtcdCluster};
use crate::harness::{free_port, ClusterMember, EphdCluster, Server};

/// What etcd logs, and ephd too, when a member learns it was removed.
const REMOVED: &str = "the member has been permanently removed from the cluster";

/// The two kinds of cluster the scenario runs on.
trait Members {
    type M: Server + Sync;
    /// Member `i` (running).
    fn at(&self, i: usize) -> &Self::M;
    /// The indexes of the running members.
    fn running(&self) -> Vec<usize>;
    /// OS process id of member `i`.
    fn pid(&self, i: usize) -> u32;
    /// Exit status and log of member `i` once it exited by itself.
    fn exited(&mut self, i: usize, limit: Duration) -> Option<(ExitStatus, String)>;
    /// Adds a voter with MemberAdd and starts it; its index.
    async fn join_voter(&mut self) -> usize;
    /// Every running member's log, for failure messages.
    fn logs(&self) -> String;
}

impl Members for EphdCluster {
    type M = ClusterMember;
    fn at(&self, i: usize) -> &ClusterMember {
        self.member(i).expect("running")
    }
    fn running(&self) -> Vec<usize> {
        EphdCluster::running(self).iter().map(|(i, _)| *i).collect()
    }
    fn pid(&self, i: usize) -> u32 {
        self.at(i).pid()
    }
    fn exited(&mut self, i: usize, limit: Duration) -> Option<(ExitStatus, String)> {
        EphdCluster::exited(self, i, limit)
    }
    async fn join_voter(&mut self) -> usize {
        let c = self.at(0).cluster().await;
        let port = free_port();
        add(&c, &format!("http://127.0.0.1:{port}"), false)
            .await
            .expect("add a voter");
        let joined = self
            .start_joining("m3", port)
            .unwrap_or_else(|e| panic!("m3 did not join: {e}"));
        // Until m3 has published itself: its publish is a membership
        // change, and raft drops one proposed while another is pending (a
        // removal right after the join would time out).
        let deadline = Instant::now() + SETTLE;
        while !crate::cluster::members::members(self.at(0))
            .await
            .iter()
            .any(|m| m.name == "m3")
        {
            assert!(Instant::now() < deadline, "m3 never published itself");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        joined
    }
    fn logs(&self) -> String {
        EphdCluster::logs(self)
    }
}

impl Members for StockEtcdCluster {
    type M = EtcdMember;
    fn at(&self, i: usize) -> &EtcdMember {
        self.member(i).expect("running")
    }
    fn running(&self) -> Vec<usize> {
        StockEtcdCluster::running(self)
            .iter()
            .map(|(i, _)| *i)
            .collect()
    }
    fn pid(&self, i: usize) -> u32 {
        self.at(i).pid()
    }
    fn exited(&mut self, i: usize, limit: Duration) -> Option<(ExitStatus, String)> {
        StockEtcdCluster::exited(self, i, limit)
    }
    async fn join_voter(&mut self) -> usize {
        self.join(0, false).await.0
    }
    fn logs(&self) -> String {
        StockEtcdCluster::logs(self)
    }
}

/// Member `m`'s ID and the leader it knows (0: none).
async fn id_and_leader(m: &impl Server) -> Option<(u64, u64)> {
    let mut c = m.maintenance().await;
    let s = tokio::time::timeout(Duration::from_secs(2), c.status(StatusRequest {}))
        .await
        .ok()?
        .ok()?
        .into_inner();
    Some((s.header?.member_id, s.leader))
}

/// Waits until every running member names the same leader, one of them;
/// returns its index and every running member's index and ID.
async fn leader(c: &impl Members) -> (usize, Vec<(usize, u64)>) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let mut seen = Vec::new();
        for i in c.running() {
            seen.push((i, id_and_leader(c.at(i)).await));
        }
        let leaders: Vec<u64> = seen.iter().map(|(_, s)| s.map_or(0, |s| s.1)).collect();
        let ids: Vec<(usize, u64)> = seen
            .iter()
            .filter_map(|(i, s)| s.map(|s| (*i, s.0)))
            .collect();
        let at = ids
            .iter()
            .find(|(_, id)| *id == leaders[0])
            .map(|(i, _)| *i);
        if let (Some(at), true) = (at, leaders.iter().all(|l| *l == leaders[0])) {
            if ids.len() == seen.len() {
                return (at, ids);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no agreed leader: {seen:?}\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A put through `m`, retried while there is no leader yet.
async fn put(m: &impl Server, key: &str) {
    let mut kv = m.kv().await;
    let deadline = Instant::now() + SETTLE;
    loop {
        let req = PutRequest {
            key: key.as_bytes().to_vec().into(),
            value: b"v".to_vec().into(),
            ..Default::default()
        };
        match kv.put(req).await {
            Ok(_) => return,
            Err(s) if s.code() == tonic::Code::Unavailable && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(s) => panic!("put {key} through {}: {s:?}", m.endpoint()),
        }
    }
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a child process this test started.
    let rc = unsafe { libc::kill(pid as i32, sig) };
    assert_eq!(rc, 0, "signal {sig} to {pid}");
}

/// Waits for member `i` to exit by itself after its removal; what the
/// scenario compares: whether it exited successfully, and whether its log
/// says it was removed.
fn stopped(c: &mut impl Members, i: usize, what: &str) -> (bool, bool) {
    let (status, logs) = c
        .exited(i, SETTLE)
        .unwrap_or_else(|| panic!("{what}: still running after its removal\n{}", c.logs()));
    (status.success(), logs.contains(REMOVED))
}

/// The scenario (see the module docs); what each step observed.
async fn scenario(c: &mut impl Members) -> Vec<(&'static str, (bool, bool))> {
    let joined = c.join_voter().await;
    let mut out = Vec::new();
    // A running follower (the member just added) is removed.
    let (l, ids) = leader(c).await;
    let id = |i: usize| ids.iter().find(|(j, _)| *j == i).unwrap().1;
    let (joined_id, leader_id) = (id(joined), id(l));
    assert_ne!(joined, l, "the new member should not lead yet");
    let via = c.at(l).cluster().await;
    remove(&via, joined_id)
        .await
        .expect("remove a running follower");
    out.push((
        "running follower",
        stopped(c, joined, "the removed follower"),
    ));
    // A follower paused while it is removed stops once it runs again, and
    // the leader stays the leader.
    let paused = c.running().into_iter().find(|i| *i != l).unwrap();
    let paused_id = id(paused);
    signal(c.pid(paused), libc::SIGSTOP);
    remove(&via, paused_id)
        .await
        .expect("remove a paused follower");
    put(c.at(l), "while-paused").await;
    signal(c.pid(paused), libc::SIGCONT);
    out.push(("paused follower", stopped(c, paused, "the paused follower")));
    let (still, _) = leader(c).await;
    assert_eq!(still, l, "the removed member disturbed the leader");
    // The running leader is removed through the member left.
    let left = c.running().into_iter().find(|i| *i != l).unwrap();
    let via = c.at(left).cluster().await;
    let after = remove(&via, leader_id).await.expect("remove the leader");
    assert_eq!(after.len(), 1, "{after:?}");
    out.push(("running leader", stopped(c, l, "the removed leader")));
    // The member left leads itself and keeps serving.
    let (now, _) = leader(c).await;
    assert_eq!(now, left);
    put(c.at(left), "after-removals").await;
    let listed = members(c.at(left)).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_members_stop_by_themselves_as_stock_etcd_members_do() {
    let mut stock = StockEtcdCluster::start(3, ETCD_TIMING);
    let expected = scenario(&mut stock).await;
    let mut ours = EphdCluster::start(3, TIMING);
    agreed_leader(&ours, None).await;
    let got = scenario(&mut ours).await;
    assert_eq!(got, expected, "ephd (left) and stock etcd (right) differ");
    assert!(
        expected.iter().all(|(_, o)| *o == (true, true)),
        "{expected:?}"
    );
}
