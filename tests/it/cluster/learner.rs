//! Learners in cluster mode, side by side with stock etcd 3.6: a learner
//! answers every client RPC as a stock etcd learner does (serves Status and
//! serializable Ranges, refuses the rest with `etcdserver: rpc not
//! supported for learner`), reports itself as a learner in Status, in
//! MemberList and in `etcd_server_is_learner`, its JSON gateway refuses
//! alike, it is no leader transferee, and it serves everything once
//! promoted.

mod calls;

use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{MoveLeaderRequest, StatusRequest};

use crate::cluster::members::{add, members, promote};
use crate::cluster::{agreed_leader, SETTLE, TIMING};
use crate::etcd_cluster::StockEtcdCluster;
use crate::harness::{free_port, EphdCluster, Server, LEARNER_REFUSAL};

/// The timing flags both kinds of cluster run with.
pub(crate) const ETCD_TIMING: &[&str] = &["--heartbeat-interval=50", "--election-timeout=500"];

/// A three-member ephd cluster with a fourth member added as a learner
/// and started; returns the cluster, the learner's index and its ID.
pub(crate) async fn ephd_with_learner() -> (EphdCluster, usize, u64) {
    let mut cluster = EphdCluster::start(3, TIMING);
    agreed_leader(&cluster, None).await;
    let c = cluster.member(0).unwrap().cluster().await;
    let port = free_port();
    let learner = add(&c, &format!("http://127.0.0.1:{port}"), true)
        .await
        .expect("add a learner");
    let i = cluster
        .start_joining("m3", port)
        .unwrap_or_else(|e| panic!("the learner did not start: {e}"));
    (cluster, i, learner.id)
}

/// `Status.isLearner` as member `m` reports it.
async fn status_is_learner(m: &impl Server) -> bool {
    m.maintenance()
        .await
        .status(StatusRequest {})
        .await
        .expect("status")
        .into_inner()
        .is_learner
}

/// The value of the `etcd_server_is_learner` gauge on the `/metrics` of
/// `m`'s client port (HTTP/1.0, so neither server answers chunked).
fn metric_is_learner(m: &impl Server) -> String {
    use std::io::{Read, Write};
    let endpoint = m.endpoint();
    let addr = endpoint.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("etcd_server_is_learner "))
        .unwrap_or_else(|| panic!("no etcd_server_is_learner on {endpoint}/metrics"))
        .to_string()
}

/// Waits until `m` reports in Status that it is no longer a learner.
async fn promoted(m: &impl Server) {
    let deadline = Instant::now() + SETTLE;
    while status_is_learner(m).await {
        assert!(
            Instant::now() < deadline,
            "{} stays a learner",
            m.endpoint()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What a learner `m` (ID `id`) and a voter `v` report about it: Status,
/// the metric, and the voter's MemberList entry.
async fn reported_as_learner(m: &impl Server, v: &impl Server, id: u64) -> (bool, String, bool) {
    let listed = members(v).await;
    let entry = listed
        .iter()
        .find(|x| x.id == id)
        .unwrap_or_else(|| panic!("{id:x} not in {listed:?}"));
    (
        status_is_learner(m).await,
        metric_is_learner(m),
        entry.is_learner,
    )
}

/// A put through `m`'s JSON gateway: status line and body (HTTP/1.0, so
/// neither server answers chunked).
fn gateway_put(m: &impl Server) -> (String, String) {
    use std::io::{Read, Write};
    let endpoint = m.endpoint();
    let mut stream =
        std::net::TcpStream::connect(endpoint.trim_start_matches("http://")).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let body = r#"{"key":"Zm9v","value":"YmFy"}"#;
    write!(
        stream,
        "POST /v3/kv/put HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    (
        head.lines().next().unwrap_or_default().to_string(),
        body.trim().to_string(),
    )
}

/// MoveLeader to `target` asked of each of `voters`: the answers, sorted.
async fn move_to(voters: &[&impl Server], target: u64) -> Vec<String> {
    let mut out = Vec::new();
    for v in voters {
        let r = v
            .maintenance()
            .await
            .move_leader(MoveLeaderRequest { target_id: target })
            .await;
        out.push(match r {
            Ok(_) => "ok".to_string(),
            Err(s) => format!("{:?}: {}", s.code(), s.message()),
        });
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_answers_every_rpc_as_a_stock_etcd_learner_until_promoted() {
    let mut stock = StockEtcdCluster::start(3, ETCD_TIMING);
    let (sl, sl_id) = stock.join(0, true).await;
    let (ours, ol, ol_id) = ephd_with_learner().await;
    let (etcd_learner, etcd_voter) = (stock.member(sl).unwrap(), stock.member(0).unwrap());
    let (ephd_learner, ephd_voter) = (ours.member(ol).unwrap(), ours.member(0).unwrap());
    let expected = calls::answers(etcd_learner).await;
    let got = calls::answers(ephd_learner).await;
    assert_eq!(got, expected, "ephd (left) and stock etcd (right) differ");
    let served: Vec<_> = expected
        .iter()
        .filter(|(_, o)| !o.ends_with(LEARNER_REFUSAL))
        .map(|(c, o)| (*c, o.as_str()))
        .collect();
    assert_eq!(
        served,
        [
            ("Range serializable", "ok"),
            ("Status", "ok"),
            ("Snapshot", "ok")
        ],
        "a stock etcd learner serves these only"
    );
    assert!(expected
        .iter()
        .all(|(_, o)| o == "ok" || o == &format!("FailedPrecondition: {LEARNER_REFUSAL}")));
    // Status, /metrics and the voters' MemberList say it is a learner.
    let want = (true, "1".to_string(), true);
    assert_eq!(
        reported_as_learner(etcd_learner, etcd_voter, sl_id).await,
        want
    );
    assert_eq!(
        reported_as_learner(ephd_learner, ephd_voter, ol_id).await,
        want
    );
    // The JSON gateway's calls are refused alike.
    let (line, body) = gateway_put(etcd_learner);
    assert!(body.contains(LEARNER_REFUSAL), "{line} {body}");
    assert_eq!(gateway_put(ephd_learner), (line, body));
    // A learner is no leader transferee: the leader says so, the others
    // that they do not lead.
    let stock_voters = [0, 1, 2].map(|i| stock.member(i).unwrap());
    let ephd_voters = [0, 1, 2].map(|i| ours.member(i).unwrap());
    let expected = move_to(&stock_voters, sl_id).await;
    assert_eq!(
        expected,
        [
            "FailedPrecondition: etcdserver: bad leader transferee",
            "FailedPrecondition: etcdserver: not leader",
            "FailedPrecondition: etcdserver: not leader",
        ]
    );
    assert_eq!(move_to(&ephd_voters, ol_id).await, expected);
    // Promoted, it serves everything, on both.
    promote(&etcd_voter.cluster().await, sl_id).await;
    promote(&ephd_voter.cluster().await, ol_id).await;
    promoted(etcd_learner).await;
    promoted(ephd_learner).await;
    let want = (false, "0".to_string(), false);
    assert_eq!(
        reported_as_learner(etcd_learner, etcd_voter, sl_id).await,
        want
    );
    assert_eq!(
        reported_as_learner(ephd_learner, ephd_voter, ol_id).await,
        want
    );
    let expected = calls::answers(etcd_learner).await;
    let got = calls::answers(ephd_learner).await;
    assert!(
        expected.iter().all(|(_, o)| !o.contains(LEARNER_REFUSAL)),
        "{expected:?}"
    );
    assert_eq!(got, expected, "ephd (left) and stock etcd (right) differ");
}
