//! What a Raft snapshot carries beside the store: a follower that falls
//! behind the leader's kept log while users, roles, tokens and the member
//! list change, and then catches up by snapshot, ends up with the same
//! auth state (users added, passwords, permissions, the enabled flag, the
//! auth revision, tokens issued meanwhile) and the same member list as the
//! others, and decides requests as they do.

use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::cluster_client::ClusterClient;
use ephd::proto::etcdserverpb::{
    self as pb, kv_client::KvClient, MemberAddRequest, MemberUpdateRequest,
};
use etcd_client::Permission;
use tonic::transport::Channel;

use crate::auth::{auth_status, client_as, connect_with_retry, raw_get, raw_token, with_token};
use crate::cluster::members::members;
use crate::cluster::snapshot::{all_at, leader, metric, signal, ARGS, SETTLE};
use crate::harness::{connect_channel, free_port, EphdCluster, Server};
use crate::support::within;

/// The cluster's timing and small log, with fast password hashing.
fn args() -> Vec<&'static str> {
    let mut a = ARGS.to_vec();
    a.extend(["--bcrypt-cost", "4"]);
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_caught_up_by_snapshot_has_the_auth_state_and_member_list() {
    let cluster = EphdCluster::start(3, &args());
    let li = leader(&cluster).await;
    let fi = (li + 1) % 3;
    let (l, f) = (cluster.member(li).unwrap(), cluster.member(fi).unwrap());
    let (le, fe) = (l.endpoint(), f.endpoint());

    // Before the cut: root, a role on /app/ for u1, auth enabled.
    let mut setup = connect_with_retry(&le).await;
    setup.user_add("root", "pw", None).await.unwrap();
    setup.user_grant_role("root", "root").await.unwrap();
    setup.user_add("u1", "p", None).await.unwrap();
    setup.role_add("app").await.unwrap();
    setup
        .role_grant_permission("app", Permission::read_write("/app/").with_prefix())
        .await
        .unwrap();
    setup.user_grant_role("u1", "app").await.unwrap();
    setup.auth_enable().await.unwrap();
    let mut root = client_as(&le, "root", "pw").await.unwrap();
    let cut = root.put("/app/cut", "x", None).await.unwrap();
    let cut = cut.header().unwrap().revision();
    let deadline = Instant::now() + SETTLE;
    while status_revision(&fe, &raw_token(&le, "root", "pw").await).await < cut {
        assert!(Instant::now() < deadline, "follower behind before the cut");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A learner (never started), added while every member is up (etcd
    // allows one learner, and no addition while a member is down).
    let mut cc = l.cluster().await;
    let learner = add_learner(&mut cc).await;
    let deadline = Instant::now() + SETTLE;
    while members(f).await.len() < 4 {
        assert!(Instant::now() < deadline, "the follower lists the learner");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let installed_before = metric(f, "ephd_raft_snapshots_installed_total");
    let mut fmaint = f.maintenance().await;
    let root_token = raw_token(&le, "root", "pw").await;
    let applied_at_cut = within(
        "status",
        fmaint.status(with_token(pb::StatusRequest {}, &root_token)),
    )
    .await
    .expect("status")
    .into_inner()
    .raft_applied_index;

    signal(f, libc::SIGSTOP);
    // First enough writes that the leader stops sending to the paused
    // member (its in-flight window fills): what follows never reaches the
    // member's socket buffers, only a snapshot can bring it.
    for i in 0..400 {
        root.put(format!("/app/k{}", i % 17), format!("v{i}"), None)
            .await
            .expect("put while the follower is paused");
    }
    // While it is paused, in what the leader will compact away: a new
    // user with a role on /ops/, u1's password changed, a token issued, a
    // learner's peer URL changed.
    root.user_add("u2", "p2", None).await.unwrap();
    root.role_add("ops").await.unwrap();
    root.role_grant_permission("ops", Permission::read_write("/ops/").with_prefix())
        .await
        .unwrap();
    root.user_grant_role("u2", "ops").await.unwrap();
    root.user_change_password("u1", "p-new").await.unwrap();
    let u2_token = raw_token(&le, "u2", "p2").await;
    let moved_url = format!("http://127.0.0.1:{}", free_port());
    within(
        "member update",
        cc.member_update(MemberUpdateRequest {
            id: learner,
            peer_ur_ls: vec![moved_url.clone()],
        }),
    )
    .await
    .expect("the learner's peer URL changed");
    for i in 0..400 {
        root.put(format!("/app/k{}", i % 17), format!("w{i}"), None)
            .await
            .expect("put while the follower is paused");
    }
    let first = metric(l, "ephd_raft_log_first_index");
    assert!(
        first > applied_at_cut + 1,
        "the leader compacted past the paused follower (first index {first}, follower at {applied_at_cut})"
    );
    signal(f, libc::SIGCONT);

    let current = root.get("/app/k0", None).await.unwrap();
    let current = current.header().unwrap().revision();
    let root_token = raw_token(&le, "root", "pw").await;
    let deadline = Instant::now() + SETTLE;
    while status_revision(&fe, &root_token).await < current {
        assert!(
            Instant::now() < deadline,
            "the follower did not catch up\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        metric(f, "ephd_raft_snapshots_installed_total") > installed_before,
        "caught up by snapshot"
    );

    // The same auth state: enabled, same auth revision.
    let (ls, fs) = (auth_status(&le).await, auth_status(&fe).await);
    assert!(fs.enabled, "auth enabled on the caught-up member");
    assert_eq!(ls.auth_revision, fs.auth_revision, "auth revision");
    // The token issued while it was paused works there, with u2's rights.
    let got = raw_get(&fe, &u2_token, "/ops/x").await;
    assert!(got.is_ok(), "u2's token on the follower: {got:?}");
    let denied = raw_get(&fe, &u2_token, "/app/cut").await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    // u2 authenticates there; u1 only with the new password.
    let mut kv = KvClient::new(connect_channel(&fe).await);
    let put = pb::PutRequest {
        key: b"/ops/from-follower".to_vec().into(),
        value: b"v".to_vec().into(),
        ..Default::default()
    };
    kv.put(with_token(put, &raw_token(&fe, "u2", "p2").await))
        .await
        .expect("u2 writes /ops/ through the caught-up member");
    let old = client_as(&fe, "u1", "p").await.map(|_| ());
    assert!(old.is_err(), "u1's old password refused: {old:?}");
    client_as(&fe, "u1", "p-new")
        .await
        .expect("u1's new password accepted");
    // The same member list, with the changes made meanwhile.
    let (lm, fm) = (members(l).await, members(f).await);
    assert_eq!(lm, fm, "member list");
    assert!(
        fm.iter()
            .any(|m| m.id == learner && m.peer_ur_ls == vec![moved_url.clone()]),
        "{fm:?}"
    );
    // And the data is the same.
    let (a, b) = (all_at(l, current).await, all_at(f, current).await);
    assert_eq!(
        a.map(|r| r.kvs).map_err(|e| e.message().to_string()),
        b.map(|r| r.kvs).map_err(|e| e.message().to_string())
    );
}

/// The revision `endpoint` reports, read serializably with `token`.
async fn status_revision(endpoint: &str, token: &str) -> i64 {
    let mut kv = KvClient::new(connect_channel(endpoint).await);
    let req = pb::RangeRequest {
        key: b"/".to_vec().into(),
        serializable: true,
        ..Default::default()
    };
    match within("range", kv.range(with_token(req, token))).await {
        Ok(r) => r.into_inner().header.map_or(0, |h| h.revision),
        Err(_) => 0,
    }
}

/// Adds a learner on a fresh loopback URL (nobody starts it); retries while
/// the cluster is too young to count as healthy (etcd's rule: every voter
/// connected for a while). Returns its ID.
async fn add_learner(c: &mut ClusterClient<Channel>) -> u64 {
    let url = format!("http://127.0.0.1:{}", free_port());
    let deadline = Instant::now() + SETTLE;
    loop {
        let req = MemberAddRequest {
            peer_ur_ls: vec![url.clone()],
            is_learner: true,
        };
        match within("member add", c.member_add(req)).await {
            Ok(r) => return r.into_inner().member.expect("the added member").id,
            Err(e)
                if e.message() == "etcdserver: unhealthy cluster" && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => panic!("learner not added: {e:?}"),
        }
    }
}
