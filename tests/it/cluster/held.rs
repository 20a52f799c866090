//! A held start (`src/server/held.rs`): a member that restarts without its
//! state while the other members answer without a leader does not form
//! the cluster anew, and does not end either. It says why in one log line
//! (which member holds what, and the command that forces recovery), on
//! `/health`, `/readyz` and `/metrics`, and answers calls with etcd's "no
//! leader"; once enough members return with their logs and elect a
//! leader, it starts by itself (rejoining under a new ID) with every
//! acknowledged write.

use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{PutRequest, StatusRequest};

use crate::cluster::members::{members, published};
use crate::cluster::{agreed_leader, linearizable_get, put, status, SETTLE, TIMING};
use crate::harness::{EphdCluster, Server};
use crate::metrics::assert_alerts_on_steady_scrape;
use crate::operations::http_get;

fn args(root: &str) -> Vec<String> {
    let mut out: Vec<String> = TIMING.iter().map(|s| s.to_string()).collect();
    out.push(format!("--data-dir={root}/{{name}}"));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_restarted_without_state_beside_a_leaderless_minority_holds_its_start_until_a_majority_returns(
) {
    let root = tempfile::tempdir().unwrap();
    let owned = args(&root.path().display().to_string());
    let flags: Vec<&str> = owned.iter().map(String::as_str).collect();
    let mut cluster = EphdCluster::start(3, &flags);
    let (leader, _) = agreed_leader(&cluster, None).await;
    let before = put(cluster.member(leader).unwrap(), "before", "v").await;
    let m0_id = status(cluster.member(0).unwrap()).await.unwrap().0;
    // Every member has published itself, so m0 knows m1 ran (CLUSTER.md's
    // limits: a member killed before its publish commits is not known).
    published(cluster.member(0).unwrap(), 3).await;

    // Two of three killed: m0 is left without a leader.
    cluster.kill(1);
    cluster.kill(2);
    let deadline = Instant::now() + SETTLE;
    while status(cluster.member(0).unwrap())
        .await
        .is_none_or(|s| s.1 != 0)
    {
        assert!(Instant::now() < deadline, "m0 keeps a leader alone");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // m1 lost its disk: it restarts without state, and is held.
    std::fs::remove_dir_all(root.path().join("m1")).unwrap();
    cluster
        .start_member_held("m1", 1)
        .unwrap_or_else(|e| panic!("{e}"));
    let m1 = cluster.member(1).unwrap();
    let log = m1.logs();
    for says in [
        "start held:",
        "a majority of the cluster may have lost its state",
        &format!("member {m0_id:x} at http://127.0.0.1:"),
        "start ONE member with --force-new-cluster",
        "every write of the old cluster is lost",
    ] {
        assert!(log.contains(says), "{says:?} not in: {log}");
    }
    let (code, body) = http_get(m1.metrics_port(), "/health");
    assert!(code.contains("503"), "{code}");
    assert_eq!(body, "{\"health\":\"false\",\"reason\":\"START HELD\"}\n");
    let (code, body) = http_get(m1.metrics_port(), "/readyz?verbose");
    assert!(code.contains("503"), "{code}");
    assert!(
        body.starts_with("[-]start_held failed: member ") && body.contains("has already run"),
        "{body}"
    );
    assert!(http_get(m1.metrics_port(), "/livez").0.contains("200"));
    let (_, metrics) = http_get(m1.metrics_port(), "/metrics");
    for line in ["ephd_server_start_held 1", "etcd_server_has_leader 0"] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line:?} not in:\n{metrics}"
        );
    }
    // ephd's own alert and etcd's etcdNoLeader fire on that scrape; etcd's
    // member-count alerts need the other members' scrapes, so are not
    // checked here.
    let rules = [
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/deploy/prometheus/ephd-alerts.yaml"
        ),
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/it/metrics/etcd-alerts.yml"
        ),
    ];
    assert_alerts_on_steady_scrape(
        &metrics,
        &rules,
        5,
        &[
            "EphdStartHeld",
            "etcdNoLeader",
            "etcdHighNumberOfFailedGRPCRequests",
        ],
        &[("EphdStartHeld", "critical"), ("etcdNoLeader", "critical")],
    );
    // The client URL says the same, over HTTP and gRPC.
    let (code, body) = http_get(m1.client_port(), "/health");
    assert!(
        code.contains("503") && body.contains("START HELD"),
        "{code} {body}"
    );
    let mut kv = m1.kv().await;
    let put_req = PutRequest {
        key: b"during".to_vec().into(),
        value: b"v".to_vec().into(),
        ..Default::default()
    };
    let refused = kv
        .put(put_req)
        .await
        .expect_err("a held member takes no write");
    assert_eq!(
        (refused.code(), refused.message()),
        (tonic::Code::Unavailable, "etcdserver: no leader")
    );
    let refused = m1
        .maintenance()
        .await
        .status(StatusRequest {})
        .await
        .expect_err("a held member has no status");
    assert_eq!(refused.code(), tonic::Code::Unavailable);

    // m2 returns with its log: m0 and m2 elect a leader, and m1 starts by
    // itself, under a new ID, with the write acknowledged before.
    cluster
        .start_member("m2", "new", Some(2))
        .unwrap_or_else(|e| panic!("{e}"));
    cluster
        .wait_started(1, SETTLE)
        .unwrap_or_else(|e| panic!("{e}"));
    let m1 = cluster.member(1).unwrap();
    assert!(
        m1.logs().contains("the start is no longer held"),
        "{}",
        m1.logs()
    );
    // Rejoined as a learner, it promotes itself once caught up.
    let deadline = Instant::now() + SETTLE;
    loop {
        let list = members(cluster.member(0).unwrap()).await;
        if list.len() == 3 && list.iter().all(|m| !m.is_learner && !m.name.is_empty()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "m1 never a voter again: {list:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let m1 = cluster.member(1).unwrap();
    let (rev, kv) = linearizable_get(m1, "before").await;
    assert!(rev >= before && kv.is_some_and(|kv| kv.mod_revision == before));
    let (code, _) = http_get(m1.metrics_port(), "/health");
    assert!(code.contains("200"), "{code}");
    let (_, metrics) = http_get(m1.metrics_port(), "/metrics");
    assert!(
        !metrics.contains("ephd_server_start_held 1"),
        "still held:\n{metrics}"
    );
}
