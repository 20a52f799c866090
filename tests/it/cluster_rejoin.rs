//! The automatic rejoin's edges (`src/cluster/rejoin.rs`; the main path,
//! restarts through rounds of leader kills, is in `cluster_members.rs`): a
//! process started with `--initial-cluster-state new` whose peer URLs
//! belong to a learner not started yet (added by MemberAdd, or by a rejoin
//! it did not finish) starts as that learner and promotes itself; a member
//! an operator removed does not add itself back when its process restarts.

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
